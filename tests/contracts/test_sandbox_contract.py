"""Every SandboxRuntime case against every runtime, plus what only the fake promises.

Runtimes are listed in ``RUNTIMES`` as factories ``(tmp_path) -> MakeSandbox``; a gVisor
variant is one more entry, ``pytest.param(gvisor_factory, id="gvisor",
marks=pytest.mark.runsc)``.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from substrate.adapters.memory import FakeSandboxRuntime, ManualClock
from substrate.adapters.memory.sandbox import (
    FAKE_RUNTIME_VERSION,
    IMAGE_FILE,
    PAGES_FILE,
    make_pages,
)
from substrate.core.ids import TemplateRef
from substrate.core.model import ActorTemplate, Container, Probe, Resources
from substrate.errors import FailedPrecondition, Internal, NotFound, Unavailable
from substrate.sandbox.ports import CHECKPOINT_FAILED_MESSAGE, SandboxRuntime
from substrate.sandbox.spec import SandboxSpec, SandboxState, netns_path_for
from substrate.testing.contracts.sandbox import (
    SANDBOX_CASES,
    MakeSandbox,
    SandboxCase,
    SandboxFactory,
    abort,
    connect,
    held_connection,
    hit,
    http_get,
    start,
)
from substrate.testing.contracts.store import raises
from tests.contracts.gvisor_factory import gvisor_factory
from tests.privileges import needs_runsc

TEMPLATE = ActorTemplate(
    ref=TemplateRef("as1", "web"),
    containers=(
        Container(
            name="main",
            image="registry.local/counter:1",
            command=("/bin/counter", "--port", "80"),
            ports=(80,),
            wakeup_probe=Probe(path="/readyz", port=80),
        ),
    ),
    resources=Resources(cpu_milli=250, memory_bytes=64 << 20),
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def paper_spec(tmp_path: Path, actor_uid: str, namespace: str) -> SandboxSpec:
    """A spec whose bundle and namespace exist only on paper (the fake needs neither)."""
    return SandboxSpec.from_template(
        TEMPLATE,
        actor_uid=actor_uid,
        bundle_dir=str(tmp_path / "bundles" / namespace / actor_uid),
        netns_path=netns_path_for(namespace),
    )


def fake_factory(tmp_path: Path) -> SandboxFactory:
    @asynccontextmanager
    async def open_spec(actor_uid: str, namespace: str) -> AsyncIterator[SandboxSpec]:
        yield paper_spec(tmp_path, actor_uid, namespace)

    return SandboxFactory(
        name="fake",
        open_runtime=FakeSandboxRuntime,
        open_spec=open_spec,
        scratch_dir=str(tmp_path),
        checkpoint_fails_with_open_connections=True,
    )


RUNTIMES = [
    pytest.param(fake_factory, id="fake"),
    pytest.param(gvisor_factory, id="gvisor", marks=(needs_runsc, pytest.mark.runsc)),
]


@pytest.fixture(params=RUNTIMES)
def make_runtime(request: pytest.FixtureRequest, tmp_path: Path) -> MakeSandbox:
    factory: Callable[[Path], MakeSandbox] = request.param
    return factory(tmp_path)


@pytest.mark.anyio
@pytest.mark.parametrize("case", SANDBOX_CASES, ids=lambda case: case.__name__)
async def test_sandbox_contract(case: SandboxCase, make_runtime: MakeSandbox) -> None:
    with anyio.fail_after(60):
        await case(make_runtime)


# --- the fake's own promises ------------------------------------------------------------


def test_fake_runtime_satisfies_the_port() -> None:
    runtime: SandboxRuntime = FakeSandboxRuntime()
    assert runtime is not None


async def _raw_request(rt: FakeSandboxRuntime, spec: SandboxSpec, data: bytes) -> bytes:
    """Send ``data`` as is and read until the workload closes; then RST."""
    address = await rt.address(spec.sandbox_id)
    stream = await connect(address, 80)
    try:
        await stream.send(data)
        received = b""
        with anyio.fail_after(5):
            while True:
                try:
                    received += await stream.receive()
                except anyio.EndOfStream:
                    return received
    finally:
        await abort(stream)


@pytest.mark.anyio
async def test_fake_records_the_namespace_and_moves_ports(tmp_path: Path) -> None:
    image = str(tmp_path / "img")
    async with FakeSandboxRuntime() as rt:
        spec_a = paper_spec(tmp_path, "u1", "ns-a")
        spec_b = paper_spec(tmp_path, "u1", "ns-b")
        await start(fake_factory(tmp_path), rt, spec_a)
        assert rt.namespace(spec_a.sandbox_id) == "/var/run/netns/ns-a"
        port_a = (await rt.address(spec_a.sandbox_id)).host_port(80)
        await hit(rt, spec_a)
        info = await rt.checkpoint(spec_a.sandbox_id, image)
        assert info.files == (IMAGE_FILE, PAGES_FILE)
        assert info.runtime_version == FAKE_RUNTIME_VERSION
        await rt.restore(spec_b, image)
        assert rt.namespace(spec_b.sandbox_id) == "/var/run/netns/ns-b"
        address = await rt.address(spec_b.sandbox_id)
        assert address.host == "127.0.0.1"
        assert address.device == ""
        assert address.host_port(80) > 0
        assert (await hit(rt, spec_b)).count == 2
        assert port_a > 0
        with raises(NotFound):
            address.host_port(8080)


@pytest.mark.anyio
async def test_fake_image_holds_the_state_and_compressible_pages(tmp_path: Path) -> None:
    image = tmp_path / "img"
    tokens = iter(["feedface00000001"])
    async with FakeSandboxRuntime(token_factory=lambda: next(tokens), pages_bytes=100_000) as rt:
        spec = paper_spec(tmp_path, "u2", "ns")
        await start(fake_factory(tmp_path), rt, spec)
        for _ in range(3):
            await hit(rt, spec)
        info = await rt.checkpoint(spec.sandbox_id, str(image))
    header = json.loads((image / IMAGE_FILE).read_bytes())
    assert header["counter"] == 3
    assert header["boot"] == "feedface00000001"
    assert header["runtime_version"] == "fake-1"
    pages = (image / PAGES_FILE).read_bytes()
    assert pages == make_pages("feedface00000001", 100_000)
    assert len(set(pages)) < 40, "pages are text, so a compressor has something to do"
    assert info.size_bytes == len(pages) + (image / IMAGE_FILE).stat().st_size


@pytest.mark.anyio
async def test_fake_refuses_an_image_of_another_runtime_version(tmp_path: Path) -> None:
    image = str(tmp_path / "img")
    spec = paper_spec(tmp_path, "u3", "ns")
    async with FakeSandboxRuntime() as old:
        await start(fake_factory(tmp_path), old, spec)
        await old.checkpoint(spec.sandbox_id, image)
    async with FakeSandboxRuntime(runtime_version="fake-2") as new:
        assert await new.runtime_version() == "fake-2"
        with raises(FailedPrecondition, match="fake-1"):
            await new.restore(spec, image)
        with raises(NotFound):
            await new.state(spec.sandbox_id)


@pytest.mark.anyio
async def test_fake_rejects_corrupt_pages(tmp_path: Path) -> None:
    image = tmp_path / "img"
    spec = paper_spec(tmp_path, "u4", "ns")
    async with FakeSandboxRuntime() as rt:
        await start(fake_factory(tmp_path), rt, spec)
        await rt.checkpoint(spec.sandbox_id, str(image))
        (image / PAGES_FILE).write_bytes(b"x")
        with raises(Internal, match="do not match"):
            await rt.restore(spec, str(image))
        (image / PAGES_FILE).unlink()
        with raises(Internal, match="no pages"):
            await rt.restore(spec, str(image))
        (image / IMAGE_FILE).write_bytes(b"[]")
        with raises(Internal, match="corrupt"):
            await rt.restore(spec, str(image))
        assert await rt.state(spec.sandbox_id) is SandboxState.CHECKPOINTED


@pytest.mark.anyio
async def test_fake_failed_checkpoint_leaves_a_partial_image(tmp_path: Path) -> None:
    image = tmp_path / "img"
    spec = paper_spec(tmp_path, "u5", "ns")
    async with FakeSandboxRuntime(close_grace_seconds=0.01) as rt:
        await start(fake_factory(tmp_path), rt, spec)
        address = await rt.address(spec.sandbox_id)
        async with held_connection(address, 80):
            assert rt.open_connections(spec.sandbox_id) == 1
            with raises(Internal, match="still open"):
                await rt.checkpoint(spec.sandbox_id, str(image))
        partial = (image / IMAGE_FILE).read_bytes()
        assert 0 < len(partial) < 100
        with raises(Internal, match="incomplete or corrupt"):
            await rt.restore(spec, str(image))


@pytest.mark.anyio
async def test_fake_rst_closes_are_seen_before_the_checkpoint(tmp_path: Path) -> None:
    spec = paper_spec(tmp_path, "u6", "ns")
    async with FakeSandboxRuntime() as rt:
        await start(fake_factory(tmp_path), rt, spec)
        address = await rt.address(spec.sandbox_id)
        async with held_connection(address, 80), held_connection(address, 80):
            assert rt.open_connections(spec.sandbox_id) == 2
        # the RSTs are in flight; the checkpoint waits for them to land and succeeds
        await rt.checkpoint(spec.sandbox_id, str(tmp_path / "img"))
        assert rt.open_connections(spec.sandbox_id) == 0


@pytest.mark.anyio
async def test_fake_time_wait_blocks_a_checkpoint_until_it_expires(tmp_path: Path) -> None:
    """A workload that closes first (HTTP/1.0) leaves TIME_WAIT behind, as busybox httpd does."""
    clock = ManualClock()
    spec = paper_spec(tmp_path, "u7", "ns")
    async with FakeSandboxRuntime(clock=clock) as rt:
        await start(fake_factory(tmp_path), rt, spec)
        answer = await _raw_request(rt, spec, b"GET / HTTP/1.0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200")
        assert answer.endswith(b"count=1 boot=" + answer.rsplit(b"boot=", 1)[1])
        with raises(Internal, match="TIME_WAIT"):
            await rt.checkpoint(spec.sandbox_id, str(tmp_path / "img1"))
        assert await rt.state(spec.sandbox_id) is SandboxState.STOPPED

        await start(fake_factory(tmp_path), rt, spec)
        await _raw_request(rt, spec, b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        clock.advance(59)
        with raises(Internal, match="TIME_WAIT"):
            await rt.checkpoint(spec.sandbox_id, str(tmp_path / "img2"))

        await start(fake_factory(tmp_path), rt, spec)
        await _raw_request(rt, spec, b"GET / HTTP/1.0\r\n\r\n")
        clock.advance(60.5)
        await rt.checkpoint(spec.sandbox_id, str(tmp_path / "img3"))
        assert await rt.state(spec.sandbox_id) is SandboxState.CHECKPOINTED


@pytest.mark.anyio
async def test_fake_client_fin_first_leaves_no_time_wait(tmp_path: Path) -> None:
    spec = paper_spec(tmp_path, "u8", "ns")
    async with FakeSandboxRuntime() as rt:
        await start(fake_factory(tmp_path), rt, spec)
        address = await rt.address(spec.sandbox_id)
        stream = await connect(address, 80)
        await stream.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        with anyio.fail_after(5):
            assert (await stream.receive()).startswith(b"HTTP/1.1 200")
        await stream.aclose()  # FIN from the client first: the workload closes passively
        await rt.checkpoint(spec.sandbox_id, str(tmp_path / "img"))


@pytest.mark.anyio
async def test_fake_answers_errors(tmp_path: Path) -> None:
    clock = ManualClock()
    spec = paper_spec(tmp_path, "u9", "ns")
    async with FakeSandboxRuntime(clock=clock) as rt:
        await start(fake_factory(tmp_path), rt, spec)
        address = await rt.address(spec.sandbox_id)
        assert (await http_get(address, 80, "/missing")).status == 404
        assert (await http_get(address, 80, "/readyz")).body == b"ok"
        post = await _raw_request(
            rt,
            spec,
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi",
        )
        assert post.startswith(b"HTTP/1.1 405")
        garbage = await _raw_request(rt, spec, b"NOT HTTP AT ALL\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400")
        # none of these counted
        assert (await hit(rt, spec)).count == 1
        stats = await rt.stats(spec.sandbox_id)
        assert stats.uptime_seconds == 0.0  # the manual clock did not move
        clock.advance(5)
        assert (await rt.stats(spec.sandbox_id)).uptime_seconds == 5.0


@pytest.mark.anyio
async def test_fake_crash_stops_the_sandbox(tmp_path: Path) -> None:
    spec = paper_spec(tmp_path, "u10", "ns")
    async with FakeSandboxRuntime() as rt:
        with raises(NotFound):
            await rt.crash(spec.sandbox_id)
        await start(fake_factory(tmp_path), rt, spec)
        await rt.crash(spec.sandbox_id)
        assert await rt.state(spec.sandbox_id) is SandboxState.STOPPED
        with raises(FailedPrecondition):
            await rt.crash(spec.sandbox_id)
        with raises(FailedPrecondition):
            await rt.checkpoint(spec.sandbox_id, str(tmp_path / "img"))
        await start(fake_factory(tmp_path), rt, spec)
        assert (await hit(rt, spec)).count == 1


@pytest.mark.anyio
async def test_fake_stops_everything_on_exit(tmp_path: Path) -> None:
    spec = paper_spec(tmp_path, "u11", "ns")
    rt = FakeSandboxRuntime()
    async with rt:
        await start(fake_factory(tmp_path), rt, spec)
        address = await rt.address(spec.sandbox_id)
    with pytest.raises(OSError, match="refused"):
        await http_get(address, 80, "/")
    with raises(Unavailable):
        await rt.state(spec.sandbox_id)
    with raises(Unavailable):
        await rt.run(spec)
    await rt.terminate(spec.sandbox_id)  # nothing runs any more: a no-op
    async with rt:  # a runtime can be opened again, empty
        with raises(NotFound):
            await rt.state(spec.sandbox_id)


@pytest.mark.anyio
async def test_fake_terminate_while_a_client_is_connected(tmp_path: Path) -> None:
    spec = paper_spec(tmp_path, "u12", "ns")
    async with FakeSandboxRuntime() as rt:
        await start(fake_factory(tmp_path), rt, spec)
        address = await rt.address(spec.sandbox_id)
        stream = await connect(address, 80)
        try:
            await rt.terminate(spec.sandbox_id)
            with anyio.fail_after(5), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                await stream.receive()
        finally:
            await abort(stream)
        assert rt.open_connections(spec.sandbox_id) == 0


@pytest.mark.anyio
async def test_fake_sandboxes_on_several_ports(tmp_path: Path) -> None:
    spec = SandboxSpec(
        sandbox_id="ate-multi",
        bundle_dir=str(tmp_path / "b"),
        netns_path="/var/run/netns/multi",
        args=("/bin/app",),
        ports=(80, 8080),
    )
    async with FakeSandboxRuntime() as rt:
        await rt.run(spec)
        address = await rt.address(spec.sandbox_id)
        assert {inner for inner, _ in address.ports} == {80, 8080}
        assert address.host_port(80) != address.host_port(8080)
        a = await http_get(address, 80, "/")
        b = await http_get(address, 8080, "/")
        assert a.body.startswith(b"count=1 ")
        assert b.body.startswith(b"count=2 "), "one workload, one memory, two ports"


@pytest.mark.anyio
async def test_fake_failing_to_start_is_internal(tmp_path: Path) -> None:
    spec = paper_spec(tmp_path, "u13", "ns")
    # 192.0.2.1 (TEST-NET-1) is not an address of this machine: binding to it fails.
    async with FakeSandboxRuntime(listen_host="192.0.2.1") as rt:
        with raises(Internal, match="failed to start"):
            await rt.run(spec)
        assert await rt.state(spec.sandbox_id) is SandboxState.STOPPED
    async with FakeSandboxRuntime(listen_host="127.0.0.2") as rt:
        await start(fake_factory(tmp_path), rt, spec)
        assert (await rt.address(spec.sandbox_id)).host == "127.0.0.2"


def test_linger_option_is_what_abort_sets() -> None:
    # abort() relies on SO_LINGER {on, 0 s}; check the packing matches the kernel's struct.
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        assert struct.unpack("ii", sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8)) == (
            1,
            0,
        )


def test_checkpoint_failure_message_is_truthful() -> None:
    assert "the sandbox is gone" in CHECKPOINT_FAILED_MESSAGE
