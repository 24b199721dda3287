"""The lifecycle against a tiny reference model, under hypothesis' stateful testing."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from substrate.core import lifecycle as lc
from substrate.core.model import Actor, ActorState
from substrate.errors import FailedPrecondition

from .lifecycle_fixtures import actor_in, command_for

S = ActorState

# The reference model, written independently of TRANSITIONS: which states each command
# accepts (including re-entry) and where it leads.
MODEL: dict[lc.Command, tuple[set[ActorState], ActorState | None]] = {
    lc.Command.BEGIN_RESUME: ({S.SUSPENDED, S.PAUSED, S.RESUMING}, S.RESUMING),
    lc.Command.FINISH_RESUME: ({S.RESUMING, S.RUNNING}, S.RUNNING),
    lc.Command.ABANDON_RESUME: ({S.RESUMING, S.SUSPENDED}, S.SUSPENDED),
    lc.Command.CRASH: (
        {S.RESUMING, S.RUNNING, S.SUSPENDING, S.PAUSING, S.PAUSED, S.CRASHED},
        S.CRASHED,
    ),
    lc.Command.BEGIN_SUSPEND: ({S.RUNNING, S.PAUSED, S.SUSPENDING}, S.SUSPENDING),
    lc.Command.FINISH_SUSPEND: ({S.SUSPENDING, S.SUSPENDED}, S.SUSPENDED),
    lc.Command.CANCEL_SUSPEND: ({S.SUSPENDING}, S.RUNNING),
    lc.Command.BEGIN_PAUSE: ({S.RUNNING, S.PAUSING}, S.PAUSING),
    lc.Command.FINISH_PAUSE: ({S.PAUSING, S.PAUSED}, S.PAUSED),
    lc.Command.CANCEL_PAUSE: ({S.PAUSING}, S.RUNNING),
    lc.Command.BEGIN_REVERT: ({S.RUNNING, S.PAUSED, S.CRASHED, S.REVERTING}, S.REVERTING),
    lc.Command.FINISH_REVERT: ({S.REVERTING}, S.SUSPENDED),
    lc.Command.BEGIN_DELETE: ({S.SUSPENDED, S.CRASHED, S.DELETING}, S.DELETING),
    lc.Command.FORCE_DELETE: (set(ActorState), S.DELETING),
    lc.Command.FINISH_DELETE: ({S.DELETING}, None),
}
# A SUSPEND of a SUSPENDED actor and a PAUSE of a PAUSED one are accepted as no-ops.
NO_OPS = {(S.SUSPENDED, lc.Command.BEGIN_SUSPEND), (S.PAUSED, lc.Command.BEGIN_PAUSE)}

HOLDS_WORKER = {S.RESUMING, S.RUNNING, S.PAUSING}


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.actor: Actor | None = actor_in(S.SUSPENDED)
        self.model_state: ActorState | None = S.SUSPENDED
        self.now = 0.0
        self.last_gen = self.actor.status.last_assigned_generation
        self.held_worker = False

    @precondition(lambda self: self.actor is not None)
    @rule(kind=st.sampled_from(lc.Command))
    def command(self, kind: lc.Command) -> None:
        assert self.actor is not None and self.model_state is not None
        self.now += 1
        before = self.actor
        cmd = command_for(kind, before)
        accepts, target = MODEL[kind]
        accepted = self.model_state in accepts or (self.model_state, kind) in NO_OPS
        try:
            decision = lc.decide(before, cmd, now=self.now)
        except FailedPrecondition:
            if accepted and kind in (lc.Command.CANCEL_SUSPEND, lc.Command.CANCEL_PAUSE):
                # Cancelling is only possible while the sandbox still runs.
                assert before.status.assignment is None
                return
            assert not accepted, f"{kind} refused in {self.model_state}"
            assert self.actor == before
            return
        assert accepted, f"{kind} accepted in {self.model_state}"
        if (self.model_state, kind) in NO_OPS:
            assert decision.changed is False
            return
        self.model_state = target
        released = [e for e in decision.effects if isinstance(e, lc.ReleaseWorker)]
        if before.status.assignment is not None and (
            decision.actor is None or decision.actor.status.assignment is None
        ):
            assert len(released) == 1, "dropping an assignment must release the worker"
        else:
            assert released == []
        self.actor = decision.actor

    @precondition(lambda self: self.actor is None)
    @rule()
    def recreate(self) -> None:
        self.actor = actor_in(S.SUSPENDED)
        self.model_state = S.SUSPENDED
        self.last_gen = self.actor.status.last_assigned_generation

    @invariant()
    def matches_model(self) -> None:
        if self.actor is None:
            assert self.model_state is None
            return
        assert self.actor.state is self.model_state

    @invariant()
    def worker_held_only_in_running_states(self) -> None:
        if self.actor is None:
            return
        st_ = self.actor.state
        if st_ in HOLDS_WORKER:
            assert self.actor.status.assignment is not None
        if st_ in {S.SUSPENDED, S.PAUSED, S.CRASHED}:
            assert self.actor.status.assignment is None
        if st_ is S.SUSPENDING:
            # From RUNNING it still holds its worker; from PAUSED it is pinned to its node.
            status = self.actor.status
            assert status.assignment is not None or status.assigned_node is not None

    @invariant()
    def crash_recorded_while_crashed_and_cleared_by_revert(self) -> None:
        if self.actor is None:
            return
        if self.actor.state is S.CRASHED:
            assert self.actor.status.crash is not None
        if self.actor.state not in {S.CRASHED, S.REVERTING, S.DELETING}:
            assert self.actor.status.crash is None

    @invariant()
    def generations_only_grow_and_in_progress_only_while_writing(self) -> None:
        if self.actor is None:
            return
        status = self.actor.status
        assert status.last_assigned_generation >= self.last_gen
        self.last_gen = status.last_assigned_generation
        writing = self.actor.state in {S.SUSPENDING, S.PAUSING}
        assert (status.in_progress_generation != 0) == writing
        gens = [s.generation for s in status.snapshots]
        assert gens == sorted(set(gens))
        assert all(g <= status.last_assigned_generation for g in gens)

    @invariant()
    def paused_is_pinned_to_its_local_copy(self) -> None:
        if self.actor is not None and self.actor.state is S.PAUSED:
            assert self.actor.status.assigned_node is not None


LifecycleMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=25)
TestLifecycle = LifecycleMachine.TestCase
