"""Calling an actor over HTTP through the router: :func:`call_actor` and its blocking twin.

The router listens for plain HTTP/1.1 and routes each request by its
``ate-target-actor: <atespace>/<name>`` header, resuming the actor if it is suspended.
A request to the actor's port 80 is sent as is; one to another port goes inside a
``CONNECT 127.0.0.1:<port>`` tunnel, which the router routes to that port.

.. code-block:: python

    answer = await call_actor("http://127.0.0.1:8080", "demo/counter-1")
    print(answer.status, answer.provenance, answer.text)

The answer carries the router's restore provenance headers after a resume
(``X-Ate-Restored-From``: ``local`` | ``durable`` | ``tag`` | ``cold-boot``,
``X-Ate-Snapshot-Generation``, ``X-Ate-Snapshot-Age-Seconds``,
``X-Ate-Resume-Duration-Seconds``); :attr:`ActorResponse.provenance` collects them.
Connection failures raise :class:`~substrate.errors.Unavailable`, a call that takes longer
than ``timeout`` :class:`~substrate.errors.DeadlineExceeded`; an HTTP error status is an
answer, not an exception.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from typing import Final
from urllib.parse import urlsplit

import anyio
import attrs
import h11
from anyio.abc import SocketStream

from substrate.core.ids import ActorRef
from substrate.errors import DeadlineExceeded, InvalidArgument, Unavailable

TARGET_ACTOR_HEADER: Final = "ate-target-actor"
PROVENANCE_PREFIX: Final = "x-ate-"
"""Response headers the router adds after a resume (and atunnel's ``x-ate-*`` answers)."""
DEFAULT_HTTP_TIMEOUT: Final = 60.0
"""Seconds a call may take, a cold boot of a gVisor sandbox included."""
MAX_RESPONSE_BYTES: Final = 64 << 20
_RECEIVE: Final = 65536
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
        TARGET_ACTOR_HEADER,
    }
)


@attrs.frozen(slots=True, kw_only=True)
class ActorResponse:
    """One HTTP answer through the router."""

    status: int
    reason: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    """Names lower-cased, in the order received."""
    body: bytes = b""
    elapsed: float = 0.0
    """Seconds from connecting to the router to the end of the answer."""

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        wanted = name.lower()
        return next((v for k, v in self.headers if k == wanted), None)

    @property
    def provenance(self) -> dict[str, str]:
        """The ``x-ate-*`` headers: the restore provenance after a resume."""
        return {k: v for k, v in self.headers if k.startswith(PROVENANCE_PREFIX)}

    @property
    def restored_from(self) -> str | None:
        """``local``, ``durable``, ``tag`` or ``cold-boot`` when the call resumed the actor."""
        return self.header("x-ate-restored-from")

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def parse_router_url(url: str) -> tuple[str, int]:
    """``http://host:port``, ``host:port`` or ``http://host`` (port 80) → (host, port)."""
    text = url if "://" in url else f"http://{url}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise InvalidArgument(f"router URL {url!r} is invalid: {exc}") from None
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
        raise InvalidArgument(f"router URL {url!r} must be http://host:port")
    return parts.hostname, port or 80


def _actor(value: ActorRef | str) -> ActorRef:
    return value if isinstance(value, ActorRef) else ActorRef.parse(value)


def request_headers(
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None,
) -> list[tuple[str, str]]:
    """End-to-end headers of ``headers``: hop-by-hop ones, Host and the routing header dropped."""
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or ())
    return [(k, v) for k, v in pairs if k.lower() not in _HOP_BY_HOP]


async def _read_response(
    conn: h11.Connection, stream: SocketStream, *, head_only: bool = False
) -> tuple[h11.Response, bytes]:
    response: h11.Response | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive(_RECEIVE)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                data = b""
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Response):
            response = event
            if head_only:
                return response, b""
        elif isinstance(event, h11.InformationalResponse):
            continue
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_RESPONSE_BYTES:
                raise Unavailable(f"the answer is larger than {MAX_RESPONSE_BYTES} bytes")
        elif isinstance(event, h11.EndOfMessage | h11.PAUSED):
            if response is None:
                raise Unavailable("the router closed the connection without an answer")
            return response, bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            raise Unavailable("the router closed the connection before the answer ended")


async def _exchange(
    host: str,
    port: int,
    actor: ActorRef,
    path: str,
    method: str,
    body: bytes,
    headers: list[tuple[str, str]],
    target_port: int | None,
) -> tuple[h11.Response, bytes]:
    try:
        stream = await anyio.connect_tcp(host, port)
    except OSError as exc:
        raise Unavailable(f"cannot reach the router at {host}:{port}: {exc}") from exc
    async with stream:
        leftover = b""
        if target_port is not None and target_port != 80:
            tunnel = h11.Connection(h11.CLIENT)
            authority = f"127.0.0.1:{target_port}"
            await stream.send(
                tunnel.send(
                    h11.Request(
                        method="CONNECT",
                        target=authority,
                        headers=[("Host", authority), (TARGET_ACTOR_HEADER, str(actor))],
                    )
                )
            )
            answer, answer_body = await _read_response(tunnel, stream, head_only=True)
            if not 200 <= answer.status_code < 300:
                _, answer_body = await _read_response(tunnel, stream)
                return answer, answer_body
            leftover = tunnel.trailing_data[0]
        conn = h11.Connection(h11.CLIENT)
        if leftover:
            conn.receive_data(leftover)
        head = [
            ("Host", f"{host}:{port}"),
            (TARGET_ACTOR_HEADER, str(actor)),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
            *request_headers(headers),
        ]
        try:
            data = conn.send(h11.Request(method=method, target=path, headers=head))
            if body:
                data += conn.send(h11.Data(data=body))
            data += conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError as exc:
            raise InvalidArgument(f"cannot send that request: {exc}") from None
        await stream.send(data)
        return await _read_response(conn, stream)


async def call_actor(
    router: str,
    actor: ActorRef | str,
    path: str = "/",
    *,
    method: str = "GET",
    body: bytes | str = b"",
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
    port: int | None = None,
    timeout: float = DEFAULT_HTTP_TIMEOUT,  # noqa: ASYNC109 (the whole call's deadline)
) -> ActorResponse:
    """Send one HTTP request to ``actor`` through the router at ``router``.

    ``path`` is the request target (``/``, ``/items?x=1``); ``port`` the actor's port
    (default 80). The router resumes a suspended actor first (and answers 503/504 if it
    cannot within its park budget).
    """
    host, router_port = parse_router_url(router)
    ref = _actor(actor)
    if not path.startswith("/"):
        raise InvalidArgument(f"path {path!r} must start with '/'")
    if not method or not method.isalpha() or not method.isupper():
        raise InvalidArgument(f"method {method!r} must be an upper-case HTTP method")
    if port is not None and not 1 <= port <= 65535:
        raise InvalidArgument(f"port {port} must be in 1..65535")
    payload = body.encode() if isinstance(body, str) else bytes(body)
    started = time.perf_counter()
    try:
        with anyio.fail_after(timeout):
            response, data = await _exchange(
                host, router_port, ref, path, method, payload, list(headers_of(headers)), port
            )
    except TimeoutError:
        raise DeadlineExceeded(
            f"no answer from {ref} through {host}:{router_port} within {timeout:g}s"
        ) from None
    except (OSError, anyio.BrokenResourceError, h11.RemoteProtocolError) as exc:
        raise Unavailable(f"request to {ref} through {host}:{router_port} failed: {exc}") from exc
    return ActorResponse(
        status=response.status_code,
        reason=response.reason.decode("latin-1") or _phrase(response.status_code),
        headers=tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers),
        body=data,
        elapsed=time.perf_counter() - started,
    )


def headers_of(
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None,
) -> Iterable[tuple[str, str]]:
    if headers is None:
        return ()
    return headers.items() if isinstance(headers, Mapping) else headers


def call_actor_sync(
    router: str,
    actor: ActorRef | str,
    path: str = "/",
    *,
    method: str = "GET",
    body: bytes | str = b"",
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
    port: int | None = None,
    timeout: float = DEFAULT_HTTP_TIMEOUT,
) -> ActorResponse:
    """:func:`call_actor`, blocking (runs its own event loop; not from async code)."""

    async def run() -> ActorResponse:
        return await call_actor(
            router,
            actor,
            path,
            method=method,
            body=body,
            headers=headers,
            port=port,
            timeout=timeout,
        )

    return anyio.run(run)


__all__ = [
    "DEFAULT_HTTP_TIMEOUT",
    "PROVENANCE_PREFIX",
    "TARGET_ACTOR_HEADER",
    "ActorResponse",
    "call_actor",
    "call_actor_sync",
    "parse_router_url",
    "request_headers",
]
