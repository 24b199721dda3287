"""A tiny HTTP/1.1 server for daemons' admin endpoints (/readyz, /metrics, /statusz)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import anyio
import h11
import structlog
from anyio.abc import SocketStream

log = structlog.get_logger("substrate.admin")


class AdminResponse:
    __slots__ = ("body", "content_type", "status")

    def __init__(self, status: int, body: bytes | str, content_type: str = "text/plain") -> None:
        self.status = status
        self.body = body.encode() if isinstance(body, str) else body
        self.content_type = content_type


Handler = Callable[[str], Awaitable[AdminResponse]]
"""Gets the request target (path and query) and answers."""


async def serve_admin(
    listener: anyio.abc.Listener[SocketStream], routes: Mapping[str, Handler]
) -> None:
    """Serve ``routes`` (by path) on ``listener`` until cancelled."""

    async def handle(stream: SocketStream) -> None:
        async with stream:
            conn = h11.Connection(h11.SERVER)
            while True:
                try:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        with anyio.fail_after(30):
                            data = await stream.receive(65536)
                        conn.receive_data(data)
                        continue
                except (anyio.EndOfStream, anyio.BrokenResourceError, TimeoutError):
                    return
                except h11.RemoteProtocolError:
                    return
                if isinstance(event, h11.Request):
                    target = event.target.decode("latin-1")
                    path = target.split("?", 1)[0]
                    handler = routes.get(path)
                    if handler is None:
                        resp = AdminResponse(404, "not found\n")
                    else:
                        try:
                            resp = await handler(target)
                        except Exception as exc:  # an admin page must never kill the daemon
                            log.exception("admin handler failed", path=path)
                            resp = AdminResponse(500, f"error: {type(exc).__name__}\n")
                    headers = [
                        ("content-type", resp.content_type),
                        ("content-length", str(len(resp.body))),
                    ]
                    try:
                        await stream.send(
                            conn.send(h11.Response(status_code=resp.status, headers=headers))
                        )
                        await stream.send(conn.send(h11.Data(data=resp.body)))
                        await stream.send(conn.send(h11.EndOfMessage()))
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        return
                elif isinstance(event, h11.ConnectionClosed):
                    return
                elif (
                    isinstance(event, h11.EndOfMessage)
                    and conn.our_state is h11.DONE
                    and conn.their_state is h11.DONE
                ):
                    try:
                        conn.start_next_cycle()
                    except h11.LocalProtocolError:
                        return
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return

    await listener.serve(handle)


__all__ = ["AdminResponse", "Handler", "serve_admin"]
