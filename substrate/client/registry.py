"""atelet's client of ateapi's ``substrate.v1.WorkerRegistry`` service (mTLS, pinned server).

:class:`GrpcRegistry` implements :class:`substrate.services.registration.Registry`. It
presents the node's atelet identity (``Identity.atelet(node)``, which ateapi authorizes
for ``RegisterWorker`` and ``Heartbeat`` of that node's workers only) and checks that the
server is ateapi (``spiffe://<trust-domain>/ateapi``) before sending a request.

Errors: ateapi's statuses come back as substrate errors (``FailedPrecondition`` "register
again", ``NotFound``, ``PermissionDenied``...). Everything that means "ateapi could not be
used right now" is :class:`~substrate.errors.Unavailable`, so the registrar retries:
connection failures, TLS failures, a server that is not ateapi, a call that timed out.
"""

from __future__ import annotations

import os
import ssl as _ssl
from contextlib import AbstractContextManager
from functools import partial
from types import TracebackType
from typing import Final, Self, TypeVar

import betterproto
from grpclib.client import Channel

from substrate.api import convert, pb
from substrate.client._async import _close_channel, parse_address, transport_errors, unary_call
from substrate.core.ids import WorkerRef
from substrate.core.model import Capacity, Worker
from substrate.errors import (
    Internal,
    InvalidArgument,
    Unauthenticated,
    Unavailable,
)
from substrate.identity.files import TlsFiles
from substrate.identity.spiffe import (
    DEFAULT_TRUST_DOMAIN,
    Identity,
    SpiffeId,
    validate_trust_domain,
)
from substrate.identity.tls import PeerCert, check_peer, client_context

REGISTRY_PATH: Final = "/substrate.v1.WorkerRegistry/"
DEFAULT_TIMEOUT: Final = 10.0

_Reply = TypeVar("_Reply", bound=betterproto.Message)


def register_worker_request(worker: Worker) -> pb.RegisterWorkerRequest:
    """The RegisterWorker request reporting ``worker`` (the inverse of
    :func:`substrate.api.convert.parse_register_worker`)."""
    if worker.capacity is None:
        raise InvalidArgument(f"worker {worker.ref} has no capacity to register")
    return pb.RegisterWorkerRequest(
        name=worker.ref.name,
        pool=worker.pool,
        node=worker.node.name,
        ips=list(worker.ips),
        sandbox_class=convert.sandbox_class_to_proto(worker.sandbox_class),
        runtime_versions=sorted(worker.runtime_versions),
        labels=convert.labels_to_proto(worker.labels),
        epoch=worker.epoch,
        capacity=convert.capacity_to_proto(worker.capacity),
        tunnel_address=worker.tunnel_address,
        atelet_address=worker.atelet_address,
    )


def heartbeat_request(
    ref: WorkerRef, epoch: int, capacity: Capacity | None = None
) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(
        name=ref.name,
        epoch=epoch,
        capacity=None if capacity is None else convert.capacity_to_proto(capacity),
    )


class GrpcRegistry:
    """ateapi's worker registry over one gRPC channel; build it with :meth:`connect`."""

    def __init__(
        self,
        channel: Channel,
        *,
        address: str,
        server_id: SpiffeId | None,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        self._channel = channel
        self.address = address
        self.server_id = server_id
        self.timeout = timeout

    @classmethod
    def connect(
        cls,
        address: str,
        *,
        ssl: _ssl.SSLContext | None = None,
        tls: TlsFiles | None = None,
        trust_domain: str = DEFAULT_TRUST_DOMAIN,
        insecure: bool = False,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> GrpcRegistry:
        """A registry client of the ateapi at ``address`` (``host:port``); connects lazily.

        Credentials: a client ``ssl`` context, or the ``tls`` files of the atelet's
        identity (host names are not checked: the server is pinned to ateapi's SPIFFE id
        instead). ``insecure=True`` speaks plaintext (an ``--insecure`` ateapi only).
        """
        validate_trust_domain(trust_domain)
        if insecure:
            if ssl is not None or tls is not None:
                raise ValueError("insecure=True speaks plaintext; do not pass TLS credentials")
            context = None
        elif ssl is not None:
            if tls is not None:
                raise ValueError("pass either an ssl context or tls files, not both")
            if ssl.protocol is not _ssl.PROTOCOL_TLS_CLIENT:
                raise ValueError("the TLS context is not a client context")
            context = ssl
        elif tls is not None:
            context = client_context(tls, check_hostname=False)
        else:
            raise ValueError("TLS credentials are required (plaintext needs insecure=True)")
        host, port = parse_address(address)
        server_id = None if context is None else Identity.ateapi(trust_domain).spiffe_id
        return cls(
            Channel(host, port, ssl=context), address=address, server_id=server_id, timeout=timeout
        )

    async def close(self) -> None:
        await _close_channel(self._channel)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- transport --------------------------------------------------------------------

    def _errors(self, method: str) -> AbstractContextManager[None]:
        # The registrar retries on Unavailable: a timeout or a rejected ateapi certificate
        # is one more reason to try again later, not a different kind of failure.
        return transport_errors(
            f"ateapi at {self.address}",
            method,
            timeout=Unavailable,
            rejected_certificate=Unavailable,
        )

    async def _call(self, method: str, request: betterproto.Message, reply: type[_Reply]) -> _Reply:
        check = None if self.server_id is None else partial(self._check_server, self.server_id)
        with self._errors(method):
            return await unary_call(
                self._channel,
                REGISTRY_PATH + method,
                request,
                reply,
                timeout=self.timeout,
                where=f"ateapi at {self.address}",
                check_server=check,
            )

    def _check_server(self, server_id: SpiffeId, cert: PeerCert | None) -> None:
        """The server must be ateapi; Unavailable if it is not."""
        try:
            check_peer(cert, server_id)
        except Unauthenticated as exc:
            raise Unavailable(f"{self.address} is not ateapi: {exc.description}") from exc

    def _worker(self, method: str, message: pb.Worker) -> Worker:
        try:
            return convert.worker_from_proto(message)
        except InvalidArgument as exc:
            raise Internal(f"malformed {method} reply from {self.address}: {exc}") from exc

    # --- Registry ---------------------------------------------------------------------

    async def register(self, worker: Worker) -> Worker:
        reply = await self._call(
            "RegisterWorker", register_worker_request(worker), pb.RegisterWorkerResponse
        )
        return self._worker("RegisterWorker", reply.worker)

    async def heartbeat(
        self, ref: WorkerRef, epoch: int, capacity: Capacity | None = None
    ) -> Worker:
        reply = await self._call(
            "Heartbeat", heartbeat_request(ref, epoch, capacity), pb.HeartbeatResponse
        )
        return self._worker("Heartbeat", reply.worker)


def tls_files(directory: str | os.PathLike[str], name: str) -> TlsFiles:
    """``<name>.crt``/``<name>.key``/``ca.crt`` in ``directory`` (InvalidArgument if missing)."""
    files = TlsFiles.in_dir(directory, name)
    missing = files.missing()
    if missing:
        raise InvalidArgument(f"TLS files not found: {', '.join(str(p) for p in missing)}")
    return files


__all__ = [
    "DEFAULT_TIMEOUT",
    "REGISTRY_PATH",
    "GrpcRegistry",
    "heartbeat_request",
    "register_worker_request",
    "tls_files",
]
