"""The gVisor runtime's parsing and bookkeeping helpers; no root, no runsc needed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from substrate.adapters.gvisor import procfs
from substrate.adapters.gvisor.runtime import (
    IMAGE_FILE,
    RUNTIME_FILE,
    RunscRuntime,
    check_image,
    parse_list,
    parse_state,
    parse_version,
    runtime_record,
    summarize_error,
)
from substrate.errors import FailedPrecondition, Internal, InvalidArgument, NotFound, Unavailable
from substrate.sandbox.oci import build_config
from substrate.sandbox.ports import RUNTIME_CLOSED_MESSAGE, SandboxRuntime
from substrate.sandbox.runsc_argv import RunscOptions
from substrate.sandbox.spec import SYSINFO_MOUNT, SandboxSpec, SandboxState

# What runsc 0.0~20221219 printed on this machine (shortened object dumps).
CHECKPOINT_PANIC = """\
checkpoint failed: checkpointing container "tgv-x1": encoding error at object tcp.endpoint{TCPEndpointStateInner:stack.TCPEndpointStateInner{TSOffset:tcp.TSOffset{milliseconds:0x540c4720}}, ...}: save rejected due to unsupported networking state: endpoint cannot be saved in connected state: local 169.254.17.2:80, remote 169.254.17.1:46984:
goroutine 58 [running]:
gvisor.dev/gvisor/pkg/state.safely.func1()
\tgvisor.dev/gvisor/pkg/state/state.go:308 +0x17d
panic({0xebbd80, 0xc00027f140})
\truntime/panic.go:884 +0x212
gvisor.dev/gvisor/pkg/tcpip/transport/tcp.(*endpoint).beforeSave(0xc0001df200)
\tgvisor.dev/gvisor/pkg/tcpip/transport/tcp/endpoint_state.go:42 +0x3a5
created by gvisor.dev/gvisor/pkg/urpc.(*Server).StartHandling
\tgvisor.dev/gvisor/pkg/urpc/urpc.go:451 +0x79
"""  # noqa: E501

STATE_RUNNING = """{
  "ociVersion": "1.0.2-dev",
  "id": "tgv-x1",
  "status": "running",
  "pid": 9850,
  "bundle": "/tmp/tgv-exp/b"
}"""


def test_parse_version() -> None:
    assert (
        parse_version("runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n") == "runsc-0.0~20221219.0"
    )
    assert parse_version("something else 1.2\n") == "something else 1.2"
    with pytest.raises(Unavailable):
        parse_version("")


def test_parse_state() -> None:
    assert parse_state(STATE_RUNNING) == (SandboxState.RUNNING, 9850)
    stopped = json.dumps({"id": "x", "status": "stopped", "pid": -1})
    assert parse_state(stopped) == (SandboxState.STOPPED, -1)
    assert parse_state('{"status": "created", "pid": 12}') == (SandboxState.CREATED, 12)
    assert parse_state('{"status": "paused", "pid": 12}')[0] is SandboxState.RUNNING
    assert parse_state('{"status": "weird"}')[0] is SandboxState.STOPPED
    with pytest.raises(Internal):
        parse_state("loading container: file does not exist")


def test_parse_list() -> None:
    assert parse_list("null") == []
    assert parse_list("") == []
    assert parse_list('[{"id": "a", "pid": 1}, {"id": "b"}, {"pid": 3}]') == ["a", "b"]
    with pytest.raises(Internal):
        parse_list("ID PID STATUS")


def test_summarize_error_keeps_the_reason_and_drops_the_dumps() -> None:
    summary = summarize_error(CHECKPOINT_PANIC)
    assert summary.startswith('checkpoint failed: checkpointing container "tgv-x1"')
    assert "endpoint cannot be saved in connected state: local 169.254.17.2:80" in summary
    assert "TSOffset" not in summary
    assert "goroutine" not in summary
    assert len(summary) < 1000
    log = "counter: serving on 1 port(s), boot=abc\nrunning container: creating container: boom\n"
    assert summarize_error(log, last=True).endswith("running container: creating container: boom")
    assert summarize_error("") == "no error output"


def test_runtime_record_and_check_image(tmp_path: Path) -> None:
    opts = RunscOptions(root="/tmp/r")
    image = tmp_path / "img"
    with pytest.raises(NotFound):
        check_image(str(image), "runsc-1")
    image.mkdir()
    with pytest.raises(NotFound):
        check_image(str(image), "runsc-1")
    (image / IMAGE_FILE).write_bytes(b"x" * 760)
    with pytest.raises(Internal, match="incomplete"):
        check_image(str(image), "runsc-1")  # what a failed checkpoint leaves
    (image / RUNTIME_FILE).write_text(runtime_record("ate-u", "runsc-1", opts, 760))
    check_image(str(image), "runsc-1")
    record = json.loads((image / RUNTIME_FILE).read_text())
    assert record["runtime_version"] == "runsc-1"
    assert record["platform"] == "ptrace"
    with pytest.raises(FailedPrecondition, match="runsc-1"):
        check_image(str(image), "runsc-2")
    (image / IMAGE_FILE).write_bytes(b"x" * 10)
    with pytest.raises(Internal, match="10 bytes"):
        check_image(str(image), "runsc-1")
    (image / RUNTIME_FILE).write_text("{")
    with pytest.raises(Internal, match="corrupt"):
        check_image(str(image), "runsc-1")


# --- procfs -------------------------------------------------------------------------------


def test_parse_stat_with_a_hostile_comm() -> None:
    fields = ["S", "1", *["0"] * 9, "7", "5", *["0"] * 6, "123456", "0"]
    st = procfs.parse_stat("42 (a) b (c) " + " ".join(fields))
    assert st.pid == 42
    assert st.comm == "a) b (c"
    assert st.state == "S"
    assert st.ppid == 1
    assert st.cpu_ticks == 12
    assert st.start_ticks == 123456
    assert not st.gone
    assert procfs.parse_stat("7 (x) Z " + " ".join(fields[1:])).gone
    with pytest.raises(ValueError, match="malformed"):
        procfs.parse_stat("garbage")


def test_read_stat_of_this_process() -> None:
    st = procfs.read_stat(os.getpid())
    assert st is not None
    assert st.pid == os.getpid()
    assert procfs.alive(os.getpid(), st.start_ticks)
    assert not procfs.alive(os.getpid(), st.start_ticks + 1), "another process with that pid"
    assert not procfs.alive(0, 0)
    assert procfs.read_stat(2**22 + 12345) is None


def test_parse_status_and_children() -> None:
    status = "Name:\tx\nVmRSS:\t   27604 kB\nRssAnon:\t    5588 kB\n"
    assert procfs.parse_status_kib(status, "VmRSS") == 27604
    assert procfs.parse_status_kib(status, "RssAnon") == 5588
    assert procfs.parse_status_kib(status, "RssShmem") is None
    assert procfs.parse_children("9871 9887 \n") == [9871, 9887]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["runsc-sandbox", "--root=/w/runsc", "boot", "x"], True),
        (["/usr/bin/runsc", "--root", "/w/runsc", "delete", "x"], True),
        (["runsc-gofer", "--root=/w/runsc/", "gofer"], True),
        (["unshare", "-m", "sh", "-c", "...", "sh", "runsc", "--root", "/w/runsc", "run"], True),
        (["runsc", "--root", "/w/runsc2", "run"], False),
        (["runsc", "--root=/w/runsc/x", "run"], False),
        (["python", "--root", "/w/runsc"], False),
        (["runsc", "--root"], False),
    ],
)
def test_argv_mentions_root(argv: list[str], expected: bool) -> None:
    assert procfs.argv_mentions_root(argv, "/w/runsc/") is expected


def test_descendants_of_this_process() -> None:
    assert os.getpid() not in procfs.descendants(os.getpid())


# --- the runtime without runsc -------------------------------------------------------------


def test_runtime_satisfies_the_port() -> None:
    runtime: SandboxRuntime = RunscRuntime(RunscOptions(root="/tmp/tgv-unused"))
    assert runtime is not None


def spec(tmp_path: Path, **changes: str) -> SandboxSpec:
    fields = {
        "sandbox_id": "ate-u1",
        "bundle_dir": str(tmp_path / "bundle"),
        "netns_path": str(tmp_path / "no-such-netns"),
        "args": ("/bin/counter",),
    }
    fields.update(changes)
    return SandboxSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_missing_binary_is_unavailable(tmp_path: Path) -> None:
    options = RunscOptions(root=str(tmp_path / "root"), binary="/nonexistent/runsc")
    with pytest.raises(Unavailable, match="not found"):
        async with RunscRuntime(options):
            pass
    runtime = RunscRuntime(options)
    with pytest.raises(Unavailable, match=RUNTIME_CLOSED_MESSAGE):
        await runtime.state("ate-u1")
    with pytest.raises(Unavailable):
        await runtime.runtime_version()
    await runtime.terminate("ate-u1")  # closed: nothing to do


@pytest.mark.anyio
async def test_a_spec_the_host_cannot_run_is_invalid(tmp_path: Path) -> None:
    """Checked before runsc is ever called, so a fake runsc binary will do."""
    fake = tmp_path / "runsc"
    fake.write_text("#!/bin/sh\necho 'runsc version 0.0~test'\n")
    fake.chmod(0o755)
    options = RunscOptions(root=str(tmp_path / "root"), binary=str(fake))
    async with RunscRuntime(options, subreaper=False) as runtime:
        assert await runtime.runtime_version() == "runsc-0.0~test"
        with pytest.raises(InvalidArgument, match="does not exist"):
            await runtime.run(spec(tmp_path))
        netns = tmp_path / "netns"
        netns.write_text("")  # stands in for /var/run/netns/<name>
        with pytest.raises(InvalidArgument, match="root filesystem"):
            await runtime.run(spec(tmp_path, netns_path=str(netns)))
        (tmp_path / "bundle" / "rootfs").mkdir(parents=True)
        with pytest.raises(InvalidArgument, match="system-info"):
            await runtime.run(
                spec(tmp_path, netns_path=str(netns), sysinfo_dir=str(tmp_path / "nope"))
            )
        with pytest.raises(NotFound):
            await runtime.state("ate-u1")  # nothing was started
        with pytest.raises(NotFound):
            await runtime.restore(spec(tmp_path, netns_path=str(netns)), str(tmp_path / "img"))
        with pytest.raises(NotFound):
            await runtime.checkpoint("ate-u1", str(tmp_path / "img"))
    assert not (tmp_path / "bundle" / "config.json").exists()


def test_the_sysinfo_dir_is_mounted_read_only_at_run_ate(tmp_path: Path) -> None:
    plain = spec(tmp_path)
    assert all(m["destination"] != SYSINFO_MOUNT for m in build_config(plain)["mounts"])
    with_info = spec(tmp_path, sysinfo_dir="/var/lib/ate/actors/u1/sysinfo")
    mounts = [m for m in build_config(with_info)["mounts"] if m["destination"] == SYSINFO_MOUNT]
    assert mounts == [
        {
            "destination": "/run/ate",
            "type": "bind",
            "source": "/var/lib/ate/actors/u1/sysinfo",
            "options": ["rbind", "ro", "nosuid", "nodev", "noexec"],
        }
    ]
    moved = with_info.relocated(netns_path="/var/run/netns/other")
    assert moved.sysinfo_dir == with_info.sysinfo_dir
    assert with_info.relocated(netns_path="/x", sysinfo_dir="/y").sysinfo_dir == "/y"
    with pytest.raises(InvalidArgument):
        spec(tmp_path, sysinfo_dir="relative/dir")
