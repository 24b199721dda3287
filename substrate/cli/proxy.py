"""``ate proxy``: a local plain-HTTP port whose requests go to one actor through the router.

Each request is read whole (head and body), sent with :func:`substrate.client.call_actor`
(the ``ate-target-actor`` header added, the actor resumed by the router if needed) and
the answer written back whole, so the proxy suits request/response traffic, not streams
or upgrades. Keep-alive is supported on the local side.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import h11
from anyio.abc import SocketStream

from substrate.client.http import call_actor, request_headers
from substrate.core.ids import ActorRef
from substrate.errors import SubstrateError

MAX_BODY = 64 << 20


async def _read_request(
    conn: h11.Connection, stream: SocketStream
) -> tuple[h11.Request, bytes] | None:
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            try:
                conn.receive_data(await stream.receive())
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                conn.receive_data(b"")
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                raise h11.RemoteProtocolError("request body too large", error_status_hint=413)
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            return request, bytes(body)
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None


async def _respond(
    conn: h11.Connection,
    stream: SocketStream,
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
    reason: str = "",
) -> None:
    head = [*headers, ("Content-Length", str(len(body)))]
    data = conn.send(h11.Response(status_code=status, headers=head, reason=reason))
    if body:
        data += conn.send(h11.Data(data=body))
    data += conn.send(h11.EndOfMessage())
    await stream.send(data)


async def _serve(
    stream: SocketStream,
    router: str,
    actor: ActorRef,
    target_port: int | None,
    log: Callable[[str], None],
) -> None:
    conn = h11.Connection(h11.SERVER)
    async with stream:
        while True:
            try:
                got = await _read_request(conn, stream)
            except h11.RemoteProtocolError as exc:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await _respond(conn, stream, exc.error_status_hint, [], str(exc).encode())
                return
            except (anyio.BrokenResourceError, OSError):
                return
            if got is None:
                return
            request, body = got
            path = request.target.decode("latin-1")
            method = request.method.decode("ascii")
            try:
                answer = await call_actor(
                    router,
                    actor,
                    path,
                    method=method,
                    body=body,
                    headers=request_headers(
                        (k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers
                    ),
                    port=target_port,
                )
            except SubstrateError as exc:
                log(f"{method} {path} -> 502 ({exc.code.name}: {exc.description})")
                await _respond(
                    conn,
                    stream,
                    502,
                    [("Content-Type", "text/plain")],
                    f"{exc.code.name}: {exc.description}\n".encode(),
                )
            else:
                restored = answer.restored_from
                log(
                    f"{method} {path} -> {answer.status} ({answer.elapsed:.3f}s"
                    f"{f', restored from {restored}' if restored else ''})"
                )
                try:
                    await _respond(
                        conn,
                        stream,
                        answer.status,
                        request_headers(answer.headers),
                        answer.body,
                        answer.reason,
                    )
                except (anyio.BrokenResourceError, OSError):
                    return
            if conn.our_state is h11.MUST_CLOSE:
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return


async def serve_proxy(
    router: str,
    actor: ActorRef,
    *,
    host: str,
    port: int,
    target_port: int | None,
    log: Callable[[str], None],
    ready: Callable[[int], None],
) -> None:
    """Serve until cancelled; ``ready(bound_port)`` is called once listening."""
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
    async with listener:
        bound = listener.listeners[0].extra(anyio.abc.SocketAttribute.local_port)
        ready(int(bound))

        async def handle(stream: SocketStream) -> None:
            await _serve(stream, router, actor, target_port, log)

        await listener.serve(handle)


__all__ = ["serve_proxy"]
