"""TCP listeners that accept every pending connection at each wakeup.

anyio's ``SocketListener.accept()`` takes one connection per call and yields to the event
loop at least twice per connection (a checkpoint, then the transport's setup). Under a
burst, while the loop also runs hundreds of other ready tasks, that caps accepting at one
connection per loop turn: a router with a thousand parked requests accepted ~150
connections a second and clients waited seconds in the kernel's accept queue before the
router read their requests (drill 6). Here each readiness wakeup drains the queue with
non-blocking ``accept()`` calls, and every connection is wrapped into an anyio stream in
its own task, concurrently.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any, Final, Self

import anyio
import anyio.abc
import structlog
from anyio.abc import SocketAttribute, SocketListener, SocketStream

log = structlog.get_logger(__name__)

MAX_BATCH: Final = 512
"""Connections accepted per wakeup at most, so one burst cannot starve the loop entirely.

A trade-off measured with drill 6 (2,800 connections at once, 2 cores): 32 per wakeup left
most of the burst waiting in the kernel (answers up to 11 s); 128 served more requests
(~380 of 2,800 vs ~200) because resume replies got turns sooner, but the last requests
were read later (answers up to 8 s); 512 reads the whole burst within ~4.5 s."""
RETRY_AFTER_ERROR: Final = 0.05
"""Seconds to wait after an accept error such as "too many open files"."""
_GONE: Final = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError)

Handler = Callable[[SocketStream, socket.socket], Awaitable[None]]
"""Serves one accepted connection: its stream, and the socket under it (owned by the stream:
for socket options and addresses without anyio's per-call attribute lookups)."""


class Listeners:
    """The listening sockets of one ``host:port``, served in batches.

    Build with :meth:`bind`, start with :meth:`serve`, stop with :meth:`aclose` (which
    wakes and ends the accept loops; connections already handed over keep running).
    """

    def __init__(self, listeners: list[SocketListener], *, name: str) -> None:
        if not listeners:
            raise ValueError("Listeners needs at least one socket")
        self._listeners = listeners
        self._name = name
        self._closed = False

    @classmethod
    async def bind(cls, host: str, port: int, *, name: str) -> Self:
        """Listen on ``host:port`` (0: any free port); ``name`` labels log lines."""
        multi = await anyio.create_tcp_listener(local_host=host, local_port=port)
        listeners = [lst for lst in multi.listeners if isinstance(lst, SocketListener)]
        return cls(listeners, name=name)

    @property
    def port(self) -> int:
        return int(self._listeners[0].extra(SocketAttribute.local_port))

    def serve(self, tg: anyio.abc.TaskGroup, handle: Handler) -> None:
        """Accept on every socket in ``tg``; each connection runs ``handle`` in ``tg``."""
        for listener in self._listeners:
            tg.start_soon(self._accept_loop, tg, listener.extra(SocketAttribute.raw_socket), handle)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Wake each accept loop and close its socket in one step, with no await between:
        # anyio's listener ``aclose()`` yields once before closing, and an accept loop that
        # a new connection had just woken would watch the socket again in that turn; the
        # socket closed under that watch left the event loop's selector holding a stale
        # entry, and the next socket to get the same descriptor number could not be waited
        # on (the router's next dial failed with ENOENT).
        for listener in self._listeners:
            with contextlib.suppress(Exception):
                close_watched(listener.extra(SocketAttribute.raw_socket))
        with anyio.CancelScope(shield=True):
            for listener in self._listeners:
                with contextlib.suppress(Exception):
                    await listener.aclose()

    async def _accept_loop(
        self, tg: anyio.abc.TaskGroup, sock: socket.socket, handle: Handler
    ) -> None:
        def accepted(conn: socket.socket, _peer: Any) -> None:
            tg.start_soon(_wrap_and_handle, conn, handle)

        await accept_each(sock, accepted, label=self._name)


async def accept_each(
    sock: socket.socket,
    on_accept: Callable[[socket.socket, Any], None],
    *,
    label: str,
    retry_after: float = RETRY_AFTER_ERROR,
) -> None:
    """Accept on the listening socket ``sock`` until it is closed: at each wakeup every
    pending connection (at most :data:`MAX_BATCH`), each handed to ``on_accept`` as a
    non-blocking socket with its peer address. ``on_accept`` must not block.

    An accept error other than a connection aborted before it was taken (e.g. out of file
    descriptors) is logged with ``label`` and retried after ``retry_after`` seconds.
    """
    while sock.fileno() != -1:
        try:
            await anyio.wait_readable(sock)
        except (anyio.ClosedResourceError, OSError):
            return
        for _ in range(MAX_BATCH):
            if sock.fileno() == -1:
                return
            try:
                conn, peer = sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno in (errno.EBADF, errno.EINVAL):  # closed under us
                    return
                if exc.errno == errno.ECONNABORTED:
                    continue
                log.warning("accept_failed", listener=label, error=str(exc))
                await anyio.sleep(retry_after)
                break
            conn.setblocking(False)
            on_accept(conn, peer)


def close_watched(sock: socket.socket) -> None:
    """Close ``sock``, first waking (with ``ClosedResourceError``) any task waiting for it
    to be readable or writable, in the same step. Closing a socket a task still waits on
    leaves the selector watching a number the kernel may hand to the next socket."""
    if sock.fileno() == -1:
        return
    anyio.notify_closing(sock)
    sock.close()


async def _wrap_and_handle(conn: socket.socket, handle: Handler) -> None:
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream = await SocketStream.from_socket(conn)
    except _GONE:  # reset before we got to it
        conn.close()
        return
    await handle(stream, conn)


def queued_seconds(sock: socket.socket) -> float:
    """How long ago the last bytes from the peer reached this host (the kernel's
    ``tcpi_last_data_recv``; the connection's set-up time if none came yet), in seconds.

    Read right after a request's head: how long the request waited in the kernel (the
    accept queue, the socket buffer) before this process read it. 0.0 if unknown.
    """
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except (OSError, AttributeError):
        return 0.0
    if len(info) < _LAST_DATA_RECV + 4:
        return 0.0
    (millis,) = struct.unpack_from("=I", info, _LAST_DATA_RECV)
    return float(millis) / 1000.0


_TCP_INFO_LEN: Final = 104
_LAST_DATA_RECV: Final = 52
"""Offset of ``tcpi_last_data_recv`` (u32, milliseconds) in Linux's ``struct tcp_info``."""


__all__ = ["MAX_BATCH", "Listeners", "accept_each", "close_watched", "queued_seconds"]
