"""atelet ⇄ ateworker over gRPC on the worker's Unix socket: servicer and client.

The socket (``<node dir>/workers/<worker>/worker.sock``) is created with mode 0600 in a
directory only its owner can enter, so file permissions are the authentication: only
processes of the node's own user (atelet) can connect. There is no TLS on it.

* :class:`AteworkerServicer` serves any :class:`~substrate.sandbox.worker_ports.WorkerApi`
  (in practice :class:`~substrate.services.workloads.WorkloadManager`); errors leave
  through :func:`~substrate.api.status.grpc_errors`.
* :class:`GrpcWorker` implements ``WorkerApi`` over the socket; statuses come back as
  substrate errors, and a worker that cannot be reached is :class:`Unavailable`.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from typing import Any, TypeVar

import betterproto
import structlog
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from substrate.api import convert, pb
from substrate.api.server import RequestCodec
from substrate.api.status import grpc_errors
from substrate.client._async import _close_channel, transport_errors, unary_call
from substrate.core.ids import ActorRef, NodeRef, WorkerRef
from substrate.errors import (
    InvalidArgument,
    SubstrateError,
)
from substrate.sandbox.node_layout import NodeLayout
from substrate.sandbox.spec import SandboxStats
from substrate.sandbox.worker_ports import (
    WorkerApi,
    WorkerInfo,
    WorkloadCheckpointed,
    WorkloadRequest,
    WorkloadStarted,
)

log = structlog.get_logger("substrate.ateworker")

ATEWORKER_SERVICE = "substrate.v1.Ateworker"
_PATH = f"/{ATEWORKER_SERVICE}/"
_Reply = TypeVar("_Reply", bound=betterproto.Message)


# --- conversions ------------------------------------------------------------------------


def _timings(timings: Mapping[str, float]) -> pb.Timings:
    return pb.Timings(
        total_seconds=float(timings.get("total", sum(timings.values()))),
        phases_seconds={k: float(v) for k, v in timings.items() if k != "total"},
    )


def _timings_from(t: pb.Timings | None) -> dict[str, float]:
    if t is None:
        return {}
    out = dict(t.phases_seconds)
    if t.total_seconds:
        out["total"] = t.total_seconds
    return out


def _env_pairs(values: list[str]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidArgument(f"image env entry {item!r} must be NAME=value")
        pairs.append((name, value))
    return tuple(pairs)


def _actor(ref: pb.ObjectRef | None) -> ActorRef:
    if ref is None or not ref.name:
        raise InvalidArgument("actor is required")
    return convert.actor_ref_from_proto(ref)


def _request_fields(request: WorkloadRequest) -> dict[str, Any]:
    return {
        "actor_uid": request.actor_uid,
        "actor": convert.object_ref_to_proto(request.actor),
        "worker_epoch": request.worker_epoch,
        "dirs": pb.ActorDirs(
            root_dir=os.path.dirname(request.bundle_dir),
            bundle_dirs={request.containers[0].name: request.bundle_dir},
            restore_dir=request.restore_dir,
        ),
        "containers": [convert.container_to_proto(c) for c in request.containers],
        "resources": convert.resources_to_proto(request.resources),
        "image_args": list(request.image_args),
        "image_env": [f"{k}={v}" for k, v in request.image_env],
        "sysinfo_dir": request.sysinfo_dir,
    }


def _parse_workload(
    *,
    actor_uid: str,
    actor: pb.ObjectRef | None,
    worker_epoch: int,
    dirs: pb.ActorDirs | None,
    containers: list[pb.Container],
    resources: pb.Resources | None,
    image_args: list[str],
    image_env: list[str],
    sysinfo_dir: str,
    restore_dir: str = "",
    preserve_restore_dir: bool = True,
) -> WorkloadRequest:
    if not actor_uid:
        raise InvalidArgument("actor_uid is required")
    parsed = tuple(convert.container_from_proto(c) for c in containers)
    if not parsed:
        raise InvalidArgument("containers are required")
    bundle = (dirs.bundle_dirs.get(parsed[0].name, "") if dirs is not None else "") or ""
    return WorkloadRequest(
        actor=_actor(actor),
        actor_uid=actor_uid,
        worker_epoch=worker_epoch,
        bundle_dir=bundle,
        containers=parsed,
        resources=convert.resources_from_proto(resources or pb.Resources()),
        image_args=tuple(image_args),
        image_env=_env_pairs(image_env),
        sysinfo_dir=sysinfo_dir,
        restore_dir=restore_dir,
        preserve_restore_dir=preserve_restore_dir,
    )


def run_request_to_proto(request: WorkloadRequest) -> pb.RunWorkloadRequest:
    return pb.RunWorkloadRequest(**_request_fields(request))


def restore_request_to_proto(request: WorkloadRequest) -> pb.RestoreWorkloadRequest:
    return pb.RestoreWorkloadRequest(
        **_request_fields(request), preserve_restore_dir=request.preserve_restore_dir
    )


def parse_run_workload(m: pb.RunWorkloadRequest) -> WorkloadRequest:
    return _parse_workload(
        actor_uid=m.actor_uid,
        actor=m.actor,
        worker_epoch=m.worker_epoch,
        dirs=m.dirs,
        containers=m.containers,
        resources=m.resources,
        image_args=m.image_args,
        image_env=m.image_env,
        sysinfo_dir=m.sysinfo_dir,
    )


def parse_restore_workload(m: pb.RestoreWorkloadRequest) -> WorkloadRequest:
    return _parse_workload(
        actor_uid=m.actor_uid,
        actor=m.actor,
        worker_epoch=m.worker_epoch,
        dirs=m.dirs,
        containers=m.containers,
        resources=m.resources,
        image_args=m.image_args,
        image_env=m.image_env,
        sysinfo_dir=m.sysinfo_dir,
        restore_dir=m.dirs.restore_dir if m.dirs is not None else "",
        preserve_restore_dir=m.preserve_restore_dir,
    )


def info_to_proto(info: WorkerInfo) -> pb.GetWorkerInfoResponse:
    return pb.GetWorkerInfoResponse(
        name=info.name,
        node=info.node.name,
        epoch=info.epoch,
        sandbox_class=convert.sandbox_class_to_proto(info.sandbox_class),
        runtime_versions=list(info.runtime_versions),
        capacity=convert.capacity_to_proto(info.capacity),
        tunnel_address=info.tunnel_address,
        pool=info.pool,
        labels=dict(info.labels),
    )


def info_from_proto(m: pb.GetWorkerInfoResponse) -> WorkerInfo:
    return WorkerInfo(
        name=m.name,
        node=NodeRef(m.node),
        epoch=m.epoch,
        sandbox_class=convert.sandbox_class_from_proto(m.sandbox_class),
        runtime_versions=tuple(m.runtime_versions),
        capacity=convert.capacity_from_proto(m.capacity or pb.Capacity()),
        tunnel_address=m.tunnel_address,
        pool=m.pool or "default",
        labels=dict(m.labels),
    )


# --- server side ------------------------------------------------------------------------


@contextmanager
def _rpc(name: str) -> Iterator[None]:
    try:
        with grpc_errors(expose_internal=True):
            yield
    except GRPCError as exc:
        if exc.status is Status.INTERNAL and exc.__cause__ is not None:
            log.error("ateworker rpc failed", rpc=name, exc_info=exc.__cause__)
        raise


class AteworkerServicer(pb.AteworkerBase):
    """The Ateworker service over a :class:`WorkerApi`."""

    def __init__(self, worker: WorkerApi) -> None:
        self.worker = worker

    async def run_workload(
        self, run_workload_request: pb.RunWorkloadRequest
    ) -> pb.RunWorkloadResponse:
        with _rpc("RunWorkload"):
            started = await self.worker.run(parse_run_workload(run_workload_request))
            return pb.RunWorkloadResponse(
                worker_epoch=started.worker_epoch,
                pod_ips=list(started.pod_ips),
                timings=_timings(started.timings),
            )

    async def restore_workload(
        self, restore_workload_request: pb.RestoreWorkloadRequest
    ) -> pb.RestoreWorkloadResponse:
        with _rpc("RestoreWorkload"):
            request = parse_restore_workload(restore_workload_request)
            started = await self.worker.restore(request)
            return pb.RestoreWorkloadResponse(
                worker_epoch=started.worker_epoch,
                pod_ips=list(started.pod_ips),
                timings=_timings(started.timings),
            )

    async def checkpoint_workload(
        self, checkpoint_workload_request: pb.CheckpointWorkloadRequest
    ) -> pb.CheckpointWorkloadResponse:
        with _rpc("CheckpointWorkload"):
            m = checkpoint_workload_request
            if not m.actor_uid:
                raise InvalidArgument("actor_uid is required")
            directory = m.dirs.checkpoint_dir if m.dirs is not None else ""
            if not directory:
                raise InvalidArgument("dirs.checkpoint_dir is required")
            done = await self.worker.checkpoint(m.actor_uid, directory, worker_epoch=m.worker_epoch)
            return pb.CheckpointWorkloadResponse(
                worker_epoch=done.worker_epoch,
                files=list(done.files),
                runtime_version=done.runtime_version,
                timings=_timings(done.timings),
                size_bytes=done.size_bytes,
            )

    async def terminate_workload(
        self, terminate_workload_request: pb.TerminateWorkloadRequest
    ) -> pb.TerminateWorkloadResponse:
        with _rpc("TerminateWorkload"):
            m = terminate_workload_request
            if not m.actor_uid:
                raise InvalidArgument("actor_uid is required")
            await self.worker.terminate(m.actor_uid, worker_epoch=m.worker_epoch)
            info = await self.worker.info()
            return pb.TerminateWorkloadResponse(worker_epoch=info.epoch)

    async def get_workload_stats(
        self, get_workload_stats_request: pb.GetWorkloadStatsRequest
    ) -> pb.GetWorkloadStatsResponse:
        with _rpc("GetWorkloadStats"):
            uid = get_workload_stats_request.actor_uid
            if not uid:
                raise InvalidArgument("actor_uid is required")
            stats = await self.worker.stats(uid)
            info = await self.worker.info()
            return pb.GetWorkloadStatsResponse(
                worker_epoch=info.epoch,
                stats=pb.WorkloadStats(
                    memory_bytes=stats.memory_bytes,
                    cpu_seconds=stats.cpu_seconds,
                    uptime_seconds=stats.uptime_seconds,
                ),
            )

    async def get_worker_info(
        self, get_worker_info_request: pb.GetWorkerInfoRequest
    ) -> pb.GetWorkerInfoResponse:
        with _rpc("GetWorkerInfo"):
            return info_to_proto(await self.worker.info())


def _remove_socket(socket_path: str) -> None:
    if os.path.lexists(socket_path):
        os.unlink(socket_path)


def _prepare_socket_dir(socket_path: str) -> None:
    directory = os.path.dirname(socket_path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    _remove_socket(socket_path)  # left by an earlier run of this worker


@asynccontextmanager
async def serve_worker(worker: WorkerApi, socket_path: str) -> AsyncIterator[Server]:
    """Serve ``worker`` on the Unix socket ``socket_path`` (mode 0600) until the block ends."""
    _prepare_socket_dir(socket_path)
    server = Server([AteworkerServicer(worker)], codec=RequestCodec())
    old = os.umask(0o177)
    try:
        await server.start(path=socket_path)
    finally:
        os.umask(old)
    try:
        yield server
    finally:
        server.close()
        await server.wait_closed()
        _remove_socket(socket_path)


# --- client side ------------------------------------------------------------------------


class GrpcWorker:
    """A :class:`WorkerApi` over the worker's Unix socket (connects lazily)."""

    def __init__(self, socket_path: str, *, timeout: float | None = None) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._channel = Channel(path=socket_path)

    async def close(self) -> None:
        await _close_channel(self._channel)

    async def __aenter__(self) -> GrpcWorker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _errors(self, method: str) -> AbstractContextManager[None]:
        return transport_errors(f"the worker at {self.socket_path}", method)

    async def _call(self, method: str, request: betterproto.Message, reply: type[_Reply]) -> _Reply:
        with self._errors(method):
            return await unary_call(
                self._channel,
                _PATH + method,
                request,
                reply,
                timeout=self.timeout,
                where=f"the worker at {self.socket_path}",
            )

    async def info(self) -> WorkerInfo:
        reply = await self._call(
            "GetWorkerInfo", pb.GetWorkerInfoRequest(), pb.GetWorkerInfoResponse
        )
        return info_from_proto(reply)

    async def run(self, request: WorkloadRequest) -> WorkloadStarted:
        reply = await self._call(
            "RunWorkload", run_request_to_proto(request), pb.RunWorkloadResponse
        )
        return WorkloadStarted(
            worker_epoch=reply.worker_epoch,
            pod_ips=tuple(reply.pod_ips),
            timings=_timings_from(reply.timings),
        )

    async def restore(self, request: WorkloadRequest) -> WorkloadStarted:
        reply = await self._call(
            "RestoreWorkload", restore_request_to_proto(request), pb.RestoreWorkloadResponse
        )
        return WorkloadStarted(
            worker_epoch=reply.worker_epoch,
            pod_ips=tuple(reply.pod_ips),
            timings=_timings_from(reply.timings),
        )

    async def checkpoint(
        self, actor_uid: str, checkpoint_dir: str, *, worker_epoch: int = 0
    ) -> WorkloadCheckpointed:
        request = pb.CheckpointWorkloadRequest(
            actor_uid=actor_uid,
            worker_epoch=worker_epoch,
            dirs=pb.ActorDirs(checkpoint_dir=checkpoint_dir),
        )
        reply = await self._call("CheckpointWorkload", request, pb.CheckpointWorkloadResponse)
        return WorkloadCheckpointed(
            worker_epoch=reply.worker_epoch,
            files=tuple(reply.files),
            runtime_version=reply.runtime_version,
            size_bytes=reply.size_bytes,
            timings=_timings_from(reply.timings),
        )

    async def terminate(self, actor_uid: str, *, worker_epoch: int = 0) -> None:
        await self._call(
            "TerminateWorkload",
            pb.TerminateWorkloadRequest(actor_uid=actor_uid, worker_epoch=worker_epoch),
            pb.TerminateWorkloadResponse,
        )

    async def stats(self, actor_uid: str) -> SandboxStats:
        reply = await self._call(
            "GetWorkloadStats",
            pb.GetWorkloadStatsRequest(actor_uid=actor_uid),
            pb.GetWorkloadStatsResponse,
        )
        s = reply.stats or pb.WorkloadStats()
        return SandboxStats(
            memory_bytes=s.memory_bytes, cpu_seconds=s.cpu_seconds, uptime_seconds=s.uptime_seconds
        )


class NodeWorkers:
    """The workers of one node, found by their sockets under the node directory.

    ``current()`` lists ``<node dir>/workers/*/worker.sock`` and returns one
    :class:`GrpcWorker` per socket (kept while the socket exists); a worker is known by its
    directory name, which is its fleet-unique name. Use it as the worker lookup of the
    node agent and the worker source of the registrar.
    """

    def __init__(self, layout: NodeLayout, *, timeout: float | None = None) -> None:
        self.layout = layout
        self.timeout = timeout
        self._clients: dict[str, GrpcWorker] = {}

    def current(self) -> dict[WorkerRef, WorkerApi]:
        found: dict[WorkerRef, WorkerApi] = {}
        try:
            names = sorted(os.listdir(self.layout.workers_dir()))
        except FileNotFoundError:
            names = []
        for name in names:
            try:
                path = self.layout.worker_socket(name)
                ref = WorkerRef(name)
            except SubstrateError:
                continue  # not a directory of ours
            if not os.path.exists(path):
                continue
            client = self._clients.get(name)
            if client is None:
                client = self._clients[name] = GrpcWorker(path, timeout=self.timeout)
            found[ref] = client
        return found

    def __call__(self, ref: WorkerRef) -> WorkerApi | None:
        return self.current().get(ref)

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()


__all__ = [
    "ATEWORKER_SERVICE",
    "AteworkerServicer",
    "GrpcWorker",
    "NodeWorkers",
    "info_from_proto",
    "info_to_proto",
    "parse_restore_workload",
    "parse_run_workload",
    "serve_worker",
]
