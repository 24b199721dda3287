"""The subreaper helper: runs commands with their output appended to a log, reaps orphans."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from substrate.adapters.gvisor import procfs
from substrate.adapters.gvisor.reaper import Subreaper
from substrate.errors import Unavailable

pytestmark = pytest.mark.anyio


async def test_runs_commands_and_appends_their_output(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    await anyio.Path(log).write_text("before\n")
    async with Subreaper() as reaper:
        assert reaper.alive
        assert reaper.pid > 0
        assert await reaper.run(["sh", "-c", "echo out; echo err >&2; exit 3"], str(log)) == 3
        assert await reaper.run(["sh", "-c", "read x; echo got=$x"], str(log)) == 0
        assert await reaper.run(["sh", "-c", "kill -9 $$"], str(log)) == -9
        with pytest.raises(OSError, match="No such file"):
            await reaper.run(["/nonexistent/binary"], str(log))
    text = await anyio.Path(log).read_text()
    assert text == "before\nout\nerr\ngot=\n", "appended; stdin is /dev/null"
    assert not reaper.alive
    with pytest.raises(Unavailable):
        await reaper.run(["true"], str(log))


async def test_orphans_are_adopted_and_reaped_at_once(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    async with Subreaper() as reaper:
        # the shell exits at once and leaves a sleeping orphan behind, as runsc run -detach does
        assert await reaper.run(["sh", "-c", "sleep 0.3 & echo $! ; exit 0"], log) == 0
        orphan = int((await anyio.Path(log).read_text()).split()[-1])
        st = procfs.read_stat(orphan)
        assert st is not None
        assert st.ppid == reaper.pid, "adopted by the helper, not by pid 1"
        with anyio.fail_after(5):
            while procfs.read_stat(orphan) is not None:  # noqa: ASYNC110 - gone, not a zombie
                await anyio.sleep(0.02)


async def test_cancelling_a_run_kills_the_command(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    async with Subreaper() as reaper:
        with anyio.move_on_after(0.3):
            await reaper.run(["sh", "-c", "echo $$; exec sleep 30"], log)
        pid = int((await anyio.Path(log).read_text()).split()[0])
        with anyio.fail_after(5):
            while procfs.read_stat(pid) is not None:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        assert await reaper.run(["true"], log) == 0, "the helper still works"


async def test_a_helper_that_cannot_start_is_unavailable() -> None:
    with pytest.raises(Unavailable):
        async with Subreaper(python="/nonexistent/python"):
            pass
