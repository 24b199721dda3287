"""atunnel's decisions, without I/O: routing headers, hop-by-hop filtering, the route table.

The worker's atunnel listener (:mod:`substrate.services.atunnel`) receives every request
for the worker's actors from the router. Each request names its actor with the header
``ate-target-actor: <atespace>/<name>`` and optionally a port with ``ate-target-port``.
This module decides, for one request head, where it goes or why it is refused, and which
headers travel on to the actor:

* :func:`parse_target` reads the routing headers (:class:`~substrate.errors.InvalidArgument`
  on a missing, repeated or malformed one);
* :class:`RouteTable` holds the actors active on this worker and :meth:`RouteTable.decide`
  turns a request head into a :class:`Forward` or a :class:`Refusal` (400, 404, 421);
* :func:`forward_request_headers` / :func:`forward_response_headers` drop the routing
  headers and the hop-by-hop ones (RFC 9110 §7.6.1), keeping ``Host`` exactly as sent and
  ``Upgrade`` + ``Connection: upgrade`` when a protocol switch (e.g. WebSocket) is asked for;
* :func:`refusal_for` maps substrate's typed errors to an HTTP status and a text body.

Headers are ``(name, value)`` byte pairs as h11 gives them (names in any case).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final

import attrs

from substrate.core.ids import ActorRef
from substrate.errors import (
    HTTP_STATUS,
    FailedPrecondition,
    GrpcCode,
    InvalidArgument,
    NotFound,
    SubstrateError,
)
from substrate.sandbox.spec import SandboxAddress

TARGET_ACTOR_HEADER: Final = b"ate-target-actor"
"""``<atespace>/<name>`` of the actor a request is for (required)."""
TARGET_PORT_HEADER: Final = b"ate-target-port"
"""The sandbox port to forward to (optional; default: the route's default port)."""
STALE_HEADER: Final = b"X-Ate-Assignment-Stale"
"""Sent with 421: the router's cached assignment of the actor to this worker is stale."""
ROUTING_HEADERS: Final = frozenset({TARGET_ACTOR_HEADER, TARGET_PORT_HEADER})

HOP_BY_HOP: Final = frozenset(
    {b"connection", b"proxy-connection", b"keep-alive", b"te", b"transfer-encoding", b"upgrade"}
)
"""Fields that describe one connection only (RFC 9110 §7.6.1), besides those named in
``Connection``. ``Transfer-Encoding`` is dropped here and the framing is redone per hop."""

_PROTECTED: Final = frozenset({b"host", b"content-length"})
"""Never dropped, even if a peer lists them in ``Connection`` (they frame or route)."""

_PORT_RE: Final = re.compile(rb"[0-9]{1,5}")

# Statuses the tunnel adds to errors.HTTP_STATUS (which is the router's resume table).
STATUS_BAD_REQUEST: Final = 400
STATUS_MISDIRECTED: Final = 421
STATUS_BAD_GATEWAY: Final = 502
_TUNNEL_STATUS: Final[dict[GrpcCode, int]] = {
    GrpcCode.INVALID_ARGUMENT: STATUS_BAD_REQUEST,
    GrpcCode.UNAVAILABLE: STATUS_BAD_GATEWAY,
}
"""Overrides of :data:`~substrate.errors.HTTP_STATUS` for a proxy: a malformed request is
400, and an actor that cannot be reached is the gateway's failure (502), not a resume
failure (503)."""


# --- the routing headers --------------------------------------------------------------


@attrs.frozen(slots=True)
class Target:
    """What the routing headers of one request ask for."""

    actor: ActorRef
    port: int | None = None
    """The sandbox port, or None for the route's default port."""


def _values(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    return [value for key, value in headers if key.lower() == name]


def parse_target(headers: Iterable[tuple[bytes, bytes]]) -> Target:
    """The actor and port named by ``headers``; :class:`InvalidArgument` if malformed.

    ``ate-target-actor`` must appear exactly once, as ``<atespace>/<name>`` (two DNS-1123
    labels); ``ate-target-port``, if present, exactly once, as a decimal in 1..65535.
    """
    pairs = list(headers)
    actor_name = TARGET_ACTOR_HEADER.decode()
    actors = _values(pairs, TARGET_ACTOR_HEADER)
    if not actors:
        raise InvalidArgument(
            f"missing {actor_name} header: every request through atunnel must name its "
            f"actor with '{actor_name}: <atespace>/<name>'"
        )
    if len(actors) > 1:
        raise InvalidArgument(f"the {actor_name} header must appear exactly once")
    try:
        text = actors[0].decode("ascii").strip()
    except UnicodeDecodeError:
        raise InvalidArgument(f"the {actor_name} header must be ASCII") from None
    try:
        actor = ActorRef.parse(text)
    except InvalidArgument as exc:
        raise InvalidArgument(f"the {actor_name} header is invalid: {exc.description}") from None
    port_name = TARGET_PORT_HEADER.decode()
    ports = _values(pairs, TARGET_PORT_HEADER)
    if not ports:
        return Target(actor)
    if len(ports) > 1:
        raise InvalidArgument(f"the {port_name} header must appear at most once")
    raw = ports[0].strip()
    if not _PORT_RE.fullmatch(raw) or not 1 <= int(raw) <= 65535:
        shown = raw.decode("ascii", "replace")
        raise InvalidArgument(
            f"the {port_name} header {shown!r} is invalid: it must be a port number in 1..65535"
        )
    return Target(actor, int(raw))


# --- hop-by-hop filtering -------------------------------------------------------------


def connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """The lower-cased options of every ``Connection`` field."""
    tokens: set[bytes] = set()
    for value in _values(headers, b"connection"):
        tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return frozenset(tokens)


def upgrade_requested(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether ``headers`` ask for a protocol switch (``Upgrade`` + ``Connection: upgrade``)."""
    pairs = list(headers)
    return bool(_values(pairs, b"upgrade")) and b"upgrade" in connection_tokens(pairs)


def is_chunked(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether the message body is chunked (the last transfer coding is ``chunked``)."""
    codings = [
        c.strip().lower()
        for value in _values(headers, b"transfer-encoding")
        for c in value.split(b",")
        if c.strip()
    ]
    return bool(codings) and codings[-1] == b"chunked"


def has_body(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a request with ``headers`` carries content (chunked or a non-zero length)."""
    pairs = list(headers)
    if _values(pairs, b"transfer-encoding"):
        return True
    return any(v.strip() not in (b"", b"0") for v in _values(pairs, b"content-length"))


def _end_to_end(
    headers: Sequence[tuple[bytes, bytes]], extra_drop: frozenset[bytes]
) -> list[tuple[bytes, bytes]]:
    drop = (HOP_BY_HOP | extra_drop | connection_tokens(headers)) - _PROTECTED
    return [(name, value) for name, value in headers if name.lower() not in drop]


def _upgrade_fields(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    fields = [(b"Upgrade", value) for value in _values(headers, b"upgrade")]
    return [*fields, (b"Connection", b"upgrade")] if fields else []


def forward_request_headers(
    headers: Sequence[tuple[bytes, bytes]], *, upstream_host: str = ""
) -> list[tuple[bytes, bytes]]:
    """The headers of a request as forwarded to the actor.

    Drops the routing headers, the hop-by-hop fields and every field named in
    ``Connection``; keeps the order, the names' case and ``Host`` exactly as sent. A chunked
    body stays chunked (``Transfer-Encoding: chunked`` is set again for the next hop), and
    a protocol switch keeps ``Upgrade`` and ``Connection: upgrade``. A request without
    ``Host`` (HTTP/1.0) gets ``upstream_host`` if it is given.
    """
    out = _end_to_end(headers, ROUTING_HEADERS)
    if is_chunked(headers):
        out.append((b"Transfer-Encoding", b"chunked"))
    if upgrade_requested(headers):
        out += _upgrade_fields(headers)
    if upstream_host and not _values(headers, b"host"):
        out.insert(0, (b"Host", upstream_host.encode("ascii")))
    return out


def forward_response_headers(
    headers: Sequence[tuple[bytes, bytes]], *, switching: bool = False
) -> list[tuple[bytes, bytes]]:
    """The headers of the actor's response as sent back to the router.

    Drops the hop-by-hop fields and those named in ``Connection`` (the framing is redone
    for this hop: ``Content-Length`` is kept, a chunked or close-delimited body is
    re-framed); a ``101 Switching Protocols`` (``switching``) keeps ``Upgrade`` and
    ``Connection: upgrade``. The routing headers are dropped here too, so an actor cannot
    smuggle them back.
    """
    out = _end_to_end(headers, ROUTING_HEADERS)
    if switching:
        out += _upgrade_fields(headers)
    return out


# --- refusals ---------------------------------------------------------------------------


@attrs.frozen(slots=True)
class Refusal:
    """A request atunnel answers itself: a status, a text body and extra headers."""

    status: int
    reason: str
    headers: tuple[tuple[bytes, bytes], ...] = ()

    @property
    def body(self) -> bytes:
        return f"{self.reason}\n".encode()

    @property
    def stale(self) -> bool:
        """Whether this is the "actor not here" answer (421 + ``X-Ate-Assignment-Stale``)."""
        return self.status == STATUS_MISDIRECTED


def refusal_for(error: SubstrateError) -> Refusal:
    """The answer to a request that failed with ``error`` (its description is the body).

    InvalidArgument is 400 and Unavailable 502 (:data:`_TUNNEL_STATUS`); everything else
    follows :data:`substrate.errors.HTTP_STATUS` (NotFound 404, PermissionDenied 403,
    Unauthenticated 401, DeadlineExceeded 504, …) and is 500 if unlisted.
    """
    code = error.code
    status = _TUNNEL_STATUS.get(code, HTTP_STATUS.get(code, 500))
    return Refusal(status, error.description or "error")


def misdirected(actor: ActorRef | str) -> Refusal:
    """421 with ``X-Ate-Assignment-Stale: true``: the actor is not active on this worker."""
    return Refusal(
        STATUS_MISDIRECTED,
        f"actor {actor} is not active on this worker",
        ((STALE_HEADER, b"true"),),
    )


# --- the route table --------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class Route:
    """An actor active on this worker, and where its workload listens."""

    actor: ActorRef
    actor_uid: str
    address: SandboxAddress
    default_port: int
    """The sandbox port a request without ``ate-target-port`` goes to."""
    quiesced: bool = False
    """Set while the actor is being checkpointed: new requests are refused with 421."""


@attrs.frozen(slots=True, kw_only=True)
class Forward:
    """Forward the request to ``host:host_port`` (bound to ``device`` if set)."""

    route: Route
    port: int
    """The sandbox port asked for."""
    host: str
    host_port: int
    device: str = ""


def make_route(
    actor: ActorRef, actor_uid: str, address: SandboxAddress, default_port: int | None = None
) -> Route:
    """A validated route; ``default_port`` defaults to the lowest exposed sandbox port."""
    actor.validate()
    if not isinstance(actor_uid, str) or not actor_uid:
        raise InvalidArgument("actor uid is required to activate an actor")
    if not address.ports:
        raise InvalidArgument(f"actor {actor} exposes no port at {address.host}")
    port = address.ports[0][0] if default_port is None else default_port
    address.host_port(port)  # NotFound if the default port is not exposed
    return Route(actor=actor, actor_uid=actor_uid, address=address, default_port=port)


class RouteTable:
    """The actors active on one worker, by uid and by reference (one uid per reference)."""

    def __init__(self) -> None:
        self._by_uid: dict[str, Route] = {}
        self._by_ref: dict[ActorRef, str] = {}

    def __len__(self) -> int:
        return len(self._by_uid)

    def routes(self) -> tuple[Route, ...]:
        return tuple(self._by_uid.values())

    def get(self, actor_uid: str) -> Route | None:
        return self._by_uid.get(actor_uid)

    def route_of(self, actor: ActorRef) -> Route | None:
        uid = self._by_ref.get(actor)
        return None if uid is None else self._by_uid[uid]

    def activate(self, route: Route) -> None:
        """Add ``route`` (or replace the one of the same uid, which lifts a quiesce).

        :class:`FailedPrecondition` if the actor is routed here under another uid, or the
        uid belongs to another actor: deactivate the old incarnation first.
        """
        other_uid = self._by_ref.get(route.actor)
        if other_uid is not None and other_uid != route.actor_uid:
            raise FailedPrecondition(
                f"actor {route.actor} is already active on this worker as uid {other_uid}; "
                "deactivate it first"
            )
        existing = self._by_uid.get(route.actor_uid)
        if existing is not None and existing.actor != route.actor:
            raise FailedPrecondition(
                f"actor uid {route.actor_uid} is active on this worker as {existing.actor}, "
                f"not {route.actor}"
            )
        self._by_uid[route.actor_uid] = attrs.evolve(route, quiesced=False)
        self._by_ref[route.actor] = route.actor_uid

    def quiesce(self, actor_uid: str) -> bool:
        """Refuse new requests for the actor (421) until it is activated again.

        False if the uid is not routed here.
        """
        route = self._by_uid.get(actor_uid)
        if route is None:
            return False
        self._by_uid[actor_uid] = attrs.evolve(route, quiesced=True)
        return True

    def remove(self, actor_uid: str) -> Route | None:
        """Drop the actor's route; the route it had, or None."""
        route = self._by_uid.pop(actor_uid, None)
        if route is not None and self._by_ref.get(route.actor) == actor_uid:
            del self._by_ref[route.actor]
        return route

    def is_active(self, actor: ActorRef) -> bool:
        """Whether requests for ``actor`` are forwarded (routed here and not quiesced)."""
        route = self.route_of(actor)
        return route is not None and not route.quiesced

    def resolve(self, target: Target) -> Forward | Refusal:
        """Where ``target`` goes: 421 if the actor is not active, 404 if the port is not
        exposed, else a :class:`Forward`."""
        route = self.route_of(target.actor)
        if route is None or route.quiesced:
            return misdirected(target.actor)
        port = route.default_port if target.port is None else target.port
        try:
            host_port = route.address.host_port(port)
        except NotFound:
            return refusal_for(NotFound(f"actor {target.actor} exposes no port {port}"))
        return Forward(
            route=route,
            port=port,
            host=route.address.host,
            host_port=host_port,
            device=route.address.device,
        )

    def decide(self, headers: Iterable[tuple[bytes, bytes]]) -> Forward | Refusal:
        """The fate of a request with ``headers``: 400 on bad routing headers, else
        :meth:`resolve`."""
        try:
            target = parse_target(headers)
        except InvalidArgument as exc:
            return refusal_for(exc)
        return self.resolve(target)


__all__ = [
    "HOP_BY_HOP",
    "ROUTING_HEADERS",
    "STALE_HEADER",
    "STATUS_BAD_GATEWAY",
    "STATUS_BAD_REQUEST",
    "STATUS_MISDIRECTED",
    "TARGET_ACTOR_HEADER",
    "TARGET_PORT_HEADER",
    "Forward",
    "Refusal",
    "Route",
    "RouteTable",
    "Target",
    "connection_tokens",
    "forward_request_headers",
    "forward_response_headers",
    "has_body",
    "is_chunked",
    "make_route",
    "misdirected",
    "parse_target",
    "refusal_for",
    "upgrade_requested",
]
