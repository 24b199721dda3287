"""An in-process :class:`~substrate.sandbox.ports.SandboxRuntime` for tests and the simulator.

Each sandbox is a real, small HTTP/1.1 server (anyio TCP listeners on 127.0.0.1,
ephemeral ports, parsed with h11) running in the runtime's own task group:

* ``GET /`` increments the workload's in-memory counter and answers
  ``count=<n> boot=<boot-token>``;
* ``GET /readyz`` answers 200.

The workload's memory — the counter, the boot token and a block of "pages" — survives
checkpoint and restore: checkpoint writes it to ``checkpoint.img`` (JSON) and
``pages.img`` (compressible bytes) and stops the server; restore reads them back and
starts a new server, possibly on other ports, with the same counter and boot token.

Like runsc on these machines, a checkpoint **fails and kills the sandbox** if any client
connection to the workload is still open, or if the workload closed a connection first
within the last ``time_wait_seconds`` (its side of the socket would be in TIME_WAIT).
It then leaves a partial ``checkpoint.img`` that cannot be restored. Clients that close
with RST (``SO_LINGER {1, 0}``) before the workload closes never block a checkpoint.

The fake ignores the bundle, the namespace and the limits of the spec: it runs no
process. It records the namespace path, so a test can see where a restore went.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import secrets
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import anyio
import anyio.lowlevel
import attrs
import h11
from anyio.abc import SocketAttribute, SocketListener, SocketStream, TaskGroup, TaskStatus

from substrate.errors import FailedPrecondition, Internal, NotFound, Unavailable
from substrate.sandbox.lifecycle import SandboxOp, check_op
from substrate.sandbox.ports import CHECKPOINT_FAILED_MESSAGE, RUNTIME_CLOSED_MESSAGE
from substrate.sandbox.spec import (
    CheckpointInfo,
    SandboxAddress,
    SandboxSpec,
    SandboxState,
    SandboxStats,
)

FAKE_RUNTIME_VERSION: Final = "fake-1"
IMAGE_FILE: Final = "checkpoint.img"
"""The image header: the workload's state as JSON (the file runsc writes, too)."""
PAGES_FILE: Final = "pages.img"
"""The workload's memory pages."""
IMAGE_FORMAT: Final = "substrate-fake-sandbox/1"
DEFAULT_PAGES_BYTES: Final = 256 * 1024
TIME_WAIT_SECONDS: Final = 60.0
"""How long a connection the workload closed first blocks a checkpoint (Linux TIME_WAIT)."""
CLOSE_GRACE_SECONDS: Final = 0.25
"""How long a checkpoint waits for connection resets that are on their way to land."""
STATE_BYTES: Final = 4096
"""What the fake counts for the workload's state besides its pages (one page)."""
LISTEN_HOST: Final = "127.0.0.1"
_RECEIVE_SIZE: Final = 65536


def _token() -> str:
    return secrets.token_hex(8)


def make_pages(boot: str, size: int) -> bytes:
    """The fake workload's memory pages: ``size`` compressible bytes derived from ``boot``."""
    line = f"fake sandbox memory page; boot={boot}\n".encode()
    return (line * (size // len(line) + 1))[:size]


@attrs.define(eq=False)
class _Memory:
    """What the workload holds in memory, and what an image carries."""

    counter: int
    boot: str
    pages: bytes


@attrs.define(eq=False)
class _Sandbox:
    spec: SandboxSpec
    memory: _Memory
    state: SandboxState = SandboxState.CREATED
    started_at: float = 0.0
    cpu_seconds: float = 0.0
    ports: tuple[tuple[int, int], ...] = ()
    connections: int = 0
    time_wait_until: float = -math.inf
    scope: anyio.CancelScope | None = None
    settled: anyio.Event = attrs.Factory(anyio.Event)
    """Set once the start has finished, started or not."""
    done: anyio.Event = attrs.Factory(anyio.Event)
    """Set once the server has stopped."""
    changed: anyio.Event = attrs.Factory(anyio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


class FakeSandboxRuntime:
    """The fake runtime; an async context manager that owns every sandbox's server.

    ``clock`` times uptime and TIME_WAIT (a ``ManualClock`` in tests); ``token_factory``
    makes boot tokens; ``pages_bytes`` is the size of each workload's memory pages;
    ``listen_host`` is the local address the workloads listen on (127.0.0.1).
    Everything the runtime started stops when its ``async with`` block exits.
    """

    def __init__(
        self,
        *,
        runtime_version: str = FAKE_RUNTIME_VERSION,
        clock: Callable[[], float] = time.monotonic,
        token_factory: Callable[[], str] = _token,
        pages_bytes: int = DEFAULT_PAGES_BYTES,
        time_wait_seconds: float = TIME_WAIT_SECONDS,
        close_grace_seconds: float = CLOSE_GRACE_SECONDS,
        listen_host: str = LISTEN_HOST,
    ) -> None:
        if pages_bytes < 0:
            raise ValueError("pages_bytes must not be negative")
        self._version = runtime_version
        self._clock = clock
        self._token_factory = token_factory
        self._pages_bytes = pages_bytes
        self._time_wait = time_wait_seconds
        self._close_grace = close_grace_seconds
        self._host = listen_host
        self._boxes: dict[str, _Sandbox] = {}
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None

    # --- lifetime ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise RuntimeError("FakeSandboxRuntime is already open")
        stack = AsyncExitStack()
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        stack, tg = self._stack, self._tg
        assert stack is not None
        assert tg is not None
        self._stack = self._tg = None
        tg.cancel_scope.cancel()
        try:
            return await stack.__aexit__(exc_type, exc, tb)
        finally:
            for box in self._boxes.values():
                if box.state in (SandboxState.CREATED, SandboxState.RUNNING):
                    box.state = SandboxState.STOPPED
            self._boxes.clear()

    async def _ready(self) -> TaskGroup:
        await anyio.lowlevel.checkpoint()
        if self._tg is None:
            raise Unavailable(RUNTIME_CLOSED_MESSAGE)
        return self._tg

    def _state_of(self, sandbox_id: str) -> SandboxState | None:
        box = self._boxes.get(sandbox_id)
        return None if box is None else box.state

    # --- the port ---------------------------------------------------------------------

    async def runtime_version(self) -> str:
        return self._version

    async def run(self, spec: SandboxSpec) -> None:
        await self._ready()
        check_op(spec.sandbox_id, self._state_of(spec.sandbox_id), SandboxOp.RUN)
        boot = self._token_factory()
        memory = _Memory(counter=0, boot=boot, pages=make_pages(boot, self._pages_bytes))
        await self._start(spec, memory, SandboxOp.RUN)

    async def checkpoint(self, sandbox_id: str, image_dir: str) -> CheckpointInfo:
        await self._ready()
        check_op(sandbox_id, self._state_of(sandbox_id), SandboxOp.CHECKPOINT)
        box = self._boxes[sandbox_id]
        # Resets sent just before the checkpoint may still be on their way to the server.
        with anyio.move_on_after(self._close_grace):
            while box.connections and box.state is SandboxState.RUNNING:
                await box.changed.wait()
        check_op(sandbox_id, self._state_of(sandbox_id), SandboxOp.CHECKPOINT)
        # From here to the kill nothing awaits: the check and the capture are atomic.
        why = self._unsaveable(box)
        memory = _Memory(counter=box.memory.counter, boot=box.memory.boot, pages=box.memory.pages)
        await self._kill(box)
        if why:
            with contextlib.suppress(OSError):
                await anyio.to_thread.run_sync(_write_partial_image, Path(image_dir))
            raise Internal(f"{CHECKPOINT_FAILED_MESSAGE}: {sandbox_id}: {why}")
        try:
            info = await anyio.to_thread.run_sync(
                _write_image, Path(image_dir), sandbox_id, self._version, memory
            )
        except OSError as exc:
            raise Internal(
                f"{CHECKPOINT_FAILED_MESSAGE}: {sandbox_id}: writing the image: {exc}"
            ) from exc
        if self._boxes.get(sandbox_id) is box:
            box.state = SandboxState.CHECKPOINTED
        return info

    async def restore(self, spec: SandboxSpec, image_dir: str) -> None:
        await self._ready()
        check_op(spec.sandbox_id, self._state_of(spec.sandbox_id), SandboxOp.RESTORE)
        memory = await anyio.to_thread.run_sync(_read_image, Path(image_dir), self._version)
        await self._start(spec, memory, SandboxOp.RESTORE)

    async def terminate(self, sandbox_id: str) -> None:
        await anyio.lowlevel.checkpoint()
        box = self._boxes.pop(sandbox_id, None)
        if box is None:
            return
        await box.settled.wait()
        await self._kill(box)

    async def state(self, sandbox_id: str) -> SandboxState:
        await self._ready()
        state = self._state_of(sandbox_id)
        if state is None:
            raise NotFound(f"sandbox {sandbox_id} not found")
        return state

    async def stats(self, sandbox_id: str) -> SandboxStats:
        await self._ready()
        check_op(sandbox_id, self._state_of(sandbox_id), SandboxOp.STATS)
        box = self._boxes[sandbox_id]
        return SandboxStats(
            memory_bytes=len(box.memory.pages) + STATE_BYTES,
            cpu_seconds=box.cpu_seconds,
            uptime_seconds=max(0.0, self._clock() - box.started_at),
        )

    async def address(self, sandbox_id: str) -> SandboxAddress:
        await self._ready()
        check_op(sandbox_id, self._state_of(sandbox_id), SandboxOp.ADDRESS)
        return SandboxAddress(host=self._host, ports=self._boxes[sandbox_id].ports)

    # --- fake-only controls (fault injection and inspection) --------------------------

    async def crash(self, sandbox_id: str) -> None:
        """The workload dies on its own: the sandbox becomes STOPPED, without an image.

        Raises :class:`NotFound` if unknown, :class:`FailedPrecondition` if not RUNNING.
        """
        await self._ready()
        state = self._state_of(sandbox_id)
        if state is None:
            raise NotFound(f"sandbox {sandbox_id} not found")
        if state is not SandboxState.RUNNING:
            raise FailedPrecondition(f"sandbox {sandbox_id} is {state.name}; it cannot crash")
        await self._kill(self._boxes[sandbox_id])

    def open_connections(self, sandbox_id: str) -> int:
        """How many client connections to the workload are open right now (0 if unknown)."""
        box = self._boxes.get(sandbox_id)
        return 0 if box is None else box.connections

    def namespace(self, sandbox_id: str) -> str:
        """The network namespace path the sandbox was last run or restored into."""
        box = self._boxes.get(sandbox_id)
        if box is None:
            raise NotFound(f"sandbox {sandbox_id} not found")
        return box.spec.netns_path

    # --- internals --------------------------------------------------------------------

    def _unsaveable(self, box: _Sandbox) -> str:
        if box.connections:
            return (
                f"save rejected: {box.connections} TCP connection(s) of the workload are "
                "still open (abort them with RST before checkpointing)"
            )
        if self._clock() < box.time_wait_until:
            return (
                "save rejected: a connection the workload closed first is in TIME_WAIT "
                "(clients must close with RST)"
            )
        return ""

    async def _start(self, spec: SandboxSpec, memory: _Memory, op: SandboxOp) -> None:
        tg = await self._ready()
        # Again, right before registering: another call may have started it meanwhile.
        check_op(spec.sandbox_id, self._state_of(spec.sandbox_id), op)
        box = _Sandbox(spec=spec, memory=memory)
        self._boxes[spec.sandbox_id] = box
        try:
            await tg.start(self._sandbox_main, box)
        except OSError as exc:
            box.state = SandboxState.STOPPED
            raise Internal(f"sandbox {spec.sandbox_id} failed to start: {exc}") from exc
        finally:
            box.settled.set()
        if self._boxes.get(spec.sandbox_id) is not box:
            await self._kill(box)
            raise FailedPrecondition(f"sandbox {spec.sandbox_id} was terminated while starting")

    async def _kill(self, box: _Sandbox) -> None:
        if box.scope is not None:
            box.scope.cancel()
            await box.done.wait()
        if box.state in (SandboxState.CREATED, SandboxState.RUNNING):
            box.state = SandboxState.STOPPED

    async def _sandbox_main(self, box: _Sandbox, *, task_status: TaskStatus[None]) -> None:
        listeners: list[tuple[int, SocketListener]] = []
        try:
            with anyio.CancelScope() as scope:
                box.scope = scope
                for port in box.spec.ports or (80,):
                    multi = await anyio.create_tcp_listener(local_host=self._host, local_port=0)
                    for lst in multi.listeners:  # exactly one, for one address
                        assert isinstance(lst, SocketListener)
                        listeners.append((port, lst))
                box.ports = tuple(
                    (port, lst.extra(SocketAttribute.local_port)) for port, lst in listeners
                )
                box.started_at = self._clock()
                box.state = SandboxState.RUNNING
                async with anyio.create_task_group() as stg:
                    for _port, lst in listeners:
                        stg.start_soon(self._accept_loop, box, lst, stg)
                    task_status.started()
        finally:
            with anyio.CancelScope(shield=True):
                for _port, lst in listeners:
                    with contextlib.suppress(Exception):
                        await lst.aclose()
            if box.state in (SandboxState.CREATED, SandboxState.RUNNING):
                box.state = SandboxState.STOPPED
            box.done.set()

    async def _accept_loop(self, box: _Sandbox, listener: SocketListener, stg: TaskGroup) -> None:
        while True:
            try:
                stream = await listener.accept()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            except OSError:
                await anyio.sleep(0.01)  # e.g. out of descriptors: try again
                continue
            box.connections += 1
            box.notify()
            stg.start_soon(self._connection, box, stream)

    async def _connection(self, box: _Sandbox, stream: SocketStream) -> None:
        try:
            await self._serve_http(box, stream)
        except Exception:
            # Whatever goes wrong with one connection never takes the workload down; the
            # workload closed it first, as a real server would.
            box.time_wait_until = self._clock() + self._time_wait
        finally:
            box.connections -= 1
            box.notify()
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await stream.aclose()

    async def _serve_http(self, box: _Sandbox, stream: SocketStream) -> None:
        """Serve requests until the client goes away (or must be closed, server first)."""
        conn = h11.Connection(h11.SERVER)
        while True:
            try:
                request = await _next_request(conn, stream)
            except h11.RemoteProtocolError:
                if await _send_response(conn, stream, 400, b"bad request"):
                    box.time_wait_until = self._clock() + self._time_wait
                return
            if request is None:
                return  # the client closed first (FIN or RST): no TIME_WAIT on our side
            started = time.thread_time()
            status, body = self._respond(box, request)
            box.cpu_seconds += time.thread_time() - started
            if not await _send_response(conn, stream, status, body):
                return  # the client went away while we answered
            if conn.our_state is h11.MUST_CLOSE:
                # HTTP/1.0 or "Connection: close": the workload closes first, so its side
                # of the connection sits in TIME_WAIT, which blocks a checkpoint.
                box.time_wait_until = self._clock() + self._time_wait
                return
            conn.start_next_cycle()

    def _respond(self, box: _Sandbox, request: h11.Request) -> tuple[int, bytes]:
        if request.method != b"GET":
            return 405, b"method not allowed"
        path = request.target.split(b"?", 1)[0]
        if path == b"/":
            box.memory.counter += 1
            return 200, f"count={box.memory.counter} boot={box.memory.boot}".encode()
        if path == b"/readyz":
            return 200, b"ok"
        return 404, b"not found"


async def _next_request(conn: h11.Connection, stream: SocketStream) -> h11.Request | None:
    """The next complete request (its body drained), or None once the client is gone."""
    request: h11.Request | None = None
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive(_RECEIVE_SIZE)
            except anyio.EndOfStream:
                data = b""
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return None  # reset by the client
            conn.receive_data(data)
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.EndOfMessage):
            return request
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None


async def _send_response(
    conn: h11.Connection, stream: SocketStream, status: int, body: bytes
) -> bool:
    """Send one response; False if the client is gone or the connection cannot carry it."""
    headers = [("content-type", "text/plain"), ("content-length", str(len(body)))]
    try:
        data = b"".join(
            conn.send(event) or b""
            for event in (
                h11.Response(status_code=status, headers=headers),
                h11.Data(data=body),
                h11.EndOfMessage(),
            )
        )
    except h11.LocalProtocolError:
        return False
    try:
        await stream.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        return False
    return True


# --- the image (runs in a worker thread) ----------------------------------------------


def _image_header(sandbox_id: str, version: str, memory: _Memory) -> dict[str, Any]:
    return {
        "format": IMAGE_FORMAT,
        "runtime_version": version,
        "sandbox_id": sandbox_id,
        "counter": memory.counter,
        "boot": memory.boot,
        "pages": {
            "file": PAGES_FILE,
            "size": len(memory.pages),
            "sha256": hashlib.sha256(memory.pages).hexdigest(),
        },
    }


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _write_image(directory: Path, sandbox_id: str, version: str, memory: _Memory) -> CheckpointInfo:
    directory.mkdir(parents=True, exist_ok=True)
    _replace(directory / PAGES_FILE, memory.pages)
    header = json.dumps(_image_header(sandbox_id, version, memory), indent=1).encode()
    _replace(directory / IMAGE_FILE, header)  # last: a complete header means a usable image
    files = (IMAGE_FILE, PAGES_FILE)
    return CheckpointInfo(
        sandbox_id=sandbox_id,
        directory=str(directory),
        files=files,
        runtime_version=version,
        size_bytes=sum((directory / name).stat().st_size for name in files),
    )


def _write_partial_image(directory: Path) -> None:
    """What a failed checkpoint leaves behind: a header that ends before the state."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / IMAGE_FILE).write_bytes(f'{{"format": "{IMAGE_FORMAT}", "runtime_v'.encode())


def _read_image(directory: Path, version: str) -> _Memory:
    header_path = directory / IMAGE_FILE
    try:
        raw = header_path.read_bytes()
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise NotFound(f"no sandbox image in {directory}") from exc
    except OSError as exc:
        raise Internal(f"cannot read the sandbox image in {directory}: {exc}") from exc
    try:
        header = json.loads(raw)
        if not isinstance(header, dict) or header.get("format") != IMAGE_FORMAT:
            raise ValueError("not a fake sandbox image")
        written_by = header["runtime_version"]
        counter, boot, pages_meta = header["counter"], header["boot"], header["pages"]
        if not (isinstance(counter, int) and isinstance(boot, str)):
            raise ValueError("malformed state")
        size, digest = int(pages_meta["size"]), str(pages_meta["sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise Internal(
            f"the sandbox image in {directory} is incomplete or corrupt "
            f"(a failed checkpoint leaves such an image): {exc}"
        ) from exc
    if written_by != version:
        raise FailedPrecondition(
            f"the sandbox image in {directory} was written by runtime {written_by!r}; "
            f"this runtime is {version!r}"
        )
    try:
        pages = (directory / PAGES_FILE).read_bytes()
    except OSError as exc:
        raise Internal(f"the sandbox image in {directory} has no pages: {exc}") from exc
    if len(pages) != size or hashlib.sha256(pages).hexdigest() != digest:
        raise Internal(f"the sandbox image pages in {directory} do not match the header")
    return _Memory(counter=counter, boot=boot, pages=pages)


__all__ = ["FAKE_RUNTIME_VERSION", "FakeSandboxRuntime"]
