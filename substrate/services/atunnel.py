"""atunnel: the worker's mTLS listener that carries the router's requests to its actors.

Seed 000 ("forwarding through the tunnel"): the router never reaches an actor directly. It
opens mutual TLS to the worker's atunnel (port 8443), names the actor with
``ate-target-actor: <atespace>/<name>`` (and optionally ``ate-target-port``), and atunnel
forwards to the actor's workload if, and only if, the actor is active on this worker.

Theory of operation
===================

*Who may talk.* The listener's ``ssl.SSLContext`` (from
:func:`substrate.identity.server_context`, or :func:`atunnel_server_context`, which also
pins ALPN to ``http/1.1``) requires a client certificate from our CA, so a client without
one fails the TLS handshake and never gets an HTTP answer. A client whose certificate is
valid but whose SPIFFE id is not allowed (default: only the router of the trust domain)
completes the handshake, and its first request is answered ``403 Forbidden`` with
``Connection: close`` naming the refused identity; then the connection is closed. We chose
a 403 over a silent close because the router's logs then say why.

*What a request becomes.* Every request on a client connection is routed on its own
(keep-alive connections may alternate actors). :meth:`RouteTable.decide
<substrate.net.tunnel.RouteTable.decide>` turns its head into a refusal (400 bad routing
headers, 404 port not exposed, 421 + ``X-Ate-Assignment-Stale: true`` actor not active or
being checkpointed) or a :class:`~substrate.net.tunnel.Forward`:

* ``CONNECT <anything>``: atunnel connects to the actor's port, answers ``200 Connection
  established`` and splices raw bytes both ways until either side ends;
* any other method: atunnel connects, forwards the head without the routing and
  hop-by-hop headers (``Host`` as sent), then streams the request body to the actor and
  the response back *at the same time* (a full-duplex echo works; nothing buffers a whole
  body: at most one 64 KiB read is in flight per direction). A ``101`` answer to an
  ``Upgrade`` request turns the connection into a raw splice, as CONNECT does.

A connection that fails (connect refused, timeout, an actor closing before answering) is
``502``.

*Connections to actors are kept alive, briefly.* A connection whose exchange ended cleanly
(the whole request sent, the whole response read, no ``Connection: close``, no protocol
switch, nothing left over) goes to a small idle pool of its actor's port and carries the
next request for that port, if one comes within ``backend_idle_timeout`` seconds (default
1 s: below the keep-alive timeout of common servers, so the actor is not the one that
closes). An idle connection is checked before reuse (a peer that closed or sent unasked
bytes makes it unusable) and reset when it expires. A request without a body that meets
a kept-alive connection broken under it (the actor closed it meanwhile: nothing came back)
is sent again once on a new connection; a request with a body is not replayed (``502``).
``backend_idle_timeout=0`` turns reuse off: one connection per request.

*Connections to actors are reset, never closed.* gVisor cannot checkpoint a sandbox while
one of its TCP connections is open or in TIME_WAIT, so every socket atunnel opens to an
actor has ``SO_LINGER {1, 0}`` from birth: closing it sends RST, never FIN, whatever the
reason (end of exchange, error, abort, shutdown). Each open connection is a *link*
registered under the actor's uid, synchronously with the routing decision (no await in
between), so :meth:`Atunnel.abort` sees every connection that exists or is being made;
an idle kept-alive connection stays registered under its actor's uid in the idle pool.

*Checkpoints.* Before a checkpoint the worker calls :meth:`Atunnel.abort`: the route is
quiesced (new requests get 421, and the router re-resolves the actor), then every link of
the actor is reset on both sides (the actor's socket and the router's connection that
carried it) and ``abort`` returns once their handlers have finished. :meth:`Atunnel.activate`
lifts the quiesce (e.g. a checkpoint that was given up), :meth:`Atunnel.deactivate`
removes the route and resets the links the same way.

*Limits.* HTTP/1.1 only (no h2 to atunnel; a connection that negotiated ``h2`` is
closed). No ``X-Forwarded-For``: the only client is the router, whose address says nothing
about the caller. A tunnel (CONNECT or upgrade) ends as soon as either side ends its
stream: a half-close is not passed on, because passing it to the actor would be a FIN. A
router that goes away while an actor has not started answering is noticed when the answer
comes (nothing reads the router's connection between a request's end and its response).
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import ssl
import struct
import termios
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Final, Self

import anyio
import anyio.abc
import attrs
import h11
import structlog
from anyio.abc import SocketAttribute, SocketStream, TaskGroup
from anyio.streams.tls import TLSAttribute, TLSStream

from substrate.core.ids import ActorRef
from substrate.errors import (
    InvalidArgument,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from substrate.identity import DEFAULT_TRUST_DOMAIN, Identity, SpiffeId, TlsFiles, server_context
from substrate.identity.tls import peer_spiffe_id
from substrate.net.tunnel import (
    Forward,
    Refusal,
    Route,
    RouteTable,
    forward_request_headers,
    forward_response_headers,
    has_body,
    is_chunked,
    make_route,
    refusal_for,
)
from substrate.sandbox.spec import SandboxAddress
from substrate.services.listeners import Listeners
from substrate.services.sandbox_sockets import connect_rst, set_rst_on_close
from substrate.services.tcp_state import has_input, peer_of

log = structlog.get_logger("substrate.atunnel")

DEFAULT_PORT: Final = 8443
"""Where the router's CONNECT/HTTP ingress reaches atunnel (seed 000)."""
HTTP11_ALPN: Final = ("http/1.1",)
RECEIVE_SIZE: Final = 65536
MAX_HEADER_BYTES: Final = 64 * 1024
"""Largest request or response head atunnel accepts."""
_STREAM_GONE: Final = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.BusyResourceError,
    OSError,  # includes ssl.SSLError
)


def atunnel_server_context(files: TlsFiles) -> ssl.SSLContext:
    """:func:`~substrate.identity.server_context` for atunnel: HTTP/1.1 only, no renegotiation.

    substrate's default context offers ALPN ``h2`` (for gRPC); atunnel speaks HTTP/1.1, so
    a client that offers both must not be told to speak HTTP/2.
    """
    ctx = server_context(files)
    ctx.set_alpn_protocols(list(HTTP11_ALPN))
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    return ctx


# --- stats ------------------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class AtunnelStats:
    """Counters since the listener started (a snapshot)."""

    connections: int
    """Client connections that completed the TLS handshake."""
    handshake_failures: int
    """Client connections refused during the handshake (no or untrusted certificate, …)."""
    forbidden: int
    """Connections refused with 403: the client's identity is not allowed."""
    requests: int
    """Plain HTTP requests forwarded to an actor (whatever the actor answered)."""
    connects: int
    """CONNECT tunnels established."""
    upgrades: int
    """Requests the actor switched to another protocol (101)."""
    bad_requests: int
    misdirected: int
    not_found: int
    bad_gateway: int
    resets: int
    """Links in use reset by :meth:`Atunnel.abort` or :meth:`Atunnel.deactivate`."""
    open_links: int
    """Connections to actors open right now (in use or idle)."""
    reused: int = 0
    """Requests forwarded on a kept-alive connection to the actor."""
    idle_links: int = 0
    """Idle kept-alive connections to actors right now (counted in ``open_links`` too)."""
    idle_resets: int = 0
    """Idle kept-alive connections reset by :meth:`Atunnel.abort` or :meth:`Atunnel.deactivate`."""
    idle_expired: int = 0
    """Idle kept-alive connections reset because they expired or the actor closed them."""
    retries: int = 0
    """Requests sent again on a new connection after a kept-alive one broke under them."""


@attrs.define(slots=True)
class _Counters:
    connections: int = 0
    handshake_failures: int = 0
    forbidden: int = 0
    requests: int = 0
    connects: int = 0
    upgrades: int = 0
    bad_requests: int = 0
    misdirected: int = 0
    not_found: int = 0
    bad_gateway: int = 0
    resets: int = 0
    reused: int = 0
    idle_resets: int = 0
    idle_expired: int = 0
    retries: int = 0

    def refused(self, refusal: Refusal) -> None:
        match refusal.status:
            case 400:
                self.bad_requests += 1
            case 421:
                self.misdirected += 1
            case 404:
                self.not_found += 1
            case 502:
                self.bad_gateway += 1
            case 403:
                self.forbidden += 1
            case _:
                pass


# --- connections ------------------------------------------------------------------------


def _set_rst_on_close(stream: anyio.abc.AnyByteStream) -> None:
    raw = stream.extra(SocketAttribute.raw_socket, None)
    if raw is not None:
        with contextlib.suppress(OSError):
            set_rst_on_close(raw)


async def _reset(stream: anyio.abc.AnyByteStream) -> None:
    """Close ``stream`` with RST (``SO_LINGER {1, 0}``), never FIN.

    The socket is closed before the first suspension (anyio's ``aclose`` aborts the
    transport, then yields), so a caller that forgets a connection and resets it at once
    leaves no moment in which the connection is open but untracked.
    """
    _set_rst_on_close(stream)
    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
        await stream.aclose()


class _Backend:
    """A connection to an actor: its stream, and its socket (``SO_LINGER {1, 0}`` from
    birth, so closing it always resets). Kept so that the hot path needs no
    ``stream.extra()`` (which asks the kernel for both addresses every time)."""

    __slots__ = ("since", "sock", "stream")

    def __init__(self, stream: SocketStream, sock: socket.socket) -> None:
        self.stream = stream
        self.sock = sock
        self.since = 0.0
        """When it went idle (in the idle pool)."""

    def quiet(self) -> bool:
        """Whether an idle connection still looks open: nothing to read, not even EOF.

        An idle HTTP/1.1 connection has nothing to say; if its socket is readable the
        actor closed it (or sent bytes nobody asked for), and it must not carry a request.
        """
        return has_input(self.sock) is False

    def unsent(self) -> int:
        """Bytes in the send queue that the actor has not acknowledged (``SIOCOUTQ``)."""
        fd = self.sock.fileno()
        if fd == -1:
            return 0
        try:
            buf = fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0")
        except OSError:
            return 0
        return int(struct.unpack("i", buf)[0])

    async def reset(self) -> None:
        """Close with RST; the socket is closed before the first suspension (see
        :func:`_reset`)."""
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await self.stream.aclose()


@attrs.define(eq=False)
class _Client:
    """A router connection (TLS) and whether it has been reset under it."""

    tls: TLSStream
    peer: str
    reset: bool = False
    method: bytes = b""
    """The method of the request being served (a HEAD answer has no body)."""

    async def hard_close(self) -> None:
        """Reset the TCP connection under the TLS session (no close_notify, no FIN)."""
        self.reset = True
        await _reset(self.tls.transport_stream)

    async def close(self, linger: float) -> None:
        """Close after our last bytes (FIN), reading and discarding what the client still
        sends for up to ``linger`` seconds: closing with unread data would reset the
        connection and could destroy our last answer before the client has read it."""
        if self.reset:
            return
        transport = self.tls.transport_stream
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            try:
                await transport.send_eof()
                with anyio.move_on_after(linger):
                    while True:
                        await transport.receive()
            finally:
                await transport.aclose()


_PoolKey = tuple[str, int, str]
"""Where kept-alive connections of one actor lead: (host, host port, device)."""


@attrs.define(eq=False, slots=True)
class _Link:
    """One connection to an actor (made, being made or taken from the idle pool) and the
    exchange that uses it."""

    actor_uid: str
    client: _Client
    scope: anyio.CancelScope = attrs.Factory(anyio.CancelScope)
    backend: _Backend | None = None
    aborted: bool = False
    done: anyio.Event = attrs.Factory(anyio.Event)
    reused: bool = False
    """The connection came from the idle pool."""
    keep: bool = False
    """The exchange ended cleanly: the connection may go back to the idle pool."""
    stale: list[_Backend] = attrs.Factory(list)
    """Idle connections found unusable on the way, reset by the link's owner (or abort)."""


class _Gone(Exception):
    """The peer went away (EOF, reset, TLS failure) while we were reading a message."""


async def _next_event(conn: h11.Connection, stream: anyio.abc.ByteStream) -> object:
    """The next h11 event; :class:`_Gone` if the stream broke, h11 errors as they come."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        try:
            data = await stream.receive(RECEIVE_SIZE)
        except anyio.EndOfStream:
            data = b""
        except _STREAM_GONE as exc:
            raise _Gone(str(exc)) from exc
        conn.receive_data(data)


async def _connect(forward: Forward) -> _Backend:
    """A TCP connection to the actor, RST-on-close from birth, bound to its device if any.

    The caller bounds the time it may take.
    """
    sock = await connect_rst(forward.host, forward.host_port, device=forward.device)
    try:
        return _Backend(await SocketStream.from_socket(sock), sock)
    except BaseException:
        sock.close()  # linger {1, 0}: reset
        raise


@attrs.define(eq=False)
class _Exchange:
    """The state shared by the two pumps of one forwarded request."""

    request_done: anyio.Event = attrs.Factory(anyio.Event)
    client_gone: bool = False
    backend_gone: bool = False
    response_head_sent: bool = False
    response_done: bool = False
    switched: bool = False
    trailers_ok: bool = False
    status: int = 0
    replayable: bool = False
    """The request may be sent again on a new connection if the actor's broke under it
    before anything came back (a kept-alive connection and a request without a body)."""
    retry: bool = False
    """It broke so: nothing was answered, the caller sends the request again."""


# --- the listener -----------------------------------------------------------------------


class Atunnel:
    """The worker's ingress for its actors: an mTLS HTTP/1.1 + CONNECT proxy.

    Use as an async context manager; it listens from ``__aenter__`` (``port`` then holds
    the bound port, useful with ``port=0``) until ``__aexit__``, which resets every open
    connection to an actor. The routing table is driven by the worker:
    :meth:`activate` after the wakeup probes answered, :meth:`abort` right before a
    checkpoint, :meth:`deactivate` when the actor leaves the worker.

    ``allowed`` is the set of client identities that may send requests (default: the
    router of ``trust_domain``); see the module docstring for what the others get.
    """

    def __init__(
        self,
        ssl_context: ssl.SSLContext,
        *,
        host: str = "0.0.0.0",
        port: int = DEFAULT_PORT,
        trust_domain: str = DEFAULT_TRUST_DOMAIN,
        allowed: Iterable[SpiffeId | Identity] | None = None,
        handshake_timeout: float = 10.0,
        idle_timeout: float = 120.0,
        connect_timeout: float = 5.0,
        drain_timeout: float = 2.0,
        abort_timeout: float = 5.0,
        backend_idle_timeout: float = 1.0,
        backend_idle_max: int = 64,
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise InvalidArgument(f"atunnel port {port!r} must be in 0..65535")
        for what, value in (
            ("handshake_timeout", handshake_timeout),
            ("idle_timeout", idle_timeout),
            ("connect_timeout", connect_timeout),
            ("drain_timeout", drain_timeout),
            ("abort_timeout", abort_timeout),
        ):
            if not value > 0:
                raise InvalidArgument(f"atunnel {what} must be greater than 0, got {value!r}")
        if not backend_idle_timeout >= 0:
            raise InvalidArgument(
                f"atunnel backend_idle_timeout must be >= 0, got {backend_idle_timeout!r}"
            )
        if backend_idle_max < 0:
            raise InvalidArgument(f"atunnel backend_idle_max must be >= 0, got {backend_idle_max}")
        who = [Identity.router(trust_domain)] if allowed is None else list(allowed)
        self._allowed: frozenset[SpiffeId] = frozenset(
            a.spiffe_id if isinstance(a, Identity) else a for a in who
        )
        self._ssl = ssl_context
        self._host = host
        self._port = port
        self._handshake_timeout = handshake_timeout
        self._idle_timeout = idle_timeout
        self._connect_timeout = connect_timeout
        self._drain_timeout = drain_timeout
        self._abort_timeout = abort_timeout
        self._idle_keep = backend_idle_timeout
        self._idle_max = backend_idle_max if backend_idle_timeout > 0 else 0
        self._table = RouteTable()
        self._links: dict[str, set[_Link]] = {}
        self._idle: dict[str, dict[_PoolKey, list[_Backend]]] = {}
        """Kept-alive connections by actor uid and destination (the most recently used last)."""
        self._counters = _Counters()
        self._tg: TaskGroup | None = None
        self._listeners: Listeners | None = None

    # --- lifetime ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._tg is not None:
            raise RuntimeError("Atunnel is already running")
        listeners = await Listeners.bind(self._host, self._port, name="atunnel")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._listeners = listeners
        self._port = listeners.port
        listeners.serve(tg, self._serve_accepted)
        if self._idle_max:
            tg.start_soon(self._expire_idle_loop)
        log.info("atunnel.listening", host=self._host, port=self._port)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg, self._tg = self._tg, None
        assert tg is not None
        tg.cancel_scope.cancel()
        try:
            return await tg.__aexit__(exc_type, exc, tb)
        finally:
            with anyio.CancelScope(shield=True):
                for uid in list(self._idle):
                    await self._reset_idle(uid)
                if self._listeners is not None:
                    await self._listeners.aclose()
            self._listeners = None

    @property
    def port(self) -> int:
        """The bound port (the ephemeral one if constructed with ``port=0``)."""
        return self._port

    @property
    def host(self) -> str:
        return self._host

    @property
    def allowed(self) -> frozenset[SpiffeId]:
        return self._allowed

    # --- the routing table ------------------------------------------------------------

    def activate(
        self,
        actor: ActorRef,
        actor_uid: str,
        address: SandboxAddress,
        *,
        default_port: int | None = None,
    ) -> None:
        """Route requests for ``actor`` to ``address`` (call once its wakeup probes answered).

        ``default_port`` is the sandbox port of requests without ``ate-target-port`` (the
        template's first port; default: the lowest exposed port). Activating the same uid
        again updates the address and lifts a quiesce. :class:`FailedPrecondition` if the
        actor is active here under another uid; :class:`InvalidArgument` /
        :class:`NotFound` for a bad reference or a default port that is not exposed.
        """
        route = make_route(actor, actor_uid, address, default_port)
        self._table.activate(route)
        log.info(
            "atunnel.activate",
            actor=str(actor),
            actor_uid=actor_uid,
            host=address.host,
            ports=[list(p) for p in address.ports],
            device=address.device,
        )

    def quiesce(self, actor_uid: str) -> bool:
        """Refuse new requests for the actor with 421 (open connections stay); False if
        the uid is not routed here. :meth:`abort` does this and resets the connections."""
        return self._table.quiesce(actor_uid)

    async def abort(self, actor_uid: str) -> int:
        """Quiesce the actor and reset every open connection to it, on both sides.

        Call right before a checkpoint: when this returns, no connection to the actor is
        open, in use or idle (each was closed with RST, so none is in TIME_WAIT either)
        and new requests get 421 until :meth:`activate` or :meth:`deactivate`. Returns
        how many connections were reset (in use or idle).
        """
        self._table.quiesce(actor_uid)
        idle = await self._reset_idle(actor_uid)
        return idle + await self._reset_links(actor_uid)

    async def deactivate(self, actor_uid: str) -> None:
        """Remove the actor's route and reset its open connections (idempotent).

        When this returns, new requests for the actor get 421 and no connection to it is
        open; :meth:`stats` counts the connections reset.
        """
        route = self._table.remove(actor_uid)
        await self._reset_idle(actor_uid)
        await self._reset_links(actor_uid)
        if route is not None:
            log.info("atunnel.deactivate", actor=str(route.actor), actor_uid=actor_uid)

    def is_active(self, actor: ActorRef) -> bool:
        """Whether requests for ``actor`` are forwarded (routed here and not quiesced)."""
        return self._table.is_active(actor)

    def route(self, actor_uid: str) -> Route | None:
        return self._table.get(actor_uid)

    def routes(self) -> tuple[Route, ...]:
        return self._table.routes()

    def open_connections(self, actor_uid: str) -> int:
        """Connections to the actor that are open (in use or idle) or being made right now."""
        pools = self._idle.get(actor_uid)
        idle = sum(len(p) for p in pools.values()) if pools else 0
        return len(self._links.get(actor_uid, ())) + idle

    def stats(self) -> AtunnelStats:
        idle = sum(len(p) for pools in self._idle.values() for p in pools.values())
        return AtunnelStats(
            **attrs.asdict(self._counters),
            open_links=sum(len(links) for links in self._links.values()) + idle,
            idle_links=idle,
        )

    # --- links ------------------------------------------------------------------------

    def _open_link(self, actor_uid: str, client: _Client) -> _Link:
        link = _Link(actor_uid=actor_uid, client=client)
        self._links.setdefault(actor_uid, set()).add(link)
        return link

    def _take_idle(self, link: _Link, forward: Forward) -> None:
        """Give ``link`` a kept-alive connection to ``forward``'s address, if one is usable.

        Synchronous, like the link's registration: the connection goes from the idle pool
        to the link with no moment in between. Unusable ones met on the way move to
        ``link.stale``, for the link's owner (or an abort) to reset.
        """
        pools = self._idle.get(link.actor_uid)
        if pools is None:
            return
        key = (forward.host, forward.host_port, forward.device)
        idle = pools.get(key)
        if idle is None:
            return
        expired = time.monotonic() - self._idle_keep
        while idle:
            backend = idle.pop()
            if backend.since > expired and backend.quiet():
                link.backend = backend
                link.reused = True
                self._counters.reused += 1
                break
            link.stale.append(backend)
            self._counters.idle_expired += 1
        if not idle:
            del pools[key]
            if not pools:
                del self._idle[link.actor_uid]

    def _keep_idle(self, link: _Link, backend: _Backend, forward: Forward) -> bool:
        """Put ``backend`` in the idle pool if the link's exchange allows it; whether it did."""
        if not link.keep or link.aborted:
            return False
        route = self._table.get(link.actor_uid)
        if route is None or route.quiesced:  # aborted or deactivated meanwhile
            return False
        pools = self._idle.setdefault(link.actor_uid, {})
        idle = pools.setdefault((forward.host, forward.host_port, forward.device), [])
        if len(idle) >= self._idle_max:
            return False
        backend.since = time.monotonic()
        idle.append(backend)
        return True

    async def _reset_idle(self, actor_uid: str) -> int:
        """Reset every idle kept-alive connection of the actor; how many."""
        pools = self._idle.pop(actor_uid, None)
        if not pools:
            return 0
        backends = [backend for idle in pools.values() for backend in idle]
        for backend in backends:
            await backend.reset()
        self._counters.idle_resets += len(backends)
        return len(backends)

    async def _expire_idle_loop(self) -> None:
        """Reset idle connections that expired, or that their actor closed, as time goes."""
        interval = max(min(self._idle_keep / 2, 1.0), 0.01)
        while True:
            await anyio.sleep(interval)
            expired = time.monotonic() - self._idle_keep
            for uid in list(self._idle):
                for key, idle in list(self._idle.get(uid, {}).items()):
                    for backend in list(idle):
                        if backend.since > expired and backend.quiet():
                            continue
                        pools = self._idle.get(uid)
                        if pools is None or pools.get(key) is not idle or backend not in idle:
                            continue  # taken or reset meanwhile
                        # Forgotten and reset with no suspension in between (see _reset).
                        idle.remove(backend)
                        self._counters.idle_expired += 1
                        await backend.reset()
                    pools = self._idle.get(uid)
                    if pools is not None and not pools.get(key, True):
                        del pools[key]
                        if not pools:
                            del self._idle[uid]

    async def _close_link(self, link: _Link, forward: Forward | None = None) -> None:
        """Keep the link's connection for reuse (a clean exchange) or reset it, and forget
        the link.

        The link stays registered until its socket is pooled or gone, so an :meth:`abort`
        meanwhile still finds (and waits for) it.
        """
        for stale in link.stale:
            await stale.reset()
        link.stale.clear()
        if link.backend is not None and (
            forward is None or not self._keep_idle(link, link.backend, forward)
        ):
            if not link.aborted:
                # A reset discards what the actor has not acknowledged yet: at the end of
                # an exchange or tunnel, let it take everything first (briefly).
                with anyio.move_on_after(self._drain_timeout):
                    # the send queue has no readiness event to wait for: poll it
                    while link.backend.unsent() and not link.aborted:  # noqa: ASYNC110
                        await anyio.sleep(0.005)
            await link.backend.reset()
        links = self._links.get(link.actor_uid)
        if links is not None:
            links.discard(link)
            if not links:
                del self._links[link.actor_uid]
        link.done.set()

    async def _reset_links(self, actor_uid: str) -> int:
        links = list(self._links.get(actor_uid, ()))
        for link in links:
            link.aborted = True
        with anyio.CancelScope(shield=True):
            for link in links:
                if link.backend is not None:
                    await link.backend.reset()
                for stale in link.stale:
                    await stale.reset()
                await link.client.hard_close()
                link.scope.cancel()
            with anyio.move_on_after(self._abort_timeout):
                for link in links:
                    await link.done.wait()
        self._counters.resets += len(links)
        if links:
            log.info("atunnel.reset", actor_uid=actor_uid, connections=len(links))
        return len(links)

    # --- serving ----------------------------------------------------------------------

    async def _serve_accepted(self, stream: SocketStream, sock: socket.socket) -> None:
        await self._serve_connection(stream, sock)

    async def _serve_connection(
        self, stream: SocketStream, sock: socket.socket | None = None
    ) -> None:
        peer = peer_of(stream, sock)
        try:
            with anyio.fail_after(self._handshake_timeout):
                tls = await TLSStream.wrap(
                    stream, server_side=True, ssl_context=self._ssl, standard_compatible=False
                )
        except (TimeoutError, *_STREAM_GONE) as exc:
            self._counters.handshake_failures += 1
            log.info("atunnel.handshake_failed", peer=peer, error=_describe(exc))
            await _reset(stream)
            return
        self._counters.connections += 1
        client = _Client(tls=tls, peer=peer)
        try:
            if tls.extra(TLSAttribute.alpn_protocol, None) == "h2":
                log.warning("atunnel.refused_h2", peer=peer)
                return
            refusal = self._check_identity(tls)
            await self._serve_requests(client, refusal)
        finally:
            await client.close(self._drain_timeout)

    def _check_identity(self, tls: TLSStream) -> Refusal | None:
        try:
            spiffe_id = peer_spiffe_id(tls.extra(TLSAttribute.peer_certificate, None))
        except Unauthenticated as exc:
            return refusal_for(PermissionDenied(exc.description))
        if spiffe_id in self._allowed:
            return None
        return refusal_for(
            PermissionDenied(f"client identity {spiffe_id} may not send requests to atunnel")
        )

    async def _serve_requests(self, client: _Client, forbidden: Refusal | None) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        while not client.reset:
            try:
                with anyio.fail_after(self._idle_timeout):
                    event = await _next_event(conn, client.tls)
            except (TimeoutError, _Gone):
                return
            except h11.RemoteProtocolError as exc:
                await self._refuse(client, conn, Refusal(400, f"bad request: {exc}"), close=True)
                return
            if not isinstance(event, h11.Request):
                return  # ConnectionClosed (or an event h11 cannot give here)
            client.method = event.method
            if forbidden is not None:
                log.warning("atunnel.forbidden", peer=client.peer, reason=forbidden.reason)
                await self._refuse(client, conn, forbidden, close=True)
                return
            if not await self._handle(client, conn, event):
                return
            if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                conn.start_next_cycle()
                client.method = b""
            else:
                return

    async def _handle(self, client: _Client, conn: h11.Connection, request: h11.Request) -> bool:
        """Serve one request; whether the client connection may carry another."""
        started = time.monotonic()
        raw_headers = list(request.headers.raw_items())
        decision = self._table.decide(raw_headers)
        is_connect = request.method == b"CONNECT"
        if isinstance(decision, Forward) and is_connect and has_body(raw_headers):
            decision = Refusal(400, "a CONNECT request must not have content")
        if isinstance(decision, Refusal):
            self._log(request, decision.status, started, client=client, reason=decision.reason)
            return await self._refuse(client, conn, decision)
        # From the routing decision to the registration nothing awaits: abort() sees it.
        link = self._open_link(decision.route.actor_uid, client)
        if not is_connect and self._idle_max:
            self._take_idle(link, decision)  # synchronous too
        status = 0
        try:
            with link.scope:
                for stale in link.stale:
                    await stale.reset()
                link.stale.clear()
                while True:
                    if link.backend is None:
                        try:
                            with anyio.fail_after(self._connect_timeout):
                                link.backend = await _connect(decision)
                        except (TimeoutError, OSError) as exc:
                            refusal = refusal_for(
                                Unavailable(
                                    f"cannot connect to actor {decision.route.actor} port "
                                    f"{decision.port}: {_describe(exc)}"
                                )
                            )
                            status = refusal.status
                            return await self._refuse(client, conn, refusal)
                    if is_connect:
                        status = await self._tunnel(link, conn, decision)
                        return False
                    outcome = await self._exchange(link, conn, request, raw_headers, decision)
                    if outcome is not None:
                        status, reusable = outcome
                        return reusable
                    # The kept-alive connection broke before any answer: a new one.
                    self._counters.retries += 1
                    broken, link.backend, link.reused = link.backend, None, False
                    await broken.reset()
        finally:
            with anyio.CancelScope(shield=True):
                await self._close_link(link, decision)
            if link.aborted:
                status = status or 499
            self._log(request, status, started, client=client, forward=decision)
        return False  # cancelled by abort(): the client connection is gone

    async def _refuse(
        self, client: _Client, conn: h11.Connection, refusal: Refusal, *, close: bool = False
    ) -> bool:
        """Answer ``refusal``; whether the connection may carry another request."""
        self._counters.refused(refusal)
        close = close or conn.their_state is h11.ERROR
        if conn.their_state is h11.SEND_BODY and not close:
            # Read what is left of the request so the answer arrives on a clean connection.
            close = not await self._drain_request(client, conn)
        headers = [
            (b"Content-Type", b"text/plain; charset=utf-8"),
            (b"Content-Length", str(len(refusal.body)).encode()),
            *refusal.headers,
        ]
        if close:
            headers.append((b"Connection", b"close"))
        try:
            data = conn.send(h11.Response(status_code=refusal.status, headers=headers)) or b""
            if client.method != b"HEAD":
                data += conn.send(h11.Data(data=refusal.body)) or b""
            data += conn.send(h11.EndOfMessage()) or b""
            await client.tls.send(data)
        except (h11.LocalProtocolError, *_STREAM_GONE):
            return False
        return not close and conn.our_state is h11.DONE

    async def _drain_request(self, client: _Client, conn: h11.Connection) -> bool:
        """Discard the rest of the request body (briefly); whether it ended."""
        with anyio.move_on_after(self._drain_timeout):
            try:
                while True:
                    event = await _next_event(conn, client.tls)
                    if isinstance(event, h11.EndOfMessage):
                        return True
                    if not isinstance(event, h11.Data):
                        return False
            except (_Gone, h11.RemoteProtocolError):
                return False
        return False

    # --- CONNECT ----------------------------------------------------------------------

    async def _tunnel(self, link: _Link, conn: h11.Connection, forward: Forward) -> int:
        client = link.client
        assert link.backend is not None
        backend = link.backend.stream
        try:
            event = await _next_event(conn, client.tls)  # EndOfMessage: CONNECT has no body
        except (_Gone, h11.RemoteProtocolError):
            return 0
        if not isinstance(event, h11.EndOfMessage):
            return 0
        try:
            head = conn.send(
                h11.Response(status_code=200, reason=b"Connection established", headers=[])
            )
            await client.tls.send(head or b"")
        except (h11.LocalProtocolError, *_STREAM_GONE):
            return 0
        self._counters.connects += 1
        leftover, _closed = conn.trailing_data
        await _splice(client.tls, backend, to_backend=leftover)
        return 200

    # --- plain requests and upgrades ----------------------------------------------------

    async def _exchange(
        self,
        link: _Link,
        conn: h11.Connection,
        request: h11.Request,
        raw_headers: list[tuple[bytes, bytes]],
        forward: Forward,
    ) -> tuple[int, bool] | None:
        """Forward one request and its response, both streamed.

        The status answered, and whether the client connection may carry another request
        (h11's states have the last word on that); None if a kept-alive connection broke
        before anything came back and the request (complete, without a body) should be
        sent again on a new one. Sets ``link.keep`` when the connection to the actor may
        carry another request.
        """
        client = link.client
        assert link.backend is not None
        backend = link.backend.stream
        upstream = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)
        state = _Exchange()
        # A request without a body (h11 has its end already): no task to pump a body, and
        # the head and its end leave in one write.
        complete = conn.their_state is h11.DONE or not has_body(raw_headers)
        try:
            head = upstream.send(
                h11.Request(
                    method=request.method,
                    target=request.target,
                    headers=forward_request_headers(
                        raw_headers, upstream_host=f"{forward.host}:{forward.host_port}"
                    ),
                )
            )
            if complete:
                if conn.their_state is not h11.DONE:
                    event = conn.next_event()
                    if not isinstance(event, h11.EndOfMessage):  # not for a bodiless request
                        raise h11.LocalProtocolError(f"unexpected {type(event).__name__}")
                head = (head or b"") + (upstream.send(h11.EndOfMessage()) or b"")
                state.request_done.set()
                state.replayable = link.reused
            await backend.send(head or b"")
            self._counters.requests += 1
        except h11.ProtocolError as exc:
            refusal = Refusal(400, f"cannot forward this request: {exc}")
            await self._refuse(client, conn, refusal, close=True)
            return refusal.status, False
        except _STREAM_GONE as exc:
            if state.replayable:
                return None
            refusal = refusal_for(
                Unavailable(f"actor {forward.route.actor} went away: {_describe(exc)}")
            )
            await self._refuse(client, conn, refusal, close=True)
            return refusal.status, False
        if complete:
            await self._pump_response(conn, client, upstream, backend, state, forward)
            if state.retry:
                self._counters.requests -= 1  # counted once, when sent again
                return None
        else:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._pump_request, conn, client, upstream, backend, state, tg)
                await self._pump_response(conn, client, upstream, backend, state, forward)
                if state.response_done and not state.request_done.is_set():
                    # The actor answered before reading the whole body: give the client a
                    # moment to finish it, so that the connection can carry another request.
                    with anyio.move_on_after(self._drain_timeout):
                        await state.request_done.wait()
                tg.cancel_scope.cancel()
        if state.client_gone:
            return state.status, False
        if state.switched:
            self._counters.upgrades += 1
            to_backend, _ = conn.trailing_data
            to_client, _ = upstream.trailing_data
            await _splice(client.tls, backend, to_backend=to_backend, to_client=to_client)
            return state.status, False
        link.keep = (
            state.response_done
            and state.request_done.is_set()
            and not state.backend_gone
            and upstream.our_state is h11.DONE
            and upstream.their_state is h11.DONE
            and upstream.trailing_data == (b"", False)
        )
        return state.status, True

    async def _pump_request(
        self,
        conn: h11.Connection,
        client: _Client,
        upstream: h11.Connection,
        backend: SocketStream,
        state: _Exchange,
        tg: TaskGroup,
    ) -> None:
        """Client → actor: the request body, chunk by chunk, then its end (and trailers)."""
        while True:
            try:
                event = await _next_event(conn, client.tls)
            except (_Gone, h11.RemoteProtocolError):
                state.client_gone = True
                tg.cancel_scope.cancel()  # nobody to answer any more
                return
            if isinstance(event, h11.Data | h11.EndOfMessage):
                if not state.backend_gone:
                    try:
                        await backend.send(upstream.send(event) or b"")
                    except (h11.LocalProtocolError, *_STREAM_GONE):
                        state.backend_gone = True  # keep reading, to end the request cleanly
                if isinstance(event, h11.EndOfMessage):
                    state.request_done.set()
                    return
            else:  # ConnectionClosed mid-body, or PAUSED
                state.client_gone = True
                tg.cancel_scope.cancel()
                return

    async def _pump_response(
        self,
        conn: h11.Connection,
        client: _Client,
        upstream: h11.Connection,
        backend: SocketStream,
        state: _Exchange,
        forward: Forward,
    ) -> None:
        """Actor → client: informational answers, the response head, body and end.

        What h11 gives from one read of the actor's socket leaves in one write to the
        router (a small answer: head, body and end together).
        """
        pending: list[bytes] = []
        tls = client.tls
        while True:
            try:
                event = upstream.next_event()
            except h11.RemoteProtocolError as exc:
                await self._actor_failed(conn, client, state, forward, _describe(exc), pending)
                return
            if event is h11.NEED_DATA:
                if pending:
                    data = b"".join(pending)
                    pending.clear()
                    try:
                        await tls.send(data)
                    except _STREAM_GONE:
                        state.client_gone = True
                        return
                try:
                    received = await backend.receive(RECEIVE_SIZE)
                except anyio.EndOfStream:
                    received = b""
                except _STREAM_GONE as exc:
                    await self._actor_failed(conn, client, state, forward, _describe(exc), pending)
                    return
                upstream.receive_data(received)
                continue
            if isinstance(event, h11.InformationalResponse):
                switching = event.status_code == 101
                if switching:
                    # The request pump has read the (empty) body; wait for it so nothing
                    # else reads from the client once the protocols switch.
                    with anyio.move_on_after(self._drain_timeout):
                        await state.request_done.wait()
                    if not state.request_done.is_set():
                        why = "it switched protocols before the request ended"
                        await self._actor_failed(conn, client, state, forward, why, pending)
                        return
                out: h11.Event = h11.InformationalResponse(
                    status_code=event.status_code,
                    headers=forward_response_headers(
                        list(event.headers.raw_items()), switching=switching
                    ),
                    reason=event.reason,
                )
            elif isinstance(event, h11.Response):
                state.status = event.status_code
                # Trailers survive only a chunked hop; h11 frames ours chunked when the
                # actor's was chunked (no Content-Length) and the router speaks HTTP/1.1.
                state.trailers_ok = is_chunked(event.headers) and conn.their_http_version == b"1.1"
                out = h11.Response(
                    status_code=event.status_code,
                    headers=forward_response_headers(list(event.headers.raw_items())),
                    reason=event.reason,
                )
            elif isinstance(event, h11.Data):
                out = event
            elif isinstance(event, h11.EndOfMessage):
                out = event if state.trailers_ok else h11.EndOfMessage()
            else:  # ConnectionClosed before the end of the response, or PAUSED
                why = "the actor closed the connection"
                await self._actor_failed(conn, client, state, forward, why, pending)
                return
            try:
                produced = conn.send(out)
            except h11.LocalProtocolError as exc:
                why = f"bad answer: {exc}"
                await self._actor_failed(conn, client, state, forward, why, pending)
                return
            state.replayable = False  # something is on its way to the client
            if produced:
                pending.append(produced)
            if isinstance(out, h11.Response):
                state.response_head_sent = True
            elif isinstance(out, h11.EndOfMessage) or (
                isinstance(out, h11.InformationalResponse) and out.status_code == 101
            ):
                try:
                    await tls.send(b"".join(pending))
                except _STREAM_GONE:
                    state.client_gone = True
                    return
                if isinstance(out, h11.EndOfMessage):
                    state.response_done = True
                else:
                    state.status = 101
                    state.switched = True
                return

    async def _actor_failed(
        self,
        conn: h11.Connection,
        client: _Client,
        state: _Exchange,
        forward: Forward,
        why: str,
        pending: list[bytes],
    ) -> None:
        if state.replayable:
            state.retry = True  # nothing came back on a kept-alive connection: send again
            return
        if pending:
            with contextlib.suppress(*_STREAM_GONE):
                await client.tls.send(b"".join(pending))
            pending.clear()
        if state.response_head_sent:
            # Too late for a status: the only way to say "truncated" is to drop the
            # connection before the end of the message.
            state.client_gone = True
            return
        refusal = refusal_for(
            Unavailable(f"actor {forward.route.actor} port {forward.port} failed: {why}")
        )
        state.status = refusal.status
        await self._refuse(client, conn, refusal, close=True)
        state.client_gone = True  # close=True: the connection ends after this answer

    # --- logging ----------------------------------------------------------------------

    def _log(
        self,
        request: h11.Request,
        status: int,
        started: float,
        *,
        client: _Client,
        forward: Forward | None = None,
        reason: str = "",
    ) -> None:
        fields: dict[str, object] = {
            "peer": client.peer,
            "method": request.method.decode("latin-1"),
            "status": status,
            "ms": round((time.monotonic() - started) * 1000, 3),
        }
        if forward is not None:
            fields["actor"] = str(forward.route.actor)
            fields["actor_uid"] = forward.route.actor_uid
            fields["port"] = forward.port
        if reason:
            fields["reason"] = reason
        log.info("atunnel.request", **fields)


async def _splice(
    client: TLSStream, backend: SocketStream, *, to_backend: bytes = b"", to_client: bytes = b""
) -> None:
    """Copy raw bytes both ways until either side ends (or breaks)."""
    try:
        if to_backend:
            await backend.send(to_backend)
        if to_client:
            await client.send(to_client)
    except _STREAM_GONE:
        return

    async def pipe(
        src: anyio.abc.ByteStream, dst: anyio.abc.ByteStream, scope: anyio.CancelScope
    ) -> None:
        with contextlib.suppress(*_STREAM_GONE):
            while True:
                await dst.send(await src.receive(RECEIVE_SIZE))
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(pipe, client, backend, tg.cancel_scope)
        tg.start_soon(pipe, backend, client, tg.cancel_scope)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc) or type(exc).__name__
    cause = exc.__cause__
    if cause is not None and str(cause):
        text = f"{text}: {cause}" if str(exc) else str(cause)
    return text


__all__ = [
    "DEFAULT_PORT",
    "Atunnel",
    "AtunnelStats",
    "atunnel_server_context",
]
