"""Consistent actors in each state and valid payloads for each command (shared by tests)."""

from __future__ import annotations

from substrate.core import lifecycle as lc
from substrate.core.ids import ActorRef, NodeRef, TemplateRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorState,
    ActorStatus,
    Crash,
    Durability,
    Fidelity,
    Metadata,
    Snapshot,
    SnapshotOwner,
    SnapshotStorage,
    StorageStatus,
    WorkerAssignment,
)

REF = ActorRef(atespace="a", name="b")
NODE = NodeRef(name="node-1")
WORKER = WorkerRef(name="w-1")
ASSIGNMENT = WorkerAssignment(worker=WORKER, node=NODE, worker_epoch=3, pod_ips=("127.0.0.1",))
S = ActorState


def durable_gen(gen: int, *, owner: SnapshotOwner = SnapshotOwner.ACTOR) -> Snapshot:
    return Snapshot(
        generation=gen,
        snapshot_id=f"snap-{gen}",
        owner=owner,
        storages=(
            SnapshotStorage(
                durability=Durability.DURABLE,
                status=StorageStatus.COMPLETED,
                fidelity=Fidelity.MEMORY,
                uri=f"file:///o/atespaces/a/actors/uid-1/snapshots/snap-{gen}/",
            ),
        ),
    )


def writing_gen(gen: int, *, local: StorageStatus, durable: StorageStatus | None) -> Snapshot:
    storages = [
        SnapshotStorage(
            durability=Durability.LOCAL,
            status=local,
            fidelity=Fidelity.MEMORY,
            local_name=f"snap-{gen}",
            node=NODE,
        )
    ]
    if durable is not None:
        storages.append(
            SnapshotStorage(
                durability=Durability.DURABLE,
                status=durable,
                fidelity=Fidelity.MEMORY,
                uri=f"file:///o/atespaces/a/actors/uid-1/snapshots/snap-{gen}/",
            )
        )
    return Snapshot(generation=gen, snapshot_id=f"snap-{gen}", storages=tuple(storages))


def actor_in(state: ActorState) -> Actor:
    """A self-consistent actor in ``state`` whose newest durable generation is 1."""
    assigned = state in {S.RESUMING, S.RUNNING, S.SUSPENDING, S.PAUSING}
    snaps: tuple[Snapshot, ...] = (durable_gen(1),)
    in_progress = 0
    assigned_node = None
    if state in {S.SUSPENDING, S.PAUSING}:
        snaps += (
            writing_gen(
                2,
                local=StorageStatus.IN_PROGRESS,
                durable=StorageStatus.PENDING if state is S.SUSPENDING else None,
            ),
        )
        in_progress = 2
    if state is S.PAUSED:
        snaps += (writing_gen(2, local=StorageStatus.COMPLETED, durable=None),)
        assigned_node = NODE
    return Actor(
        ref=REF,
        metadata=Metadata(uid="uid-1", version=7),
        template=TemplateRef(atespace="a", name="t"),
        status=ActorStatus(
            state=state,
            assignment=ASSIGNMENT if assigned else None,
            snapshots=snaps,
            crash=Crash(message="boom", time=1.0) if state is S.CRASHED else None,
            assigned_node=assigned_node,
            last_assigned_generation=max(s.generation for s in snaps),
            in_progress_generation=in_progress,
        ),
    )


def command_for(kind: lc.Command, actor: Actor) -> lc.LifecycleCommand:
    """A payload for ``kind`` that is valid whenever the table allows the pair."""
    nxt = actor.status.last_assigned_generation + 1
    gen = actor.status.in_progress_generation or nxt
    match kind:
        case lc.Command.BEGIN_RESUME:
            return lc.BeginResume(assignment=ASSIGNMENT)
        case lc.Command.FINISH_RESUME:
            return lc.FinishResume(worker_epoch=ASSIGNMENT.worker_epoch, pod_ips=("127.0.0.2",))
        case lc.Command.ABANDON_RESUME:
            return lc.AbandonResume(reason="worker not registered yet")
        case lc.Command.CRASH:
            return lc.CrashActor(message="restore failed")
        case lc.Command.BEGIN_SUSPEND:
            if actor.state is S.PAUSED:
                paused = actor.snapshot(actor.status.last_assigned_generation)
                assert paused is not None
                return lc.BeginSuspend(
                    snapshot=paused.with_storage(
                        SnapshotStorage(
                            durability=Durability.DURABLE,
                            status=StorageStatus.PENDING,
                            fidelity=Fidelity.MEMORY,
                            uri=f"file:///o/atespaces/a/actors/uid-1/snapshots/{paused.snapshot_id}/",
                        )
                    )
                )
            return lc.BeginSuspend(
                snapshot=writing_gen(
                    gen, local=StorageStatus.IN_PROGRESS, durable=StorageStatus.PENDING
                )
            )
        case lc.Command.FINISH_SUSPEND:
            return lc.FinishSuspend(
                snapshot=writing_gen(
                    gen, local=StorageStatus.COMPLETED, durable=StorageStatus.COMPLETED
                )
            )
        case lc.Command.CANCEL_SUSPEND:
            return lc.CancelSuspend()
        case lc.Command.BEGIN_PAUSE:
            return lc.BeginPause(
                snapshot=writing_gen(gen, local=StorageStatus.IN_PROGRESS, durable=None)
            )
        case lc.Command.FINISH_PAUSE:
            return lc.FinishPause(
                snapshot=writing_gen(gen, local=StorageStatus.COMPLETED, durable=None)
            )
        case lc.Command.CANCEL_PAUSE:
            return lc.CancelPause()
        case lc.Command.BEGIN_REVERT:
            return lc.BeginRevert()
        case lc.Command.FINISH_REVERT:
            return lc.FinishRevert()
        case lc.Command.BEGIN_DELETE:
            return lc.BeginDelete()
        case lc.Command.FORCE_DELETE:
            return lc.BeginDelete(force=True)
        case lc.Command.FINISH_DELETE:
            return lc.FinishDelete()
    raise AssertionError(kind)
