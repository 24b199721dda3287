"""A keep-alive HTTP/1.1 client over any anyio byte stream, for tests (h11 underneath).

Used against the router (plain TCP) and atunnel (mutual TLS): the tests need raw control
(any header, several requests on one connection, 1xx answers skipped) that the SDK's
one-shot :func:`substrate.client.http.call_actor` deliberately does not offer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import anyio
import attrs
import h11
from anyio.abc import ByteStream

TIMEOUT: Final = 10.0
DEFAULT_HOST: Final = "actor.example"


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()


class H11Client:
    """Requests one after another on ``stream``; each answer read to its end."""

    def __init__(self, stream: ByteStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    async def send(self, event: h11.Event) -> None:
        await self.stream.send(self.conn.send(event) or b"")

    async def event(self) -> object:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await self.stream.receive()
            except anyio.EndOfStream:
                data = b""
            self.conn.receive_data(data)

    async def response(self) -> Reply:
        status, headers, body = 0, {}, bytearray()
        while True:
            event = await self.event()
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode().lower(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
                    self.conn.start_next_cycle()
                return Reply(status, headers, bytes(body))
            else:
                raise AssertionError(f"unexpected {event!r}")

    async def request(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> Reply:
        """One request (a ``host`` header is added if missing) and its whole answer."""
        all_headers = list(headers)
        if not any(k.lower() == "host" for k, _ in all_headers):
            all_headers.insert(0, ("host", DEFAULT_HOST))
        if body:
            all_headers.append(("content-length", str(len(body))))
        with anyio.fail_after(TIMEOUT):
            await self.send(h11.Request(method=method, target=target, headers=all_headers))
            if body:
                await self.send(h11.Data(data=body))
            await self.send(h11.EndOfMessage())
            return await self.response()

    async def get(self, actor: object | None, path: str = "/", **extra: str) -> Reply:
        """GET ``path`` of ``actor`` (``ate-target-actor``; None: no such header);
        ``extra`` are more headers, ``_`` in their names written as ``-``."""
        headers = [] if actor is None else [("ate-target-actor", str(actor))]
        headers += [(k.replace("_", "-"), v) for k, v in extra.items()]
        return await self.request("GET", path, headers)


__all__ = ["DEFAULT_HOST", "TIMEOUT", "H11Client", "Reply"]
