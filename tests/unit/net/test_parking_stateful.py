"""The parking lot against an independent reference model, under hypothesis' stateful testing.

The model re-derives every resolution (who, which outcome, when, with what) from the rules
of seed 001 in the plainest possible way: it scans everything on every step instead of
keeping heaps. The machine compares the lot's answers and resolutions with the model's
after every rule and checks the invariants: every admitted request is resolved exactly
once, the lot never holds more than ``max_parked``, nobody waits past its flight's budget
or its own deadline, at most one flight and one attempt per actor, and the active count is
the number of unresolved admitted requests.
"""

from __future__ import annotations

import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from substrate.core.ids import ActorRef
from substrate.errors import GrpcCode
from substrate.net.parking import (
    BUDGET_RAN_OUT_FAILURE,
    CANCELED_FAILURE,
    TIMEOUT_FAILURE,
    Admitted,
    AwaitBudget,
    Failure,
    FlightEnded,
    FlightState,
    NoFlight,
    Outcome,
    ParkingConfig,
    ParkingLot,
    RequestId,
    RetryAt,
    Shed,
    Verdict,
    classify,
)

ACTORS = [ActorRef("team-a", "web"), ActorRef("team-a", "api"), ActorRef("team-b", "web")]
FAILURE_CODES = [code for code in GrpcCode if code is not GrpcCode.OK]
# Time steps: zero (simultaneous events), round values (ties with deadlines) and anything.
STEPS = st.sampled_from([0.0, 0.0, 0.05, 0.1, 0.25, 0.5, 1.0]) | st.floats(0.0, 1.5)
TIMEOUTS = st.none() | st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 3.0])

Expected = tuple[Outcome, float, str | None, Failure | None]


class _Req:
    def __init__(self, rid: RequestId, actor: ActorRef, at: float, deadline: float | None) -> None:
        self.rid = rid
        self.actor = actor
        self.admitted_at = at
        self.deadline = deadline
        self.order = -1  # position among scheduled deadlines, if the deadline is ahead
        self.flight_deadline = 0.0
        self.done = False


class _Flight:
    def __init__(self, actor: ActorRef, started_at: float, deadline: float, order: int) -> None:
        self.actor = actor
        self.started_at = started_at
        self.deadline = deadline
        self.order = order
        self.state = FlightState.ATTEMPTING
        self.waiters: dict[RequestId, _Req] = {}
        self.retries = 0
        self.retry_at: float | None = None
        self.last_failure: Failure | None = None
        self.done = False


class ParkingLotMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.order = 0
        self.answers = 0
        self.flights: dict[ActorRef, _Flight] = {}
        self.attempting: set[ActorRef] = set()
        self.waiting: dict[RequestId, _Req] = {}
        self.admitted: dict[RequestId, _Req] = {}
        self.resolved: set[RequestId] = set()
        self.expected: dict[RequestId, Expected] = {}
        self.rejected = 0

    @initialize(
        enabled=st.booleans(),
        capacity=st.integers(1, 6),
        budget=st.sampled_from([0.5, 1.0, 2.0]),
        jitter=st.sampled_from([0.0, 0.1, 0.5]),
        seed=st.integers(0, 2**32 - 1),
    )
    def setup(self, enabled: bool, capacity: int, budget: float, jitter: float, seed: int) -> None:
        self.config = ParkingConfig(
            budget=budget,
            max_parked=capacity if enabled else 0,
            retry_jitter=jitter,
            disabled_abort_budget=budget * 1.5,
        )
        self.budget = self.config.effective_budget
        self.backoff = self.config.backoff
        self.lot: ParkingLot[str] = ParkingLot(self.config)
        self.rng = random.Random(seed)  # the lot's
        self.model_rng = random.Random(seed)  # the model's copy draws the same numbers

    # --- the model ---------------------------------------------------------------------

    def _next_order(self) -> int:
        self.order += 1
        return self.order

    def _resolve(
        self,
        req: _Req,
        outcome: Outcome,
        at: float,
        result: str | None = None,
        failure: Failure | None = None,
    ) -> None:
        req.done = True
        del self.waiting[req.rid]
        self.expected[req.rid] = (outcome, max(at, req.admitted_at), result, failure)

    def _end_flight(
        self,
        flight: _Flight,
        outcome: Outcome,
        at: float,
        result: str | None = None,
        failure: Failure | None = None,
    ) -> int:
        for req in flight.waiters.values():
            self._resolve(req, outcome, at, result, failure)
        count = len(flight.waiters)
        flight.waiters.clear()
        flight.done = True
        del self.flights[flight.actor]
        return count

    def _expire(self) -> None:
        due: list[tuple[float, int, _Flight | _Req]] = [
            (f.deadline, f.order, f) for f in self.flights.values() if f.deadline <= self.now
        ]
        due += [
            (r.deadline, r.order, r)
            for r in self.waiting.values()
            if r.deadline is not None and r.order >= 0 and r.deadline <= self.now
        ]
        due.sort(key=lambda item: (item[0], item[1]))
        for at, _, item in due:
            if item.done:
                continue
            if isinstance(item, _Flight):
                self._end_flight(
                    item,
                    Outcome.BUDGET_EXHAUSTED,
                    at,
                    failure=item.last_failure or BUDGET_RAN_OUT_FAILURE,
                )
            else:
                del self.flights[item.actor].waiters[item.rid]
                self._resolve(item, Outcome.TIMEOUT, at, failure=TIMEOUT_FAILURE)

    def _check_resolutions(self) -> None:
        got = self.lot.take_resolutions()
        seen = [r.request for r in got]
        assert len(seen) == len(set(seen)), "a request was resolved twice in one step"
        for resolution in got:
            rid = resolution.request
            assert rid in self.admitted, "resolution for a request never admitted"
            assert rid not in self.resolved, "request resolved twice"
            self.resolved.add(rid)
            req = self.admitted[rid]
            assert resolution.actor == req.actor
            assert resolution.admitted_at == req.admitted_at
            # Nobody waits past the budget of the flight it joined (+0), nor its deadline.
            assert resolution.resolved_at <= req.flight_deadline
            if req.deadline is not None:
                assert resolution.resolved_at <= max(req.deadline, req.admitted_at)
            assert resolution.waited >= 0
            expected = self.expected.pop(rid, None)
            assert expected is not None, f"unexpected resolution {resolution}"
            assert (
                resolution.outcome,
                resolution.resolved_at,
                resolution.result,
                resolution.failure,
            ) == expected
        assert not self.expected, f"resolutions missing: {self.expected}"

    def _advance(self, dt: float) -> None:
        self.now += dt

    # --- rules ---------------------------------------------------------------------------

    @rule(actor=st.sampled_from(ACTORS), dt=STEPS, timeout=TIMEOUTS)
    def admit(self, actor: ActorRef, dt: float, timeout: float | None) -> None:
        self._advance(dt)
        deadline = None if timeout is None else self.now + timeout
        admission = self.lot.admit(actor, now=self.now, deadline=deadline)
        self._expire()
        if self.config.enabled and len(self.waiting) >= self.config.max_parked:
            assert isinstance(admission, Shed)
            self.rejected += 1
            self._check_resolutions()
            return
        assert isinstance(admission, Admitted)
        rid = admission.request
        assert rid not in self.admitted
        flight = self.flights.get(actor)
        new_flight = flight is None
        start_attempt = False
        if flight is None:
            flight = _Flight(actor, self.now, self.now + self.budget, self._next_order())
            self.flights[actor] = flight
            start_attempt = actor not in self.attempting
            self.attempting.add(actor)
        assert (admission.new_flight, admission.start_attempt) == (new_flight, start_attempt)
        req = _Req(rid, actor, self.now, deadline)
        req.flight_deadline = flight.deadline
        self.admitted[rid] = req
        self.waiting[rid] = req
        flight.waiters[rid] = req
        if deadline is not None:
            if deadline <= self.now:
                del flight.waiters[rid]
                self._resolve(req, Outcome.TIMEOUT, self.now, failure=TIMEOUT_FAILURE)
            else:
                req.order = self._next_order()
        self._check_resolutions()

    @precondition(lambda self: self.admitted)
    @rule(data=st.data(), dt=STEPS)
    def cancel(self, data: st.DataObject, dt: float) -> None:
        rid = data.draw(st.sampled_from(sorted(self.admitted)))
        self._advance(dt)
        canceled = self.lot.cancel(rid, now=self.now)
        self._expire()
        req = self.waiting.get(rid)
        assert canceled == (req is not None)
        if req is not None:
            del self.flights[req.actor].waiters[rid]
            self._resolve(req, Outcome.CANCELED, self.now, failure=CANCELED_FAILURE)
        self._check_resolutions()

    @rule(dt=STEPS)
    def poll(self, dt: float) -> None:
        self._advance(dt)
        due = self.lot.poll(now=self.now)
        self._expire()
        expected = []
        for flight in self.flights.values():
            if flight.state is FlightState.BACKING_OFF:
                assert flight.retry_at is not None
                if flight.retry_at <= self.now:
                    flight.state = FlightState.ATTEMPTING
                    flight.retry_at = None
                    assert flight.actor not in self.attempting
                    self.attempting.add(flight.actor)
                    expected.append(flight.actor)
        assert sorted(due) == sorted(expected)
        self._check_resolutions()

    @precondition(lambda self: self.attempting)
    @rule(data=st.data(), dt=STEPS)
    def succeed(self, data: st.DataObject, dt: float) -> None:
        actor = data.draw(st.sampled_from(sorted(self.attempting)))
        self._advance(dt)
        self.answers += 1
        result = f"10.0.0.{self.answers}"
        decision = self.lot.attempt_succeeded(actor, result, now=self.now)
        self._expire()
        self.attempting.remove(actor)
        flight = self.flights.get(actor)
        if flight is None:
            assert decision == NoFlight()
        else:
            count = self._end_flight(flight, Outcome.SERVED, self.now, result=result)
            assert decision == FlightEnded(outcome=Outcome.SERVED, resolved=count)
        self._check_resolutions()

    @precondition(lambda self: self.attempting)
    @rule(data=st.data(), dt=STEPS, code=st.sampled_from(FAILURE_CODES))
    def fail(self, data: st.DataObject, dt: float, code: GrpcCode) -> None:
        actor = data.draw(st.sampled_from(sorted(self.attempting)))
        self._advance(dt)
        self.answers += 1
        failure = Failure(code, f"{code.name.lower()} #{self.answers}")
        decision = self.lot.attempt_failed(actor, failure, now=self.now, rng=self.rng)
        self._expire()
        self.attempting.remove(actor)
        flight = self.flights.get(actor)
        if flight is None:
            assert decision == NoFlight()
        elif classify(code, self.config.enabled) is Verdict.FAIL:
            count = self._end_flight(flight, Outcome.ERROR, self.now, failure=failure)
            assert decision == FlightEnded(outcome=Outcome.ERROR, resolved=count)
        else:
            flight.last_failure = failure
            at = self.now + self.backoff.delay(flight.retries, self.model_rng)
            if at < flight.deadline:
                assert decision == RetryAt(at=at, retry=flight.retries)
                flight.retries += 1
                flight.state = FlightState.BACKING_OFF
                flight.retry_at = at
            else:
                assert decision == AwaitBudget(deadline=flight.deadline)
                flight.state = FlightState.AWAITING_BUDGET
        self._check_resolutions()

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def counts_match(self) -> None:
        if not hasattr(self, "lot"):
            return
        stats = self.lot.stats()
        unresolved = set(self.admitted) - self.resolved
        assert stats.waiting == len(unresolved) == len(self.waiting)
        assert all(self.lot.is_waiting(rid) for rid in unresolved)
        if self.config.enabled:
            assert stats.parked == stats.waiting <= self.config.max_parked
            assert stats.max_parked_seen <= self.config.max_parked
        else:
            assert stats.parked == 0
        assert stats.rejected == self.rejected
        assert stats.admitted == len(self.admitted)
        assert stats.resolved == len(self.resolved)
        assert stats.attempts_in_progress == len(self.attempting)

    @invariant()
    def one_flight_per_actor_as_modelled(self) -> None:
        if not hasattr(self, "lot"):
            return
        assert self.lot.stats().flights == len(self.flights)
        for actor in ACTORS:
            view = self.lot.flight(actor)
            flight = self.flights.get(actor)
            if flight is None:
                assert view is None
                continue
            assert view is not None
            assert (view.started_at, view.deadline, view.state) == (
                flight.started_at,
                flight.deadline,
                flight.state,
            )
            assert view.waiting == len(flight.waiters)
            assert view.retry_at == flight.retry_at
            assert (view.state is FlightState.ATTEMPTING) == (actor in self.attempting)

    @invariant()
    def next_deadline_is_the_earliest_pending_event(self) -> None:
        if not hasattr(self, "lot"):
            return
        times = [f.deadline for f in self.flights.values()]
        times += [f.retry_at for f in self.flights.values() if f.retry_at is not None]
        times += [
            r.deadline for r in self.waiting.values() if r.deadline is not None and r.order >= 0
        ]
        assert self.lot.next_deadline() == (min(times) if times else None)

    def teardown(self) -> None:
        if not hasattr(self, "lot"):
            return
        # Far past every deadline, everyone admitted has been resolved, exactly once.
        self.poll(100.0)
        assert self.resolved == set(self.admitted)
        assert self.lot.stats().waiting == 0
        assert self.lot.stats().flights == 0


ParkingLotMachine.TestCase.settings = settings(
    max_examples=75, stateful_step_count=35, deadline=None
)
TestParkingLot = ParkingLotMachine.TestCase
