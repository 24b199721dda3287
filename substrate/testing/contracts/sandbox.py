"""The SandboxRuntime conformance suite: every case runs unchanged against every runtime.

The cases drive a runtime through :class:`substrate.sandbox.ports.SandboxRuntime` and
talk to the workload over real TCP, so the workload of a runtime under test must speak
this small protocol (the fake runtime's built-in server does; a gVisor harness builds a
bundle that does):

* ``GET /`` adds one to a counter held in the sandbox's memory and answers
  ``count=<n> boot=<token>``; nothing else changes the counter, a cold boot starts it
  at 0 (the first answer is ``count=1``) and picks a new random token;
* the wakeup probe of the spec (``GET /readyz`` if the spec declares none) answers 200
  once the workload serves.

Every client connection of the suite closes with RST (``SO_LINGER {1, 0}``) before the
workload can close it, which is what a worker must do too: runsc cannot checkpoint a
sandbox while a connection is open or in TIME_WAIT, and a failed checkpoint kills it.

Run the suite with, e.g.::

    @pytest.mark.parametrize("case", SANDBOX_CASES, ids=lambda c: c.__name__)
    async def test_sandbox_contract(case, make_runtime):
        await case(make_runtime)
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Final, Protocol

import anyio
import anyio.lowlevel
import attrs
import h11
from anyio.abc import SocketAttribute, SocketStream

from substrate.core.model import Probe
from substrate.errors import (
    FailedPrecondition,
    Internal,
    NotFound,
    SubstrateError,
)
from substrate.sandbox.ports import CHECKPOINT_FAILED_MESSAGE, SandboxRuntime
from substrate.sandbox.spec import (
    SandboxAddress,
    SandboxSpec,
    SandboxState,
    sandbox_id_for,
)
from substrate.testing.contracts.store import raises

READY_TIMEOUT: Final = 15.0
"""Seconds a case waits for a workload to answer its wakeup probe."""
REQUEST_TIMEOUT: Final = 5.0
"""Seconds one HTTP request may take."""
DEFAULT_READY_PATH: Final = "/readyz"

_COUNT_RE: Final = re.compile(rb"count=(\d+) boot=(\S+)")
_GONE: Final = (
    OSError,
    TimeoutError,
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    h11.RemoteProtocolError,
)
"""What a request to a workload that is not (or no longer) serving may raise."""


class MakeSandbox(Protocol):
    """What a case gets: fresh runtimes ("workers"), specs, image directories.

    ``runtime()`` opens a new runtime, as a new worker would have; two open at once are
    two workers of one machine. ``spec(actor_uid, namespace=...)`` prepares what a
    worker prepares for a run or restore — the bundle and the network namespace — and
    yields the spec; specs with one ``actor_uid`` share the sandbox id.
    ``prepare(spec)`` is called right before every run or restore into ``spec`` (a real
    network puts the namespace's address and route back there, because runsc strips
    them). ``image_dir(name)`` is a fresh path for a checkpoint image.
    ``checkpoint_fails_with_open_connections`` says whether the runtime has runsc's
    limitation (True for runsc and for the fake, which copies it).
    """

    @property
    def name(self) -> str: ...

    @property
    def checkpoint_fails_with_open_connections(self) -> bool: ...

    def runtime(self) -> AbstractAsyncContextManager[SandboxRuntime]: ...

    def spec(self, actor_uid: str, *, namespace: str) -> AbstractAsyncContextManager[SandboxSpec]:
        """A spec for ``actor_uid``'s sandbox in the namespace called ``namespace``."""
        ...

    async def prepare(self, spec: SandboxSpec) -> None: ...

    def image_dir(self, name: str) -> str: ...


SandboxCase = Callable[[MakeSandbox], Awaitable[None]]


async def _nothing_to_prepare(_spec: SandboxSpec) -> None:
    await anyio.lowlevel.checkpoint()


@attrs.frozen(slots=True, kw_only=True)
class SandboxFactory:
    """A ready-made :class:`MakeSandbox` from openers (one per runtime under test)."""

    name: str
    open_runtime: Callable[[], AbstractAsyncContextManager[SandboxRuntime]]
    open_spec: Callable[[str, str], AbstractAsyncContextManager[SandboxSpec]]
    """``open_spec(actor_uid, namespace)``."""
    scratch_dir: str
    """A directory the cases may write image directories into."""
    prepare_by: Callable[[SandboxSpec], Awaitable[None]] = _nothing_to_prepare
    checkpoint_fails_with_open_connections: bool = True

    def runtime(self) -> AbstractAsyncContextManager[SandboxRuntime]:
        return self.open_runtime()

    def spec(self, actor_uid: str, *, namespace: str) -> AbstractAsyncContextManager[SandboxSpec]:
        return self.open_spec(actor_uid, namespace)

    async def prepare(self, spec: SandboxSpec) -> None:
        await self.prepare_by(spec)

    def image_dir(self, name: str) -> str:
        return os.path.join(self.scratch_dir, "images", name)


# --- talking to a workload ------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class HttpAnswer:
    status: int
    body: bytes


@attrs.frozen(slots=True, kw_only=True)
class Count:
    """What ``GET /`` answered."""

    count: int
    boot: str


async def connect(address: SandboxAddress, port: int) -> SocketStream:
    """A TCP connection to ``port`` of the sandbox at ``address`` (bound to its device)."""
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if address.device:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, address.device.encode())
        sock.setblocking(False)
        err = sock.connect_ex((address.host, address.host_port(port)))
        if err == errno.EINPROGRESS:
            await anyio.wait_writable(sock)
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise OSError(err, os.strerror(err))
        return await SocketStream.from_socket(sock)
    except BaseException:
        sock.close()
        raise


async def abort(stream: SocketStream) -> None:
    """Close ``stream`` with RST (``SO_LINGER {1, 0}``): no TIME_WAIT on either side."""
    raw = stream.extra(SocketAttribute.raw_socket)
    with contextlib.suppress(OSError):  # already closed
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await stream.aclose()


async def _exchange(stream: SocketStream, host: str, path: str) -> HttpAnswer:
    """One keep-alive HTTP/1.1 GET on ``stream``; the connection stays open."""
    conn = h11.Connection(h11.CLIENT)
    request = h11.Request(
        method="GET", target=path, headers=[("host", host), ("user-agent", "substrate-contract")]
    )
    await stream.send((conn.send(request) or b"") + (conn.send(h11.EndOfMessage()) or b""))
    status = 0
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive()
            except anyio.EndOfStream:
                data = b""
            conn.receive_data(data)
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return HttpAnswer(status=status, body=bytes(body))
        elif isinstance(event, h11.ConnectionClosed):
            raise anyio.EndOfStream


async def http_get(address: SandboxAddress, port: int, path: str) -> HttpAnswer:
    """GET ``path`` from ``port`` of the sandbox, then close with RST."""
    with anyio.fail_after(REQUEST_TIMEOUT):
        stream = await connect(address, port)
        try:
            return await _exchange(stream, address.host, path)
        finally:
            with anyio.CancelScope(shield=True):
                await abort(stream)


@asynccontextmanager
async def held_connection(
    address: SandboxAddress, port: int, path: str = "/"
) -> AsyncIterator[HttpAnswer]:
    """A connection that answered one GET and stays open until the block ends (then RST)."""
    with anyio.fail_after(REQUEST_TIMEOUT):
        stream = await connect(address, port)
    try:
        with anyio.fail_after(REQUEST_TIMEOUT):
            answer = await _exchange(stream, address.host, path)
        yield answer
    finally:
        with anyio.CancelScope(shield=True):
            await abort(stream)


def probe_of(spec: SandboxSpec) -> Probe:
    """The spec's wakeup probe, or ``GET /readyz`` on its first port."""
    if spec.wakeup_probe is not None:
        return spec.wakeup_probe
    return Probe(path=DEFAULT_READY_PATH, port=spec.ports[0] if spec.ports else 80)


async def wait_ready(runtime: SandboxRuntime, spec: SandboxSpec) -> SandboxAddress:
    """Poll the wakeup probe until it answers 200; the address it answered at."""
    probe = probe_of(spec)
    last: BaseException | None = None
    with anyio.move_on_after(READY_TIMEOUT):
        while True:
            address = await runtime.address(spec.sandbox_id)
            try:
                answer = await http_get(address, probe.port, probe.path)
            except _GONE as exc:
                last = exc
            else:
                if answer.status == 200:
                    return address
                last = AssertionError(f"probe answered {answer.status}")
            await anyio.sleep(0.02)
    raise AssertionError(f"sandbox {spec.sandbox_id} never became ready: {last!r}")


async def hit(runtime: SandboxRuntime, spec: SandboxSpec) -> Count:
    """``GET /`` once: the counter after this request and the boot token."""
    address = await runtime.address(spec.sandbox_id)
    answer = await http_get(address, spec.ports[0], "/")
    assert answer.status == 200, answer
    match = _COUNT_RE.search(answer.body)
    assert match is not None, f"unexpected answer {answer.body!r}"
    return Count(count=int(match.group(1)), boot=match.group(2).decode())


async def start(make: MakeSandbox, runtime: SandboxRuntime, spec: SandboxSpec) -> None:
    """Run ``spec`` the way a worker does (prepare, run, wait for the probe)."""
    await make.prepare(spec)
    await runtime.run(spec)
    await wait_ready(runtime, spec)


async def resume(
    make: MakeSandbox, runtime: SandboxRuntime, spec: SandboxSpec, image_dir: str
) -> None:
    """Restore ``spec`` from ``image_dir`` the way a worker does."""
    await make.prepare(spec)
    await runtime.restore(spec, image_dir)
    await wait_ready(runtime, spec)


async def assert_gone(runtime: SandboxRuntime, sandbox_id: str) -> None:
    """The runtime no longer knows ``sandbox_id``."""
    with raises(NotFound):
        await runtime.state(sandbox_id)


# --- the cases ------------------------------------------------------------------------


async def case_run_answers_http_and_counts(make: MakeSandbox) -> None:
    async with make.runtime() as rt, make.spec("run-1", namespace="ns-a") as spec:
        await start(make, rt, spec)
        assert await rt.state(spec.sandbox_id) is SandboxState.RUNNING
        first = await hit(rt, spec)
        second = await hit(rt, spec)
        assert first.count == 1, "a cold boot starts counting at 1"
        assert second.count == 2
        assert second.boot == first.boot
        assert first.boot
        await rt.terminate(spec.sandbox_id)


async def case_spec_sandbox_id_is_derived_from_the_actor(make: MakeSandbox) -> None:
    async with make.spec("uid-7", namespace="ns-a") as spec:
        assert spec.sandbox_id == sandbox_id_for("uid-7")


async def _run_and_checkpoint(
    make: MakeSandbox, rt: SandboxRuntime, spec: SandboxSpec, image: str
) -> Count:
    """Run, count twice, checkpoint; the last count before the checkpoint."""
    await start(make, rt, spec)
    await hit(rt, spec)
    last = await hit(rt, spec)
    info = await rt.checkpoint(spec.sandbox_id, image)
    assert info.sandbox_id == spec.sandbox_id
    assert await anyio.Path(info.directory).samefile(image)
    assert info.files
    assert info.size_bytes > 0
    assert info.runtime_version == await rt.runtime_version()
    size = 0
    for name in info.files:
        path = anyio.Path(image, name)
        assert await path.is_file(), name
        size += (await path.stat()).st_size
    assert size == info.size_bytes
    assert await rt.state(spec.sandbox_id) in (SandboxState.CHECKPOINTED, SandboxState.STOPPED)
    return last


async def case_checkpoint_restore_on_another_worker(make: MakeSandbox) -> None:
    image = make.image_dir("other-worker")
    async with make.spec("mover", namespace="ns-a") as spec_a:
        async with make.runtime() as worker_a:
            before = await _run_and_checkpoint(make, worker_a, spec_a, image)
            await worker_a.terminate(spec_a.sandbox_id)
        async with make.runtime() as worker_b, make.spec("mover", namespace="ns-b") as spec_b:
            assert spec_b.sandbox_id == spec_a.sandbox_id
            assert spec_b.netns_path != spec_a.netns_path
            await resume(make, worker_b, spec_b, image)
            assert await worker_b.state(spec_b.sandbox_id) is SandboxState.RUNNING
            after = await hit(worker_b, spec_b)
            assert after.boot == before.boot, "restored memory must carry the boot token"
            assert after.count == before.count + 1, "the in-memory counter must continue"
            await worker_b.terminate(spec_b.sandbox_id)


async def case_checkpoint_restore_same_worker_same_namespace(make: MakeSandbox) -> None:
    image = make.image_dir("same-ns")
    async with make.runtime() as rt, make.spec("stay", namespace="ns-a") as spec:
        before = await _run_and_checkpoint(make, rt, spec, image)
        await resume(make, rt, spec, image)
        after = await hit(rt, spec)
        assert after.boot == before.boot
        assert after.count == before.count + 1
        await rt.terminate(spec.sandbox_id)


async def case_checkpoint_restore_same_worker_other_namespace(make: MakeSandbox) -> None:
    image = make.image_dir("other-ns")
    async with (
        make.runtime() as rt,
        make.spec("hop", namespace="ns-a") as spec_a,
        make.spec("hop", namespace="ns-b") as spec_b,
    ):
        before = await _run_and_checkpoint(make, rt, spec_a, image)
        await resume(make, rt, spec_b, image)
        after = await hit(rt, spec_b)
        assert after.boot == before.boot
        assert after.count == before.count + 1
        await rt.terminate(spec_b.sandbox_id)


async def case_image_can_be_restored_twice(make: MakeSandbox) -> None:
    image = make.image_dir("twice")
    async with make.runtime() as rt, make.spec("twice", namespace="ns-a") as spec:
        before = await _run_and_checkpoint(make, rt, spec, image)
        await resume(make, rt, spec, image)
        first = await hit(rt, spec)
        await rt.terminate(spec.sandbox_id)
        await resume(make, rt, spec, image)
        second = await hit(rt, spec)
        assert first.boot == second.boot == before.boot
        assert first.count == second.count == before.count + 1, "an image is never changed"
        await rt.terminate(spec.sandbox_id)


async def case_checkpoint_and_restore_chain(make: MakeSandbox) -> None:
    """A restored sandbox checkpoints again, and the counter keeps climbing."""
    async with make.runtime() as rt, make.spec("chain", namespace="ns-a") as spec:
        last = await _run_and_checkpoint(make, rt, spec, make.image_dir("chain-1"))
        for generation in (2, 3):
            image = make.image_dir(f"chain-{generation}")
            await resume(make, rt, spec, make.image_dir(f"chain-{generation - 1}"))
            now = await hit(rt, spec)
            assert now.boot == last.boot
            assert now.count == last.count + 1
            last = now
            await rt.checkpoint(spec.sandbox_id, image)
        await rt.terminate(spec.sandbox_id)


async def case_run_after_checkpoint_cold_boots(make: MakeSandbox) -> None:
    image = make.image_dir("cold-again")
    async with make.runtime() as rt, make.spec("cold", namespace="ns-a") as spec:
        before = await _run_and_checkpoint(make, rt, spec, image)
        await start(make, rt, spec)
        after = await hit(rt, spec)
        assert after.boot != before.boot, "a run is a cold boot, with a new boot token"
        assert after.count == 1
        await rt.terminate(spec.sandbox_id)


async def case_terminate_is_idempotent(make: MakeSandbox) -> None:
    async with make.runtime() as rt, make.spec("term", namespace="ns-a") as spec:
        await rt.terminate(spec.sandbox_id)  # never started: nothing to do
        await start(make, rt, spec)
        address = await rt.address(spec.sandbox_id)
        await rt.terminate(spec.sandbox_id)
        await assert_gone(rt, spec.sandbox_id)
        await rt.terminate(spec.sandbox_id)
        await assert_gone(rt, spec.sandbox_id)
        port = spec.ports[0]
        try:
            answer = await http_get(address, port, "/")
        except _GONE:
            pass
        else:
            raise AssertionError(f"a terminated sandbox still answered: {answer!r}")


async def case_terminate_after_checkpoint_keeps_the_image(make: MakeSandbox) -> None:
    image = make.image_dir("term-ckpt")
    async with make.runtime() as rt, make.spec("term-ckpt", namespace="ns-a") as spec:
        before = await _run_and_checkpoint(make, rt, spec, image)
        await rt.terminate(spec.sandbox_id)
        await assert_gone(rt, spec.sandbox_id)
        await rt.terminate(spec.sandbox_id)
        await resume(make, rt, spec, image)
        assert (await hit(rt, spec)).boot == before.boot
        await rt.terminate(spec.sandbox_id)


async def case_unknown_sandbox_not_found(make: MakeSandbox) -> None:
    async with make.runtime() as rt, make.spec("ghost", namespace="ns-a") as spec:
        sid = spec.sandbox_id
        await assert_gone(rt, sid)
        with raises(NotFound):
            await rt.checkpoint(sid, make.image_dir("ghost"))
        with raises(NotFound):
            await rt.stats(sid)
        with raises(NotFound):
            await rt.address(sid)
        ghost = anyio.Path(make.image_dir("ghost"))
        if await ghost.is_dir():
            assert [p async for p in ghost.iterdir()] == [], "nothing was checkpointed"


async def case_checkpoint_of_a_checkpointed_sandbox_fails(make: MakeSandbox) -> None:
    image = make.image_dir("double")
    async with make.runtime() as rt, make.spec("double", namespace="ns-a") as spec:
        await _run_and_checkpoint(make, rt, spec, image)
        with raises(FailedPrecondition):
            await rt.checkpoint(spec.sandbox_id, make.image_dir("double-2"))
        with raises(FailedPrecondition):
            await rt.stats(spec.sandbox_id)
        with raises(FailedPrecondition):
            await rt.address(spec.sandbox_id)
        await rt.terminate(spec.sandbox_id)
        with raises(NotFound):
            await rt.checkpoint(spec.sandbox_id, make.image_dir("double-3"))


async def case_run_or_restore_over_a_running_sandbox_fails(make: MakeSandbox) -> None:
    image = make.image_dir("over")
    async with (
        make.runtime() as rt,
        make.spec("over", namespace="ns-a") as spec,
        make.spec("over", namespace="ns-b") as elsewhere,
    ):
        before = await _run_and_checkpoint(make, rt, spec, image)
        await resume(make, rt, spec, image)
        with raises(FailedPrecondition):
            await rt.restore(elsewhere, image)
        with raises(FailedPrecondition):
            await rt.run(elsewhere)
        with raises(FailedPrecondition):
            await rt.run(spec)
        # the running sandbox was not disturbed
        assert await rt.state(spec.sandbox_id) is SandboxState.RUNNING
        now = await hit(rt, spec)
        assert now.boot == before.boot
        assert now.count == before.count + 1
        await rt.terminate(spec.sandbox_id)


async def case_restore_without_an_image_not_found(make: MakeSandbox) -> None:
    async with make.runtime() as rt, make.spec("no-image", namespace="ns-a") as spec:
        await make.prepare(spec)
        with raises(NotFound):
            await rt.restore(spec, make.image_dir("never-written"))
        empty = make.image_dir("empty")
        await anyio.Path(empty).mkdir(parents=True)
        with raises(NotFound):
            await rt.restore(spec, empty)
        state: SandboxState | None
        try:
            state = await rt.state(spec.sandbox_id)
        except NotFound:
            state = None
        assert state is not SandboxState.RUNNING


async def case_checkpoint_with_an_open_connection(make: MakeSandbox) -> None:
    """runsc's limitation: an open connection fails the checkpoint and kills the sandbox."""
    image = make.image_dir("held")
    async with make.runtime() as rt, make.spec("held", namespace="ns-a") as spec:
        await start(make, rt, spec)
        address = await rt.address(spec.sandbox_id)
        async with held_connection(address, spec.ports[0]) as answer:
            assert answer.status == 200
            if make.checkpoint_fails_with_open_connections:
                with raises(Internal, match=CHECKPOINT_FAILED_MESSAGE):
                    await rt.checkpoint(spec.sandbox_id, image)
            else:
                await rt.checkpoint(spec.sandbox_id, image)
        if not make.checkpoint_fails_with_open_connections:
            await rt.terminate(spec.sandbox_id)
            return
        # the sandbox is gone: truthfully STOPPED, not running, not reachable
        assert await rt.state(spec.sandbox_id) is SandboxState.STOPPED
        with raises(FailedPrecondition):
            await rt.address(spec.sandbox_id)
        with raises(FailedPrecondition):
            await rt.checkpoint(spec.sandbox_id, make.image_dir("held-again"))
        # what the failed checkpoint left behind cannot be restored
        with raises(SubstrateError):
            await rt.restore(spec, image)
        state: SandboxState | None
        try:
            state = await rt.state(spec.sandbox_id)
        except NotFound:
            state = None
        assert state is not SandboxState.RUNNING
        # a cold boot over the remains works
        await start(make, rt, spec)
        assert (await hit(rt, spec)).count == 1
        await rt.terminate(spec.sandbox_id)


async def case_checkpoint_right_after_traffic_closed_with_rst(make: MakeSandbox) -> None:
    """Connections closed with RST never block a checkpoint, however recent."""
    image = make.image_dir("busy")
    async with make.runtime() as rt, make.spec("busy", namespace="ns-a") as spec:
        await start(make, rt, spec)
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(hit, rt, spec)
        last = await hit(rt, spec)
        assert last.count == 9
        await rt.checkpoint(spec.sandbox_id, image)
        await resume(make, rt, spec, image)
        assert (await hit(rt, spec)).count == last.count + 1
        await rt.terminate(spec.sandbox_id)


async def case_stats_are_sane(make: MakeSandbox) -> None:
    async with make.runtime() as rt, make.spec("stats", namespace="ns-a") as spec:
        await start(make, rt, spec)
        await hit(rt, spec)
        first = await rt.stats(spec.sandbox_id)
        assert first.memory_bytes > 0
        assert first.cpu_seconds >= 0.0
        assert first.uptime_seconds >= 0.0
        await anyio.sleep(0.05)
        second = await rt.stats(spec.sandbox_id)
        assert second.uptime_seconds >= first.uptime_seconds
        assert second.cpu_seconds >= first.cpu_seconds
        await rt.terminate(spec.sandbox_id)
        with raises(NotFound):
            await rt.stats(spec.sandbox_id)


async def case_sandboxes_are_independent(make: MakeSandbox) -> None:
    """Two actors on one worker: separate memory; checkpointing one leaves the other."""
    image = make.image_dir("pair")
    async with (
        make.runtime() as rt,
        make.spec("left", namespace="ns-l") as left,
        make.spec("right", namespace="ns-r") as right,
    ):
        assert left.sandbox_id != right.sandbox_id
        await start(make, rt, left)
        await start(make, rt, right)
        for _ in range(3):
            await hit(rt, left)
        r1 = await hit(rt, right)
        l4 = await hit(rt, left)
        assert l4.count == r1.count + 3
        assert l4.boot != r1.boot
        await rt.checkpoint(left.sandbox_id, image)
        assert await rt.state(right.sandbox_id) is SandboxState.RUNNING
        assert (await hit(rt, right)).count == r1.count + 1
        await rt.terminate(left.sandbox_id)
        await rt.terminate(right.sandbox_id)


async def case_runtime_version_is_stable(make: MakeSandbox) -> None:
    async with make.runtime() as a, make.runtime() as b:
        version = await a.runtime_version()
        assert version
        assert await a.runtime_version() == version
        assert await b.runtime_version() == version


SANDBOX_CASES: Final[tuple[SandboxCase, ...]] = (
    case_run_answers_http_and_counts,
    case_spec_sandbox_id_is_derived_from_the_actor,
    case_checkpoint_restore_on_another_worker,
    case_checkpoint_restore_same_worker_same_namespace,
    case_checkpoint_restore_same_worker_other_namespace,
    case_image_can_be_restored_twice,
    case_checkpoint_and_restore_chain,
    case_run_after_checkpoint_cold_boots,
    case_terminate_is_idempotent,
    case_terminate_after_checkpoint_keeps_the_image,
    case_unknown_sandbox_not_found,
    case_checkpoint_of_a_checkpointed_sandbox_fails,
    case_run_or_restore_over_a_running_sandbox_fails,
    case_restore_without_an_image_not_found,
    case_checkpoint_with_an_open_connection,
    case_checkpoint_right_after_traffic_closed_with_rst,
    case_stats_are_sane,
    case_sandboxes_are_independent,
    case_runtime_version_is_stable,
)
"""Every case of the suite, in a stable order."""


__all__ = [
    "SANDBOX_CASES",
    "Count",
    "HttpAnswer",
    "MakeSandbox",
    "SandboxCase",
    "SandboxFactory",
    "abort",
    "connect",
    "held_connection",
    "hit",
    "http_get",
    "probe_of",
    "resume",
    "start",
    "wait_ready",
]
