"""The actor lifecycle as a table, and the pure decision function over it."""

# Theory of operation
# -------------------
#
# Rule 1: every fact about which lifecycle command is legal in which state lives in
# TRANSITIONS below, and nowhere else. Workflows (substrate.services) never test states
# with `if` chains; they build a command and call `decide`, which either returns the next
# actor record plus the side effects the shell must carry out, or raises
# `IllegalTransition` (a FailedPrecondition) whose message follows the original system's
# wording. The input actor is never modified (records are frozen), so a refused command
# leaves the actor exactly as it was.
#
# Rule 2: every `-ING` state is a persisted intent. A workflow first persists the intent
# (BEGIN_*), then does its slow work (atelet calls, uploads), then persists the result
# (FINISH_*). If the process dies in between, the next workflow (or the reconciler)
# re-enters from the stored record: BEGIN_* on an actor already in the -ING state is a
# no-op (`changed=False`), and FINISH_* on an actor already in the final state is a no-op
# too. That is what makes every step idempotent.
#
# Rule 3: when a workflow cannot finish, it does not leave the intent behind. It either
# rolls back to the state it came from, when nothing irreversible happened (ABANDON_RESUME:
# the restore never started, so the snapshot is intact; CANCEL_SUSPEND / CANCEL_PAUSE: the
# sandbox is still running), or it records a crash (CRASH), releasing the worker first.
# The reconciler uses the same commands for intents whose workflow died.
#
# The transition table is rendered into docs/lifecycle.md by scripts/render_lifecycle.py.

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import attrs

from substrate.core.ids import NodeRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorState,
    ActorStatus,
    Crash,
    Durability,
    Snapshot,
    SnapshotOwner,
    StorageStatus,
    WorkerAssignment,
)
from substrate.errors import FailedPrecondition, IllegalTransition

S = ActorState


class Command(enum.Enum):
    """What a workflow (or the reconciler) asks of an actor's lifecycle."""

    BEGIN_RESUME = "BeginResume"
    FINISH_RESUME = "FinishResume"
    ABANDON_RESUME = "AbandonResume"
    CRASH = "Crash"
    BEGIN_SUSPEND = "BeginSuspend"
    FINISH_SUSPEND = "FinishSuspend"
    CANCEL_SUSPEND = "CancelSuspend"
    BEGIN_PAUSE = "BeginPause"
    FINISH_PAUSE = "FinishPause"
    CANCEL_PAUSE = "CancelPause"
    BEGIN_REVERT = "BeginRevert"
    FINISH_REVERT = "FinishRevert"
    BEGIN_DELETE = "BeginDelete"
    FORCE_DELETE = "ForceDelete"
    FINISH_DELETE = "FinishDelete"


DELETED: Final = None
"""Next state of FINISH_DELETE: the record is removed."""

_ALL_STATES: Final = tuple(ActorState)

TRANSITIONS: Final[Mapping[tuple[ActorState, Command], ActorState | None]] = MappingProxyType(
    {
        # resume
        (S.SUSPENDED, Command.BEGIN_RESUME): S.RESUMING,
        (S.PAUSED, Command.BEGIN_RESUME): S.RESUMING,
        (S.RESUMING, Command.BEGIN_RESUME): S.RESUMING,
        (S.RESUMING, Command.FINISH_RESUME): S.RUNNING,
        (S.RUNNING, Command.FINISH_RESUME): S.RUNNING,
        (S.RESUMING, Command.ABANDON_RESUME): S.SUSPENDED,
        (S.SUSPENDED, Command.ABANDON_RESUME): S.SUSPENDED,
        # crash
        (S.RESUMING, Command.CRASH): S.CRASHED,
        (S.RUNNING, Command.CRASH): S.CRASHED,
        (S.SUSPENDING, Command.CRASH): S.CRASHED,
        (S.PAUSING, Command.CRASH): S.CRASHED,
        (S.PAUSED, Command.CRASH): S.CRASHED,
        (S.CRASHED, Command.CRASH): S.CRASHED,
        # suspend
        (S.RUNNING, Command.BEGIN_SUSPEND): S.SUSPENDING,
        (S.PAUSED, Command.BEGIN_SUSPEND): S.SUSPENDING,
        (S.SUSPENDING, Command.BEGIN_SUSPEND): S.SUSPENDING,
        (S.SUSPENDED, Command.BEGIN_SUSPEND): S.SUSPENDED,
        (S.SUSPENDING, Command.FINISH_SUSPEND): S.SUSPENDED,
        (S.SUSPENDED, Command.FINISH_SUSPEND): S.SUSPENDED,
        (S.SUSPENDING, Command.CANCEL_SUSPEND): S.RUNNING,
        # pause
        (S.RUNNING, Command.BEGIN_PAUSE): S.PAUSING,
        (S.PAUSING, Command.BEGIN_PAUSE): S.PAUSING,
        (S.PAUSED, Command.BEGIN_PAUSE): S.PAUSED,
        (S.PAUSING, Command.FINISH_PAUSE): S.PAUSED,
        (S.PAUSED, Command.FINISH_PAUSE): S.PAUSED,
        (S.PAUSING, Command.CANCEL_PAUSE): S.RUNNING,
        # revert
        (S.RUNNING, Command.BEGIN_REVERT): S.REVERTING,
        (S.PAUSED, Command.BEGIN_REVERT): S.REVERTING,
        (S.CRASHED, Command.BEGIN_REVERT): S.REVERTING,
        (S.REVERTING, Command.BEGIN_REVERT): S.REVERTING,
        (S.REVERTING, Command.FINISH_REVERT): S.SUSPENDED,
        # delete
        (S.SUSPENDED, Command.BEGIN_DELETE): S.DELETING,
        (S.CRASHED, Command.BEGIN_DELETE): S.DELETING,
        (S.DELETING, Command.BEGIN_DELETE): S.DELETING,
        **{(state, Command.FORCE_DELETE): S.DELETING for state in _ALL_STATES},
        (S.DELETING, Command.FINISH_DELETE): DELETED,
    }
)
"""(state, command) → next state. A pair that is absent is refused with IllegalTransition."""


def _want(*states: ActorState) -> str:
    return " or ".join(s.wire_name for s in states)


_REFUSALS: Final[Mapping[Command, str]] = MappingProxyType(
    {
        Command.BEGIN_RESUME: "AssignWorker prerequisite not met for Actor: {ref} "
        f"(got: {{got}}, want {_want(S.SUSPENDED, S.PAUSED)})",
        Command.FINISH_RESUME: "FinalizeRunning prerequisite not met for Actor: {ref} "
        f"(got: {{got}}, want {_want(S.RESUMING)})",
        Command.ABANDON_RESUME: "ReleaseResume prerequisite not met for Actor: {ref} "
        f"(got: {{got}}, want {_want(S.RESUMING)})",
        Command.CRASH: "CrashActor prerequisite not met for Actor: {ref} "
        "(got: {got}, want one of [RESUMING RUNNING SUSPENDING PAUSING PAUSED])",
        Command.BEGIN_SUSPEND: "MarkSuspending prerequisite not met for Actor: {ref} "
        f"(got: {{got}}, want {_want(S.RUNNING, S.PAUSED)})",
        Command.FINISH_SUSPEND: "FinalizeSuspended prerequisite not met for Actor: {ref} "
        f"(got: {{got}}, want {_want(S.SUSPENDING)})",
        Command.CANCEL_SUSPEND: "CancelSuspend prerequisite not met for Actor: {ref} "
        f"(got: {{got}}, want {_want(S.SUSPENDING)})",
        Command.BEGIN_PAUSE: "MarkPausing prerequisite not met for Actor: {ref} "
        f"(got: {{got}}, want {_want(S.RUNNING)})",
        Command.FINISH_PAUSE: "FinalizePaused prerequisite not met for Actor: {ref} "
        f"(got: {{got}}, want {_want(S.PAUSING)})",
        Command.CANCEL_PAUSE: "CancelPause prerequisite not met for Actor: {ref} "
        f"(got: {{got}}, want {_want(S.PAUSING)})",
        Command.BEGIN_REVERT: "Actor {ref} is not in a revertable state "
        "(got: {got}, want one of [RUNNING PAUSED CRASHED])",
        Command.FINISH_REVERT: "FinalizeReverted prerequisite not met for Actor: {ref} "
        f"(got: {{got}}, want {_want(S.REVERTING)})",
        Command.BEGIN_DELETE: "Actor {ref} is not in a deletable state "
        "(got: {got}, want one of [SUSPENDED CRASHED])",
        Command.FORCE_DELETE: "ForceDelete prerequisite not met for Actor: {ref} (got: {got})",
        Command.FINISH_DELETE: "DeleteVolumes prerequisite not met for Actor: {ref} "
        f"(got: {{got}}, want {_want(S.DELETING)})",
    }
)


def refusal_message(command: Command, actor: Actor) -> str:
    return _REFUSALS[command].format(ref=actor.ref, got=actor.state.wire_name)


def next_state(state: ActorState, command: Command) -> ActorState | None:
    """The table lookup (KeyError for a refused pair; check with :func:`allowed` first)."""
    return TRANSITIONS[(state, command)]


def allowed(state: ActorState, command: Command) -> bool:
    return (state, command) in TRANSITIONS


# --- commands (inputs) ------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class BeginResume:
    assignment: WorkerAssignment
    kind: Command = attrs.field(default=Command.BEGIN_RESUME, init=False)


@attrs.frozen(slots=True, kw_only=True)
class FinishResume:
    worker_epoch: int
    pod_ips: tuple[str, ...] = ()
    kind: Command = attrs.field(default=Command.FINISH_RESUME, init=False)


@attrs.frozen(slots=True, kw_only=True)
class AbandonResume:
    """Roll a RESUMING actor back to SUSPENDED: the restore never started or was undone."""

    reason: str = ""
    kind: Command = attrs.field(default=Command.ABANDON_RESUME, init=False)


@attrs.frozen(slots=True, kw_only=True)
class CrashActor:
    message: str
    kind: Command = attrs.field(default=Command.CRASH, init=False)


@attrs.frozen(slots=True, kw_only=True)
class BeginSuspend:
    """Persist the intent to suspend, with the generation being written.

    From RUNNING, ``snapshot`` is a new generation (LOCAL in progress, DURABLE pending).
    From PAUSED, it is the paused generation with a DURABLE copy added.
    """

    snapshot: Snapshot
    kind: Command = attrs.field(default=Command.BEGIN_SUSPEND, init=False)


@attrs.frozen(slots=True, kw_only=True)
class FinishSuspend:
    """Commit SUSPENDED with the final form of the generation.

    If the generation's DURABLE copy is COMPLETED, older generations are pruned and the
    node pin is dropped. Otherwise (ASYNC suspend, or a SYNC suspend whose upload failed)
    the actor stays pinned to the node holding the COMPLETED local copy, and the older
    generations with a completed durable copy are kept as the revert point.
    """

    snapshot: Snapshot
    kind: Command = attrs.field(default=Command.FINISH_SUSPEND, init=False)


@attrs.frozen(slots=True, kw_only=True)
class CancelSuspend:
    """The checkpoint was never taken and the sandbox still runs: back to RUNNING."""

    kind: Command = attrs.field(default=Command.CANCEL_SUSPEND, init=False)


@attrs.frozen(slots=True, kw_only=True)
class BeginPause:
    snapshot: Snapshot
    kind: Command = attrs.field(default=Command.BEGIN_PAUSE, init=False)


@attrs.frozen(slots=True, kw_only=True)
class FinishPause:
    snapshot: Snapshot
    kind: Command = attrs.field(default=Command.FINISH_PAUSE, init=False)


@attrs.frozen(slots=True, kw_only=True)
class CancelPause:
    kind: Command = attrs.field(default=Command.CANCEL_PAUSE, init=False)


@attrs.frozen(slots=True, kw_only=True)
class BeginRevert:
    kind: Command = attrs.field(default=Command.BEGIN_REVERT, init=False)


@attrs.frozen(slots=True, kw_only=True)
class FinishRevert:
    kind: Command = attrs.field(default=Command.FINISH_REVERT, init=False)


@attrs.frozen(slots=True, kw_only=True)
class BeginDelete:
    force: bool = False

    @property
    def kind(self) -> Command:
        return Command.FORCE_DELETE if self.force else Command.BEGIN_DELETE


@attrs.frozen(slots=True, kw_only=True)
class FinishDelete:
    kind: Command = attrs.field(default=Command.FINISH_DELETE, init=False)


LifecycleCommand = (
    BeginResume
    | FinishResume
    | AbandonResume
    | CrashActor
    | BeginSuspend
    | FinishSuspend
    | CancelSuspend
    | BeginPause
    | FinishPause
    | CancelPause
    | BeginRevert
    | FinishRevert
    | BeginDelete
    | FinishDelete
)


# --- effects (outputs) ------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class ReleaseWorker:
    """Give the actor's booking on ``worker`` back (idempotent in the store)."""

    worker: WorkerRef
    actor_uid: str


@attrs.frozen(slots=True, kw_only=True)
class TerminateSandbox:
    """Stop the actor's sandbox on ``worker`` (node ``node``), discarding its memory."""

    worker: WorkerRef
    node: NodeRef
    actor_uid: str


@attrs.frozen(slots=True, kw_only=True)
class DeleteObjects:
    """Delete an object-store prefix the actor owns (never a borrowed one)."""

    uri: str


@attrs.frozen(slots=True, kw_only=True)
class DropLocalCopy:
    """Delete a node-local snapshot directory."""

    node: NodeRef
    local_name: str


Effect = ReleaseWorker | TerminateSandbox | DeleteObjects | DropLocalCopy


@attrs.frozen(slots=True, kw_only=True)
class Decision:
    """The outcome of a command: the next record (None = deleted) and effects to run."""

    actor: Actor | None
    changed: bool
    effects: tuple[Effect, ...] = ()


# --- the decision function --------------------------------------------------------------


def decide(actor: Actor, command: LifecycleCommand, *, now: float) -> Decision:
    """Apply ``command`` to ``actor``; pure. Raises IllegalTransition if the table refuses.

    ``now`` is used only for timestamps recorded in the status (crash time).
    """
    kind = command.kind
    state = actor.state
    if (state, kind) not in TRANSITIONS:
        raise IllegalTransition(refusal_message(kind, actor))
    target = TRANSITIONS[(state, kind)]
    status = actor.status

    match command:
        case BeginResume(assignment=assignment):
            if state is S.RESUMING:
                current = status.assignment
                if current is not None and current.worker != assignment.worker:
                    raise FailedPrecondition(
                        f"Actor {actor.ref} is already being resumed on worker {current.worker}"
                    )
                if current == assignment:
                    return Decision(actor=actor, changed=False)
            return _with(actor, state=S.RESUMING, assignment=assignment, crash=None)
        case FinishResume(worker_epoch=epoch, pod_ips=ips):
            if state is S.RUNNING:
                return Decision(actor=actor, changed=False)
            bound = status.assignment
            if bound is None:
                raise FailedPrecondition(f"Actor {actor.ref} is RESUMING without a worker")
            if epoch != bound.worker_epoch:
                raise FailedPrecondition(
                    f"worker {bound.worker} epoch changed during the restore "
                    f"(assigned {bound.worker_epoch}, now {epoch})"
                )
            pod_ips = ips or bound.pod_ips
            return _with(
                actor,
                state=S.RUNNING,
                assignment=attrs.evolve(bound, pod_ips=tuple(pod_ips)),
                assigned_node=None,
            )
        case AbandonResume():
            if state is S.SUSPENDED:
                return Decision(actor=actor, changed=False)
            return _with(
                actor,
                state=S.SUSPENDED,
                assignment=None,
                effects=_release(actor),
            )
        case CrashActor(message=message):
            if state is S.CRASHED:
                return Decision(actor=actor, changed=False)
            return _with(
                actor,
                state=S.CRASHED,
                assignment=None,
                crash=Crash(message=message, time=now),
                in_progress_generation=0,
                effects=_release(actor),
            )
        case BeginSuspend(snapshot=snap) | BeginPause(snapshot=snap):
            if state is target:
                return Decision(actor=actor, changed=False)
            if state is S.SUSPENDING or state is S.PAUSING:
                if status.in_progress_generation == snap.generation:
                    return Decision(actor=actor, changed=False)
                raise FailedPrecondition(
                    f"Actor {actor.ref} is already writing generation "
                    f"{status.in_progress_generation}"
                )
            snapshots = _put_generation(status.snapshots, snap)
            return _with(
                actor,
                state=target,
                snapshots=snapshots,
                in_progress_generation=snap.generation,
                last_assigned_generation=max(status.last_assigned_generation, snap.generation),
            )
        case FinishSuspend(snapshot=snap):
            if state is S.SUSPENDED:
                return Decision(actor=actor, changed=False)
            return _finish_suspend(actor, snap)
        case FinishPause(snapshot=snap):
            if state is S.PAUSED:
                return Decision(actor=actor, changed=False)
            local = snap.local()
            if local is None or not local.completed or local.node is None:
                raise FailedPrecondition(
                    f"Actor {actor.ref} cannot be paused without a completed local snapshot"
                )
            return _with(
                actor,
                state=S.PAUSED,
                assignment=None,
                snapshots=_put_generation(status.snapshots, snap),
                assigned_node=local.node,
                in_progress_generation=0,
                effects=_release(actor),
            )
        case CancelSuspend() | CancelPause():
            if status.assignment is None:
                raise FailedPrecondition(
                    f"Actor {actor.ref} has no running sandbox to return to; finish or crash "
                    "the operation instead"
                )
            gen = status.in_progress_generation
            snapshots = tuple(s for s in status.snapshots if s.generation != gen)
            return _with(actor, state=S.RUNNING, snapshots=snapshots, in_progress_generation=0)
        case BeginRevert():
            if state is S.REVERTING:
                return Decision(actor=actor, changed=False)
            effects: tuple[Effect, ...] = ()
            if status.assignment is not None:
                effects = (
                    TerminateSandbox(
                        worker=status.assignment.worker,
                        node=status.assignment.node,
                        actor_uid=actor.metadata.uid,
                    ),
                )
            return _with(actor, state=S.REVERTING, effects=effects)
        case FinishRevert():
            return _finish_revert(actor)
        case BeginDelete():
            if state is S.DELETING:
                return Decision(actor=actor, changed=False)
            effects = ()
            if status.assignment is not None:
                effects = (
                    TerminateSandbox(
                        worker=status.assignment.worker,
                        node=status.assignment.node,
                        actor_uid=actor.metadata.uid,
                    ),
                )
            return _with(actor, state=S.DELETING, in_progress_generation=0, effects=effects)
        case FinishDelete():
            effects = _release(actor)
            for snap in status.snapshots:
                effects += owned_cleanup(snap)
            return Decision(actor=None, changed=True, effects=effects)
    raise AssertionError(f"unhandled command {command!r}")  # pragma: no cover


# --- helpers ----------------------------------------------------------------------------


def _with(
    actor: Actor, *, state: ActorState | None, effects: tuple[Effect, ...] = (), **changes: Any
) -> Decision:
    """A changed decision: ``actor`` with ``state`` and the given status fields replaced."""
    assert state is not None, "FINISH_DELETE is handled without _with"
    status: ActorStatus = attrs.evolve(actor.status, state=state, **changes)
    return Decision(actor=attrs.evolve(actor, status=status), changed=True, effects=effects)


def _release(actor: Actor) -> tuple[Effect, ...]:
    a = actor.status.assignment
    if a is None:
        return ()
    return (ReleaseWorker(worker=a.worker, actor_uid=actor.metadata.uid),)


def _put_generation(snapshots: tuple[Snapshot, ...], snap: Snapshot) -> tuple[Snapshot, ...]:
    kept = [s for s in snapshots if s.generation != snap.generation]
    kept.append(snap)
    kept.sort(key=lambda s: s.generation)
    return tuple(kept)


def owned_cleanup(snap: Snapshot) -> tuple[Effect, ...]:
    """Effects that delete what the actor owns of ``snap`` (nothing of a borrowed one)."""
    out: list[Effect] = []
    for storage in snap.storages:
        if storage.durability is Durability.LOCAL and storage.node is not None:
            if storage.local_name:
                out.append(DropLocalCopy(node=storage.node, local_name=storage.local_name))
        elif (
            storage.durability is Durability.DURABLE
            and snap.owner is SnapshotOwner.ACTOR
            and storage.uri
        ):
            out.append(DeleteObjects(uri=storage.uri))
    return tuple(out)


def _durable_completed(snap: Snapshot) -> bool:
    d = snap.durable()
    return d is not None and d.completed


def _finish_suspend(actor: Actor, snap: Snapshot) -> Decision:
    status = actor.status
    effects: list[Effect] = list(_release(actor))
    snapshots = _put_generation(status.snapshots, snap)
    local = snap.local()
    if _durable_completed(snap):
        # The new generation is durable: older generations are no longer needed.
        kept = tuple(s for s in snapshots if s.generation == snap.generation)
        for old in snapshots:
            if old.generation != snap.generation:
                effects.extend(owned_cleanup(old))
        # Any local copy stays as a preference for placement, not as a pin.
        return _with(
            actor,
            state=S.SUSPENDED,
            assignment=None,
            snapshots=kept,
            assigned_node=None,
            in_progress_generation=0,
            effects=tuple(effects),
        )
    if local is None or not local.completed:
        raise FailedPrecondition(
            f"Actor {actor.ref} cannot finish suspending: generation {snap.generation} has "
            "neither a completed durable copy nor a completed local copy"
        )
    # Durable copy pending: keep the newest older generation that is durable as the revert
    # point, drop the rest.
    older_durable = [
        s for s in snapshots if s.generation < snap.generation and _durable_completed(s)
    ]
    keep_gens = {snap.generation}
    if older_durable:
        keep_gens.add(max(s.generation for s in older_durable))
    kept = tuple(s for s in snapshots if s.generation in keep_gens)
    for old in snapshots:
        if old.generation not in keep_gens:
            effects.extend(owned_cleanup(old))
    return _with(
        actor,
        state=S.SUSPENDED,
        assignment=None,
        snapshots=kept,
        assigned_node=local.node,
        in_progress_generation=0,
        effects=tuple(effects),
    )


def _finish_revert(actor: Actor) -> Decision:
    """Back to SUSPENDED at the last durable snapshot; newer work is discarded."""
    status = actor.status
    effects: list[Effect] = list(_release(actor))
    durable = [s for s in status.snapshots if _durable_completed(s)]
    keep = max(durable, key=lambda s: s.generation) if durable else None
    kept: tuple[Snapshot, ...] = ()
    for snap in status.snapshots:
        if keep is not None and snap.generation == keep.generation:
            continue
        effects.extend(owned_cleanup(snap))
    if keep is not None:
        local = keep.local()
        if local is not None and local.node is not None and local.local_name:
            effects.append(DropLocalCopy(node=local.node, local_name=local.local_name))
        kept = (keep.without(Durability.LOCAL),)
    return _with(
        actor,
        state=S.SUSPENDED,
        assignment=None,
        snapshots=kept,
        crash=None,
        assigned_node=None,
        in_progress_generation=0,
        effects=tuple(effects),
    )


def pending_uploads(actor: Actor) -> tuple[Snapshot, ...]:
    """Generations whose local copy is complete but whose durable copy is not yet."""
    out = []
    for snap in actor.status.snapshots:
        local, durable = snap.local(), snap.durable()
        if (
            local is not None
            and local.completed
            and durable is not None
            and durable.status is not StorageStatus.COMPLETED
        ):
            out.append(snap)
    return tuple(out)


__all__ = [
    "DELETED",
    "TRANSITIONS",
    "AbandonResume",
    "BeginDelete",
    "BeginPause",
    "BeginResume",
    "BeginRevert",
    "BeginSuspend",
    "CancelPause",
    "CancelSuspend",
    "Command",
    "CrashActor",
    "Decision",
    "DeleteObjects",
    "DropLocalCopy",
    "Effect",
    "FinishDelete",
    "FinishPause",
    "FinishResume",
    "FinishRevert",
    "FinishSuspend",
    "LifecycleCommand",
    "ReleaseWorker",
    "TerminateSandbox",
    "allowed",
    "decide",
    "next_state",
    "owned_cleanup",
    "pending_uploads",
    "refusal_message",
]
