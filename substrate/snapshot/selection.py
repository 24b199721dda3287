"""Choosing what to restore (seed 000 §4), and the generation bookkeeping of suspend.

The decision, for an actor about to run on ``worker``::

    newest generation with a usable copy?
    ├─ no                                  → ColdBoot: run from the template spec
    └─ yes                                 → Restore that generation
         ├─ captured under another template → at VOLUMES fidelity
         ├─ memory runtime not on worker    → at ROOTFS fidelity
         └─ otherwise                       → at the copy's own fidelity

A copy is *usable* when it is COMPLETED and, for a LOCAL copy, on a live node. For one
particular worker a generation is usable if

* its LOCAL copy is usable and on the worker's node → restore that copy in place; or
* its DURABLE copy is COMPLETED → restore from object storage. If the generation also
  has a local copy on another node (live or not), the plan drops the binding to that node.

A generation whose only usable copy is LOCAL on *another* node is not usable for this
worker: selection falls through to older generations (or a cold boot). Callers that must
not lose that newer state keep the actor on that node with :func:`pin_node` (a PAUSED
actor, or one whose durable upload has not finished) and steer it there with
:func:`preferred_node`; selection itself stays a pure function of its inputs.

There is no separate "golden" branch: an actor created from a tag (or a template's golden
tag) holds the tag's snapshot as its first generation, owned by the TAG, and restoring it
is recorded with the TAG provenance.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeAlias

import attrs

from substrate.core.ids import NodeRef
from substrate.core.model import (
    COLD_BOOT_PROVENANCE,
    Actor,
    ActorTemplate,
    Durability,
    Fidelity,
    RestoreSource,
    SandboxClass,
    Snapshot,
    SnapshotOwner,
    SnapshotStorage,
    StorageStatus,
    Worker,
    newest_first,
)
from substrate.errors import InvalidArgument
from substrate.snapshot.layout import actor_snapshot_prefix, validate_id


@attrs.frozen(slots=True, kw_only=True)
class ColdBoot:
    """No usable snapshot: run the actor from its template spec."""

    drop_node: NodeRef | None = None
    """A node the actor is bound to other than the worker's; the binding is dropped."""

    @property
    def provenance(self) -> str:
        return COLD_BOOT_PROVENANCE


@attrs.frozen(slots=True, kw_only=True)
class Restore:
    """Restore ``snapshot`` from ``storage`` at ``fidelity``."""

    snapshot: Snapshot
    storage: SnapshotStorage
    """The copy to restore from (COMPLETED; LOCAL only when on the worker's node)."""
    fidelity: Fidelity
    """Never higher than ``storage.fidelity``."""
    source: RestoreSource
    drop_node: NodeRef | None = None
    """A node the actor (or this generation's local copy) is bound to other than the
    worker's; restoring elsewhere drops that binding."""

    @property
    def generation(self) -> int:
        return self.snapshot.generation

    @property
    def provenance(self) -> str:
        return self.source.value


RestorePlan: TypeAlias = ColdBoot | Restore


# --- selection --------------------------------------------------------------------------


def _local_usable(storage: SnapshotStorage | None, live_nodes: frozenset[NodeRef]) -> bool:
    return (
        storage is not None
        and storage.completed
        and storage.node is not None
        and storage.node in live_nodes
    )


def _durable_usable(storage: SnapshotStorage | None) -> bool:
    return storage is not None and storage.completed


def has_usable_copy(snapshot: Snapshot, live_nodes: frozenset[NodeRef]) -> bool:
    """A LOCAL COMPLETED copy on a live node, or a DURABLE COMPLETED copy."""
    return _local_usable(snapshot.local(), live_nodes) or _durable_usable(snapshot.durable())


def restore_fidelity(
    snapshot: Snapshot,
    storage: SnapshotStorage,
    template: ActorTemplate,
    worker: Worker,
) -> Fidelity:
    """The fidelity at which ``storage`` of ``snapshot`` restores on ``worker``.

    Captured under another template (both UIDs known and different) → VOLUMES; written
    by another sandbox class than the worker's → VOLUMES (an image of one class cannot
    be restored by another; the scheduler normally prevents this); a MEMORY copy whose
    runtime the worker cannot restore → ROOTFS; otherwise the copy's own fidelity.
    """
    own = storage.fidelity
    template_uid = template.metadata.uid
    if snapshot.template_uid and template_uid and snapshot.template_uid != template_uid:
        return min(own, Fidelity.VOLUMES)
    if snapshot.sandbox_class is not worker.sandbox_class:
        return min(own, Fidelity.VOLUMES)
    if own is Fidelity.MEMORY and not worker.can_restore(snapshot.runtime_version):
        return Fidelity.ROOTFS
    return own


def _stale_binding(actor: Actor, snapshot: Snapshot | None, worker: Worker) -> NodeRef | None:
    if snapshot is not None:
        local = snapshot.local()
        if local is not None and local.node is not None and local.node != worker.node:
            return local.node
    assigned = actor.status.assigned_node
    if assigned is not None and assigned != worker.node:
        return assigned
    return None


def select_restore(
    actor: Actor,
    template: ActorTemplate,
    worker: Worker,
    *,
    live_nodes: frozenset[NodeRef],
) -> RestorePlan:
    """Choose what to restore for ``actor`` on ``worker`` (seed 000 §4, see the module doc).

    ``live_nodes`` are the nodes whose local snapshot copies can be trusted (their atelet
    is up); a local copy on the worker's node counts only if that node is live too.
    """
    for snapshot in newest_first(actor.status.snapshots):
        local = snapshot.local()
        if _local_usable(local, live_nodes) and local is not None and local.node == worker.node:
            return Restore(
                snapshot=snapshot,
                storage=local,
                fidelity=restore_fidelity(snapshot, local, template, worker),
                source=RestoreSource.LOCAL,
                drop_node=_stale_binding(actor, snapshot, worker),
            )
        durable = snapshot.durable()
        if _durable_usable(durable) and durable is not None:
            return Restore(
                snapshot=snapshot,
                storage=durable,
                fidelity=restore_fidelity(snapshot, durable, template, worker),
                source=(
                    RestoreSource.TAG
                    if snapshot.owner is SnapshotOwner.TAG
                    else RestoreSource.DURABLE
                ),
                drop_node=_stale_binding(actor, snapshot, worker),
            )
        # Unusable here: nothing COMPLETED, a local copy on a dead node, or a local-only
        # copy on another node. Fall through to the next older generation.
    return ColdBoot(drop_node=_stale_binding(actor, None, worker))


def newest_usable(actor: Actor, live_nodes: frozenset[NodeRef]) -> Snapshot | None:
    """The newest generation with a usable copy on any worker (None: cold boot)."""
    for snapshot in newest_first(actor.status.snapshots):
        if has_usable_copy(snapshot, live_nodes):
            return snapshot
    return None


def preferred_node(actor: Actor, live_nodes: frozenset[NodeRef]) -> NodeRef | None:
    """The node holding a usable local copy of the newest usable generation.

    The scheduler prefers it so the restore needs no download. None if the newest usable
    generation has no usable local copy (an older local copy would not be restored).
    """
    snapshot = newest_usable(actor, live_nodes)
    if snapshot is None:
        return None
    local = snapshot.local()
    if _local_usable(local, live_nodes) and local is not None:
        return local.node
    return None


def pin_node(actor: Actor) -> NodeRef | None:
    """The node ``actor`` must run on, or None if it may run anywhere.

    ``status.assigned_node`` if set (a PAUSED actor, or one holding a node-only copy).
    Otherwise, if the newest generation with any COMPLETED copy has it only on a node
    (local COMPLETED, durable missing or unfinished), that node: restoring anywhere else
    would silently roll the actor back to an older generation.
    """
    if actor.status.assigned_node is not None:
        return actor.status.assigned_node
    for snapshot in newest_first(actor.status.snapshots):
        local = snapshot.local()
        durable = snapshot.durable()
        if _durable_usable(durable):
            return None
        if local is not None and local.completed and local.node is not None:
            return local.node
    return None


def latest_durable(actor: Actor) -> Snapshot | None:
    """The newest generation whose DURABLE copy is COMPLETED (what revert goes back to)."""
    for snapshot in newest_first(actor.status.snapshots):
        if _durable_usable(snapshot.durable()):
            return snapshot
    return None


# --- suspend bookkeeping ----------------------------------------------------------------


def next_generation(actor: Actor) -> int:
    """``status.last_assigned_generation + 1`` (and above every generation held)."""
    held = max((s.generation for s in actor.status.snapshots), default=0)
    return max(actor.status.last_assigned_generation, held) + 1


def new_generation(
    actor: Actor,
    *,
    snapshot_id: str,
    fidelity: Fidelity,
    node: NodeRef,
    template_uid: str,
    sandbox_class: SandboxClass,
    runtime_version: str,
    now: float,
    location: str,
) -> Snapshot:
    """The next generation a suspend writes: owned by the actor, captured at ``now``.

    It has a LOCAL IN_PROGRESS copy on ``node`` (directory ``snapshot_id``) and a DURABLE
    PENDING copy at ``<location>/atespaces/<as>/actors/<uid>/snapshots/<snapshot_id>/``.
    The caller records ``generation`` as ``status.last_assigned_generation``. Raises
    :class:`InvalidArgument` if the actor has no UID or an id is unsafe.
    """
    if not actor.metadata.uid:
        raise InvalidArgument(f"actor {actor.ref} has no uid; it must be stored first")
    validate_id(snapshot_id, what="snapshot id")
    uri = actor_snapshot_prefix(location, actor.ref.atespace, actor.metadata.uid, snapshot_id)
    return Snapshot(
        generation=next_generation(actor),
        snapshot_id=snapshot_id,
        owner=SnapshotOwner.ACTOR,
        template_uid=template_uid,
        sandbox_class=sandbox_class,
        runtime_version=runtime_version,
        captured_at=now,
        storages=(
            SnapshotStorage(
                durability=Durability.LOCAL,
                status=StorageStatus.IN_PROGRESS,
                fidelity=fidelity,
                local_name=snapshot_id,
                node=node,
            ),
            SnapshotStorage(
                durability=Durability.DURABLE,
                status=StorageStatus.PENDING,
                fidelity=fidelity,
                uri=uri,
            ),
        ),
    )


def prune_after_suspend(
    actor_snapshots: Iterable[Snapshot], keep_generation: int
) -> tuple[tuple[Snapshot, ...], tuple[Snapshot, ...]]:
    """Keep ``keep_generation`` (and anything newer); drop the older generations.

    Returns ``(kept, released)``: ``kept`` in the input order, ``released`` the dropped
    generations whose objects the actor owns and may delete. TAG-owned (borrowed)
    generations are dropped from the actor but never released, and neither is a dropped
    generation whose durable uri is still used by a kept one. The deleter should still
    gate each deletion with :func:`substrate.snapshot.layout.owned_by_actor`.
    Raises :class:`InvalidArgument` if ``keep_generation`` is not among the snapshots.
    """
    snapshots = tuple(actor_snapshots)
    if not any(s.generation == keep_generation for s in snapshots):
        raise InvalidArgument(f"generation {keep_generation} is not among the actor's snapshots")
    kept = tuple(s for s in snapshots if s.generation >= keep_generation)
    kept_ids = {s.snapshot_id for s in kept}
    kept_uris = {d.uri for s in kept if (d := s.durable()) is not None and d.uri}
    released = tuple(
        s
        for s in snapshots
        if s.generation < keep_generation
        and s.owner is SnapshotOwner.ACTOR
        and s.snapshot_id not in kept_ids
        and not ((d := s.durable()) is not None and d.uri in kept_uris)
    )
    return kept, released


__all__ = [
    "COLD_BOOT_PROVENANCE",
    "ColdBoot",
    "Restore",
    "RestorePlan",
    "RestoreSource",
    "has_usable_copy",
    "latest_durable",
    "new_generation",
    "newest_usable",
    "next_generation",
    "pin_node",
    "preferred_node",
    "prune_after_suspend",
    "restore_fidelity",
    "select_restore",
]
