"""What the runsc runtime promises beyond the conformance suite (real runsc, root only)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import attrs
import pytest

from substrate.adapters.gvisor import procfs
from substrate.adapters.gvisor.runtime import RUNTIME_FILE, RunscRuntime, cleanup_root
from substrate.core.model import EnvVar
from substrate.errors import FailedPrecondition, Internal, NotFound
from substrate.sandbox.oci import render_config
from substrate.sandbox.ports import CHECKPOINT_FAILED_MESSAGE
from substrate.sandbox.runsc_argv import RunscOptions, run_argv
from substrate.sandbox.spec import SandboxState
from substrate.testing.contracts.sandbox import held_connection, hit, http_get, resume, start
from tests.contracts.gvisor_factory import gvisor_factory, root_leftovers
from tests.privileges import needs_runsc

pytestmark = [needs_runsc, pytest.mark.runsc, pytest.mark.anyio]


async def test_whoami_reads_the_host_files_live_and_after_a_restore(tmp_path: Path) -> None:
    make = gvisor_factory(tmp_path)
    image = make.image_dir("who")
    async with make.runtime() as rt:
        async with make.spec("who", namespace="ns-a") as spec:
            await start(make, rt, spec)
            address = await rt.address(spec.sandbox_id)
            assert (await http_get(address, 80, "/whoami")).body == b"as1/who who"
            await anyio.Path(spec.sysinfo_dir, "name").write_text("renamed\n")
            assert (await http_get(address, 80, "/whoami")).body == b"as1/renamed who"
            await rt.checkpoint(spec.sandbox_id, image)
        # restored elsewhere: another namespace and another system-info directory
        async with make.spec("who", namespace="ns-b") as moved:
            await anyio.Path(moved.sysinfo_dir, "uid").write_text("new-uid\n")
            await resume(make, rt, moved, image)
            address = await rt.address(moved.sandbox_id)
            assert (await http_get(address, 80, "/whoami")).body == b"as1/who new-uid"
            tmp = anyio.Path(moved.sysinfo_dir, "atespace.tmp")
            await tmp.write_text("as2\n")
            await tmp.rename(Path(moved.sysinfo_dir, "atespace"))  # replaced, not rewritten
            assert (await http_get(address, 80, "/whoami")).body == b"as2/who new-uid"
            assert (await hit(rt, moved)).count == 1, "/whoami does not count"
            await rt.terminate(moved.sandbox_id)


async def test_filled_memory_shows_in_stats_and_in_the_image(tmp_path: Path) -> None:
    make = gvisor_factory(tmp_path)
    mib = 24
    async with make.runtime() as rt, make.spec("fill", namespace="ns-a") as plain:
        spec = attrs.evolve(plain, env=(EnvVar(name="FILL_MIB", value=str(mib)),))
        await start(make, rt, spec)
        address = await rt.address(spec.sandbox_id)
        with anyio.fail_after(20):
            while (await http_get(address, 80, "/fill")).body != f"filled={mib}".encode():  # noqa: ASYNC110
                await anyio.sleep(0.05)
        stats = await rt.stats(spec.sandbox_id)
        assert stats.memory_bytes >= mib << 20
        assert stats.memory_bytes < (mib + 200) << 20
        assert stats.cpu_seconds > 0.0
        info = await rt.checkpoint(spec.sandbox_id, make.image_dir("fill"))
        assert info.size_bytes >= mib << 20, "random memory does not compress"
        assert sorted(info.files) == ["checkpoint.img", RUNTIME_FILE]
        await rt.terminate(spec.sandbox_id)


async def test_restore_refuses_an_image_of_another_runsc(tmp_path: Path) -> None:
    make = gvisor_factory(tmp_path)
    image = Path(make.image_dir("old"))
    async with make.runtime() as rt, make.spec("old", namespace="ns-a") as spec:
        await start(make, rt, spec)
        await rt.checkpoint(spec.sandbox_id, str(image))
        await rt.terminate(spec.sandbox_id)
        record = json.loads((image / RUNTIME_FILE).read_text())
        (image / RUNTIME_FILE).write_text(json.dumps({**record, "runtime_version": "runsc-1999"}))
        with pytest.raises(FailedPrecondition, match="runsc-1999"):
            await rt.restore(spec, str(image))
        with pytest.raises(NotFound):
            await rt.state(spec.sandbox_id)


async def test_a_failed_checkpoint_says_why(tmp_path: Path) -> None:
    make = gvisor_factory(tmp_path)
    async with make.runtime() as rt, make.spec("why", namespace="ns-a") as spec:
        await start(make, rt, spec)
        address = await rt.address(spec.sandbox_id)
        async with held_connection(address, 80):
            with pytest.raises(Internal, match=CHECKPOINT_FAILED_MESSAGE) as failed:
                await rt.checkpoint(spec.sandbox_id, make.image_dir("why"))
        assert "connected state" in failed.value.description
        assert "goroutine" not in failed.value.description
        assert await rt.state(spec.sandbox_id) is SandboxState.STOPPED


async def test_sandboxes_are_adopted_by_the_subreaper(tmp_path: Path) -> None:
    make = gvisor_factory(tmp_path)
    async with make.runtime() as rt, make.spec("adopt", namespace="ns-a") as spec:
        assert isinstance(rt, RunscRuntime)
        await start(make, rt, spec)
        pid = rt.sandbox_pid(spec.sandbox_id)
        st = procfs.read_stat(pid)
        assert st is not None
        assert rt.subreaper_pid > 0
        assert st.ppid == rt.subreaper_pid
        await rt.terminate(spec.sandbox_id)
        assert not procfs.alive(pid, st.start_ticks)
        assert procfs.read_stat(pid) is None, "reaped at once, not left a zombie"


async def test_a_sandbox_that_dies_is_stopped(tmp_path: Path) -> None:
    make = gvisor_factory(tmp_path)
    async with make.runtime() as rt, make.spec("dies", namespace="ns-a") as spec:
        assert isinstance(rt, RunscRuntime)
        await start(make, rt, spec)
        os.kill(rt.sandbox_pid(spec.sandbox_id), signal.SIGKILL)
        with anyio.fail_after(5):
            while await rt.state(spec.sandbox_id) is not SandboxState.STOPPED:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        with pytest.raises(FailedPrecondition):
            await rt.stats(spec.sandbox_id)
        with pytest.raises(FailedPrecondition):
            await rt.checkpoint(spec.sandbox_id, make.image_dir("dead"))
        await start(make, rt, spec)  # a cold boot over the remains
        assert (await hit(rt, spec)).count == 1
        await rt.terminate(spec.sandbox_id)


async def test_cleanup_root_removes_what_an_unclean_exit_left(tmp_path: Path) -> None:
    make = gvisor_factory(tmp_path)
    root = str(tmp_path / "crashed-root")
    opts = RunscOptions(root=root)
    async with make.spec("orphan", namespace="ns-a") as spec:
        await anyio.Path(spec.bundle_dir, "config.json").write_text(render_config(spec))
        await anyio.Path(root).mkdir()
        await make.prepare(spec)
        log = os.open(tmp_path / "orphan.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            done = await anyio.run_process(
                run_argv(opts, spec.sandbox_id, spec.bundle_dir),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                check=False,
            )
        finally:
            os.close(log)
        assert done.returncode == 0
        # a process that names the root, as a hung runsc would
        stray = await anyio.open_process(
            [sys.executable, "-c", "import time; time.sleep(60)", "runsc", "--root", root]
        )
        try:
            assert len(root_leftovers(root)) >= 3  # the container, its sandbox, the stray
            report = await cleanup_root(root)
            assert report.deleted == (spec.sandbox_id,)
            assert stray.pid in report.killed
            with anyio.fail_after(5):
                assert await stray.wait() == -signal.SIGKILL
            assert root_leftovers(root) == []
            assert [p async for p in anyio.Path(root).iterdir()] == []
            again = await cleanup_root(root)
            assert again.deleted == ()
            assert again.killed == ()
        finally:
            if stray.returncode is None:
                stray.kill()
            await stray.aclose()
            await cleanup_root(root)
