"""The router's connections to workers' atunnel listeners: mutual TLS, pinned, pooled.

Every connection is HTTP/1.1 over mutual TLS (ALPN ``http/1.1``; atunnel speaks nothing
else). After the handshake the worker's certificate must carry exactly the SPIFFE id
``Identity.worker(<worker name>)`` of the worker the route names; anything else is closed
and reported as :class:`TunnelUnreachable`. Connections are kept alive and reused per
(worker, address); an idle one is reused only if the peer has not closed it meanwhile, and
is dropped after ``idle_timeout`` seconds.
"""

from __future__ import annotations

import collections
import contextlib
import select
import ssl
from typing import Final

import anyio
import h11
from anyio.abc import SocketAttribute
from anyio.streams.tls import TLSAttribute, TLSStream

from substrate.core.ids import WorkerRef
from substrate.errors import InvalidArgument, SubstrateError, Unavailable
from substrate.identity import Identity, TlsFiles
from substrate.identity.tls import check_peer, client_context
from substrate.services.tcp_state import has_input

RECEIVE_SIZE: Final = 65536
MAX_HEAD_BYTES: Final = 64 * 1024
HTTP11_ALPN: Final = ("http/1.1",)
STREAM_GONE: Final = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.BusyResourceError,
    OSError,  # includes ssl.SSLError
)


def tunnel_client_context(files: TlsFiles) -> ssl.SSLContext:
    """The router's client context for atunnel: our CA only, our certificate, HTTP/1.1.

    Host names are not checked: every connection pins the worker's SPIFFE id instead.
    """
    ctx = client_context(files, check_hostname=False)
    ctx.set_alpn_protocols(list(HTTP11_ALPN))
    return ctx


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port); :class:`InvalidArgument` otherwise."""
    if address.startswith("["):
        host, sep, rest = address[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        ok = bool(sep and host)
    else:
        host, _, port = address.rpartition(":")
        ok = bool(host) and ":" not in host
    if not ok or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"tunnel address {address!r} must be host:port")
    return host, int(port)


class TunnelUnreachable(Unavailable):
    """The worker's atunnel could not be reached, or it is not who the route says."""


class UpstreamGone(Exception):
    """The atunnel connection broke (EOF, reset, TLS failure) in the middle of a message."""


class Upstream:
    """One HTTP/1.1 client connection to a worker's atunnel."""

    __slots__ = ("_bio", "_sock", "address", "conn", "idle_since", "reused", "stream", "worker")

    def __init__(self, stream: TLSStream, worker: WorkerRef, address: str) -> None:
        self.stream = stream
        self.worker = worker
        self.address = address
        self.conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.reused = False
        self.idle_since = 0.0
        # Looked up once: ``stream.extra()`` asks the kernel for both addresses every time.
        self._sock = stream.extra(SocketAttribute.raw_socket, None)
        self._bio = getattr(stream, "_read_bio", None)  # anyio's TLS input buffer

    async def send(self, data: bytes) -> None:
        try:
            await self.stream.send(data)
        except STREAM_GONE as exc:
            raise UpstreamGone(_describe(exc)) from exc

    async def next_event(self) -> object:
        """The next h11 event from atunnel; :class:`UpstreamGone` if the stream broke."""
        conn = self.conn
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await self.stream.receive(RECEIVE_SIZE)
            except anyio.EndOfStream:
                data = b""
            except STREAM_GONE as exc:
                raise UpstreamGone(_describe(exc)) from exc
            conn.receive_data(data)

    @property
    def reusable(self) -> bool:
        """Whether the last exchange ended cleanly, so the connection can carry another."""
        conn = self.conn
        return (
            conn.our_state is h11.DONE
            and conn.their_state is h11.DONE
            and not conn.trailing_data[0]
            and not conn.trailing_data[1]
        )

    def readable(self) -> bool:
        """Whether more of the answer is already here (decrypted or in the socket), so a
        flush to the client can wait for it: one write instead of two for a small answer."""
        bio = self._bio
        if bio is not None and bio.pending:
            return True
        return has_input(self._sock, select.POLLIN) is True

    def alive(self) -> bool:
        """Whether an idle connection still looks open: nothing to read, not even EOF.

        An idle HTTP/1.1 connection has nothing to say; if its socket is readable, the
        peer closed it (or sent bytes nobody asked for), and it must not carry a request.
        """
        return has_input(self._sock) is False

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await self.stream.aclose()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    text = str(exc) or type(exc).__name__
    cause = exc.__cause__
    if cause is not None and str(cause):
        text = f"{text}: {cause}" if str(exc) else str(cause)
    return text


class _PoolWaiter:
    """A request waiting for a connection to one atunnel: handed one, or told to dial."""

    __slots__ = ("event", "upstream")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.upstream: Upstream | None = None


class TunnelPool:
    """Keep-alive mTLS connections to atunnel listeners, per (worker, address).

    At most ``max_dials_per_worker`` handshakes to one atunnel run at once. When parked
    requests are released together (a resume finished with dozens waiting), each would
    otherwise open its own connection: a mutual-TLS handshake costs ~3.5 ms of CPU on each
    side, so 200 of them kept the router and the worker busy for most of a second (drill
    6). Requests beyond the limit wait for whichever comes first: a connection another
    request releases (handed over directly) or a free dial slot (a slot frees when a
    handshake ends, not when its connection does, so a long-lived request never blocks
    the others).
    """

    def __init__(
        self,
        ssl_context: ssl.SSLContext,
        *,
        trust_domain: str,
        connect_timeout: float = 5.0,
        idle_timeout: float = 60.0,
        max_idle_per_worker: int = 256,
        max_dials_per_worker: int = 16,
    ) -> None:
        if connect_timeout <= 0 or idle_timeout <= 0 or max_idle_per_worker < 0:
            raise InvalidArgument("tunnel pool timeouts must be > 0 and sizes >= 0")
        if max_dials_per_worker < 1:
            raise InvalidArgument("tunnel pool max_dials_per_worker must be >= 1")
        self._ssl = ssl_context
        self._trust_domain = trust_domain
        self._connect_timeout = connect_timeout
        self._idle_timeout = idle_timeout
        self._max_idle = max_idle_per_worker
        self._max_dials = max_dials_per_worker
        self._idle: dict[tuple[WorkerRef, str], list[Upstream]] = {}
        self._dialing: dict[tuple[WorkerRef, str], int] = {}
        self._waiting: dict[tuple[WorkerRef, str], collections.deque[_PoolWaiter]] = {}
        self._opened = 0
        self._reused = 0
        self._handed = 0

    @property
    def trust_domain(self) -> str:
        return self._trust_domain

    def stats(self) -> dict[str, int]:
        return {
            "opened": self._opened,
            "reused": self._reused,
            "handed_over": self._handed,
            "idle": sum(len(v) for v in self._idle.values()),
            "waiting": sum(len(v) for v in self._waiting.values()),
        }

    async def acquire(
        self, worker: WorkerRef, address: str, *, now: float, fresh: bool = False
    ) -> Upstream:
        """An idle connection to ``worker`` at ``address`` (unless ``fresh``), or a new one.

        :class:`TunnelUnreachable` if a new connection cannot be made in time, the TLS
        handshake fails, or the peer is not ``Identity.worker(worker.name)``.
        """
        key = (worker, address)
        if not fresh:
            idle = self._idle.get(key)
            while idle:
                upstream = idle.pop()
                if now - upstream.idle_since < self._idle_timeout and upstream.alive():
                    upstream.reused = True
                    self._reused += 1
                    return upstream
                await upstream.aclose()
            while self._dialing.get(key, 0) >= self._max_dials:
                handed = await self._wait_turn(key)
                if handed is not None:
                    return handed
        self._dialing[key] = self._dialing.get(key, 0) + 1
        try:
            return await self._connect(worker, address)
        finally:
            left = self._dialing[key] - 1
            if left:
                self._dialing[key] = left
            else:
                del self._dialing[key]
            self._wake(key, None)

    async def _wait_turn(self, key: tuple[WorkerRef, str]) -> Upstream | None:
        """Wait for a handed-over connection (returned) or a free dial slot (None)."""
        waiter = _PoolWaiter()
        queue = self._waiting.setdefault(key, collections.deque())
        queue.append(waiter)
        taken = False
        try:
            await waiter.event.wait()
            upstream = waiter.upstream
            if upstream is not None and upstream.alive():
                taken = True
                upstream.reused = True
                self._handed += 1
                return upstream
            return None
        finally:
            if not waiter.event.is_set():
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)
                if not queue:
                    self._waiting.pop(key, None)
            elif not taken and waiter.upstream is not None:
                # handed a connection, then cancelled (or it died): pass it on or drop it
                upstream, waiter.upstream = waiter.upstream, None
                if not (upstream.alive() and self._wake(key, upstream)):
                    await self._park_idle(key, upstream)

    def _wake(self, key: tuple[WorkerRef, str], upstream: Upstream | None) -> bool:
        """Wake the first waiter of ``key``, handing it ``upstream`` (or a dial slot)."""
        queue = self._waiting.get(key)
        if not queue:
            return False
        waiter = queue.popleft()
        if not queue:
            del self._waiting[key]
        waiter.upstream = upstream
        waiter.event.set()
        return True

    def release(self, upstream: Upstream, *, now: float) -> bool:
        """Keep ``upstream`` for reuse if its exchange ended cleanly; whether it was kept.

        A connection that is not kept must be closed by the caller.
        """
        if not upstream.reusable:
            return False
        key = (upstream.worker, upstream.address)
        upstream.conn.start_next_cycle()
        upstream.idle_since = now
        return self._wake(key, upstream) or self._keep_idle(key, upstream)

    def _keep_idle(self, key: tuple[WorkerRef, str], upstream: Upstream) -> bool:
        """Add ``upstream`` to the idle connections of ``key`` unless they are full."""
        idle = self._idle.setdefault(key, [])
        if len(idle) >= self._max_idle:
            return False
        idle.append(upstream)
        return True

    async def _park_idle(self, key: tuple[WorkerRef, str], upstream: Upstream) -> None:
        if not (upstream.alive() and self._keep_idle(key, upstream)):
            await upstream.aclose()

    async def close_idle(self, *, now: float) -> int:
        """Close the connections idle for longer than ``idle_timeout``; how many."""
        closed = 0
        for key in list(self._idle):
            keep: list[Upstream] = []
            for upstream in self._idle[key]:
                if now - upstream.idle_since < self._idle_timeout and upstream.alive():
                    keep.append(upstream)
                else:
                    await upstream.aclose()
                    closed += 1
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]
        return closed

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for upstreams in idle.values():
            for upstream in upstreams:
                await upstream.aclose()

    async def _connect(self, worker: WorkerRef, address: str) -> Upstream:
        try:
            host, port = split_address(address)
        except InvalidArgument as exc:
            raise TunnelUnreachable(exc.description) from None
        expected = Identity.worker(worker.name, self._trust_domain)
        what = f"worker {worker} at {address}"
        try:
            with anyio.fail_after(self._connect_timeout):
                tcp = await anyio.connect_tcp(host, port)
                try:
                    tls = await TLSStream.wrap(
                        tcp, ssl_context=self._ssl, standard_compatible=False, server_side=False
                    )
                except BaseException:
                    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                        await tcp.aclose()
                    raise
        except (TimeoutError, *STREAM_GONE) as exc:
            raise TunnelUnreachable(f"cannot reach {what}: {_describe(exc)}") from exc
        upstream = Upstream(tls, worker, address)
        try:
            check_peer(tls.extra(TLSAttribute.peer_certificate, None), expected)
            alpn = tls.extra(TLSAttribute.alpn_protocol, None)
            if alpn not in (None, *HTTP11_ALPN):
                raise TunnelUnreachable(f"{what} negotiated {alpn!r}, not HTTP/1.1")
        except SubstrateError as exc:
            await upstream.aclose()
            if isinstance(exc, TunnelUnreachable):
                raise
            raise TunnelUnreachable(f"{what} is not who it should be: {exc.description}") from exc
        self._opened += 1
        return upstream


__all__ = [
    "MAX_HEAD_BYTES",
    "RECEIVE_SIZE",
    "STREAM_GONE",
    "TunnelPool",
    "TunnelUnreachable",
    "Upstream",
    "UpstreamGone",
    "split_address",
    "tunnel_client_context",
]
