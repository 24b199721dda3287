"""``ate up --store postgresql://…``, ``ate down``, ``ate up`` again on the same state
directory: the actors and their snapshots are still there, and an actor resumes from its
snapshot with its memory intact (the fake runtime, so it runs without root)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import attrs
import pytest

from substrate.client import call_actor, connect_local, read_local_stack
from substrate.client.manifest import load_template
from substrate.core.model import ActorState, SandboxClass, SuspendMode
from tests.pg import PgHandle

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def ate(*argv: str, env: dict[str, str]) -> str:
    with anyio.fail_after(180):
        done = await anyio.run_process(
            [sys.executable, "-m", "substrate.cli", *argv],
            cwd=ROOT,
            env=env,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, f"ate {' '.join(argv)}: exit {done.returncode}\n{out}"
    return out


async def count(state: Path, actor: str) -> tuple[int, str]:
    answer = await call_actor(read_local_stack(state).router_url, actor)
    assert answer.status == 200, answer
    return int(answer.text.split()[0].removeprefix("count=")), answer.restored_from or ""


async def test_restart_on_postgresql_keeps_actors_and_snapshots(
    tmp_path: Path, pg_server: PgHandle
) -> None:
    database = await pg_server.take_database()
    state = tmp_path / "s"
    env = {**os.environ, "ATE_STATE_DIR": str(state)}
    up = [
        "up",
        "--runtime=fake",
        "--nodes=1",
        "--workers-per-node=1",
        f"--store={pg_server.url(database)}",
    ]
    try:
        out = await ate(*up, env=env)
        assert "store       postgresql://" in out
        template = load_template(ROOT / "examples/counter/template.yaml", atespace="keep")
        async with connect_local(state) as c:
            await c.create_atespace("keep")
            await c.create_template(attrs.evolve(template, sandbox_class=SandboxClass.FAKE))
            await c.create_actor("keep/a1", template="keep/counter")
            assert (await count(state, "keep/a1"))[0] == 1
            assert (await count(state, "keep/a1"))[0] == 2
            before = await c.suspend_actor("keep/a1", SuspendMode.SYNC)
            assert before.state is ActorState.SUSPENDED
            await c.create_tag("keep/t1", "keep/a1")
        await ate("down", env=env)

        await ate(*up, env=env)
        async with connect_local(state) as c:
            after = await c.get_actor("keep/a1")
            assert after.state is ActorState.SUSPENDED
            assert after.metadata.uid == before.metadata.uid
            assert [s.snapshot_id for s in after.status.snapshots] == [
                s.snapshot_id for s in before.status.snapshots
            ]
            assert (await c.get_tag("keep/t1")).snapshot is not None
            value, source = await count(state, "keep/a1")
            assert value == 3, "the actor resumed from its snapshot after the restart"
            assert source in ("local", "durable")
            await c.create_actor("keep/a2", source_tag="keep/t1")
            assert await count(state, "keep/a2") == (3, "tag")
    finally:
        await ate("down", "--purge", env=env)
        await pg_server.discard_database(database)
