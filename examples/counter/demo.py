"""The counter demo: one actor's life through the local stack, with the SDK.

    ate up                                   # or: make demo (which runs both)
    python examples/counter/demo.py [--state-dir DIR] [--atespace demo] [--json FILE]

It creates the atespace, the template of ``template.yaml`` and an actor, calls it through
the router (``ate-target-actor``), suspends it (SYNC: the snapshot is durable when the
call returns), calls it again (the router resumes it: the memory count continued), pauses
and resumes it, reverts it (back to the last durable snapshot's count), tags it and
creates a second actor from the tag (it starts from the tag's state). Every step prints
its latency, and every call the restore provenance headers the router adds.

The counter answers ``count=N boot=TOKEN disk=M``: N is in the process's memory, M in the
file ``$STATE_DIR/count`` (``/tmp/state``). The system mounts no durable volumes into
sandboxes; ``/tmp`` is a tmpfs inside the sandbox, so that file travels with the memory
snapshot. (The fake runtime's stand-in workload has no disk counter.)

Exit status 0 when every check held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs

from substrate.client import (
    ActorResponse,
    SyncAteClient,
    call_actor_sync,
    connect_local_sync,
    default_state_dir,
    load_template,
    read_local_stack,
)
from substrate.core.model import ActorState, SandboxClass, SuspendMode
from substrate.errors import NotFound, SubstrateError

HERE = Path(__file__).resolve().parent
COUNT = re.compile(r"count=(\d+) boot=(\w+)(?: disk=(\d+))?")
T = TypeVar("T")


@attrs.frozen
class Reading:
    count: int
    boot: str
    disk: int | None
    provenance: dict[str, str]
    seconds: float


class Demo:
    def __init__(self, client: SyncAteClient, router: str, atespace: str) -> None:
        self.c = client
        self.router = router
        self.atespace = atespace
        self.step_no = 0
        self.timings: list[tuple[str, float]] = []
        self.failures: list[str] = []

    def step(self, title: str, fn: Callable[[], T]) -> T:
        self.step_no += 1
        started = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - started
        self.timings.append((title, elapsed))
        print(f"[{self.step_no:2}] {title:<52} {elapsed * 1000:8.1f} ms")
        return result

    def call(self, actor: str, why: str) -> Reading:
        answer: ActorResponse = self.step(
            f"GET / {actor} ({why})", lambda: call_actor_sync(self.router, actor)
        )
        if answer.status != 200:
            raise SystemExit(f"{actor} answered {answer.status}: {answer.text.strip()}")
        match = COUNT.search(answer.text)
        if match is None:
            raise SystemExit(f"{actor} answered {answer.text!r}, not a counter")
        for name, value in answer.provenance.items():
            print(f"       {name}: {value}")
        print(f"       -> {answer.text.strip()}")
        disk = int(match.group(3)) if match.group(3) else None
        return Reading(
            count=int(match.group(1)),
            boot=match.group(2),
            disk=disk,
            provenance=answer.provenance,
            seconds=answer.elapsed,
        )

    def check(self, ok: bool, text: str) -> None:
        print(f"       {'✓' if ok else '✗'} {text}")
        if not ok:
            self.failures.append(text)

    def reset(self) -> None:
        """Remove what an earlier run of the demo left in the atespace."""
        try:
            self.c.get_atespace(self.atespace)
        except NotFound:
            return
        print(f"cleaning up an earlier demo run in atespace {self.atespace!r}")
        for actor in list(self.c.list_actors(self.atespace)):
            self.c.delete_actor(actor.ref, force=True)
        for tag in self.c.list_tags(self.atespace):
            self.c.delete_tag(tag.ref)
        for template in self.c.list_templates(self.atespace):
            self.c.delete_template(template.ref)
        self.c.delete_atespace(self.atespace)


def run(state_dir: Path, atespace: str) -> dict[str, Any]:
    stack = read_local_stack(state_dir)
    print(f"local stack in {state_dir}: runtime {stack.runtime}, router {stack.router_url}")
    template = load_template(HERE / "template.yaml", atespace=atespace)
    if stack.runtime == "fake":
        print(
            "NOTE: no gVisor here: the actors are the fake runtime's in-process stand-ins "
            "(same API, same snapshots; no disk counter)"
        )
        template = attrs.evolve(template, sandbox_class=SandboxClass.FAKE)
    print(
        "NOTE: sandboxes get no durable volume mounted; the counter's file lives in the "
        "sandbox's /tmp (tmpfs), so it is captured by the memory snapshots.\n"
    )
    a1, a2 = f"{atespace}/counter-1", f"{atespace}/counter-2"
    results: dict[str, Any] = {"runtime": stack.runtime}
    with connect_local_sync(state_dir, timeout=120) as c:
        demo = Demo(c, stack.router_url, atespace)
        demo.reset()
        demo.step(f"create atespace {atespace}", lambda: c.create_atespace(atespace))
        demo.step(f"create template {template.ref}", lambda: c.create_template(template))
        demo.step(f"create actor {a1}", lambda: c.create_actor(a1, template=str(template.ref)))

        first = demo.call(a1, "cold boot through the router")
        demo.check(
            first.provenance.get("x-ate-restored-from") == "cold-boot" and first.count == 1,
            "the first call cold-booted the actor: count=1",
        )
        second = demo.call(a1, "running")
        demo.check(second.count == 2 and second.boot == first.boot, "count=2, same boot")

        suspended = demo.step(f"suspend {a1} (sync)", lambda: c.suspend_actor(a1, SuspendMode.SYNC))
        snap = suspended.status.snapshots[-1]
        durable = snap.durable()
        demo.check(
            suspended.state is ActorState.SUSPENDED and durable is not None and durable.completed,
            f"suspended; snapshot generation {snap.generation} is durable "
            f"({durable.uri if durable else '-'})",
        )

        resumed = demo.call(a1, "resumes it from the snapshot")
        demo.check(
            resumed.count == 3 and resumed.boot == first.boot,
            f"the memory count continued across suspend/resume: count={resumed.count}, same boot",
        )
        if resumed.disk is not None:
            demo.check(resumed.disk == 3, f"the file counter continued too: disk={resumed.disk}")

        demo.step(f"pause {a1}", lambda: c.pause_actor(a1))
        after_pause = demo.call(a1, "resumes it in place")
        demo.check(
            after_pause.count == 4 and after_pause.provenance.get("x-ate-restored-from") == "local",
            f"paused and resumed from the node-local copy: count={after_pause.count}",
        )

        reverted = demo.step(f"revert {a1}", lambda: c.revert_actor(a1))
        demo.check(
            reverted.state is ActorState.SUSPENDED,
            f"reverted to generation {reverted.status.snapshots[-1].generation} "
            "(the last durable snapshot)",
        )
        after_revert = demo.call(a1, "resumes the reverted actor")
        demo.check(
            after_revert.count == 3,
            f"back to the last durable value: count={after_revert.count} "
            f"(the snapshot held {after_revert.count - 1}; the pause's count=4 is gone)",
        )

        demo.step(f"suspend {a1} (sync), to tag it", lambda: c.suspend_actor(a1, SuspendMode.SYNC))
        tag = demo.step(
            f"tag {atespace}/golden from {a1}", lambda: c.create_tag(f"{atespace}/golden", a1)
        )
        demo.step(
            f"create actor {a2} from tag golden",
            lambda: c.create_actor(a2, source_tag=str(tag.ref)),
        )
        tagged = demo.call(a2, "starts from the tag's snapshot")
        demo.check(
            tagged.count == after_revert.count + 1
            and tagged.provenance.get("x-ate-restored-from") == "tag",
            f"the tagged actor started from the tag's state: count={tagged.count}",
        )
        original = demo.call(a1, "the original goes on by itself")
        demo.check(original.count == after_revert.count + 1, f"count={original.count}")

        results.update(
            first=first.count,
            before_suspend=second.count,
            after_resume=resumed.count,
            after_pause=after_pause.count,
            after_revert=after_revert.count,
            tagged=tagged.count,
            tagged_restored_from=tagged.provenance.get("x-ate-restored-from"),
            resume_restored_from=resumed.provenance.get("x-ate-restored-from"),
            disk_after_resume=resumed.disk,
            same_boot=resumed.boot == first.boot,
            failures=demo.failures,
            timings=dict(demo.timings),
        )
    print(
        f"\n{'all checks held' if not demo.failures else f'{len(demo.failures)} check(s) failed'}. "
        f"Try: ate get actors -a {atespace}; ate call {a1}; ate top. Stop with: ate down"
    )
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--state-dir", type=Path, default=default_state_dir(os.environ))
    p.add_argument("--atespace", default="demo")
    p.add_argument("--json", type=Path, help="also write the results to this file")
    args = p.parse_args(argv)
    try:
        results = run(args.state_dir.expanduser().absolute(), args.atespace)
    except SubstrateError as exc:
        print(f"error: {exc.code.name}: {exc.description}", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if results["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
