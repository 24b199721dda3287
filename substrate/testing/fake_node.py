"""An in-memory node side (atelets, workers, sandboxes, a bucket) for workflow tests.

Each sandbox holds a counter that survives checkpoint and restore, so a test can tell which
snapshot an actor came back from. Faults are switched on per node or for the bucket.
"""

from __future__ import annotations

from collections.abc import Iterable

import anyio
import anyio.lowlevel
import attrs

from substrate.core.agent_ports import (
    CheckpointMode,
    CheckpointRequest,
    CheckpointResult,
    StartRequest,
    StartResult,
    UploadRequest,
    WorkloadTarget,
)
from substrate.core.ids import NodeRef, WorkerRef
from substrate.core.model import Durability, Snapshot, StorageStatus
from substrate.errors import FailedPrecondition, Internal, NotFound, Unavailable


@attrs.define
class FakeSandbox:
    actor_uid: str
    counter: int
    boot_id: int


@attrs.define
class FakeWorkerProcess:
    ref: WorkerRef
    epoch: int = 1
    registered: bool = True
    sandboxes: dict[str, FakeSandbox] = attrs.Factory(dict)


class FakeBucket:
    """Object storage: snapshot prefix → the counter it holds. ``down`` refuses every call."""

    def __init__(self) -> None:
        self.objects: dict[str, int] = {}
        self.down = False
        self.copies = 0
        self.deletes: list[str] = []

    def _check(self) -> None:
        if self.down:
            raise Unavailable("object store unreachable: connection refused")

    async def put(self, uri: str, counter: int) -> None:
        self._check()
        await anyio.lowlevel.checkpoint()
        self.objects[uri] = counter

    async def get(self, uri: str) -> int:
        self._check()
        await anyio.lowlevel.checkpoint()
        if uri not in self.objects:
            raise NotFound(f"no snapshot at {uri}")
        return self.objects[uri]

    # SnapshotObjects
    async def copy_prefix(self, src: str, dst: str) -> None:
        self._check()
        if src not in self.objects:
            raise NotFound(f"no snapshot at {src}")
        self.objects[dst] = self.objects[src]
        self.copies += 1

    async def delete_prefix(self, uri: str) -> None:
        self._check()
        for key in [k for k in self.objects if k.startswith(uri)]:
            del self.objects[key]
        self.deletes.append(uri)


class FakeNodeAgent:
    """One node's atelet plus its worker processes, in memory (implements NodeAgent)."""

    def __init__(self, node: NodeRef, bucket: FakeBucket, workers: Iterable[WorkerRef]) -> None:
        self.node = node
        self.bucket = bucket
        self.workers: dict[WorkerRef, FakeWorkerProcess] = {
            w: FakeWorkerProcess(ref=w) for w in workers
        }
        self.local: dict[str, int] = {}
        """Node-local snapshot directories: local name → counter."""
        self.down = False
        self.probe_fails = False
        self.checkpoint_fails = False
        self.calls: list[str] = []
        self._boots = 0

    # --- fault and state helpers --------------------------------------------------------

    def restart_worker(self, ref: WorkerRef, *, register: bool = False) -> int:
        """The worker process restarts: sandboxes gone, epoch + 1, not registered yet."""
        w = self.workers[ref]
        w.epoch += 1
        w.sandboxes.clear()
        w.registered = register
        return w.epoch

    def request(self, worker: WorkerRef, actor_uid: str) -> int:
        """An HTTP request to the actor: increments and returns its counter."""
        if self.down:
            raise Unavailable(f"node {self.node} is down")
        box = self.workers[worker].sandboxes.get(actor_uid)
        if box is None:
            raise NotFound(f"actor {actor_uid} is not active on worker {worker}")
        box.counter += 1
        return box.counter

    def sandbox(self, actor_uid: str) -> FakeSandbox | None:
        for w in self.workers.values():
            if actor_uid in w.sandboxes:
                return w.sandboxes[actor_uid]
        return None

    def _worker(self, target: WorkloadTarget) -> FakeWorkerProcess:
        if self.down:
            raise Unavailable(f"node {self.node} is down")
        w = self.workers.get(target.worker)
        if w is None:
            raise NotFound(f"worker {target.worker} is not on node {self.node}")
        if not w.registered:
            raise Unavailable("worker has not registered yet: not accepting workloads")
        return w

    # --- NodeAgent ----------------------------------------------------------------------

    async def start(self, request: StartRequest) -> StartResult:
        self.calls.append("start")
        await anyio.lowlevel.checkpoint()
        w = self._worker(request.target)
        if w.epoch != request.target.worker_epoch:
            return StartResult(worker_epoch=w.epoch, pod_ips=("127.0.0.1",))
        uid = request.target.actor_uid
        if uid in w.sandboxes:  # re-entry after a lost reply
            return StartResult(worker_epoch=w.epoch, pod_ips=("127.0.0.1",))
        counter = 0
        if request.snapshot is not None:
            storage = request.storage
            if storage is None:
                raise Internal("restore without a storage")
            if storage.durability is Durability.LOCAL:
                if storage.local_name not in self.local:
                    raise FailedPrecondition(f"local snapshot {storage.local_name} not on node")
                counter = self.local[storage.local_name]
            else:
                counter = await self.bucket.get(storage.uri)
        if self.probe_fails:
            raise FailedPrecondition("wakeup probe did not answer 200 within 30 s")
        self._boots += 1
        w.sandboxes[uid] = FakeSandbox(actor_uid=uid, counter=counter, boot_id=self._boots)
        return StartResult(worker_epoch=w.epoch, pod_ips=("127.0.0.1",))

    async def checkpoint(self, request: CheckpointRequest) -> CheckpointResult:
        self.calls.append(f"checkpoint:{request.mode.name}")
        await anyio.lowlevel.checkpoint()
        w = self._worker(request.target)
        uid = request.target.actor_uid
        snap = request.snapshot
        local = snap.local()
        if local is None:
            raise Internal("checkpoint without a local destination")
        if request.mode is CheckpointMode.SUSPEND_SYNC and self.bucket.down:
            # Checked before checkpointing, so the actor keeps running.
            raise Unavailable("object store unreachable: connection refused")
        box = w.sandboxes.get(uid)
        if box is None:
            if local.local_name in self.local:  # re-entry: the checkpoint was taken
                counter = self.local[local.local_name]
            else:
                raise FailedPrecondition(f"actor {uid} has no sandbox on worker {w.ref}")
        else:
            if self.checkpoint_fails:
                del w.sandboxes[uid]
                raise Internal("checkpoint failed: the sandbox is gone")
            counter = box.counter
            del w.sandboxes[uid]
        self.local[local.local_name] = counter
        out = snap.with_storage(attrs.evolve(local, status=StorageStatus.COMPLETED))
        upload_error = ""
        durable = snap.durable()
        if request.mode is CheckpointMode.SUSPEND_SYNC and durable is not None:
            try:
                await self.bucket.put(durable.uri, counter)
                out = out.with_storage(attrs.evolve(durable, status=StorageStatus.COMPLETED))
            except Unavailable as exc:
                upload_error = exc.description
        return CheckpointResult(snapshot=out, upload_error=upload_error)

    async def upload(self, request: UploadRequest) -> Snapshot:
        self.calls.append("upload")
        if self.down:
            raise Unavailable(f"node {self.node} is down")
        snap = request.snapshot
        local, durable = snap.local(), snap.durable()
        if durable is None:
            raise Internal("upload without a durable destination")
        if durable.completed:
            return snap
        if local is None or local.local_name not in self.local:
            raise FailedPrecondition("no local copy to upload")
        await self.bucket.put(durable.uri, self.local[local.local_name])
        return snap.with_storage(attrs.evolve(durable, status=StorageStatus.COMPLETED))

    async def terminate(self, target: WorkloadTarget) -> None:
        self.calls.append("terminate")
        if self.down:
            raise Unavailable(f"node {self.node} is down")
        w = self.workers.get(target.worker)
        if w is not None:
            w.sandboxes.pop(target.actor_uid, None)

    async def detach(self, request: UploadRequest) -> Snapshot:
        self.calls.append("detach")
        out = await self.upload(request)
        local = out.local()
        if local is not None:
            self.local.pop(local.local_name, None)
        return out.without(Durability.LOCAL)

    async def drop_local(self, actor_uid: str, local_name: str) -> None:
        self.calls.append("drop_local")
        if self.down:
            raise Unavailable(f"node {self.node} is down")
        self.local.pop(local_name, None)


class FakeNodes:
    """Every node's fake agent (implements NodeAgents)."""

    def __init__(self, bucket: FakeBucket | None = None) -> None:
        self.bucket = bucket or FakeBucket()
        self.nodes: dict[NodeRef, FakeNodeAgent] = {}

    def add_node(self, node: NodeRef, workers: Iterable[WorkerRef]) -> FakeNodeAgent:
        agent = FakeNodeAgent(node, self.bucket, workers)
        self.nodes[node] = agent
        return agent

    def for_node(self, node: NodeRef) -> FakeNodeAgent:
        agent = self.nodes.get(node)
        if agent is None:
            raise Unavailable(f"no atelet known for node {node}")
        return agent

    def find(self, actor_uid: str) -> tuple[FakeNodeAgent, WorkerRef] | None:
        for agent in self.nodes.values():
            for ref, w in agent.workers.items():
                if actor_uid in w.sandboxes:
                    return agent, ref
        return None


__all__ = ["FakeBucket", "FakeNodeAgent", "FakeNodes", "FakeSandbox", "FakeWorkerProcess"]
