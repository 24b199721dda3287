"""Issue 6's main job on gVisor: ``ate up``, the counter demo, ``ate down`` — and nothing left.

``ate up`` and the demo run as the user runs them (``python -m substrate.cli``,
``python examples/counter/demo.py``) from a clean state directory; the demo's results
(written with ``--json``) are checked, then ``ate down`` must leave no process, network
namespace, veth, nftables table, runsc sandbox or mount of the stack behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from substrate.adapters.gvisor import procfs
from substrate.adapters.linux.netlink import LinuxHostNetwork
from substrate.cli.stack import session_members
from substrate.client.local import LocalStack, read_local_stack
from substrate.net.plan import netns_prefix, veth_prefix, worker_tag
from substrate.sandbox.node_layout import NodeLayout
from tests.privileges import needs_nft, needs_runsc

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.runsc, needs_runsc, needs_nft]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    with anyio.fail_after(240):
        return await anyio.run_process(
            [sys.executable, *argv], cwd=ROOT, env=env, check=False, stdin=subprocess.DEVNULL
        )


def shown(done: subprocess.CompletedProcess[bytes]) -> str:
    return f"exit {done.returncode}\n{done.stdout.decode()}\n{done.stderr.decode()}"


def logs(stack: LocalStack) -> str:
    out = []
    for p in stack.processes:
        with contextlib.suppress(OSError):
            out.append(f"===== {p.name} =====\n{Path(p.log).read_text(errors='replace')[-3000:]}")
    return "\n".join(out)


async def assert_nothing_left(stack: LocalStack) -> None:
    for p in stack.processes:
        assert not procfs.alive(p.pid, p.start_ticks), p
        assert session_members(p.pid) == [], p
    network = LinuxHostNetwork()
    for node in stack.nodes:
        for worker in node.workers:
            owned = await network.owned(netns_prefix(worker), veth_prefix(worker))
            assert owned == ([], []), (worker, owned)
            table = await anyio.run_process(
                ["nft", "list", "table", "ip", f"ate_egress_{worker_tag(worker)}"], check=False
            )
            assert table.returncode != 0, f"nft table of {worker} left: {table.stdout!r}"
            root = NodeLayout(node.directory).worker_runsc_root(worker)
            listed = await anyio.run_process(["runsc", "--root", root, "list"], check=False)
            assert listed.stdout.decode().strip().splitlines()[1:] == [], listed.stdout
    mounts = await anyio.Path("/proc/self/mountinfo").read_text()
    assert str(stack.state_dir) + "/" not in mounts


async def test_up_demo_down(tmp_path: Path) -> None:
    state = tmp_path / "s"
    env = {**os.environ, "ATE_STATE_DIR": str(state), "PYTHONUNBUFFERED": "1"}
    up = await run(
        ["-m", "substrate.cli", "up", "--runtime=gvisor", "--nodes=1", "--workers-per-node=2"], env
    )
    assert up.returncode == 0, shown(up)
    out = up.stdout.decode()
    assert "the local stack is up" in out and "runtime     gvisor" in out, out
    stack = read_local_stack(state)
    try:
        results_file = tmp_path / "results.json"
        demo = await run(["examples/counter/demo.py", f"--json={results_file}"], env)
        assert demo.returncode == 0, shown(demo) + logs(stack)
        text = demo.stdout.decode()
        assert "no durable volume" in text  # the demo says so
        assert "x-ate-restored-from: cold-boot" in text and "x-ate-snapshot-generation" in text
        results = json.loads(results_file.read_text())
        assert results["failures"] == []
        assert results["runtime"] == "gvisor"
        # the counter continued across suspend/resume, in memory and in its file
        assert (results["first"], results["before_suspend"], results["after_resume"]) == (1, 2, 3)
        assert results["same_boot"] is True
        assert results["disk_after_resume"] == 3
        # the pause's count (4) is gone after the revert: back to the durable 2, then 3
        assert (results["after_pause"], results["after_revert"]) == (4, 3)
        # the tagged actor started from the tag's state (3), restored from the tag
        assert results["tagged"] == 4 and results["tagged_restored_from"] == "tag"
    finally:
        down = await run(["-m", "substrate.cli", "down"], env)
    assert down.returncode == 0, shown(down)
    assert "the local stack is down" in down.stdout.decode()
    await assert_nothing_left(stack)
    assert not (state / "stack.json").exists()
