"""ateapi ⇄ atelet over gRPC: the ``substrate.v1.Atelet`` servicer and its client.

Node side:

* :class:`AteletServicer` serves the Atelet service from any
  :class:`~substrate.core.agent_ports.NodeAgent`: it parses each request into the port's
  record (``convert.parse_*``, INVALID_ARGUMENT on bad input), calls the agent and converts
  the result back; errors leave through :func:`~substrate.api.status.grpc_errors`.
* :func:`build_atelet_server` / :func:`serve_atelet` put it behind mTLS with a
  ``RecvRequest`` authorizer (:func:`authorize_atelet_call`): only ateapi's identity may
  call the Atelet service (PERMISSION_DENIED for any other, UNAUTHENTICATED for a
  certificate without a usable identity); anyone authenticated may call the health
  service; an ``insecure`` (plaintext) server lets everyone in.

ateapi side:

* :class:`GrpcNodeAgent` implements ``NodeAgent`` over one channel to one atelet and pins
  the server's SPIFFE id to ``spiffe://<trust-domain>/atelet/<node>``.
* :class:`GrpcNodeAgents` implements ``NodeAgents`` over the
  :class:`~substrate.services.worker_cache.WorkerCache`: a node's atelet address comes
  from its workers' records (``Worker.atelet_address``, reported at registration), with one
  channel per node, replaced when the address changes.

The client keeps the port's error contract: the atelet's statuses come back as substrate
errors, and everything that means "the node could not be used" is
:class:`~substrate.errors.Unavailable` (retryable, never a reason to crash an actor):
connection failures, TLS failures, a server that is not the node's atelet, and an atelet
that refuses ateapi's identity (nothing ran on the node in each case).
"""

from __future__ import annotations

import ssl as _ssl
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import attrs
import betterproto
import structlog
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.events import RecvRequest, listen
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from substrate.api import convert, pb
from substrate.api.authz import ALLOW, HEALTH_SERVICE, Decision, split_path
from substrate.api.server import RequestCodec, Serving, _health_handlers, started
from substrate.api.status import grpc_errors
from substrate.client._async import _close_channel, transport_errors, unary_call
from substrate.core.agent_ports import (
    CheckpointRequest,
    CheckpointResult,
    NodeAgent,
    StartRequest,
    StartResult,
    UploadRequest,
    WorkloadTarget,
)
from substrate.core.ids import NodeRef
from substrate.core.model import Snapshot, Worker, WorkerState
from substrate.errors import (
    GrpcCode,
    Internal,
    InvalidArgument,
    PermissionDenied,
    SubstrateError,
    Unauthenticated,
    Unavailable,
)
from substrate.identity.spiffe import (
    DEFAULT_TRUST_DOMAIN,
    Identity,
    IdentityKind,
    SpiffeId,
    validate_trust_domain,
)
from substrate.identity.tls import PeerCert, check_peer, peer_identity

if TYPE_CHECKING:
    from substrate.services.worker_cache import WorkerCache

log = structlog.get_logger("substrate.atelet")

ATELET_SERVICE = "substrate.v1.Atelet"
_PATH = f"/{ATELET_SERVICE}/"

_Reply = TypeVar("_Reply", bound=betterproto.Message)
_T = TypeVar("_T")


# --- server side ------------------------------------------------------------------------


def authorize_atelet_call(identity: Identity | None, path: str, *, insecure: bool) -> Decision:
    """May ``identity`` call the method at ``path`` of an atelet?

    Only ateapi may call the Atelet service; any authenticated caller may call the health
    service. A caller without an identity (plaintext) is allowed only on an ``insecure``
    server, else UNAUTHENTICATED.
    """
    if identity is None:
        if insecure:
            return ALLOW
        return Decision(
            allowed=False,
            code=GrpcCode.UNAUTHENTICATED,
            message="a client certificate is required",
        )
    service, _ = split_path(path)
    if service == HEALTH_SERVICE or identity.kind is IdentityKind.ATEAPI:
        return ALLOW
    return Decision(
        allowed=False,
        code=GrpcCode.PERMISSION_DENIED,
        message=f"{identity} may not call {path or '(no method)'}: only ateapi drives atelets",
    )


@attrs.frozen(slots=True)
class AteletAuthorizer:
    """The atelet server's ``RecvRequest`` listener: authenticate, then authorize."""

    trust_domain: str
    insecure: bool

    def decide(self, peercert: dict[str, Any] | None, path: str) -> Decision:
        if peercert is None:
            identity = None
        else:
            try:
                identity = peer_identity(peercert, trust_domain=self.trust_domain)
            except SubstrateError as exc:
                return Decision(
                    allowed=False, code=GrpcCode.UNAUTHENTICATED, message=exc.description
                )
        return authorize_atelet_call(identity, path, insecure=self.insecure)

    async def __call__(self, event: RecvRequest) -> None:
        decision = self.decide(event.peer.cert(), event.method_name)
        if decision.allowed:
            return
        log.info(
            "atelet call refused",
            method=event.method_name,
            code=decision.code.name,
            reason=decision.message,
        )
        status = (
            Status.UNAUTHENTICATED
            if decision.code is GrpcCode.UNAUTHENTICATED
            else Status.PERMISSION_DENIED
        )
        raise GRPCError(status, decision.message)


@contextmanager
def _rpc(name: str) -> Iterator[None]:
    """``grpc_errors()``, logging the cause of every INTERNAL answer (its text stays here)."""
    try:
        with grpc_errors(expose_internal=True):
            yield
    except GRPCError as exc:
        if exc.status is Status.INTERNAL and exc.__cause__ is not None:
            log.error("atelet rpc failed", rpc=name, exc_info=exc.__cause__)
        raise


class AteletServicer(pb.AteletBase):
    """The Atelet service over a :class:`NodeAgent` (the node's real atelet, or a fake)."""

    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent

    async def run(self, run_request: pb.RunRequest) -> pb.RunResponse:
        with _rpc("Run"):
            request = convert.parse_run(run_request)
            return convert.run_response_to_proto(await self.agent.start(request))

    async def restore(self, restore_request: pb.RestoreRequest) -> pb.RestoreResponse:
        with _rpc("Restore"):
            request = convert.parse_restore(restore_request)
            result = await self.agent.start(request)
            return convert.restore_response_to_proto(result, fidelity=request.fidelity)

    async def checkpoint(self, checkpoint_request: pb.CheckpointRequest) -> pb.CheckpointResponse:
        with _rpc("Checkpoint"):
            request = convert.parse_checkpoint(checkpoint_request)
            result = await self.agent.checkpoint(request)
            return convert.checkpoint_result_to_proto(
                result, worker_epoch=request.target.worker_epoch
            )

    async def upload_snapshot(
        self, upload_snapshot_request: pb.UploadSnapshotRequest
    ) -> pb.UploadSnapshotResponse:
        with _rpc("UploadSnapshot"):
            request = convert.parse_upload_snapshot(upload_snapshot_request)
            return convert.upload_result_to_proto(await self.agent.upload(request))

    async def terminate(self, terminate_request: pb.TerminateRequest) -> pb.TerminateResponse:
        with _rpc("Terminate"):
            target = convert.parse_terminate(terminate_request)
            await self.agent.terminate(target)
            return pb.TerminateResponse(worker_epoch=target.worker_epoch)

    async def detach(self, detach_request: pb.DetachRequest) -> pb.DetachResponse:
        with _rpc("Detach"):
            request = convert.parse_detach(detach_request)
            return convert.detach_result_to_proto(await self.agent.detach(request))

    async def drop_snapshot(
        self, drop_snapshot_request: pb.DropSnapshotRequest
    ) -> pb.DropSnapshotResponse:
        with _rpc("DropSnapshot"):
            args = convert.parse_drop_snapshot(drop_snapshot_request)
            await self.agent.drop_local(args.actor_uid, args.local_name)
            return pb.DropSnapshotResponse()


def _check_server_tls(ssl: _ssl.SSLContext | None, insecure: bool) -> None:
    if ssl is None and not insecure:
        raise ValueError("a TLS context is required (plaintext needs insecure=True)")
    if ssl is not None and insecure:
        raise ValueError("insecure=True serves plaintext; do not pass a TLS context")
    if ssl is not None and ssl.protocol is _ssl.PROTOCOL_TLS_CLIENT:
        raise ValueError("the TLS context is a client context; build one with server_context()")
    if ssl is not None and ssl.verify_mode is not _ssl.CERT_REQUIRED:
        raise ValueError("the server TLS context must require client certificates")


def build_atelet_server(
    agent: NodeAgent,
    *,
    ssl: _ssl.SSLContext | None,
    insecure: bool = False,
    trust_domain: str = DEFAULT_TRUST_DOMAIN,
    health: bool = True,
) -> Server:
    """A grpclib server of the Atelet service over ``agent``; start it with the same ``ssl``.

    Exactly one of ``ssl`` (a server context requiring client certificates) and
    ``insecure=True`` must be given.
    """
    validate_trust_domain(trust_domain)
    _check_server_tls(ssl, insecure)
    handlers: list[Any] = [AteletServicer(agent)]
    if health:
        handlers += _health_handlers()
    server = Server(handlers, codec=RequestCodec())
    listen(server, RecvRequest, AteletAuthorizer(trust_domain=trust_domain, insecure=insecure))
    return server


@asynccontextmanager
async def serve_atelet(
    agent: NodeAgent,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    ssl: _ssl.SSLContext | None,
    insecure: bool = False,
    trust_domain: str = DEFAULT_TRUST_DOMAIN,
    health: bool = True,
) -> AsyncIterator[Serving]:
    """Serve ``agent`` as the Atelet service on ``host:port`` (0 picks a free port)."""
    server = build_atelet_server(
        agent, ssl=ssl, insecure=insecure, trust_domain=trust_domain, health=health
    )
    async with started(server, host, port, ssl=ssl) as running:
        yield running


# --- client side ------------------------------------------------------------------------


def _check_client_tls(ssl: _ssl.SSLContext | None, insecure: bool) -> None:
    if ssl is None and not insecure:
        raise ValueError("a TLS context is required (plaintext needs insecure=True)")
    if ssl is not None and insecure:
        raise ValueError("insecure=True speaks plaintext; do not pass a TLS context")
    if ssl is not None and ssl.protocol is not _ssl.PROTOCOL_TLS_CLIENT:
        raise ValueError("the TLS context is not a client context; build one with client_context()")


class GrpcNodeAgent:
    """A :class:`NodeAgent` that calls one node's atelet over one gRPC channel.

    Build it with :meth:`connect` (or give it a channel). With TLS, every call first checks
    that the server is ``server_id`` (``spiffe://<trust-domain>/atelet/<node>``) and sends
    the request only then. ``timeout`` bounds each call (None: the caller's own deadlines).
    """

    def __init__(
        self,
        channel: Channel,
        *,
        node: NodeRef,
        address: str,
        server_id: SpiffeId | None,
        timeout: float | None = None,
    ) -> None:
        self._channel = channel
        self.node = node
        self.address = address
        self.server_id = server_id
        self.timeout = timeout
        self._inflight = 0
        self._retired = False

    @classmethod
    def connect(
        cls,
        node: NodeRef,
        address: str,
        *,
        ssl: _ssl.SSLContext | None,
        trust_domain: str = DEFAULT_TRUST_DOMAIN,
        insecure: bool = False,
        timeout: float | None = None,
    ) -> GrpcNodeAgent:
        """An agent for ``node``'s atelet at ``address`` (``host:port``); connects lazily.

        With ``ssl`` (a client context of ateapi's identity) the server is pinned to the
        node's atelet identity; host-name checks are the context's business (the pinned
        SPIFFE id already names the node, so ``client_context(check_hostname=False)`` is
        enough when atelet certificates do not carry the node's address).
        """
        _check_client_tls(ssl, insecure)
        host, port = convert.parse_host_port(address, what=f"atelet address of node {node}")
        server_id = None if ssl is None else Identity.atelet(node.name, trust_domain).spiffe_id
        return cls(
            Channel(host, port, ssl=ssl),
            node=node,
            address=address,
            server_id=server_id,
            timeout=timeout,
        )

    @property
    def _where(self) -> str:
        return f"the atelet of node {self.node} at {self.address}"

    async def close(self) -> None:
        """Close the channel (and wait briefly for its connection to shut down)."""
        self._retired = True
        await _close_channel(self._channel)

    @property
    def busy(self) -> bool:
        """Whether a call is in flight."""
        return self._inflight > 0

    def retire(self) -> None:
        """Close the channel once no call is in flight (the node's atelet moved)."""
        self._retired = True
        if self._inflight == 0:
            self._channel.close()

    # --- transport --------------------------------------------------------------------

    @contextmanager
    def _errors(self, method: str) -> Iterator[None]:
        try:
            with transport_errors(self._where, method):
                yield
        except (PermissionDenied, Unauthenticated) as exc:
            # Only the atelet's authorizer says this: nothing ran on the node.
            raise Unavailable(
                f"{self._where} refused {method} from ateapi: {exc.description}"
            ) from exc

    async def _call(self, method: str, request: betterproto.Message, reply: type[_Reply]) -> _Reply:
        check = None if self.server_id is None else partial(self._check_server, self.server_id)
        self._inflight += 1
        try:
            with self._errors(method):
                return await unary_call(
                    self._channel,
                    _PATH + method,
                    request,
                    reply,
                    timeout=self.timeout,
                    where=self._where,
                    check_server=check,
                )
        finally:
            self._inflight -= 1
            if self._retired and self._inflight == 0:
                self._channel.close()

    def _check_server(self, server_id: SpiffeId, cert: PeerCert | None) -> None:
        """The server must be the node's atelet; Unavailable if it is not."""
        try:
            check_peer(cert, server_id)
        except Unauthenticated as exc:
            raise Unavailable(f"{self._where} is not the node's atelet: {exc.description}") from exc

    def _decode(self, method: str, fn: Callable[[_Reply], _T], reply: _Reply) -> _T:
        try:
            return fn(reply)
        except InvalidArgument as exc:
            raise Internal(f"malformed {method} reply from {self._where}: {exc}") from exc

    # --- NodeAgent --------------------------------------------------------------------

    async def start(self, request: StartRequest) -> StartResult:
        message = convert.start_request_to_proto(request)
        if isinstance(message, pb.RunRequest):
            run = await self._call("Run", message, pb.RunResponse)
            return self._decode("Run", convert.start_result_from_proto, run)
        restored = await self._call("Restore", message, pb.RestoreResponse)
        return self._decode("Restore", convert.start_result_from_proto, restored)

    async def checkpoint(self, request: CheckpointRequest) -> CheckpointResult:
        message = convert.checkpoint_request_to_proto(request)
        reply = await self._call("Checkpoint", message, pb.CheckpointResponse)
        return self._decode("Checkpoint", convert.checkpoint_result_from_proto, reply)

    async def upload(self, request: UploadRequest) -> Snapshot:
        message = convert.upload_request_to_proto(request)
        reply = await self._call("UploadSnapshot", message, pb.UploadSnapshotResponse)
        return self._decode("UploadSnapshot", convert.upload_result_from_proto, reply)

    async def terminate(self, target: WorkloadTarget) -> None:
        message = convert.terminate_request_to_proto(target)
        await self._call("Terminate", message, pb.TerminateResponse)

    async def detach(self, request: UploadRequest) -> Snapshot:
        message = convert.detach_request_to_proto(request)
        reply = await self._call("Detach", message, pb.DetachResponse)
        return self._decode("Detach", convert.detach_result_from_proto, reply)

    async def drop_local(self, actor_uid: str, local_name: str) -> None:
        message = convert.drop_snapshot_request_to_proto(actor_uid, local_name)
        await self._call("DropSnapshot", message, pb.DropSnapshotResponse)


def _freshness(worker: Worker) -> tuple[bool, float, float, str]:
    """Orders a node's workers: the live, most recently heard-from one reports best."""
    return (
        worker.state is not WorkerState.UNAVAILABLE,
        worker.last_heartbeat,
        worker.metadata.update_time,
        worker.ref.name,
    )


class GrpcNodeAgents:
    """:class:`~substrate.core.agent_ports.NodeAgents` over gRPC, addressed by the fleet.

    A node's atelet address is the ``atelet_address`` of its workers in ``workers`` (the
    live, most recently heard-from worker wins when they disagree). One
    :class:`GrpcNodeAgent` (one channel) is kept per node and replaced when the address
    changes; the old channel closes once its in-flight calls end. Close with :meth:`close`
    or use as an async context manager.
    """

    def __init__(
        self,
        workers: WorkerCache,
        *,
        ssl: _ssl.SSLContext | None,
        trust_domain: str,
        insecure: bool = False,
        timeout: float | None = None,
    ) -> None:
        validate_trust_domain(trust_domain)
        _check_client_tls(ssl, insecure)
        self._workers = workers
        self._ssl = ssl
        self._trust_domain = trust_domain
        self._insecure = insecure
        self._timeout = timeout
        self._agents: dict[NodeRef, GrpcNodeAgent] = {}
        self._retired: list[GrpcNodeAgent] = []
        self._closed = False

    def address_of(self, node: NodeRef) -> str | None:
        """The node's atelet address as its workers report it; None if none does."""
        best: Worker | None = None
        for worker in self._workers.index:
            if worker.node != node or not worker.atelet_address:
                continue
            if best is None or _freshness(worker) > _freshness(best):
                best = worker
        return None if best is None else best.atelet_address

    def for_node(self, node: NodeRef) -> GrpcNodeAgent:
        """The agent of ``node``'s atelet; :class:`Unavailable` if its address is unknown."""
        if self._closed:
            raise Unavailable("ateapi's node agents are closed")
        address = self.address_of(node)
        if address is None:
            raise Unavailable(f"no atelet address known for node {node}")
        current = self._agents.get(node)
        if current is not None and current.address == address:
            return current
        try:
            agent = GrpcNodeAgent.connect(
                node,
                address,
                ssl=self._ssl,
                trust_domain=self._trust_domain,
                insecure=self._insecure,
                timeout=self._timeout,
            )
        except InvalidArgument as exc:
            raise Unavailable(f"cannot use the atelet of node {node}: {exc.description}") from exc
        self._agents[node] = agent
        if current is not None:
            log.info("atelet address changed", node=str(node), old=current.address, new=address)
            current.retire()
            self._retired = [a for a in self._retired if a.busy] + [current]
        return agent

    async def close(self) -> None:
        """Close every channel; later :meth:`for_node` calls raise :class:`Unavailable`."""
        self._closed = True
        agents = [*self._agents.values(), *self._retired]
        self._agents.clear()
        self._retired.clear()
        for agent in agents:
            await agent.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


__all__ = [
    "ATELET_SERVICE",
    "AteletAuthorizer",
    "AteletServicer",
    "GrpcNodeAgent",
    "GrpcNodeAgents",
    "authorize_atelet_call",
    "build_atelet_server",
    "serve_atelet",
]
