"""Ports ateapi uses beyond its store: the node agent (atelet) and snapshot objects."""

from __future__ import annotations

import enum
from typing import Protocol

import attrs

from substrate.core.ids import ActorRef, NodeRef, WorkerRef
from substrate.core.model import (
    ActorTemplate,
    Fidelity,
    Snapshot,
    SnapshotStorage,
)


class CheckpointMode(enum.Enum):
    PAUSE = 1
    """Node-local only; the actor is pinned to the node."""
    SUSPEND_ASYNC = 2
    """Local copy completed now; the durable upload runs in the background."""
    SUSPEND_SYNC = 3
    """Local copy completed, then uploaded before the call returns (if the store answers)."""


@attrs.frozen(slots=True, kw_only=True)
class WorkloadTarget:
    """Which actor, on which worker, in which worker epoch."""

    actor: ActorRef
    actor_uid: str
    worker: WorkerRef
    node: NodeRef
    worker_epoch: int


@attrs.frozen(slots=True, kw_only=True)
class StartRequest:
    """Run (cold boot) or restore an actor on a worker."""

    target: WorkloadTarget
    template: ActorTemplate
    snapshot: Snapshot | None = None
    """None = cold boot from the template."""
    storage: SnapshotStorage | None = None
    """The copy to restore from (local in place, or durable download)."""
    fidelity: Fidelity = Fidelity.MEMORY


@attrs.frozen(slots=True, kw_only=True)
class StartResult:
    worker_epoch: int
    pod_ips: tuple[str, ...] = ()
    duration: float = 0.0


@attrs.frozen(slots=True, kw_only=True)
class CheckpointRequest:
    target: WorkloadTarget
    template: ActorTemplate
    mode: CheckpointMode
    snapshot: Snapshot
    """The generation being written: its LOCAL storage names the directory, and for a
    suspend its DURABLE storage names the destination prefix."""


@attrs.frozen(slots=True, kw_only=True)
class CheckpointResult:
    """What the checkpoint produced; the sandbox is gone after a successful checkpoint."""

    snapshot: Snapshot
    """The generation with its storages' final statuses (durable PENDING if not uploaded)."""
    upload_error: str = ""
    """Why a SYNC upload did not complete (the local copy is kept and retried)."""


@attrs.frozen(slots=True, kw_only=True)
class UploadRequest:
    actor: ActorRef
    actor_uid: str
    node: NodeRef
    snapshot: Snapshot


class NodeAgent(Protocol):
    """One node's atelet, as ateapi sees it.

    Errors: ``Unavailable`` when the node or worker cannot be reached or the worker has
    not registered for its current epoch (retryable, never a reason to crash an actor);
    ``FailedPrecondition`` when the worker rejects the request for its state;
    ``Internal``/``InvalidArgument`` for failures that will not heal by retrying.
    """

    async def start(self, request: StartRequest) -> StartResult:
        """Run or restore the actor and wait until every wakeup probe answers 200."""
        ...

    async def checkpoint(self, request: CheckpointRequest) -> CheckpointResult:
        """Checkpoint the actor's sandbox to the node (and upload it, for SYNC)."""
        ...

    async def upload(self, request: UploadRequest) -> Snapshot:
        """Upload a node-local snapshot to its DURABLE destination; returns it COMPLETED."""
        ...

    async def terminate(self, target: WorkloadTarget) -> None:
        """Stop the actor's sandbox and remove its resources; idempotent."""
        ...

    async def detach(self, request: UploadRequest) -> Snapshot:
        """Upload the snapshot if it is not durable yet, then drop the node-local copy."""
        ...

    async def drop_local(self, actor_uid: str, local_name: str) -> None:
        """Delete a node-local snapshot directory; idempotent."""
        ...


class NodeAgents(Protocol):
    """Finds the node agent of a node."""

    def for_node(self, node: NodeRef) -> NodeAgent: ...


class SnapshotObjects(Protocol):
    """ateapi's access to snapshot objects: copy for tags, delete what is owned."""

    async def copy_prefix(self, src: str, dst: str) -> None:
        """Copy every object under ``src`` to ``dst``, writing ``manifest.json`` last."""
        ...

    async def delete_prefix(self, uri: str) -> None:
        """Delete every object under ``uri``; idempotent."""
        ...


__all__ = [
    "CheckpointMode",
    "CheckpointRequest",
    "CheckpointResult",
    "NodeAgent",
    "NodeAgents",
    "SnapshotObjects",
    "StartRequest",
    "StartResult",
    "UploadRequest",
    "WorkloadTarget",
]
