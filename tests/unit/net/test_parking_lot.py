"""The pure parking lot: the seed's result table, shared budgets, shedding, retries."""

from __future__ import annotations

import random

import pytest

from substrate.core.ids import ActorRef
from substrate.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    GrpcCode,
    IllegalTransition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    http_response,
)
from substrate.net.parking import (
    BUDGET_RAN_OUT_FAILURE,
    CANCELED_FAILURE,
    SHED_FAILURE,
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
    Resolution,
    RetryAt,
    Shed,
)

WEB = ActorRef("team-a", "web")
API = ActorRef("team-a", "api")
NO_ROOM = Failure(GrpcCode.RESOURCE_EXHAUSTED, "no worker has room for the actor")
NO_JITTER = ParkingConfig(retry_jitter=0.0)


def rng() -> random.Random:
    return random.Random(1234)


def admitted(admission: Admitted | Shed) -> Admitted:
    assert isinstance(admission, Admitted), admission
    return admission


def only(resolutions: list[Resolution[str]]) -> Resolution[str]:
    assert len(resolutions) == 1, resolutions
    return resolutions[0]


def fail_until_budget(lot: ParkingLot[str], actor: ActorRef, failure: Failure, now: float) -> int:
    """Answer every attempt of ``actor``'s flight with ``failure`` until it stops retrying."""
    attempts = 0
    r = rng()
    while True:
        attempts += 1
        decision = lot.attempt_failed(actor, failure, now=now, rng=r)
        if not isinstance(decision, RetryAt):
            return attempts
        now = decision.at
        assert lot.poll(now=now) == [actor]


# --- the seed's table, one row at a time ----------------------------------------------


def test_ok_routes_every_waiter_of_the_flight() -> None:
    lot: ParkingLot[str] = ParkingLot()
    first = admitted(lot.admit(WEB, now=10.0))
    second = admitted(lot.admit(WEB, now=10.02))
    assert (first.new_flight, first.start_attempt) == (True, True)
    assert (second.new_flight, second.start_attempt) == (False, False)

    decision = lot.attempt_succeeded(WEB, "10.0.0.7", now=10.05)

    assert decision == FlightEnded(outcome=Outcome.SERVED, resolved=2)
    resolutions = lot.take_resolutions()
    assert [(r.request, r.outcome, r.result) for r in resolutions] == [
        (first.request, Outcome.SERVED, "10.0.0.7"),
        (second.request, Outcome.SERVED, "10.0.0.7"),
    ]
    assert [r.waited for r in resolutions] == pytest.approx([0.05, 0.03])
    assert lot.flight(WEB) is None
    assert lot.take_resolutions() == []


RETRYABLE_ROWS = [
    (Failure(GrpcCode.ABORTED, "another operation is in progress for this actor"), Aborted),
    (NO_ROOM, ResourceExhausted),
    (Failure(GrpcCode.FAILED_PRECONDITION, "actor is suspending"), FailedPrecondition),
    (Failure(GrpcCode.UNAVAILABLE, "ateapi is restarting"), Unavailable),
]


@pytest.mark.parametrize(("failure", "error_type"), RETRYABLE_ROWS)
def test_retryable_rows_park_until_the_budget_and_answer_503_with_the_description(
    failure: Failure, error_type: type[Exception]
) -> None:
    lot: ParkingLot[str] = ParkingLot()
    request = admitted(lot.admit(WEB, now=0.0)).request

    attempts = fail_until_budget(lot, WEB, failure, now=0.0)

    assert attempts > 10  # 100 ms growing by 1.1x fits well over ten attempts in 5 s
    assert lot.take_resolutions() == []
    assert lot.poll(now=5.0) == []
    resolution = only(lot.take_resolutions())
    assert resolution.request == request
    assert resolution.outcome is Outcome.BUDGET_EXHAUSTED
    assert resolution.resolved_at == 5.0
    assert resolution.failure == failure
    error = failure.to_error()
    assert isinstance(error, error_type)
    assert http_response(error, str(WEB)) == (
        503,
        f"actor team-a/web unavailable: {failure.description}",
    )


FAIL_FAST_ROWS = [
    (Failure(GrpcCode.NOT_FOUND, "actor web not found"), 404, "actor team-a/web not found"),
    (Failure(GrpcCode.DEADLINE_EXCEEDED, "slow"), 504, "actor team-a/web: deadline exceeded"),
    (Failure(GrpcCode.PERMISSION_DENIED, "no"), 403, "actor team-a/web: permission denied"),
    (Failure(GrpcCode.UNAUTHENTICATED, "who"), 401, "actor team-a/web: unauthenticated"),
    (Failure(GrpcCode.INTERNAL, "boom"), 500, "error resuming actor team-a/web"),
    (Failure(GrpcCode.INVALID_ARGUMENT, "bad"), 500, "error resuming actor team-a/web"),
]


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
@pytest.mark.parametrize(("failure", "status", "body"), FAIL_FAST_ROWS)
def test_fail_fast_rows_end_the_flight_at_once(
    failure: Failure, status: int, body: str, enabled: bool
) -> None:
    lot: ParkingLot[str] = ParkingLot(ParkingConfig(max_parked=1024 if enabled else 0))
    first = admitted(lot.admit(WEB, now=1.0)).request
    second = admitted(lot.admit(WEB, now=1.1)).request

    decision = lot.attempt_failed(WEB, failure, now=1.2, rng=rng())

    assert decision == FlightEnded(outcome=Outcome.ERROR, resolved=2)
    resolutions = lot.take_resolutions()
    assert [(r.request, r.outcome, r.failure) for r in resolutions] == [
        (first, Outcome.ERROR, failure),
        (second, Outcome.ERROR, failure),
    ]
    assert all(r.resolved_at == 1.2 for r in resolutions)
    assert http_response(failure.to_error(), str(WEB)) == (status, body)
    assert lot.flight(WEB) is None
    assert lot.next_deadline() is None


@pytest.mark.parametrize(
    "failure",
    [NO_ROOM, Failure(GrpcCode.FAILED_PRECONDITION, "x"), Failure(GrpcCode.UNAVAILABLE, "y")],
)
def test_disabled_parking_fails_fast_on_capacity_and_unavailability(failure: Failure) -> None:
    lot: ParkingLot[str] = ParkingLot(ParkingConfig(max_parked=0))
    admitted(lot.admit(WEB, now=0.0))
    assert lot.attempt_failed(WEB, failure, now=0.3, rng=rng()) == FlightEnded(
        outcome=Outcome.ERROR, resolved=1
    )
    resolution = only(lot.take_resolutions())
    assert resolution.failure == failure
    assert resolution.waited == pytest.approx(0.3)


def test_disabled_parking_retries_aborted_within_fifteen_seconds() -> None:
    lot: ParkingLot[str] = ParkingLot(ParkingConfig(max_parked=0))
    admitted(lot.admit(WEB, now=100.0))
    aborted = Failure(GrpcCode.ABORTED, "another operation is in progress for this actor")

    fail_until_budget(lot, WEB, aborted, now=100.0)
    lot.poll(now=114.999)
    assert lot.take_resolutions() == []
    lot.poll(now=200.0)

    resolution = only(lot.take_resolutions())
    assert resolution.outcome is Outcome.BUDGET_EXHAUSTED
    assert resolution.resolved_at == 115.0
    assert resolution.failure == aborted


def test_disabled_parking_has_no_cap_and_no_slots() -> None:
    lot: ParkingLot[str] = ParkingLot(ParkingConfig(max_parked=0))
    for n in range(5000):
        admitted(lot.admit(ActorRef("team-a", f"a{n % 7}"), now=0.0))
    stats = lot.stats()
    assert (stats.enabled, stats.capacity, stats.parked, stats.waiting) == (False, 0, 0, 5000)
    assert (stats.max_parked_seen, stats.rejected, stats.flights) == (0, 0, 7)


# --- one flight per actor, one budget per flight ----------------------------------------


def test_late_joiner_shares_the_remaining_budget() -> None:
    lot: ParkingLot[str] = ParkingLot()
    first = admitted(lot.admit(WEB, now=0.0))
    decision = lot.attempt_failed(WEB, NO_ROOM, now=0.01, rng=rng())
    assert isinstance(decision, RetryAt)
    assert 0.11 <= decision.at < 0.12
    late = admitted(lot.admit(WEB, now=4.0))
    assert not late.new_flight
    assert not late.start_attempt
    flight = lot.flight(WEB)
    assert flight is not None
    assert (flight.started_at, flight.deadline, flight.waiting) == (0.0, 5.0, 2)

    lot.poll(now=6.0)

    resolutions = {r.request: r for r in lot.take_resolutions()}
    assert resolutions[first.request].outcome is Outcome.BUDGET_EXHAUSTED
    assert resolutions[late.request].outcome is Outcome.BUDGET_EXHAUSTED
    assert resolutions[first.request].waited == 5.0
    assert resolutions[late.request].waited == 1.0  # sub-budget exhaustion is expected


def test_a_flight_counts_its_budget_from_when_its_first_request_arrived() -> None:
    lot: ParkingLot[str] = ParkingLot()
    # read at 1.5 s, but its bytes reached the host at 0.0 (the router was busy)
    first = admitted(lot.admit(WEB, now=1.5, arrived=0.0))
    assert first.start_attempt
    flight = lot.flight(WEB)
    assert flight is not None
    assert (flight.started_at, flight.deadline) == (0.0, 5.0)
    assert lot.next_deadline() == 5.0
    # a joiner that queued too: its recorded wait starts at its own arrival
    late = admitted(lot.admit(WEB, now=2.0, arrived=1.0))
    lot.poll(now=5.2)
    resolutions = {r.request: r for r in lot.take_resolutions()}
    assert resolutions[first.request].outcome is Outcome.BUDGET_EXHAUSTED
    assert resolutions[first.request].waited == 5.0  # what the client waited, not 3.5
    assert resolutions[late.request].waited == 4.0


def test_a_request_that_queued_past_the_budget_ends_at_once_but_still_wakes_the_actor() -> None:
    lot: ParkingLot[str] = ParkingLot()
    request = admitted(lot.admit(WEB, now=6.0, arrived=0.5))
    assert request.start_attempt  # a retry by the client finds the actor awake
    assert lot.poll(now=6.0) == []
    resolution = only(lot.take_resolutions())
    assert resolution.outcome is Outcome.BUDGET_EXHAUSTED
    # as every deadline resolution: at the deadline (arrival + budget), however late noticed
    assert (resolution.resolved_at, resolution.waited) == (5.5, 5.0)


def test_an_arrival_after_now_counts_as_now_and_nan_is_refused() -> None:
    lot: ParkingLot[str] = ParkingLot()
    admitted(lot.admit(WEB, now=1.0, arrived=3.0))
    flight = lot.flight(WEB)
    assert flight is not None
    assert flight.started_at == 1.0
    with pytest.raises(InvalidArgument, match="arrival"):
        lot.admit(API, now=1.0, arrived=float("nan"))


def test_flights_of_different_actors_are_independent() -> None:
    lot: ParkingLot[str] = ParkingLot()
    assert admitted(lot.admit(WEB, now=0.0)).start_attempt
    assert admitted(lot.admit(API, now=0.0)).start_attempt
    assert lot.stats().flights == 2
    assert lot.stats().attempts_in_progress == 2
    lot.attempt_succeeded(API, "10.0.0.8", now=0.2)
    assert [r.actor for r in lot.take_resolutions()] == [API]
    assert lot.flight(WEB) is not None


def test_a_new_request_after_a_flight_ended_starts_a_fresh_flight() -> None:
    lot: ParkingLot[str] = ParkingLot()
    admitted(lot.admit(WEB, now=0.0))
    lot.attempt_succeeded(WEB, "10.0.0.7", now=0.1)
    again = admitted(lot.admit(WEB, now=0.2))
    assert again.new_flight
    assert again.start_attempt
    flight = lot.flight(WEB)
    assert flight is not None
    assert flight.deadline == pytest.approx(5.2)


# --- retries ---------------------------------------------------------------------------


def test_retry_schedule_without_jitter_is_0_1_then_0_11_then_0_121() -> None:
    lot: ParkingLot[str] = ParkingLot(NO_JITTER)
    admitted(lot.admit(WEB, now=0.0))
    now = 0.0
    gaps = []
    for _ in range(6):
        decision = lot.attempt_failed(WEB, NO_ROOM, now=now, rng=rng())
        assert isinstance(decision, RetryAt)
        gaps.append(decision.at - now)
        assert lot.next_deadline() == decision.at
        assert lot.poll(now=decision.at - 1e-9) == []
        assert lot.poll(now=decision.at) == [WEB]
        now = decision.at + 0.02  # the attempt itself takes 20 ms
    assert gaps == pytest.approx([0.1, 0.11, 0.121, 0.1331, 0.14641, 0.161051])


def test_retry_jitter_adds_zero_to_a_tenth_of_each_delay() -> None:
    for seed in range(20):
        lot: ParkingLot[str] = ParkingLot()
        admitted(lot.admit(WEB, now=0.0))
        r = random.Random(seed)
        now = 0.0
        for n in range(8):
            decision = lot.attempt_failed(WEB, NO_ROOM, now=now, rng=r)
            assert isinstance(decision, RetryAt)
            assert decision.retry == n
            base = 0.1 * 1.1**n
            assert base - 1e-12 <= decision.at - now < base * 1.1
            now = decision.at
            lot.poll(now=now)


def test_a_retry_past_the_deadline_means_budget_exhausted_at_the_deadline() -> None:
    lot: ParkingLot[str] = ParkingLot(ParkingConfig(budget=0.25, retry_jitter=0.0))
    request = admitted(lot.admit(WEB, now=0.0)).request
    assert lot.attempt_failed(WEB, NO_ROOM, now=0.0, rng=rng()) == RetryAt(at=0.1, retry=0)
    assert lot.poll(now=0.1) == [WEB]
    decision = lot.attempt_failed(WEB, NO_ROOM, now=0.1, rng=rng())
    assert isinstance(decision, RetryAt)
    assert decision.at == pytest.approx(0.21)
    assert decision.retry == 1
    assert lot.poll(now=decision.at) == [WEB]
    # The next retry would start at 0.331, after the 0.25 deadline: no more attempts.
    assert lot.attempt_failed(WEB, NO_ROOM, now=decision.at, rng=rng()) == AwaitBudget(
        deadline=0.25
    )
    flight = lot.flight(WEB)
    assert flight is not None
    assert flight.state is FlightState.AWAITING_BUDGET
    assert lot.next_deadline() == 0.25
    assert lot.take_resolutions() == []

    assert lot.poll(now=0.4) == []

    resolution = only(lot.take_resolutions())
    assert (resolution.request, resolution.outcome) == (request, Outcome.BUDGET_EXHAUSTED)
    assert resolution.resolved_at == 0.25  # at the deadline, not when the lot noticed


def test_a_due_retry_never_starts_once_the_deadline_has_passed() -> None:
    lot: ParkingLot[str] = ParkingLot(NO_JITTER)
    admitted(lot.admit(WEB, now=0.0))
    decision = lot.attempt_failed(WEB, NO_ROOM, now=4.85, rng=rng())
    assert isinstance(decision, RetryAt)
    assert decision.at == pytest.approx(4.95)
    assert lot.poll(now=5.5) == []  # the retry was due at 4.95, but so was the budget
    assert only(lot.take_resolutions()).outcome is Outcome.BUDGET_EXHAUSTED


# --- the budget is a hard bound, attempts are never cancelled ---------------------------


def test_an_attempt_in_progress_at_the_deadline_becomes_an_orphan() -> None:
    lot: ParkingLot[str] = ParkingLot()
    first = admitted(lot.admit(WEB, now=0.0)).request
    lot.poll(now=5.0)
    resolution = only(lot.take_resolutions())
    assert (resolution.request, resolution.outcome) == (first, Outcome.BUDGET_EXHAUSTED)
    assert resolution.failure == BUDGET_RAN_OUT_FAILURE
    assert http_response(BUDGET_RAN_OUT_FAILURE.to_error(), str(WEB)) == (
        503,
        "actor team-a/web unavailable: resume did not finish within the park budget",
    )
    assert lot.flight(WEB) is None
    assert lot.stats().attempts_in_progress == 1

    # A new request adopts the attempt still in progress instead of starting another.
    adopter = admitted(lot.admit(WEB, now=6.0))
    assert adopter.new_flight
    assert not adopter.start_attempt
    assert lot.attempt_succeeded(WEB, "10.0.0.7", now=7.0) == FlightEnded(
        outcome=Outcome.SERVED, resolved=1
    )
    served = only(lot.take_resolutions())
    assert (served.request, served.outcome, served.result) == (
        adopter.request,
        Outcome.SERVED,
        "10.0.0.7",
    )
    assert served.waited == 1.0


def test_an_orphan_answer_with_nobody_waiting_is_dropped() -> None:
    lot: ParkingLot[str] = ParkingLot()
    admitted(lot.admit(WEB, now=0.0))
    lot.poll(now=5.0)
    lot.take_resolutions()
    assert lot.attempt_failed(WEB, NO_ROOM, now=6.0, rng=rng()) == NoFlight()
    assert lot.stats().attempts_in_progress == 0
    assert lot.take_resolutions() == []
    assert admitted(lot.admit(WEB, now=6.5)).start_attempt


def test_budget_exhausted_carries_the_last_retryable_failure() -> None:
    lot: ParkingLot[str] = ParkingLot(NO_JITTER)
    admitted(lot.admit(WEB, now=0.0))
    aborted = Failure(GrpcCode.ABORTED, "another operation is in progress for this actor")
    decision = lot.attempt_failed(WEB, aborted, now=0.0, rng=rng())
    assert isinstance(decision, RetryAt)
    lot.poll(now=decision.at)
    decision = lot.attempt_failed(WEB, NO_ROOM, now=decision.at, rng=rng())
    assert isinstance(decision, RetryAt)
    lot.poll(now=decision.at)
    lot.poll(now=5.0)  # the third attempt is still in progress at the deadline
    assert only(lot.take_resolutions()).failure == NO_ROOM


# --- the lot's capacity ------------------------------------------------------------------


def test_a_full_lot_sheds_at_once_and_counts_rejected() -> None:
    lot: ParkingLot[str] = ParkingLot(ParkingConfig(max_parked=3))
    for _ in range(3):  # a hot actor: three slots, one flight
        admitted(lot.admit(WEB, now=0.0))
    assert lot.stats().flights == 1

    shed = lot.admit(API, now=0.1)

    assert shed == Shed(failure=SHED_FAILURE)
    assert isinstance(shed, Shed)
    assert shed.failure == Failure(GrpcCode.RESOURCE_EXHAUSTED, "router at capacity")
    error = shed.failure.to_error()
    assert isinstance(error, ResourceExhausted)
    assert http_response(error, "team-a/api") == (
        503,
        "actor team-a/api unavailable: router at capacity",
    )
    stats = lot.stats()
    assert (stats.parked, stats.rejected, stats.max_parked_seen, stats.flights) == (3, 1, 3, 1)
    assert lot.flight(API) is None
    assert lot.take_resolutions() == []  # shed requests are never recorded as a wait

    lot.attempt_succeeded(WEB, "10.0.0.7", now=0.2)
    assert len(lot.take_resolutions()) == 3
    assert isinstance(lot.admit(API, now=0.3), Admitted)
    assert lot.stats().rejected == 1


def test_a_resolved_request_frees_its_slot() -> None:
    lot: ParkingLot[str] = ParkingLot(ParkingConfig(max_parked=1))
    request = admitted(lot.admit(WEB, now=0.0)).request
    assert isinstance(lot.admit(WEB, now=0.0), Shed)
    assert lot.cancel(request, now=0.1)
    assert isinstance(lot.admit(WEB, now=0.2), Admitted)
    assert lot.stats().rejected == 1


# --- the request's own deadline and departing clients ------------------------------------


def test_request_deadline_is_a_timeout_distinct_from_the_budget() -> None:
    lot: ParkingLot[str] = ParkingLot()
    patient = admitted(lot.admit(WEB, now=0.0)).request
    hasty = admitted(lot.admit(WEB, now=0.5, deadline=1.5)).request
    assert lot.next_deadline() == 1.5

    lot.poll(now=2.0)

    resolution = only(lot.take_resolutions())
    assert (resolution.request, resolution.outcome) == (hasty, Outcome.TIMEOUT)
    assert resolution.resolved_at == 1.5
    assert resolution.failure == TIMEOUT_FAILURE
    error = TIMEOUT_FAILURE.to_error()
    assert isinstance(error, DeadlineExceeded)
    assert http_response(error, str(WEB)) == (504, "actor team-a/web: deadline exceeded")
    assert lot.is_waiting(patient)
    lot.attempt_succeeded(WEB, "10.0.0.7", now=3.0)
    assert only(lot.take_resolutions()).request == patient


def test_a_deadline_already_past_resolves_at_admission() -> None:
    lot: ParkingLot[str] = ParkingLot()
    admission = admitted(lot.admit(WEB, now=3.0, deadline=2.0))
    assert admission.start_attempt  # the actor is still resumed for whoever comes next
    resolution = only(lot.take_resolutions())
    assert (resolution.outcome, resolution.waited) == (Outcome.TIMEOUT, 0.0)


def test_a_request_deadline_after_the_budget_is_a_budget_exhaustion() -> None:
    lot: ParkingLot[str] = ParkingLot()
    admitted(lot.admit(WEB, now=0.0, deadline=30.0))
    lot.poll(now=31.0)
    resolution = only(lot.take_resolutions())
    assert (resolution.outcome, resolution.resolved_at) == (Outcome.BUDGET_EXHAUSTED, 5.0)


def test_a_departing_client_never_cancels_the_flight() -> None:
    lot: ParkingLot[str] = ParkingLot()
    leaver = admitted(lot.admit(WEB, now=0.0)).request
    stayer = admitted(lot.admit(WEB, now=0.1)).request

    assert lot.cancel(leaver, now=0.4)

    canceled = only(lot.take_resolutions())
    assert (canceled.request, canceled.outcome, canceled.failure) == (
        leaver,
        Outcome.CANCELED,
        CANCELED_FAILURE,
    )
    assert canceled.waited == pytest.approx(0.4)
    assert not lot.cancel(leaver, now=0.5)
    assert not lot.cancel(RequestId(999), now=0.5)
    flight = lot.flight(WEB)
    assert flight is not None
    assert flight.waiting == 1
    assert lot.cancel(stayer, now=0.6)
    # Nobody waits any more, yet the flight (and its attempt) go on.
    flight = lot.flight(WEB)
    assert flight is not None
    assert flight.waiting == 0
    assert lot.attempt_succeeded(WEB, "10.0.0.7", now=1.0) == FlightEnded(
        outcome=Outcome.SERVED, resolved=0
    )


def test_cancel_after_the_deadline_is_a_timeout() -> None:
    lot: ParkingLot[str] = ParkingLot()
    request = admitted(lot.admit(WEB, now=0.0, deadline=1.0)).request
    assert not lot.cancel(request, now=1.5)
    assert only(lot.take_resolutions()).outcome is Outcome.TIMEOUT


# --- misuse and bookkeeping ------------------------------------------------------------------


def test_reporting_an_attempt_nobody_started_is_an_illegal_transition() -> None:
    lot: ParkingLot[str] = ParkingLot()
    with pytest.raises(IllegalTransition, match="no resume attempt is in progress"):
        lot.attempt_succeeded(WEB, "x", now=0.0)
    admitted(lot.admit(WEB, now=0.0))
    lot.attempt_failed(WEB, NO_ROOM, now=0.1, rng=rng())
    with pytest.raises(IllegalTransition):  # backing off, not attempting
        lot.attempt_failed(WEB, NO_ROOM, now=0.1, rng=rng())


def test_ok_is_not_an_attempt_failure() -> None:
    lot: ParkingLot[str] = ParkingLot()
    admitted(lot.admit(WEB, now=0.0))
    with pytest.raises(InvalidArgument):
        lot.attempt_failed(WEB, Failure(GrpcCode.OK), now=0.1, rng=rng())


def test_time_never_runs_backwards() -> None:
    lot: ParkingLot[str] = ParkingLot()
    request = admitted(lot.admit(WEB, now=5.0)).request
    assert lot.cancel(request, now=3.0)
    resolution = only(lot.take_resolutions())
    assert resolution.resolved_at == 5.0
    assert resolution.waited == 0.0
    with pytest.raises(InvalidArgument, match="nan"):
        lot.poll(now=float("nan"))


def test_fail_all_resolves_everyone_for_shutdown() -> None:
    lot: ParkingLot[str] = ParkingLot()
    admitted(lot.admit(WEB, now=0.0))
    admitted(lot.admit(API, now=0.0))
    shutting_down = Failure(GrpcCode.UNAVAILABLE, "router is shutting down")
    assert lot.fail_all(shutting_down, now=1.0) == 2
    resolutions = lot.take_resolutions()
    assert {(r.outcome, r.failure) for r in resolutions} == {(Outcome.ERROR, shutting_down)}
    assert lot.stats().flights == 0
    assert lot.next_deadline() is None


def test_stats_track_the_lot() -> None:
    lot: ParkingLot[str] = ParkingLot(ParkingConfig(max_parked=10))
    for n in range(4):
        admitted(lot.admit(WEB if n % 2 else API, now=float(n)))
    stats = lot.stats()
    assert (stats.parked, stats.waiting, stats.admitted, stats.flights) == (4, 4, 4, 2)
    lot.attempt_succeeded(WEB, "w", now=4.0)
    lot.attempt_succeeded(API, "a", now=4.5)
    stats = lot.stats()
    assert (stats.parked, stats.max_parked_seen, stats.resolved) == (0, 4, 4)
    assert stats.longest_wait == 4.5
    assert stats.attempts_in_progress == 0


def test_failure_from_error_and_back() -> None:
    assert Failure.from_error(NotFound("gone")) == Failure(GrpcCode.NOT_FOUND, "gone")
    assert Failure.from_error(ValueError("secret")) == Failure(
        GrpcCode.INTERNAL, "unexpected ValueError"
    )
    assert isinstance(Failure(GrpcCode.INTERNAL, "x").to_error(), Internal)


def test_deadline_heap_stays_bounded_when_requests_resolve_early() -> None:
    lot: ParkingLot[str] = ParkingLot(ParkingConfig(max_parked=0))
    now = 0.0
    for _ in range(6000):
        admitted(lot.admit(WEB, now=now, deadline=now + 60.0))
        lot.attempt_succeeded(WEB, "w", now=now)
        now += 0.0001
    assert len(lot.take_resolutions()) == 6000
    # 12,000 deadlines were scheduled and none is due yet; the dead ones are compacted away.
    assert len(lot._deadlines) <= 1026
