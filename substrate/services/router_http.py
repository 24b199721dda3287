"""The router's HTTP/1.1 mechanics: client connections, CONNECT tunnels, streamed exchanges.

One task per client connection (:func:`serve_connection`) reads requests with h11, keep-alive
included. For each request it

1. reads the routing headers (404 / 400 on bad ones);
2. takes the body bytes h11 already holds, without waiting for more;
3. resolves the actor (:meth:`Router.cached`, else :meth:`Router.resolve` while a watcher
   notices a client that goes away: that cancels only this request's wait, never the
   resume);
4. forwards it over a pooled mTLS connection to the worker's atunnel: the head, then the
   body streamed while the response is streamed back (full duplex; no whole body is ever
   held), or a raw splice after ``101 Switching Protocols``.

A ``421`` with ``X-Ate-Assignment-Stale: true`` is never shown to the client: the route is
evicted, resolved again and the request sent once more. That needs the request's body:
up to ``replay_limit`` bytes of it are kept while they are forwarded, so a larger body that
was already sent cannot be replayed (503). A reused keep-alive connection that breaks before
any answer is retried once on a new connection under the same condition.

``CONNECT host:port`` is answered ``200 Connection established``; the connection then
carries plain HTTP/1.1 requests that are routed one by one, each to ``port``.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Sequence
from http import HTTPStatus
from typing import TYPE_CHECKING, Final

import anyio
import attrs
import h11
import structlog
from anyio.abc import SocketAttribute, SocketStream

from substrate.core.ids import ActorRef
from substrate.errors import InvalidArgument, SubstrateError, Unavailable, http_response
from substrate.net.routing import (
    DEFAULT_PORT,
    RETRY_AFTER_HEADER,
    DeadlineRejected,
    RequestRecord,
    RouteOutcome,
    downstream_headers,
    is_stale_answer,
    outcome_for_status,
    parse_connect_port,
    parse_request_timeout,
    parse_target_actor,
    provenance_headers,
    redact_target,
    upstream_headers,
)
from substrate.net.tunnel import is_chunked
from substrate.services.listeners import queued_seconds
from substrate.services.parking import Parked
from substrate.services.router_upstream import (
    MAX_HEAD_BYTES,
    RECEIVE_SIZE,
    STREAM_GONE,
    TunnelUnreachable,
    Upstream,
    UpstreamGone,
)
from substrate.services.tcp_state import peer_of

if TYPE_CHECKING:
    from substrate.services.router import Resolution, Router

log = structlog.get_logger("substrate.router")

_CLIENT_DONE: Final = frozenset({h11.MUST_CLOSE, h11.CLOSED})
"""h11 states of a client that sent its whole request and said it sends no other."""

DRAIN_BYTES: Final = 1 << 20
"""At most this much of an unwanted request body is read (and dropped) to keep a
connection alive after answering it ourselves."""


class ClientGone(Exception):
    """The client went away (or broke the protocol) in the middle of a request."""


class ClientConn:
    """One client connection (or the inside of its CONNECT tunnel) and its h11 state."""

    __slots__ = ("conn", "idle_scope", "method", "peer", "sock", "stream")

    def __init__(self, stream: SocketStream, peer: str, sock: socket.socket | None = None) -> None:
        self.stream = stream
        self.peer = peer
        self.sock = sock
        """The socket under ``stream`` when known (to ask the kernel when a request came)."""
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.idle_scope: anyio.CancelScope | None = None
        self.method = b""

    def close_if_idle(self) -> None:
        if self.idle_scope is not None:
            self.idle_scope.cancel()

    async def next_event(self) -> object:
        """The next h11 event; :class:`ClientGone` if the stream broke or the client sent
        something that is not HTTP/1.1."""
        conn = self.conn
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise ClientGone(f"bad request: {exc}") from exc
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await self.stream.receive(RECEIVE_SIZE)
            except anyio.EndOfStream:
                data = b""
            except STREAM_GONE as exc:
                raise ClientGone(str(exc)) from exc
            conn.receive_data(data)

    async def send(self, data: bytes) -> None:
        try:
            await self.stream.send(data)
        except STREAM_GONE as exc:
            raise ClientGone(str(exc)) from exc

    async def wait_gone(self, limit: int) -> bool:
        """Read ahead (into h11's buffer) until the client closes: True then. Gives up,
        waiting forever, once ``limit`` bytes are buffered."""
        buffered = 0
        while buffered < limit:
            try:
                data = await self.stream.receive(RECEIVE_SIZE)
            except (anyio.EndOfStream, *STREAM_GONE):
                return True
            self.conn.receive_data(data)
            buffered += len(data)
        await anyio.sleep_forever()
        return False  # pragma: no cover

    def next_cycle(self) -> bool:
        """Get ready for the next request on this connection; False if it must close."""
        conn = self.conn
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
            self.method = b""
            return True
        return False


@attrs.define(slots=True)
class _Ctx:
    """What the router remembers of one request while serving it."""

    started: float
    at: float
    method: str
    target: str
    port: int
    actor: str = ""
    status: int = 0
    outcome: RouteOutcome = RouteOutcome.ERROR
    resolution: str = ""
    worker: str = ""
    provenance: str = ""
    queued: float = 0.0
    """Seconds the request waited in the kernel before the router read it."""
    routed: float | None = None
    """Clock time a route was first in hand (after any park), None if never."""

    def resolved(self, resolution: Resolution, now: float) -> None:
        if self.routed is None:
            self.routed = now
        self.resolution = resolution.via
        self.worker = str(resolution.route.worker)
        if resolution.result is not None:
            self.provenance = resolution.result.provenance

    def record(self, now: float) -> RequestRecord:
        return RequestRecord(
            at=self.at,
            method=self.method,
            target=self.target,
            actor=self.actor,
            port=self.port,
            status=self.status,
            outcome=self.outcome,
            seconds=max(now - self.started, 0.0),
            queued_seconds=self.queued,
            route_seconds=None if self.routed is None else max(self.routed - self.started, 0.0),
            resolution=self.resolution,
            worker=self.worker,
            provenance=self.provenance,
        )


# --- the connection ------------------------------------------------------------------------


async def serve_connection(
    router: Router, stream: SocketStream, sock: socket.socket | None = None
) -> None:
    """Serve one client connection until it closes (or the router stops).

    ``sock`` is the socket under ``stream``, if the caller has it: with it, each request's
    clock starts when its bytes reached the host (:func:`queued_seconds`), not when the
    router got around to reading them, so the park budget and the request timeout bound
    what the client waits even when a burst keeps the router busy.
    """
    client = ClientConn(stream, peer_of(stream, sock), sock)
    port, tunneled = DEFAULT_PORT, False
    router.client_opened(client)
    try:
        while True:
            request = await _next_request(router, client)
            if request is None:
                return
            if isinstance(request, ClientGone):
                await _bad_request(router, client, str(request))
                return
            router.request_started()
            queued = 0.0 if client.sock is None else queued_seconds(client.sock)
            ctx = _Ctx(
                started=router.clock() - queued,
                at=time.time() - queued,
                method=request.method.decode("latin-1"),
                target=redact_target(request.target.decode("latin-1")),
                port=port,
                queued=queued,
            )
            client.method = request.method
            keep = False
            try:
                if request.method == b"CONNECT":
                    inner = await _connect(router, client, request, ctx, tunneled=tunneled)
                    if inner is not None:
                        trailing, closed = client.conn.trailing_data
                        router.client_closed(client)
                        client = ClientConn(stream, client.peer, client.sock)
                        router.client_opened(client)
                        if trailing:  # (h11 takes b"" for "the peer closed")
                            client.conn.receive_data(trailing)
                        if closed:
                            client.conn.receive_data(b"")
                        port, tunneled, keep = inner, True, True
                        continue
                else:
                    keep = await _handle(router, client, request, port, ctx)
            except ClientGone:
                ctx.outcome = RouteOutcome.CANCELLED
                keep = False
            finally:
                router.request_finished(ctx.record(router.clock()))
            if not keep or not client.next_cycle():
                return
    except Exception:  # a bug in one connection must not take the router down
        log.exception("router.connection_failed", peer=client.peer)
    finally:
        router.client_closed(client)
        done = client.conn.their_state in _CLIENT_DONE and not client.conn.trailing_data[0]
        await _close(stream, router.config.linger, done=done, sock=client.sock)


async def _next_request(router: Router, client: ClientConn) -> h11.Request | ClientGone | None:
    """The next request's head; None when the connection should end quietly."""
    if router.draining:
        return None
    with anyio.move_on_after(router.config.idle_timeout) as scope:
        client.idle_scope = scope  # a drain cancels it to close an idle connection
        try:
            event = await client.next_event()
        except ClientGone as exc:
            if client.conn.their_state is h11.ERROR:
                return exc
            return None
        finally:
            client.idle_scope = None
        if isinstance(event, h11.Request):
            return event
    return None


async def _bad_request(router: Router, client: ClientConn, why: str) -> None:
    """Answer a request h11 could not parse (its head is unusable: raw bytes, then close)."""
    router.request_started()
    now = router.clock()
    ctx = _Ctx(started=now, at=time.time(), method="?", target="?", port=0)
    ctx.status, ctx.outcome = 400, RouteOutcome.BAD_REQUEST
    body = f"{why}\n".encode("utf-8", "replace")
    head = (
        b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    with contextlib.suppress(ClientGone):
        await client.send(head + body)
    router.request_finished(ctx.record(router.clock()))


async def _close(
    stream: SocketStream, linger: float, *, done: bool = False, sock: socket.socket | None = None
) -> None:
    """Close after our last bytes: FIN, then read and drop what the client still sends for
    up to ``linger`` seconds (closing with unread data would reset the connection and could
    destroy our last answer before the client read it).

    ``done``: the client said it sends nothing more (``Connection: close`` on a request we
    read to its end). Then, as nginx's lingering-close heuristic does, the linger is
    skipped when nothing is pending, and the connection is closed at once: nothing unread
    means no reset. Most one-shot clients end this way, and in a burst the linger's extra
    wakeups per connection are a noticeable part of the router's work.
    """
    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
        try:
            await stream.send_eof()
            if done and _nothing_pending(stream, sock):
                return
            with anyio.move_on_after(linger):
                while True:
                    await stream.receive(RECEIVE_SIZE)
        finally:
            await stream.aclose()


def _nothing_pending(stream: SocketStream, sock: socket.socket | None) -> bool:
    """Whether the client's side has no unread bytes for us (or has closed)."""
    try:
        if sock is None:
            sock = stream.extra(SocketAttribute.raw_socket)
        return not sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True
    except OSError:
        return False


# --- answering ourselves ----------------------------------------------------------------------


async def _refuse(
    router: Router,
    client: ClientConn,
    ctx: _Ctx,
    status: int,
    text: str,
    *,
    extra: Sequence[tuple[bytes, bytes]] = (),
    close: bool = False,
) -> bool:
    """Answer the request ourselves; whether the connection may carry another request."""
    conn = client.conn
    ctx.status = status
    ctx.outcome = outcome_for_status(status)
    if conn.our_state is not h11.SEND_RESPONSE:
        return False
    close = close or router.draining or conn.their_state is h11.ERROR
    if conn.their_state is h11.SEND_BODY and not close:
        close = not await _drain_request(router, client)
    body = f"{text}\n".encode("utf-8", "replace")
    headers = [
        (b"Content-Type", b"text/plain; charset=utf-8"),
        (b"Content-Length", str(len(body)).encode()),
        *extra,
    ]
    if close or conn.their_state is h11.MUST_CLOSE:
        # The connection ends with this answer, so h11's state no longer matters: write the
        # bytes directly (h11's header validation is most of a refusal's cost in a burst).
        await client.send(
            _closing_response(status, headers, b"" if client.method == b"HEAD" else body)
        )
        return False
    try:
        data = conn.send(h11.Response(status_code=status, headers=headers)) or b""
        if client.method != b"HEAD":
            data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
    except h11.LocalProtocolError:
        return False
    await client.send(data)
    return not close and _sent_all(conn)


def _closing_response(status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> bytes:
    """An answer we wrote ourselves, ending with ``Connection: close`` (all values are ours)."""
    try:
        reason = HTTPStatus(status).phrase.encode()
    except ValueError:
        reason = b""
    lines = [b"HTTP/1.1 %d %s" % (status, reason)]
    lines += [name + b": " + value for name, value in headers]
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _sent_all(conn: h11.Connection) -> bool:
    return conn.our_state is h11.DONE


async def _refuse_error(
    router: Router, client: ClientConn, ctx: _Ctx, error: BaseException, actor: str
) -> bool:
    """Answer a failed resolution through the one HTTP mapping (:func:`http_response`)."""
    status, text = http_response(error, actor)
    extra: list[tuple[bytes, bytes]] = []
    if status == 503:
        seconds = error.retry_after if isinstance(error, DeadlineRejected) else 1
        extra.append((RETRY_AFTER_HEADER, str(seconds).encode()))
    return await _refuse(router, client, ctx, status, text, extra=extra)


async def _drain_request(router: Router, client: ClientConn) -> bool:
    """Read and drop the rest of the request body (briefly); whether it ended."""
    taken = 0
    with anyio.move_on_after(router.config.linger):
        try:
            while taken <= DRAIN_BYTES:
                event = await client.next_event()
                if isinstance(event, h11.EndOfMessage):
                    return True
                if not isinstance(event, h11.Data):
                    return False
                taken += len(event.data)
        except ClientGone:
            return False
    return False


# --- the request ------------------------------------------------------------------------------


class _Body:
    """The request body as h11 events: what is not yet sent upstream, and a replay copy."""

    __slots__ = ("client", "complete", "limit", "retained", "size", "unsent")

    def __init__(self, client: ClientConn, limit: int) -> None:
        self.client = client
        self.limit = limit
        self.unsent: list[h11.Data | h11.EndOfMessage] = []
        self.retained: list[h11.Data | h11.EndOfMessage] | None = []
        self.size = 0
        self.complete = False

    @property
    def replayable(self) -> bool:
        return self.retained is not None

    def _take(self, event: object) -> h11.Data | h11.EndOfMessage:
        if isinstance(event, h11.EndOfMessage):
            self.complete = True
        elif isinstance(event, h11.Data):
            self.size += len(event.data)
        else:
            raise ClientGone("the client ended the connection in the middle of its request")
        if self.retained is not None:
            if self.size > self.limit:
                self.retained = None
            else:
                self.retained.append(event)
        return event

    def take_buffered(self) -> None:
        """Take the body events h11 can give without reading from the client."""
        conn = self.client.conn
        while not self.complete:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise ClientGone(f"bad request body: {exc}") from exc
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            self.unsent.append(self._take(event))

    async def next(self) -> h11.Data | h11.EndOfMessage:
        """The next body event from the client (kept for replay while it fits)."""
        return self._take(await self.client.next_event())

    def rewind(self) -> None:
        """Send everything again on the next attempt (only while :attr:`replayable`)."""
        assert self.retained is not None
        self.unsent = list(self.retained)

    def take_unsent(self) -> list[h11.Data | h11.EndOfMessage]:
        unsent, self.unsent = self.unsent, []
        return unsent


async def _handle(
    router: Router, client: ClientConn, request: h11.Request, port: int, ctx: _Ctx
) -> bool:
    """Serve one plain request; whether the connection may carry another."""
    headers = request.headers.raw_items()
    try:
        actor = parse_target_actor(headers)
    except InvalidArgument as exc:
        return await _refuse(router, client, ctx, 404, exc.description)
    ctx.actor = str(actor)
    try:
        timeout = parse_request_timeout(headers)
    except InvalidArgument as exc:
        return await _refuse(router, client, ctx, 400, exc.description)
    deadline = None if timeout is None else ctx.started + timeout
    body = _Body(client, router.config.replay_limit)
    body.take_buffered()
    resolution = router.cached(actor)
    if resolution is None:
        try:
            resolution = await _resolve_watching(
                router, client, actor, deadline, arrived=ctx.started
            )
        except SubstrateError as exc:
            return await _refuse_error(router, client, ctx, exc, ctx.actor)
    return await _forward(router, client, request, headers, body, actor, port, resolution, ctx)


async def _resolve_watching(
    router: Router,
    client: ClientConn,
    actor: ActorRef,
    deadline: float | None,
    *,
    arrived: float | None = None,
) -> Resolution:
    """:meth:`Router.resolve`, given up (only for this request) if the client goes away.

    A request answered without waiting (shed at a full lot, a deadline that cannot be
    met) is answered before anything is set up to watch the client: in a burst most
    requests end that way, and the watcher is the most expensive part of a request.
    """
    begun = router.begin_resolve(actor, deadline=deadline, arrived=arrived)
    if not isinstance(begun, Parked):
        return begun
    result: Resolution | None = None
    error: SubstrateError | None = None
    gone = False
    try:
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                nonlocal gone
                if await client.wait_gone(router.config.replay_limit):
                    gone = True
                    tg.cancel_scope.cancel()

            tg.start_soon(watch)
            try:
                result = await begun.wait()
            except SubstrateError as exc:
                error = exc
            finally:
                tg.cancel_scope.cancel()
    finally:
        begun.cancel()
    if error is not None:
        raise error
    if result is None or gone:
        raise ClientGone("the client went away while its actor was being resolved")
    return result


@attrs.frozen(slots=True)
class _Broken:
    """The atunnel connection failed before any answer reached the client."""

    reason: str
    reused: bool


class _Stale:
    """atunnel answered 421 + ``X-Ate-Assignment-Stale``."""


_STALE: Final = _Stale()


async def _forward(
    router: Router,
    client: ClientConn,
    request: h11.Request,
    headers: Sequence[tuple[bytes, bytes]],
    body: _Body,
    actor: ActorRef,
    port: int,
    resolution: Resolution,
    ctx: _Ctx,
) -> bool:
    """Send the request to the actor's atunnel (retrying a stale route or a dead reused
    connection once) and its answer back; whether the client connection may continue."""
    up_headers = upstream_headers(headers, actor, port)
    stale_retry = True
    unreachable_retry = True
    fresh = False
    while True:
        ctx.resolved(resolution, router.clock())
        extra = () if resolution.result is None else provenance_headers(resolution.result)
        try:
            upstream, route = await router.connect(resolution.route, fresh=fresh)
        except TunnelUnreachable as exc:
            # The worker is gone (connect() forgot the route). A cached or last-known route
            # is not the last word: resolve once more, which parks until ateapi answers.
            if resolution.via == "resume" or not unreachable_retry or not body.replayable:
                return await _refuse_error(router, client, ctx, exc, ctx.actor)
            unreachable_retry = False
            try:
                resolution = await _resolve_watching(router, client, actor, None)
            except SubstrateError as again:
                return await _refuse_error(router, client, ctx, again, ctx.actor)
            continue
        except SubstrateError as exc:
            return await _refuse_error(router, client, ctx, exc, ctx.actor)
        outcome = await _exchange(router, client, upstream, request, up_headers, body, extra, ctx)
        if isinstance(outcome, bool):
            return outcome
        if isinstance(outcome, _Stale):
            router.stale(route)
            if not stale_retry or not body.replayable:
                error = Unavailable(f"the assignment of actor {actor} changed; retry")
                return await _refuse_error(router, client, ctx, error, ctx.actor)
            stale_retry, fresh = False, False
            body.rewind()
            cached = router.cached(actor)
            if cached is None:
                try:
                    cached = await _resolve_watching(router, client, actor, None)
                except SubstrateError as exc:
                    return await _refuse_error(router, client, ctx, exc, ctx.actor)
            resolution = cached
            continue
        if outcome.reused and not fresh and body.replayable:
            fresh = True
            body.rewind()
            continue
        error = Unavailable(f"lost the connection to worker {route.worker}: {outcome.reason}")
        return await _refuse_error(router, client, ctx, error, ctx.actor)


@attrs.define(slots=True)
class _Duplex:
    done: anyio.Event = attrs.Factory(anyio.Event)
    client_gone: bool = False
    upstream_broken: bool = False


async def _exchange(
    router: Router,
    client: ClientConn,
    up: Upstream,
    request: h11.Request,
    up_headers: list[tuple[bytes, bytes]],
    body: _Body,
    extra: Sequence[tuple[bytes, bytes]],
    ctx: _Ctx,
) -> bool | _Stale | _Broken:
    """One try of the request on ``up``; the connection is released or closed here."""
    keep_upstream = False
    try:
        try:
            data = up.conn.send(
                h11.Request(method=request.method, target=request.target, headers=up_headers)
            )
            out = [data or b""]
            out += [up.conn.send(event) or b"" for event in body.take_unsent()]
        except h11.LocalProtocolError as exc:
            return await _refuse(router, client, ctx, 400, f"cannot forward: {exc}", close=True)
        try:
            await up.send(b"".join(out))
        except UpstreamGone as exc:
            return _Broken(str(exc), up.reused)
        if body.complete:
            result = await _relay(router, client, up, body, extra, ctx, None)
        else:
            duplex = _Duplex()
            gone: ClientGone | None = None
            async with anyio.create_task_group() as tg:
                tg.start_soon(_pump, up, body, duplex, tg.cancel_scope)
                try:
                    result = await _relay(router, client, up, body, extra, ctx, duplex)
                    if result is True and not body.complete:
                        # Answered before the whole request arrived: let the client finish
                        # (briefly), so that the connection can carry another request.
                        with anyio.move_on_after(router.config.linger):
                            await duplex.done.wait()
                except ClientGone as exc:
                    gone = exc
                finally:
                    tg.cancel_scope.cancel()
            if gone is not None or duplex.client_gone:
                raise gone or ClientGone("the client went away while sending its request")
        keep_upstream = result is True and body.complete
        return result
    finally:
        if keep_upstream:
            router.release(up)
        else:
            await up.aclose()


async def _pump(up: Upstream, body: _Body, duplex: _Duplex, scope: anyio.CancelScope) -> None:
    """Client → atunnel: the request body, event by event, as it arrives."""
    try:
        while not body.complete:
            event = await body.next()
            try:
                await up.send(up.conn.send(event) or b"")
            except (UpstreamGone, h11.LocalProtocolError):
                duplex.upstream_broken = True
                return
    except ClientGone:
        duplex.client_gone = True
        scope.cancel()
    finally:
        duplex.done.set()


async def _relay(
    router: Router,
    client: ClientConn,
    up: Upstream,
    body: _Body,
    extra: Sequence[tuple[bytes, bytes]],
    ctx: _Ctx,
    duplex: _Duplex | None,
) -> bool | _Stale | _Broken:
    """atunnel → client: informational answers, the head, the body and its end.

    Returns whether the client connection may carry another request, :data:`_STALE`, or
    :class:`_Broken` if atunnel failed before the client got anything. A failure after the
    head was sent cuts the client connection (the only way left to say "truncated").
    """
    cconn = client.conn
    upconn = up.conn
    out: list[bytes] = []
    head_sent = False
    trailers_ok = False
    while True:
        event: object
        try:
            event = upconn.next_event()
        except h11.RemoteProtocolError as exc:
            event = exc
        if event is h11.NEED_DATA:
            if out and not up.readable():
                await client.send(b"".join(out))
                out.clear()
            try:
                data = await up.stream.receive(RECEIVE_SIZE)
            except anyio.EndOfStream:
                data = b""
            except STREAM_GONE as exc:
                event = UpstreamGone(str(exc))
            else:
                upconn.receive_data(data)
                continue
        if isinstance(event, h11.Response):
            raw = event.headers.raw_items()
            if is_stale_answer(event.status_code, raw):
                return _STALE
            ctx.status = event.status_code
            ctx.outcome = RouteOutcome.OK
            trailers_ok = is_chunked(raw) and cconn.their_http_version == b"1.1"
            try:
                out.append(
                    cconn.send(
                        h11.Response(
                            status_code=event.status_code,
                            headers=downstream_headers(raw, extra=extra, close=router.draining),
                            reason=event.reason,
                        )
                    )
                    or b""
                )
            except h11.LocalProtocolError as exc:
                return _Broken(f"unusable answer: {exc}", False)
            head_sent = True
        elif isinstance(event, h11.Data):
            out.append(cconn.send(event) or b"")
        elif isinstance(event, h11.EndOfMessage):
            end = event if trailers_ok else h11.EndOfMessage()
            out.append(cconn.send(end) or b"")
            await client.send(b"".join(out))
            return True
        elif isinstance(event, h11.InformationalResponse):
            if event.status_code == 101:
                return await _switch(router, client, up, body, event, ctx, duplex, out)
            if cconn.their_http_version == b"1.1":
                informational = h11.InformationalResponse(
                    status_code=event.status_code,
                    headers=downstream_headers(event.headers.raw_items()),
                    reason=event.reason,
                )
                out.append(cconn.send(informational) or b"")
        else:  # the connection broke or closed before the end of the answer
            reason = str(event) if isinstance(event, Exception) else "atunnel closed the connection"
            if head_sent:
                if out:
                    with contextlib.suppress(ClientGone):
                        await client.send(b"".join(out))
                return False
            return _Broken(reason, up.reused)


async def _switch(
    router: Router,
    client: ClientConn,
    up: Upstream,
    body: _Body,
    event: h11.InformationalResponse,
    ctx: _Ctx,
    duplex: _Duplex | None,
    out: list[bytes],
) -> bool:
    """The actor switched protocols (e.g. WebSocket): pass the 101 on, then splice bytes."""
    if duplex is not None and not body.complete:
        with anyio.move_on_after(router.config.linger):
            await duplex.done.wait()
    if not body.complete:
        return False  # a request still sending its body cannot switch: give up
    ctx.status, ctx.outcome = 101, RouteOutcome.OK
    head = client.conn.send(
        h11.InformationalResponse(
            status_code=101,
            headers=downstream_headers(event.headers.raw_items(), switching=True),
            reason=event.reason,
        )
    )
    await client.send(b"".join(out) + (head or b""))
    to_up, _ = client.conn.trailing_data
    to_client, _ = up.conn.trailing_data
    await splice(client.stream, up.stream, to_up=to_up, to_client=to_client)
    return False


async def splice(
    a: anyio.abc.ByteStream, b: anyio.abc.ByteStream, *, to_up: bytes = b"", to_client: bytes = b""
) -> None:
    """Copy raw bytes both ways between client ``a`` and atunnel ``b`` until either ends."""
    try:
        if to_up:
            await b.send(to_up)
        if to_client:
            await a.send(to_client)
    except STREAM_GONE:
        return

    async def pipe(src: anyio.abc.ByteStream, dst: anyio.abc.ByteStream) -> None:
        with contextlib.suppress(*STREAM_GONE):
            while True:
                await dst.send(await src.receive(RECEIVE_SIZE))
        tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(pipe, a, b)
        tg.start_soon(pipe, b, a)


# --- CONNECT ----------------------------------------------------------------------------------


async def _connect(
    router: Router, client: ClientConn, request: h11.Request, ctx: _Ctx, *, tunneled: bool
) -> int | None:
    """Answer ``CONNECT host:port`` with 200; the port its tunnel routes to (None: refused)."""
    ctx.port = 0
    if tunneled:
        text = "CONNECT inside a CONNECT tunnel is not supported"
        await _refuse(router, client, ctx, 400, text, close=True)
        return None
    try:
        port = parse_connect_port(request.target)
    except InvalidArgument as exc:
        await _refuse(router, client, ctx, 400, exc.description, close=True)
        return None
    ctx.port = port
    event = await client.next_event()
    if not isinstance(event, h11.EndOfMessage):
        await _refuse(router, client, ctx, 400, "a CONNECT request has no content", close=True)
        return None
    response = h11.Response(status_code=200, headers=[], reason=b"Connection established")
    await client.send(client.conn.send(response) or b"")
    ctx.status, ctx.outcome = 200, RouteOutcome.OK
    return port


__all__ = ["ClientConn", "ClientGone", "serve_connection", "splice"]
