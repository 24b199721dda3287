"""Exhaustive (state, command) table test and the idempotency of re-entered steps."""

from __future__ import annotations

import itertools

import pytest

from substrate.core import lifecycle as lc
from substrate.core.model import ActorState, Durability, StorageStatus
from substrate.errors import FailedPrecondition, IllegalTransition

from .lifecycle_fixtures import ASSIGNMENT, NODE, REF, actor_in, command_for, durable_gen

PAIRS = list(itertools.product(ActorState, lc.Command))


@pytest.mark.parametrize(("state", "kind"), PAIRS, ids=lambda v: v.name)
def test_every_pair_is_allowed_with_its_next_state_or_refused_unchanged(
    state: ActorState, kind: lc.Command
) -> None:
    actor = actor_in(state)
    before = actor_in(state)
    command = command_for(kind, actor)
    assert command.kind is kind
    if (state, kind) in lc.TRANSITIONS:
        decision = lc.decide(actor, command, now=100.0)
        expected = lc.TRANSITIONS[(state, kind)]
        if expected is None:
            assert decision.actor is None
        else:
            assert decision.actor is not None
            assert decision.actor.state is expected
            assert decision.actor.ref == actor.ref
            assert decision.actor.metadata == actor.metadata
    else:
        with pytest.raises(IllegalTransition) as info:
            lc.decide(actor, command, now=100.0)
        assert isinstance(info.value, FailedPrecondition)
        assert str(REF) in info.value.description
        assert state.wire_name in info.value.description
    assert actor == before


def test_original_wording_of_refusals() -> None:
    crashed = actor_in(ActorState.CRASHED)
    with pytest.raises(IllegalTransition) as info:
        lc.decide(crashed, lc.BeginResume(assignment=ASSIGNMENT), now=0)
    assert info.value.description == (
        "AssignWorker prerequisite not met for Actor: a/b (got: ACTOR_STATE_CRASHED, "
        "want ACTOR_STATE_SUSPENDED or ACTOR_STATE_PAUSED)"
    )
    with pytest.raises(IllegalTransition) as info:
        lc.decide(actor_in(ActorState.SUSPENDED), lc.BeginRevert(), now=0)
    assert info.value.description == (
        "Actor a/b is not in a revertable state (got: ACTOR_STATE_SUSPENDED, "
        "want one of [RUNNING PAUSED CRASHED])"
    )
    with pytest.raises(IllegalTransition) as info:
        lc.decide(actor_in(ActorState.RESUMING), lc.BeginSuspend(snapshot=durable_gen(9)), now=0)
    assert info.value.description == (
        "MarkSuspending prerequisite not met for Actor: a/b (got: ACTOR_STATE_RESUMING, "
        "want ACTOR_STATE_RUNNING or ACTOR_STATE_PAUSED)"
    )


def test_every_state_and_command_appears_in_the_table() -> None:
    assert {s for s, _ in lc.TRANSITIONS} == set(ActorState)
    assert {c for _, c in lc.TRANSITIONS} == set(lc.Command)


@pytest.mark.parametrize(
    ("state", "kind"),
    [(s, c) for (s, c), nxt in lc.TRANSITIONS.items() if nxt is not None],
    ids=lambda v: v.name,
)
def test_re_entering_a_step_is_a_no_op(state: ActorState, kind: lc.Command) -> None:
    """Applying the same command again, from the state it produced, changes nothing."""
    actor = actor_in(state)
    command = command_for(kind, actor)
    first = lc.decide(actor, command, now=1.0)
    assert first.actor is not None
    if (first.actor.state, kind) not in lc.TRANSITIONS:
        return  # e.g. FINISH_REVERT lands in SUSPENDED, where re-entry is a new command
    second = lc.decide(first.actor, command, now=2.0)
    assert second.changed is False
    assert second.actor == first.actor
    assert second.effects == ()


def test_resume_records_assignment_and_finish_checks_epoch() -> None:
    suspended = actor_in(ActorState.SUSPENDED)
    resuming = lc.decide(suspended, lc.BeginResume(assignment=ASSIGNMENT), now=0).actor
    assert resuming is not None and resuming.status.assignment == ASSIGNMENT
    with pytest.raises(FailedPrecondition, match="epoch changed"):
        lc.decide(resuming, lc.FinishResume(worker_epoch=4), now=0)
    running = lc.decide(resuming, lc.FinishResume(worker_epoch=3, pod_ips=("10.1.1.1",)), now=0)
    assert running.actor is not None
    assert running.actor.status.assignment is not None
    assert running.actor.status.assignment.pod_ips == ("10.1.1.1",)


def test_crash_releases_the_worker_first_and_records_the_message() -> None:
    running = actor_in(ActorState.RUNNING)
    d = lc.decide(running, lc.CrashActor(message="probe timed out"), now=42.0)
    assert d.actor is not None and d.actor.status.assignment is None
    assert d.actor.status.crash is not None
    assert (d.actor.status.crash.message, d.actor.status.crash.time) == ("probe timed out", 42.0)
    assert d.effects == (lc.ReleaseWorker(worker=ASSIGNMENT.worker, actor_uid="uid-1"),)


def test_async_suspend_keeps_local_copy_pinned_and_the_durable_revert_point() -> None:
    from .lifecycle_fixtures import writing_gen

    suspending = actor_in(ActorState.SUSPENDING)
    snap = writing_gen(2, local=StorageStatus.COMPLETED, durable=StorageStatus.PENDING)
    d = lc.decide(suspending, lc.FinishSuspend(snapshot=snap), now=0)
    assert d.actor is not None
    assert d.actor.state is ActorState.SUSPENDED
    assert [s.generation for s in d.actor.status.snapshots] == [1, 2]
    assert d.actor.status.assigned_node == NODE
    assert lc.pending_uploads(d.actor) == (snap,)


def test_durable_suspend_prunes_older_owned_generations_only() -> None:
    from .lifecycle_fixtures import writing_gen

    suspending = actor_in(ActorState.SUSPENDING)
    snap = writing_gen(2, local=StorageStatus.COMPLETED, durable=StorageStatus.COMPLETED)
    d = lc.decide(suspending, lc.FinishSuspend(snapshot=snap), now=0)
    assert d.actor is not None
    assert [s.generation for s in d.actor.status.snapshots] == [2]
    assert d.actor.status.assigned_node is None
    assert lc.DeleteObjects(uri="file:///o/atespaces/a/actors/uid-1/snapshots/snap-1/") in d.effects


def test_borrowed_snapshot_is_never_deleted() -> None:
    from substrate.core.model import SnapshotOwner

    actor = actor_in(ActorState.DELETING)
    import attrs

    actor = attrs.evolve(
        actor,
        status=attrs.evolve(actor.status, snapshots=(durable_gen(1, owner=SnapshotOwner.TAG),)),
    )
    d = lc.decide(actor, lc.FinishDelete(), now=0)
    assert d.actor is None
    assert not any(isinstance(e, lc.DeleteObjects) for e in d.effects)


def test_revert_goes_back_to_last_durable_and_discards_newer_work() -> None:
    from .lifecycle_fixtures import writing_gen

    paused = actor_in(ActorState.PAUSED)
    reverting = lc.decide(paused, lc.BeginRevert(), now=0).actor
    assert reverting is not None
    d = lc.decide(reverting, lc.FinishRevert(), now=0)
    assert d.actor is not None
    assert d.actor.state is ActorState.SUSPENDED
    assert [s.generation for s in d.actor.status.snapshots] == [1]
    assert d.actor.status.assigned_node is None and d.actor.status.crash is None
    assert lc.DropLocalCopy(node=NODE, local_name="snap-2") in d.effects
    assert all(s.durability is Durability.DURABLE for s in d.actor.status.snapshots[0].storages)
    del writing_gen


def test_cancel_suspend_drops_the_unwritten_generation() -> None:
    suspending = actor_in(ActorState.SUSPENDING)
    d = lc.decide(suspending, lc.CancelSuspend(), now=0)
    assert d.actor is not None and d.actor.state is ActorState.RUNNING
    assert [s.generation for s in d.actor.status.snapshots] == [1]
    assert d.actor.status.in_progress_generation == 0
