"""ateapi's gRPC server: both servicers, per-RPC authorization by mTLS identity, health.

:func:`build_server` returns a :class:`grpclib.server.Server` carrying the Control and
WorkerRegistry servicers, the gRPC health service (when ``grpclib.health``'s protobuf
runtime is installed) and a ``RecvRequest`` listener that authorizes every call before it
runs:

1. the peer's certificate (``RecvRequest.peer.cert()``, verified by TLS against our CA) must
   carry one SPIFFE id of a known kind in the server's trust domain, else UNAUTHENTICATED;
   a caller without a certificate is allowed only on an ``insecure`` (plaintext) server;
2. :func:`substrate.api.authz.authorize` decides from the table (PERMISSION_DENIED when the
   identity may not call the method);
3. the decision is recorded for the handler (:func:`substrate.api.servicers.acting_as`), so
   the registry can scope an atelet to its node's workers.

TLS itself refuses a client without a certificate, or with one from another CA: the
handshake fails and the connection is dropped before any RPC (clients see a lost
connection; :mod:`substrate.client` reports it as UNAVAILABLE).

:func:`serving` binds a socket, starts the server with the ``ssl`` context and closes it on
exit; use it (or ``server.start(..., ssl=ssl)`` with the same context) to serve.
"""

from __future__ import annotations

import functools
import socket
import ssl as _ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

import attrs
import betterproto
import structlog
from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.events import RecvRequest, listen
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from substrate.api.authz import authorize
from substrate.api.servicers import Caller, ControlServicer, RegistryServicer, acting_as
from substrate.errors import GrpcCode, SubstrateError
from substrate.identity.spiffe import DEFAULT_TRUST_DOMAIN, Identity, validate_trust_domain
from substrate.identity.tls import peer_identity
from substrate.services.actors import ActorService

log = structlog.get_logger("substrate.api")


_WIRE_VARINT, _WIRE_FIXED64, _WIRE_LEN, _WIRE_FIXED32 = 0, 1, 2, 5
_WIRE_OF: Final[Mapping[str, int]] = {
    **dict.fromkeys(
        (
            betterproto.TYPE_INT32,
            betterproto.TYPE_INT64,
            betterproto.TYPE_UINT32,
            betterproto.TYPE_UINT64,
            betterproto.TYPE_SINT32,
            betterproto.TYPE_SINT64,
            betterproto.TYPE_BOOL,
            betterproto.TYPE_ENUM,
        ),
        _WIRE_VARINT,
    ),
    **dict.fromkeys(
        (betterproto.TYPE_FIXED64, betterproto.TYPE_SFIXED64, betterproto.TYPE_DOUBLE),
        _WIRE_FIXED64,
    ),
    **dict.fromkeys(
        (betterproto.TYPE_FIXED32, betterproto.TYPE_SFIXED32, betterproto.TYPE_FLOAT),
        _WIRE_FIXED32,
    ),
    **dict.fromkeys(
        (
            betterproto.TYPE_STRING,
            betterproto.TYPE_BYTES,
            betterproto.TYPE_MESSAGE,
            betterproto.TYPE_MAP,
        ),
        _WIRE_LEN,
    ),
}
_MAX_DEPTH: Final = 32


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    for n in range(10):
        if i + n >= len(data):
            raise ValueError("truncated varint")
        byte = data[i + n]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + n + 1
        shift += 7
    raise ValueError("varint longer than 10 bytes")


@attrs.frozen(slots=True)
class _Field:
    name: str
    wire: int | None
    """The wire type of the declared type (None: unknown to this check)."""
    repeated: bool
    nested: type[betterproto.Message] | None
    """The message (or map entry) type of a length-delimited nested field."""


@functools.cache
def _schema(message_type: type[betterproto.Message]) -> Mapping[int, _Field]:
    meta = betterproto.ProtoClassMetadata(message_type)
    default = message_type()
    fields = {}
    for number, name in meta.field_name_by_number.items():
        proto_type = meta.meta_by_field_name[name].proto_type
        nested = (
            meta.cls_by_field[name]
            if proto_type in (betterproto.TYPE_MESSAGE, betterproto.TYPE_MAP)
            else None
        )
        fields[number] = _Field(
            name=name,
            wire=_WIRE_OF.get(proto_type),
            repeated=isinstance(getattr(default, name), list),
            nested=nested,
        )
    return fields


def check_wire_format(data: bytes, message_type: type[betterproto.Message], depth: int = 0) -> None:
    """Raise ``ValueError`` unless ``data`` is well-formed for ``message_type``.

    betterproto's decoder is lenient: a truncated field, a group, or a known field sent with
    another wire type decodes into a message with wrongly typed (or None) fields instead of
    failing. This check walks the encoding first: every field is complete, uses a valid
    wire type and, when known, the wire type of its declared type (packed or not for
    repeated numbers); nested messages and map entries are checked the same way.
    """
    if depth > _MAX_DEPTH:
        raise ValueError("message nested too deeply")
    schema = _schema(message_type)
    i, end = 0, len(data)
    while i < end:
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 0x7
        if number == 0:
            raise ValueError("field number 0")
        payload = b""
        if wire == _WIRE_VARINT:
            _, i = _varint(data, i)
        elif wire == _WIRE_FIXED64:
            i += 8
        elif wire == _WIRE_FIXED32:
            i += 4
        elif wire == _WIRE_LEN:
            length, i = _varint(data, i)
            payload, i = data[i : i + length], i + length
        else:
            raise ValueError(f"field {number} has the unsupported wire type {wire}")
        if i > end:
            raise ValueError(f"field {number} is truncated")
        field = schema.get(number)
        if field is None:
            continue  # unknown fields are skipped, as protobuf requires
        packed = wire == _WIRE_LEN and field.repeated and field.wire != _WIRE_LEN
        if field.wire is not None and wire != field.wire and not packed:
            raise ValueError(f"field {field.name} has wire type {wire}, expected {field.wire}")
        if field.nested is not None:
            check_wire_format(payload, field.nested, depth + 1)


class RequestCodec(ProtoCodec):
    """The protobuf codec, answering malformed requests INVALID_ARGUMENT (not UNKNOWN).

    betterproto requests are checked with :func:`check_wire_format` before they are decoded
    (the health service's messages are Google protobuf ones, decoded strictly already).
    """

    def decode(self, data: bytes, message_type: Any) -> Any:
        try:
            if isinstance(message_type, type) and issubclass(message_type, betterproto.Message):
                check_wire_format(data, message_type)
            return super().decode(data, message_type)
        except Exception as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, "malformed request message") from exc


@attrs.frozen(slots=True)
class Authorizer:
    """The ``RecvRequest`` listener: authenticate, authorize, record the caller."""

    trust_domain: str
    insecure: bool

    def caller_identity(self, peercert: dict[str, Any] | None) -> Identity | None:
        """The caller's identity; None without TLS; raises Unauthenticated when unusable."""
        if peercert is None:
            return None
        return peer_identity(peercert, trust_domain=self.trust_domain)

    async def __call__(self, event: RecvRequest) -> None:
        try:
            identity = self.caller_identity(event.peer.cert())
        except SubstrateError as exc:
            log.info("unauthenticated call", method=event.method_name, error=exc.description)
            raise GRPCError(Status.UNAUTHENTICATED, exc.description) from None
        decision = authorize(identity, event.method_name, insecure=self.insecure)
        if not decision.allowed:
            log.info(
                "call refused",
                method=event.method_name,
                caller=str(identity) if identity else None,
                code=decision.code.name,
            )
            status = (
                Status.UNAUTHENTICATED
                if decision.code is GrpcCode.UNAUTHENTICATED
                else Status.PERMISSION_DENIED
            )
            raise GRPCError(status, decision.message)
        caller = Caller(identity=identity, decision=decision)
        handler = event.method_func

        async def as_caller(stream: Stream[Any, Any]) -> None:
            with acting_as(caller):
                await handler(stream)

        event.method_func = as_caller


def _health_handlers() -> list[Any]:
    try:
        from grpclib.health.service import Health
    except ImportError:  # the protobuf runtime is not installed: no health service
        return []
    return [Health()]


def build_server(
    service: ActorService,
    *,
    ssl: _ssl.SSLContext | None,
    insecure: bool = False,
    trust_domain: str = DEFAULT_TRUST_DOMAIN,
    health: bool = True,
) -> Server:
    """A grpclib server for ``service``; start it with the same ``ssl`` context.

    Exactly one of ``ssl`` (which must require client certificates) and ``insecure=True``
    must be given: plaintext is never the default.
    """
    validate_trust_domain(trust_domain)
    if ssl is None and not insecure:
        raise ValueError("a TLS context is required (plaintext needs insecure=True)")
    if ssl is not None and insecure:
        raise ValueError("insecure=True serves plaintext; do not pass a TLS context")
    if ssl is not None and ssl.protocol is _ssl.PROTOCOL_TLS_CLIENT:
        raise ValueError("the TLS context is a client context; build one with server_context()")
    if ssl is not None and ssl.verify_mode is not _ssl.CERT_REQUIRED:
        raise ValueError("the server TLS context must require client certificates")
    handlers: list[Any] = [ControlServicer(service), RegistryServicer(service)]
    if health:
        handlers += _health_handlers()
    server = Server(handlers, codec=RequestCodec())
    listen(server, RecvRequest, Authorizer(trust_domain=trust_domain, insecure=insecure))
    return server


@attrs.frozen(slots=True)
class Serving:
    """A started server and the address it listens on."""

    server: Server
    host: str
    port: int

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def _listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``.

    Made with an explicit ``IPPROTO_TCP``: grpclib sets TCP_NODELAY only on sockets that
    say so, and without it every small response waits for a delayed ACK (~40 ms).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


@asynccontextmanager
async def started(
    server: Server, host: str, port: int, *, ssl: _ssl.SSLContext | None
) -> AsyncIterator[Serving]:
    """Start ``server`` on ``host:port`` (0 picks a free port); close it when the block exits."""
    sock = _listen_socket(host, port)
    bound = int(sock.getsockname()[1])
    try:
        await server.start(sock=sock, ssl=ssl)
    except BaseException:
        sock.close()
        raise
    try:
        yield Serving(server=server, host=host, port=bound)
    finally:
        server.close()
        await server.wait_closed()


@asynccontextmanager
async def serving(
    service: ActorService,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    ssl: _ssl.SSLContext | None,
    insecure: bool = False,
    trust_domain: str = DEFAULT_TRUST_DOMAIN,
    health: bool = True,
) -> AsyncIterator[Serving]:
    """Serve ``service`` on ``host:port`` (0 picks a free port) until the block exits."""
    server = build_server(
        service, ssl=ssl, insecure=insecure, trust_domain=trust_domain, health=health
    )
    async with started(server, host, port, ssl=ssl) as running:
        yield running


__all__ = ["Authorizer", "RequestCodec", "Serving", "build_server", "serving", "started"]
