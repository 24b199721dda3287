"""The async SDK: :class:`AteClient`, typed calls to ateapi's Control API over mTLS."""

from __future__ import annotations

import asyncio
import os
import ssl
from asyncio.trsock import TransportSocket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Final, TypeVar, TypeVarTuple

import anyio
import betterproto
from cryptography import x509
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.exceptions import ProtocolError, StreamTerminatedError

from substrate.api import convert, pb
from substrate.api.status import substrate_errors
from substrate.core.ids import ActorRef, Labels, TagRef, TemplateRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorTemplate,
    Atespace,
    ResumeResult,
    SuspendMode,
    Tag,
    Worker,
)
from substrate.errors import (
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    SubstrateError,
    Unauthenticated,
    Unavailable,
)
from substrate.identity.ca import spiffe_ids_of
from substrate.identity.files import TlsFiles
from substrate.identity.spiffe import Identity, SpiffeId
from substrate.identity.tls import PeerCert, check_peer, client_context

DEFAULT_TIMEOUT: Final = 30.0
"""Seconds a call may take unless the client is told otherwise."""
DEFAULT_TLS_NAME: Final = "client"
"""The bundle name (``<name>.crt``/``<name>.key``) looked up in ``tls_dir``."""

CLOSE_WAIT: Final = 2.0
"""Seconds a closing client waits for its TLS connection to shut down."""

_CONTROL: Final = "/substrate.v1.Control/"

_Reply = TypeVar("_Reply", bound=betterproto.Message)
_T = TypeVar("_T")
_Args = TypeVarTuple("_Args")
_Ref = TypeVar("_Ref", ActorRef, TemplateRef, TagRef)


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port)."""
    if address.startswith("["):
        host, sep, rest = address[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        ok = bool(sep and host)
    else:
        host, _, port_text = address.rpartition(":")
        ok = bool(host) and ":" not in host
    if not ok or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidArgument(f"address {address!r} must be host:port")
    return host, int(port_text)


def _scoped(value: _Ref | str, cls: type[_Ref], what: str) -> _Ref:
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        atespace, sep, name = value.partition("/")
        if sep and atespace and name and "/" not in name:
            return cls(atespace=atespace, name=name)
    raise InvalidArgument(f"{what} {value!r} must be a {cls.__name__} or '<atespace>/<name>'")


def _actor(value: ActorRef | str) -> pb.ObjectRef:
    return convert.object_ref_to_proto(_scoped(value, ActorRef, "actor"))


def _template(value: TemplateRef | str) -> pb.ObjectRef:
    return convert.object_ref_to_proto(_scoped(value, TemplateRef, "template"))


def _tag(value: TagRef | str) -> pb.ObjectRef:
    return convert.object_ref_to_proto(_scoped(value, TagRef, "tag"))


def _worker(value: WorkerRef | str) -> str:
    return value.name if isinstance(value, WorkerRef) else value


def _labels(value: Labels | Mapping[str, str] | None) -> dict[str, str]:
    if value is None:
        return {}
    return convert.labels_to_proto(value if isinstance(value, Labels) else Labels(value))


def _tls_files(
    tls_dir: str | os.PathLike[str] | None,
    name: str,
    cert: str | os.PathLike[str] | None,
    key: str | os.PathLike[str] | None,
    ca: str | os.PathLike[str] | None,
) -> TlsFiles:
    if tls_dir is not None:
        files = TlsFiles.in_dir(tls_dir, name)
    elif cert is None or key is None or ca is None:
        raise InvalidArgument("mTLS needs tls_dir, or all of cert, key and ca (or insecure=True)")
    else:
        files = TlsFiles(cert=Path(cert), key=Path(key), ca=Path(ca))
    files = TlsFiles(
        cert=Path(cert) if cert is not None else files.cert,
        key=Path(key) if key is not None else files.key,
        ca=Path(ca) if ca is not None else files.ca,
    )
    missing = files.missing()
    if missing:
        raise InvalidArgument(f"TLS files not found: {', '.join(str(p) for p in missing)}")
    return files


def _default_server_id(files: TlsFiles) -> SpiffeId:
    """``spiffe://<trust-domain>/ateapi``, the trust domain read from the CA certificate."""
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    for uri in spiffe_ids_of(ca):
        spiffe_id = SpiffeId.parse(uri)
        if not spiffe_id.path:
            return Identity.ateapi(spiffe_id.trust_domain).spiffe_id
    raise InvalidArgument(
        f"the CA certificate {files.ca} names no SPIFFE trust domain; pass server_id"
    )


async def isolated(fn: Callable[[*_Args], Awaitable[_T]], *args: *_Args) -> _T:
    """``await fn(*args)`` in a child task, re-raising its error unwrapped.

    grpclib interrupts a call whose deadline passed or whose connection was lost by
    cancelling the *calling task* (``Task.cancel()``) and then raises its own error,
    without ``Task.uncancel()``. The unbalanced cancel request would make anyio's cancel
    scopes in the caller's task believe it is being cancelled; confined to a child task it
    ends with the task.
    """
    result: list[_T] = []

    async def run() -> None:
        result.append(await fn(*args))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    return result[0]


async def unary_call(
    channel: Channel,
    path: str,
    request: betterproto.Message,
    reply: type[_Reply],
    *,
    timeout: float | None,  # noqa: ASYNC109 (grpclib sends it to the server as grpc-timeout)
    where: str,
    check_server: Callable[[PeerCert | None], object] | None = None,
) -> _Reply:
    """One unary call of ``path`` on ``channel``; returns the reply.

    The call runs in a child task (see :func:`isolated`): grpclib's cancel of the calling
    task, on a timeout or a lost connection, stays in that task. ``check_server``, if given,
    gets the server's certificate (None without TLS) after the handshake and before the
    request's body is sent; what it raises ends the call. A reply with no message raises
    :class:`Internal`. Errors are not translated: call this inside the client's
    :func:`transport_errors`.
    """

    async def exchange() -> _Reply | None:
        async with channel.request(
            path, Cardinality.UNARY_UNARY, type(request), reply, timeout=timeout
        ) as stream:
            if check_server is not None:
                await stream.send_request()
                check_server(stream.peer.cert() if stream.peer else None)
            await stream.send_message(request, end=True)
            return await stream.recv_message()

    response = await isolated(exchange)
    if response is None:
        method = path.rsplit("/", 1)[-1]
        raise Internal(f"{method} on {where} returned no message")
    return response


@contextmanager
def transport_errors(
    where: str,
    method: str = "",
    *,
    timeout: type[SubstrateError] = DeadlineExceeded,
    rejected_certificate: type[SubstrateError] = Unavailable,
    lost_hint: str = "",
) -> Iterator[None]:
    """Client side of one call: a status as its substrate error, transport failures typed.

    Every gRPC client of the project (the SDK, ateapi's atelet client, atelet's registry
    and worker clients) translates the same way; they differ only in ``where`` the server
    is, the error a timeout or a rejected server certificate becomes (``timeout``,
    ``rejected_certificate``) and a hint added to a lost connection.
    """
    call = f"{method} on {where}" if method else f"call to {where}"
    try:
        with substrate_errors():
            yield
    except UnicodeError as exc:
        what = f"the {method} request" if method else "the request"
        raise InvalidArgument(f"{what} cannot be encoded: {exc}") from exc
    except TimeoutError as exc:
        raise timeout(f"{call} timed out") from exc
    except ssl.SSLCertVerificationError as exc:
        raise rejected_certificate(
            f"the certificate of {where} was rejected: {exc.verify_message}"
        ) from exc
    except ssl.SSLError as exc:
        raise Unavailable(f"TLS with {where} failed: {exc.reason or exc}") from exc
    except OSError as exc:
        raise Unavailable(f"cannot reach {where}: {exc}") from exc
    except StreamTerminatedError as exc:
        raise Unavailable(f"connection to {where} lost: {exc}{lost_hint}") from exc
    except ProtocolError as exc:
        raise Unavailable(f"protocol error talking to {where}: {exc}") from exc


def _socket_of(channel: Channel) -> TransportSocket | None:
    """The socket of ``channel``'s live connection, if any.

    grpclib keeps the connection private (``Channel._protocol.processor.connection``), so
    this reads it defensively; None when the layout differs or nothing is connected.
    """
    protocol = getattr(channel, "_protocol", None)
    connection = getattr(getattr(protocol, "processor", None), "connection", None)
    transport = getattr(connection, "_transport", None)
    if not isinstance(transport, asyncio.BaseTransport):
        return None
    sock = transport.get_extra_info("socket")
    return sock if isinstance(sock, TransportSocket) else None


async def _close_channel(channel: Channel) -> None:
    """Close ``channel`` and wait (at most :data:`CLOSE_WAIT`) until its socket is closed.

    ``Channel.close()`` only starts closing: a TLS connection exchanges close_notify with
    the server on later loop iterations. Waiting here means an event loop that ends right
    after the client (e.g. :class:`SyncAteClient`'s) leaves no socket open.
    """
    sock = _socket_of(channel)
    channel.close()
    if sock is None:
        return
    with anyio.move_on_after(CLOSE_WAIT, shield=True):
        # Nothing signals the socket's closing (asyncio closes it in a callback): poll.
        while sock.fileno() != -1:  # noqa: ASYNC110
            await anyio.sleep(0.001)


class AteClient:
    """An async client of ateapi's Control API; open it with :meth:`connect`.

    Results are :mod:`substrate.core.model` records; failures raise
    :mod:`substrate.errors` classes: the server's status travels back as its error class
    (NotFound, AlreadyExists, InvalidArgument, FailedPrecondition, Aborted,
    ResourceExhausted, PermissionDenied, Unauthenticated...). Connection failures are
    translated too:

    * the server's certificate fails verification (unknown CA, wrong host name, or not the
      pinned SPIFFE id): :class:`~substrate.errors.Unauthenticated`;
    * connection refused, reset or lost, including a server that drops the TLS handshake
      because it does not trust *our* certificate (TLS cannot tell the client why):
      :class:`~substrate.errors.Unavailable`;
    * the call's timeout passes: :class:`~substrate.errors.DeadlineExceeded`.
    """

    def __init__(
        self,
        channel: Channel,
        *,
        address: str,
        tls: bool,
        timeout: float | None = DEFAULT_TIMEOUT,
        server_id: SpiffeId | None = None,
    ) -> None:
        self._channel = channel
        self.address = address
        self.tls = tls
        self.timeout = timeout
        self.server_id = server_id

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        address: str,
        *,
        tls_dir: str | os.PathLike[str] | None = None,
        name: str = DEFAULT_TLS_NAME,
        cert: str | os.PathLike[str] | None = None,
        key: str | os.PathLike[str] | None = None,
        ca: str | os.PathLike[str] | None = None,
        insecure: bool = False,
        timeout: float | None = DEFAULT_TIMEOUT,  # noqa: ASYNC109 (each call's timeout)
        server_id: SpiffeId | Identity | str | None = None,
        pin_server: bool = True,
        check_hostname: bool = True,
    ) -> AsyncIterator[AteClient]:
        """A client of the ateapi at ``address`` (``host:port``), closed on exit.

        mTLS credentials come from ``tls_dir`` (``<name>.crt``, ``<name>.key``, ``ca.crt``,
        as ``ate up`` writes them) or from explicit ``cert``/``key``/``ca`` paths (which
        also override single files of ``tls_dir``). The server must present a certificate
        from that CA; with ``pin_server`` (the default) it must also be ``server_id``,
        by default ``spiffe://<trust-domain of the CA>/ateapi``. ``insecure=True``
        speaks plaintext (local debugging against an ``--insecure`` server only).

        The connection is made by the first call, not here.
        """
        host, port = parse_address(address)
        pinned: SpiffeId | None = None
        context: ssl.SSLContext | None = None
        if insecure:
            if tls_dir is not None or cert is not None or key is not None or ca is not None:
                raise InvalidArgument("insecure=True takes no TLS files")
        else:
            files = _tls_files(tls_dir, name, cert, key, ca)
            context = client_context(files, check_hostname=check_hostname)
            if isinstance(server_id, Identity):
                pinned = server_id.spiffe_id
            elif isinstance(server_id, str):
                pinned = SpiffeId.parse(server_id)
            elif server_id is not None:
                pinned = server_id
            elif pin_server:
                pinned = _default_server_id(files)
        channel = Channel(host, port, ssl=context)
        try:
            yield cls(
                channel,
                address=address,
                tls=context is not None,
                timeout=timeout,
                server_id=pinned,
            )
        finally:
            await _close_channel(channel)

    # --- transport --------------------------------------------------------------------

    def _errors(self) -> AbstractContextManager[None]:
        hint = " (the server may have refused our certificate during the TLS handshake)"
        return transport_errors(
            self.address, rejected_certificate=Unauthenticated, lost_hint=hint if self.tls else ""
        )

    async def _call(self, method: str, request: betterproto.Message, reply: type[_Reply]) -> _Reply:
        check = None if self.server_id is None else partial(check_peer, expected=self.server_id)
        with self._errors():
            return await unary_call(
                self._channel,
                _CONTROL + method,
                request,
                reply,
                timeout=self.timeout,
                where=self.address,
                check_server=check,
            )

    # --- atespaces --------------------------------------------------------------------

    async def create_atespace(self, name: str) -> Atespace:
        reply = await self._call("CreateAtespace", pb.CreateAtespaceRequest(name=name), pb.Atespace)
        return convert.atespace_from_proto(reply)

    async def get_atespace(self, name: str) -> Atespace:
        reply = await self._call("GetAtespace", pb.GetAtespaceRequest(name=name), pb.Atespace)
        return convert.atespace_from_proto(reply)

    async def list_atespaces(self) -> list[Atespace]:
        reply = await self._call(
            "ListAtespaces", pb.ListAtespacesRequest(), pb.ListAtespacesResponse
        )
        return [convert.atespace_from_proto(a) for a in reply.atespaces]

    async def delete_atespace(self, name: str) -> None:
        await self._call(
            "DeleteAtespace", pb.DeleteAtespaceRequest(name=name), pb.DeleteAtespaceResponse
        )

    # --- templates --------------------------------------------------------------------

    async def create_template(self, template: ActorTemplate) -> ActorTemplate:
        request = pb.CreateActorTemplateRequest(template=convert.actor_template_to_proto(template))
        reply = await self._call("CreateActorTemplate", request, pb.ActorTemplate)
        return convert.actor_template_from_proto(reply)

    async def get_template(self, ref: TemplateRef | str) -> ActorTemplate:
        request = pb.GetActorTemplateRequest(ref=_template(ref))
        reply = await self._call("GetActorTemplate", request, pb.ActorTemplate)
        return convert.actor_template_from_proto(reply)

    async def list_templates(self, atespace: str) -> list[ActorTemplate]:
        request = pb.ListActorTemplatesRequest(atespace=atespace)
        reply = await self._call("ListActorTemplates", request, pb.ListActorTemplatesResponse)
        return [convert.actor_template_from_proto(t) for t in reply.templates]

    async def update_template(self, template: ActorTemplate) -> ActorTemplate:
        """Replace the spec; a non-zero ``template.metadata.version`` is a precondition."""
        request = pb.UpdateActorTemplateRequest(template=convert.actor_template_to_proto(template))
        reply = await self._call("UpdateActorTemplate", request, pb.ActorTemplate)
        return convert.actor_template_from_proto(reply)

    async def delete_template(self, ref: TemplateRef | str) -> None:
        request = pb.DeleteActorTemplateRequest(ref=_template(ref))
        await self._call("DeleteActorTemplate", request, pb.DeleteActorTemplateResponse)

    # --- actors -----------------------------------------------------------------------

    async def create_actor(
        self,
        ref: ActorRef | str,
        *,
        template: TemplateRef | str | None = None,
        source_tag: TagRef | str | None = None,
        worker_selector: Labels | Mapping[str, str] | None = None,
    ) -> Actor:
        """A new SUSPENDED actor from ``template``, ``source_tag``, or both."""
        request = pb.CreateActorRequest(
            ref=_actor(ref),
            template=pb.ObjectRef() if template is None else _template(template),
            source_tag=pb.ObjectRef() if source_tag is None else _tag(source_tag),
            worker_selector=_labels(worker_selector),
        )
        return convert.actor_from_proto(await self._call("CreateActor", request, pb.Actor))

    async def get_actor(self, ref: ActorRef | str) -> Actor:
        reply = await self._call("GetActor", pb.GetActorRequest(ref=_actor(ref)), pb.Actor)
        return convert.actor_from_proto(reply)

    async def list_actors_page(
        self, atespace: str | None = None, *, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[Actor], str]:
        """One page of actors and the next page token ("" after the last page)."""
        request = pb.ListActorsRequest(
            atespace=atespace or "", page_size=page_size, page_token=page_token
        )
        reply = await self._call("ListActors", request, pb.ListActorsResponse)
        return [convert.actor_from_proto(a) for a in reply.actors], reply.next_page_token

    async def list_actors(
        self, atespace: str | None = None, *, page_size: int = 0
    ) -> AsyncIterator[Actor]:
        """Every actor (of ``atespace``, or of all), fetched a page at a time."""
        token = ""
        while True:
            actors, token = await self.list_actors_page(
                atespace, page_size=page_size, page_token=token
            )
            for actor in actors:
                yield actor
            if not token:
                return

    async def update_actor_selector(
        self, ref: ActorRef | str, worker_selector: Labels | Mapping[str, str] | None
    ) -> Actor:
        request = pb.UpdateActorRequest(ref=_actor(ref), worker_selector=_labels(worker_selector))
        return convert.actor_from_proto(await self._call("UpdateActor", request, pb.Actor))

    async def suspend_actor(
        self, ref: ActorRef | str, mode: SuspendMode = SuspendMode.ASYNC
    ) -> Actor:
        request = pb.SuspendActorRequest(ref=_actor(ref), mode=convert.suspend_mode_to_proto(mode))
        reply = await self._call("SuspendActor", request, pb.SuspendActorResponse)
        return convert.actor_from_proto(reply.actor)

    async def pause_actor(self, ref: ActorRef | str) -> Actor:
        request = pb.PauseActorRequest(ref=_actor(ref))
        reply = await self._call("PauseActor", request, pb.PauseActorResponse)
        return convert.actor_from_proto(reply.actor)

    async def resume_actor(self, ref: ActorRef | str) -> ResumeResult:
        request = pb.ResumeActorRequest(ref=_actor(ref))
        reply = await self._call("ResumeActor", request, pb.ResumeActorResponse)
        return convert.resume_result_from_proto(reply)

    async def revert_actor(self, ref: ActorRef | str) -> Actor:
        request = pb.RevertActorRequest(ref=_actor(ref))
        reply = await self._call("RevertActor", request, pb.RevertActorResponse)
        return convert.actor_from_proto(reply.actor)

    async def delete_actor(self, ref: ActorRef | str, *, force: bool = False) -> None:
        request = pb.DeleteActorRequest(ref=_actor(ref), force=force)
        await self._call("DeleteActor", request, pb.DeleteActorResponse)

    # --- tags -------------------------------------------------------------------------

    async def create_tag(self, ref: TagRef | str, actor: ActorRef | str) -> Tag:
        """Tag the newest snapshot of a SUSPENDED actor."""
        request = pb.CreateTagRequest(ref=_tag(ref), actor=_actor(actor))
        return convert.tag_from_proto(await self._call("CreateTag", request, pb.Tag))

    async def get_tag(self, ref: TagRef | str) -> Tag:
        reply = await self._call("GetTag", pb.GetTagRequest(ref=_tag(ref)), pb.Tag)
        return convert.tag_from_proto(reply)

    async def list_tags(self, atespace: str) -> list[Tag]:
        request = pb.ListTagsRequest(atespace=atespace)
        reply = await self._call("ListTags", request, pb.ListTagsResponse)
        return [convert.tag_from_proto(t) for t in reply.tags]

    async def delete_tag(self, ref: TagRef | str) -> None:
        await self._call("DeleteTag", pb.DeleteTagRequest(ref=_tag(ref)), pb.DeleteTagResponse)

    # --- workers ----------------------------------------------------------------------

    async def list_workers(self, pool: str | None = None) -> list[Worker]:
        request = pb.ListWorkersRequest(pool=pool or "")
        reply = await self._call("ListWorkers", request, pb.ListWorkersResponse)
        return [convert.worker_from_proto(w) for w in reply.workers]

    async def get_worker(self, name: WorkerRef | str) -> Worker:
        reply = await self._call("GetWorker", pb.GetWorkerRequest(name=_worker(name)), pb.Worker)
        return convert.worker_from_proto(reply)

    async def drain_worker(self, name: WorkerRef | str) -> Worker:
        """DRAINING, then suspend (SYNC) every actor running on the worker."""
        request = pb.DrainWorkerRequest(name=_worker(name))
        return convert.worker_from_proto(await self._call("DrainWorker", request, pb.Worker))


__all__ = [
    "CLOSE_WAIT",
    "DEFAULT_TIMEOUT",
    "DEFAULT_TLS_NAME",
    "AteClient",
    "isolated",
    "parse_address",
    "unary_call",
]
