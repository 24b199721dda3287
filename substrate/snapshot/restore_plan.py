"""What a node's atelet does with a snapshot: where a restore reads from, what a checkpoint
writes and uploads (pure; the node agent in :mod:`substrate.services.node_agent` does it).

Restore (seed 000 §5)::

    no snapshot                               → COLD: run from the template
    LOCAL copy on this node                   → LOCAL: restore in place from its
                                                 snapshot directory (kept afterwards)
    DURABLE copy under a tag's prefix         → TAG_CACHE: download once into the node's
                                                 tag cache, restore from there (kept)
    other DURABLE copy                        → DOWNLOAD: download into the actor's
                                                 restore directory (removed after)

A MEMORY restore needs the worker to run the runtime that wrote the snapshot and the
sandbox class that wrote it. The worker port restores memory images only, so a restore
asked at a lower fidelity (ROOTFS, VOLUMES) is refused with ``FailedPrecondition`` rather
than silently turned into a cold boot.

Checkpoint: the LOCAL storage of the generation names the node-local directory; a
SUSPEND_SYNC whose DURABLE copy is not COMPLETED checks the object store first (so an
unreachable store leaves the actor running) and uploads right after the checkpoint.
"""

from __future__ import annotations

import enum

import attrs

from substrate.core.agent_ports import CheckpointMode
from substrate.core.ids import ActorRef, NodeRef
from substrate.core.model import (
    Durability,
    Fidelity,
    SandboxClass,
    Snapshot,
    SnapshotStorage,
    StorageStatus,
)
from substrate.errors import FailedPrecondition, InvalidArgument
from substrate.sandbox.node_layout import NodeLayout
from substrate.snapshot.layout import PrefixKind, parse_prefix

SYSINFO_NAME = "name"
SYSINFO_ATESPACE = "atespace"
SYSINFO_UID = "uid"


class RestoreKind(enum.Enum):
    """Where a start reads the actor's state from."""

    COLD = "cold"
    """No snapshot: a cold boot from the template."""
    LOCAL = "local"
    """The node-local checkpoint directory, in place (no copy, no download)."""
    TAG_CACHE = "tag"
    """A tag's durable copy, through the node's tag cache (downloaded once per node)."""
    DOWNLOAD = "durable"
    """A durable copy, downloaded into the actor's restore directory."""


@attrs.frozen(slots=True, kw_only=True)
class NodeRestorePlan:
    """How to prepare and call the worker for one start."""

    kind: RestoreKind
    restore_dir: str = ""
    """The directory the worker restores from ("" for a cold boot)."""
    preserve: bool = True
    """Whether the worker keeps ``restore_dir`` after the restore."""
    uri: str = ""
    """The durable prefix to download (TAG_CACHE and DOWNLOAD)."""
    tag_uid: str = ""
    """The tag owning ``uri`` (TAG_CACHE)."""
    local_name: str = ""
    """The node-local snapshot name (LOCAL)."""

    @property
    def restores(self) -> bool:
        return self.kind is not RestoreKind.COLD

    @property
    def downloads(self) -> bool:
        return self.kind in (RestoreKind.TAG_CACHE, RestoreKind.DOWNLOAD)


def tag_of(uri: str) -> str | None:
    """The uid of the tag whose prefix ``uri`` is; None for any other (or unparsable) uri."""
    try:
        parsed = parse_prefix(uri)
    except InvalidArgument:
        return None
    return parsed.owner_uid if parsed.kind is PrefixKind.TAG else None


def plan_restore(
    *,
    layout: NodeLayout,
    node: NodeRef,
    actor_uid: str,
    snapshot: Snapshot | None,
    storage: SnapshotStorage | None,
    fidelity: Fidelity,
    sandbox_class: SandboxClass,
    runtime_versions: frozenset[str] | tuple[str, ...],
) -> NodeRestorePlan:
    """Where the start of ``actor_uid`` on a worker of ``node`` restores from.

    ``sandbox_class`` and ``runtime_versions`` are the worker's. Raises
    :class:`InvalidArgument` for a malformed request (a snapshot without a storage, a
    storage without its name or uri) and :class:`FailedPrecondition` for one this worker
    cannot carry out (a local copy of another node, a durable copy not yet completed, a
    snapshot of another sandbox class or runtime, a fidelity below MEMORY).
    """
    if snapshot is None:
        return NodeRestorePlan(kind=RestoreKind.COLD)
    if storage is None:
        raise InvalidArgument("a restore needs the snapshot storage to restore from")
    effective = min(fidelity, storage.fidelity)
    if effective < Fidelity.MEMORY:
        raise FailedPrecondition(
            f"restoring snapshot {snapshot.snapshot_id} at {effective.name} fidelity is not "
            "supported: workers restore MEMORY images only"
        )
    if snapshot.sandbox_class is not sandbox_class:
        raise FailedPrecondition(
            f"snapshot {snapshot.snapshot_id} was written by a {snapshot.sandbox_class.name} "
            f"sandbox; the worker runs {sandbox_class.name}"
        )
    if snapshot.runtime_version and snapshot.runtime_version not in runtime_versions:
        raise FailedPrecondition(
            f"snapshot {snapshot.snapshot_id} needs runtime {snapshot.runtime_version!r}; "
            f"the worker restores {sorted(runtime_versions)}"
        )
    if storage.durability is Durability.LOCAL:
        if not storage.local_name:
            raise InvalidArgument("a LOCAL snapshot storage needs its local name")
        if storage.node is not None and storage.node != node:
            raise FailedPrecondition(
                f"local snapshot {storage.local_name} is on node {storage.node}, not {node}"
            )
        return NodeRestorePlan(
            kind=RestoreKind.LOCAL,
            restore_dir=layout.local_snapshot_dir(actor_uid, storage.local_name),
            preserve=True,
            local_name=storage.local_name,
        )
    if not storage.uri:
        raise InvalidArgument("a DURABLE snapshot storage needs its uri")
    if not storage.completed:
        raise FailedPrecondition(
            f"the durable copy of snapshot {snapshot.snapshot_id} is {storage.status.name}, "
            "not COMPLETED"
        )
    tag_uid = tag_of(storage.uri)
    if tag_uid is not None:
        return NodeRestorePlan(
            kind=RestoreKind.TAG_CACHE,
            restore_dir=layout.tag_cache_dir(tag_uid, snapshot.snapshot_id),
            preserve=True,
            uri=storage.uri,
            tag_uid=tag_uid,
        )
    return NodeRestorePlan(
        kind=RestoreKind.DOWNLOAD,
        restore_dir=layout.restore_dir(actor_uid),
        preserve=False,
        uri=storage.uri,
    )


def sysinfo_files(actor: ActorRef, actor_uid: str) -> dict[str, str]:
    """The actor's system-info files (``/run/ate`` in the sandbox): name → content."""
    return {SYSINFO_NAME: actor.name, SYSINFO_ATESPACE: actor.atespace, SYSINFO_UID: actor_uid}


# --- checkpoint and upload ----------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class CheckpointPlan:
    """What a checkpoint writes, and whether it uploads before answering."""

    local: SnapshotStorage
    local_dir: str
    durable: SnapshotStorage | None
    check_store_first: bool
    """Check that the object store answers before touching the actor (SUSPEND_SYNC)."""
    upload_now: bool
    """Upload to ``durable.uri`` right after the checkpoint (SUSPEND_SYNC)."""


def plan_checkpoint(
    *,
    layout: NodeLayout,
    node: NodeRef,
    actor_uid: str,
    mode: CheckpointMode,
    snapshot: Snapshot,
) -> CheckpointPlan:
    """The checkpoint of ``actor_uid`` into ``snapshot``'s LOCAL storage on ``node``.

    Raises :class:`InvalidArgument` if the generation has no LOCAL storage (or it names
    another node), or a SUSPEND_SYNC's durable copy has no uri.
    """
    local = snapshot.local()
    if local is None or not local.local_name:
        raise InvalidArgument(
            f"checkpoint of snapshot {snapshot.snapshot_id} needs a LOCAL storage with a name"
        )
    if local.node is not None and local.node != node:
        raise InvalidArgument(
            f"snapshot {snapshot.snapshot_id} is to be written on node {local.node}, not {node}"
        )
    durable = snapshot.durable()
    upload = mode is CheckpointMode.SUSPEND_SYNC and durable is not None and not durable.completed
    if upload and durable is not None and not durable.uri:
        raise InvalidArgument(f"the durable copy of snapshot {snapshot.snapshot_id} has no uri")
    return CheckpointPlan(
        local=local,
        local_dir=layout.local_snapshot_dir(actor_uid, local.local_name),
        durable=durable,
        check_store_first=upload,
        upload_now=upload,
    )


def checkpointed(snapshot: Snapshot, *, runtime_version: str, uploaded: bool) -> Snapshot:
    """``snapshot`` after a successful checkpoint: LOCAL COMPLETED, the runtime that wrote
    it recorded, and the DURABLE copy COMPLETED if it was uploaded (else as it was)."""
    local = snapshot.local()
    if local is None:
        raise InvalidArgument(f"snapshot {snapshot.snapshot_id} has no LOCAL storage")
    out = snapshot.with_storage(attrs.evolve(local, status=StorageStatus.COMPLETED))
    if runtime_version:
        out = attrs.evolve(out, runtime_version=runtime_version)
    return uploaded_snapshot(out) if uploaded else out


def uploaded_snapshot(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with its DURABLE copy COMPLETED."""
    durable = snapshot.durable()
    if durable is None:
        raise InvalidArgument(f"snapshot {snapshot.snapshot_id} has no DURABLE storage")
    return snapshot.with_storage(attrs.evolve(durable, status=StorageStatus.COMPLETED))


@attrs.frozen(slots=True, kw_only=True)
class UploadPlan:
    """An upload of a node-local copy to its durable destination."""

    local_dir: str
    uri: str
    fidelity: Fidelity


def plan_upload(
    *, layout: NodeLayout, node: NodeRef, actor_uid: str, snapshot: Snapshot
) -> UploadPlan | None:
    """The upload of ``snapshot``'s local copy; None if its durable copy is COMPLETED.

    Raises :class:`InvalidArgument` without a DURABLE storage (or its uri) and
    :class:`FailedPrecondition` without a LOCAL copy on this node.
    """
    durable = snapshot.durable()
    if durable is None or not durable.uri:
        raise InvalidArgument(
            f"upload of snapshot {snapshot.snapshot_id} needs a DURABLE storage with a uri"
        )
    if durable.completed:
        return None
    local = snapshot.local()
    if local is None or not local.local_name:
        raise FailedPrecondition(f"snapshot {snapshot.snapshot_id} has no local copy to upload")
    if local.node is not None and local.node != node:
        raise FailedPrecondition(
            f"the local copy of snapshot {snapshot.snapshot_id} is on node {local.node}, not {node}"
        )
    return UploadPlan(
        local_dir=layout.local_snapshot_dir(actor_uid, local.local_name),
        uri=durable.uri,
        fidelity=durable.fidelity,
    )


__all__ = [
    "SYSINFO_ATESPACE",
    "SYSINFO_NAME",
    "SYSINFO_UID",
    "CheckpointPlan",
    "NodeRestorePlan",
    "RestoreKind",
    "UploadPlan",
    "checkpointed",
    "plan_checkpoint",
    "plan_restore",
    "plan_upload",
    "sysinfo_files",
    "tag_of",
    "uploaded_snapshot",
]
