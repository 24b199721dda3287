"""What every drill shares: its settings, its result (checks and figures), and helpers to
set up actors on a :class:`~benchmarks.drills.cluster.Cluster`."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Final, TypeVar

import anyio
import attrs

from benchmarks.drills.cluster import Cluster, ClusterOptions, Progress
from benchmarks.drills.timeline import Timeline
from substrate.client import AteClient
from substrate.client.http import call_actor
from substrate.core.ids import TemplateRef
from substrate.core.model import (
    Actor,
    ActorState,
    ActorTemplate,
    Container,
    Durability,
    EnvVar,
    Probe,
    Resources,
    SandboxClass,
    SnapshotConfig,
    StorageStatus,
)
from substrate.errors import AlreadyExists, SubstrateError

ATESPACE: Final = "drill"
TEMPLATE: Final = "counter"
_COUNT: Final = re.compile(r"count=(\d+)")
T = TypeVar("T")


@attrs.frozen(kw_only=True)
class DrillConfig:
    """Knobs of a drill run; :meth:`short` is the variant the test suite runs."""

    out: Path
    """Timelines, summaries and the stacks' state directories go below it."""
    runtime: str = "auto"
    budget: float = 5.0
    """The router's park budget (``--parked-request-budget``)."""
    slack: float = 1.5
    """How much past the budget an answer may come before it counts as hanging."""
    client_timeout: float = 15.0
    heartbeat_timeout: float = 10.0
    pg_away: float = 60.0
    pg_fault: str = "stop"
    """``stop`` (pg_ctl stop, then start) or ``refuse``/``blackhole`` (a proxy in front)."""
    api_away: float = 60.0
    bucket_away: float = 30.0
    node_down: float = 40.0
    drain_after: float = 10.0
    burst_requests: int = 2800
    burst_actors: int = 100
    burst_workers: int = 2
    burst_slots: int = 10
    burst_lot: int = 1024
    burst_slack: float = 4.0
    """The bound of the burst's "none hangs" check at the client (budget + this), the only
    client-side bound on a served answer, which includes the exchange with its actor. The
    "within the budget" checks (budget + ``slack``) apply to every request's verdict in
    the router and to every refusal at the client (see :mod:`benchmarks.drills.burst`)."""
    suspended_every: float = 5.0
    keep: bool = False
    """Keep the stacks' state directories (logs) after a drill that passed."""

    def cluster_options(self, *, nodes: int, max_actors: int, **more: object) -> ClusterOptions:
        """A drill's stack: ``nodes`` nodes of one worker with ``max_actors`` slots each,
        this run's runtime, heartbeat timeout and park budget; ``more`` sets the rest."""
        return ClusterOptions(
            nodes=nodes,
            workers_per_node=1,
            max_actors=max_actors,
            runtime=self.runtime,
            heartbeat_timeout=self.heartbeat_timeout,
            parked_budget=self.budget,
            **more,  # type: ignore[arg-type]
        )

    @classmethod
    def short(cls, out: Path, **changes: object) -> DrillConfig:
        """A quick variant of every drill (the test suite's): same checks, short outages."""
        base = cls(
            out=out,
            pg_away=12.0,
            api_away=12.0,
            bucket_away=12.0,
            node_down=14.0,
            heartbeat_timeout=5.0,
            drain_after=4.0,
            burst_requests=2800,
            burst_actors=40,
            burst_workers=2,
            burst_slots=8,
            suspended_every=3.0,
        )
        return attrs.evolve(base, **changes)  # type: ignore[arg-type]


@attrs.frozen
class Check:
    name: str
    ok: bool
    detail: str = ""


@attrs.frozen
class Figure:
    what: str
    ours: str
    original: str


@attrs.define
class DrillResult:
    number: int
    key: str
    title: str
    runtime: str = ""
    checks: list[Check] = attrs.Factory(list)
    figures: list[Figure] = attrs.Factory(list)
    files: list[Path] = attrs.Factory(list)
    notes: list[str] = attrs.Factory(list)
    error: str = ""
    logs: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.error and all(c.ok for c in self.checks)

    def expect(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, bool(ok), detail))
        return bool(ok)

    def figure(self, what: str, ours: str, original: str) -> None:
        self.figures.append(Figure(what, ours, original))

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def report(self) -> str:
        lines = [
            f"Drill {self.number}: {self.title}  [{'PASS' if self.passed else 'FAIL'}]",
            f"  runtime {self.runtime}, {self.seconds:.0f} s",
        ]
        lines += [f"  {f.what}: {f.ours} (original: {f.original})" for f in self.figures]
        lines += [
            f"  [{'ok  ' if c.ok else 'FAIL'}] {c.name}{f' — {c.detail}' if c.detail else ''}"
            for c in self.checks
        ]
        lines += [f"  note: {n}" for n in self.notes]
        if self.error:
            lines.append(f"  ERROR: {self.error}")
        lines += [f"  file: {p}" for p in self.files]
        return "\n".join(lines)


# --- set-up helpers ---------------------------------------------------------------------


def sandbox_class(cluster: Cluster) -> SandboxClass:
    return SandboxClass.GVISOR if cluster.runtime == "gvisor" else SandboxClass.FAKE


def counter_template(
    cluster: Cluster, *, name: str = TEMPLATE, fill_mib: int = 0, memory_mib: int = 64
) -> ActorTemplate:
    env = [EnvVar(name="STATE_DIR", value="/tmp/state")]
    if fill_mib:
        env.append(EnvVar(name="FILL_MIB", value=str(fill_mib)))
    return ActorTemplate(
        ref=TemplateRef(atespace=ATESPACE, name=name),
        containers=(
            Container(
                name="app",
                image="counter:1",
                env=tuple(env),
                wakeup_probe=Probe(path="/readyz"),
            ),
        ),
        resources=Resources(cpu_milli=100, memory_bytes=max(64, memory_mib) << 20),
        sandbox_class=sandbox_class(cluster),
        snapshot_config=SnapshotConfig(storage_location=cluster.location),
    )


async def setup_template(c: AteClient, cluster: Cluster, **kw: int | str) -> ActorTemplate:
    with contextlib.suppress(AlreadyExists):
        await c.create_atespace(ATESPACE)
    template = counter_template(cluster, **kw)  # type: ignore[arg-type]
    try:
        return await c.create_template(template)
    except AlreadyExists:
        return await c.get_template(template.ref)


def ref(name: str) -> str:
    return f"{ATESPACE}/{name}"


async def create_actors(
    c: AteClient,
    names: list[str],
    *,
    template: str = TEMPLATE,
    selector: dict[str, str] | None = None,
) -> list[str]:
    async with anyio.create_task_group() as tg:
        for n in names:
            create = partial(
                c.create_actor, ref(n), template=f"{ATESPACE}/{template}", worker_selector=selector
            )
            tg.start_soon(create)
    return [ref(n) for n in names]


def count_of(body: str) -> int | None:
    m = _COUNT.search(body)
    return int(m.group(1)) if m else None


async def call_count(cluster: Cluster, actor: str, *, timeout: float = 30.0) -> int:  # noqa: ASYNC109
    """One request through the router that must answer 200; the counter it reports."""
    answer = await call_actor(cluster.router_url, actor, timeout=timeout)
    if answer.status != 200:
        raise RuntimeError(f"{actor}: HTTP {answer.status} {answer.text[:200]}")
    n = count_of(answer.text)
    if n is None:
        raise RuntimeError(f"{actor}: no count in {answer.text[:200]!r}")
    return n


async def place_running(
    c: AteClient, cluster: Cluster, names: list[str], node: str, *, calls: int = 1
) -> dict[str, int]:
    """Create actors pinned to ``node``, call each ``calls`` times, then unpin them (they
    stay RUNNING there, free to move once suspended); their counts."""
    refs = await create_actors(c, names, selector={"node": node})
    counts = {}
    for r in refs:
        for _ in range(calls):
            counts[r] = await call_count(cluster, r)
    for r in refs:
        await c.update_actor_selector(r, None)
    return counts


async def wait_for(
    what: str,
    check: Callable[[], Awaitable[T | None]],
    *,
    timeout: float,  # noqa: ASYNC109
    every: float = 0.1,
) -> tuple[T, float]:
    """Call ``check`` until it returns something; (that, seconds). TimeoutError else."""
    started = time.monotonic()
    last_error = ""
    while True:
        try:
            got = await check()
        except SubstrateError as exc:
            got, last_error = None, exc.description
        if got is not None:
            return got, time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: not within {timeout:g} s {last_error}".strip())
        await anyio.sleep(every)


async def actor_state(c: AteClient, actor: str) -> Actor:
    return await c.get_actor(actor)


async def list_actors(c: AteClient) -> list[Actor]:
    return [a async for a in c.list_actors(None)]


async def unsettled(c: AteClient) -> list[str]:
    """Actors in a transient (-ING) state, as ``ref STATE`` texts."""
    return [f"{a.ref} {a.state.name}" for a in await list_actors(c) if a.state.transient]


async def wait_settled(c: AteClient, timeout: float) -> tuple[list[str], float]:  # noqa: ASYNC109
    """Until no actor is in a transient state (or ``timeout``); what is left, seconds."""
    started = time.monotonic()
    left: list[str] = []
    while time.monotonic() - started < timeout:
        try:
            left = await unsettled(c)
        except SubstrateError as exc:
            left = [f"(cannot list: {exc.description})"]
        if not left:
            break
        await anyio.sleep(0.25)
    return left, time.monotonic() - started


def durable_state(actor: Actor) -> str:
    """The newest snapshot's durable copy status (``COMPLETED``, ``PENDING`` …) or ``none``."""
    if not actor.status.snapshots:
        return "none"
    durable = actor.status.snapshots[-1].durable()
    return durable.status.name if durable is not None else "none"


def newest_local_node(actor: Actor) -> str:
    if not actor.status.snapshots:
        return ""
    local = actor.status.snapshots[-1].local()
    return str(local.node) if local is not None and local.node is not None else ""


def worker_of(actor: Actor) -> str:
    a = actor.status.assignment
    return a.worker.name if a is not None else ""


def is_durable(actor: Actor) -> bool:
    return any(
        s.durability is Durability.DURABLE and s.status is StorageStatus.COMPLETED
        for snap in actor.status.snapshots
        for s in snap.storages
    )


def crashed(actors: list[Actor]) -> list[str]:
    return [f"{a.ref}: {a.status.crash.message if a.status.crash else ''}" for a in actors
            if a.state is ActorState.CRASHED]  # fmt: skip


@asynccontextmanager
async def drill_stack(
    cfg: DrillConfig,
    result: DrillResult,
    stack_name: str,
    options: ClusterOptions,
    progress: Callable[[str], None],
) -> AsyncIterator[Cluster]:
    """A drill's own stack for the block: the runtime, any error, the logs of a failed
    drill and the time it took all go into ``result``."""
    started = time.monotonic()
    async with Cluster(cfg.out / "stacks" / stack_name, options, progress) as cluster:
        result.runtime = cluster.runtime
        try:
            yield cluster
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        if not result.passed:
            result.logs = cluster.tails()
    result.seconds = time.monotonic() - started


def write_timeline(cfg: DrillConfig, tl: Timeline) -> list[Path]:
    return tl.write(cfg.out / "timelines")


__all__ = [
    "ATESPACE",
    "Check",
    "DrillConfig",
    "DrillResult",
    "Figure",
    "Progress",
    "drill_stack",
]
