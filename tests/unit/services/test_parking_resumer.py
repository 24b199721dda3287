"""The parking resumer on anyio's trio backend with a virtual clock (5 s budgets run instantly)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import anyio
import pytest
from trio.testing import MockClock

from substrate.core.ids import ActorRef
from substrate.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    NotFound,
    ResourceExhausted,
    SubstrateError,
    Unavailable,
    http_response,
)
from substrate.net.parking import BUDGET_RAN_OUT, Outcome, ParkingConfig
from substrate.services.parking import (
    NOT_RUNNING,
    SHUTTING_DOWN,
    ParkingMetrics,
    ParkingResumer,
    ParkingStatus,
)

WEB = ActorRef("team-a", "web")
API = ActorRef("team-a", "api")
NO_ROOM = "no worker has room for the actor"


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("trio", {"clock": MockClock(autojump_threshold=0)})


Answer = str | SubstrateError | Exception


class FakeControlPlane:
    """A scripted ResumeActor: each call sleeps ``latency`` then gives the next answer.

    Errors are raised as fresh copies so concurrent callers never share an instance.
    """

    def __init__(self, *answers: Answer, latency: float = 0.0, then: Answer = "10.0.0.7") -> None:
        self.answers = list(answers)
        self.latency = latency
        self.then = then
        self.calls: list[tuple[ActorRef, float]] = []
        self.finished = 0

    async def resume(self, actor: ActorRef) -> str:
        self.calls.append((actor, anyio.current_time()))
        await anyio.sleep(self.latency)
        self.finished += 1
        answer = self.answers.pop(0) if self.answers else self.then
        if isinstance(answer, SubstrateError):
            raise type(answer)(answer.description)
        if isinstance(answer, Exception):
            raise type(answer)(*answer.args)
        return answer


class RecordingMetrics:
    def __init__(self) -> None:
        self.active = 0
        self.max_active = 0
        self.active_calls = 0
        self.waits: list[tuple[float, Outcome]] = []
        self.rejected = 0

    def parking_active(self, delta: int) -> None:
        self.active_calls += 1
        self.active += delta
        self.max_active = max(self.max_active, self.active)

    def parking_wait(self, seconds: float, outcome: Outcome) -> None:
        self.waits.append((seconds, outcome))

    def parking_rejected(self) -> None:
        self.rejected += 1

    def outcomes(self) -> list[Outcome]:
        return [outcome for _, outcome in self.waits]


def resumer(
    control: FakeControlPlane,
    config: ParkingConfig | None = None,
    metrics: ParkingMetrics | None = None,
    **kwargs: object,
) -> ParkingResumer[str]:
    return ParkingResumer(
        control.resume,
        config,
        rng=random.Random(42),
        metrics=metrics,
        **kwargs,  # type: ignore[arg-type]
    )


async def expect_error(
    call: Callable[[], object], error_type: type[SubstrateError]
) -> tuple[SubstrateError, float]:
    start = anyio.current_time()
    with pytest.raises(error_type) as info:
        await call()  # type: ignore[misc]
    return info.value, anyio.current_time() - start


# --- singleflight --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_fifty_callers_of_a_cold_actor_share_one_resume() -> None:
    control = FakeControlPlane(latency=0.2)
    metrics = RecordingMetrics()
    results: list[str] = []

    async def call() -> None:
        results.append(await parking.resolve(WEB))

    async with resumer(control, metrics=metrics) as parking:
        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(call)
        assert anyio.current_time() - start == pytest.approx(0.2)
        assert parking.stats().flights == 0

    assert results == ["10.0.0.7"] * 50
    assert len(control.calls) == 1
    assert metrics.outcomes() == [Outcome.SERVED] * 50
    assert all(seconds == pytest.approx(0.2) for seconds, _ in metrics.waits)
    assert (metrics.active, metrics.max_active, metrics.rejected) == (0, 50, 0)


@pytest.mark.anyio
async def test_different_actors_get_their_own_flights() -> None:
    control = FakeControlPlane(latency=0.1)
    results: dict[ActorRef, str] = {}

    async def call(actor: ActorRef) -> None:
        results[actor] = await parking.resolve(actor)

    async with resumer(control) as parking, anyio.create_task_group() as tg:
        for actor in (WEB, API, WEB, API):
            tg.start_soon(call, actor)

    assert sorted(actor for actor, _ in control.calls) == [API, WEB]
    assert results == {WEB: "10.0.0.7", API: "10.0.0.7"}


# --- callers that go away ------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_cancelled_caller_does_not_cancel_the_flight() -> None:
    control = FakeControlPlane(latency=1.0)
    metrics = RecordingMetrics()
    outcome: dict[str, object] = {}

    async def impatient() -> None:  # starts the flight, then leaves
        with anyio.move_on_after(0.3) as scope:
            await parking.resolve(WEB)
        outcome["impatient"] = scope.cancelled_caught

    async def patient() -> None:
        outcome["patient"] = await parking.resolve(WEB)
        outcome["served_at"] = anyio.current_time()

    async with resumer(control, metrics=metrics) as parking:
        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(impatient)
            await anyio.sleep(0.1)
            tg.start_soon(patient)

    assert outcome["impatient"] is True
    assert outcome["patient"] == "10.0.0.7"
    assert outcome["served_at"] == pytest.approx(start + 1.0)
    assert len(control.calls) == 1
    assert control.finished == 1
    waits = {outcome: seconds for seconds, outcome in metrics.waits}
    assert len(metrics.waits) == 2
    assert waits[Outcome.CANCELED] == pytest.approx(0.3)
    assert waits[Outcome.SERVED] == pytest.approx(0.9)


@pytest.mark.anyio
async def test_the_resume_finishes_even_when_every_caller_left() -> None:
    control = FakeControlPlane(latency=1.0)
    metrics = RecordingMetrics()
    async with resumer(control, metrics=metrics) as parking:
        with anyio.move_on_after(0.2):
            await parking.resolve(WEB)
        assert parking.stats().waiting == 0
        assert parking.stats().flights == 1
        await anyio.sleep(2.0)
        assert control.finished == 1
        assert parking.stats().flights == 0
        # The next request starts a new flight: the resume result is not cached here.
        assert await parking.resolve(WEB) == "10.0.0.7"
    assert metrics.outcomes() == [Outcome.CANCELED, Outcome.SERVED]


# --- budget, errors, deadlines ---------------------------------------------------------------


@pytest.mark.anyio
async def test_budget_exhaustion_answers_503_with_the_last_description() -> None:
    control = FakeControlPlane(then=ResourceExhausted(NO_ROOM))
    metrics = RecordingMetrics()
    async with resumer(control, metrics=metrics) as parking:
        error, waited = await expect_error(lambda: parking.resolve(WEB), ResourceExhausted)

    assert waited == pytest.approx(5.0)
    assert error.description == NO_ROOM
    assert http_response(error, str(WEB)) == (
        503,
        "actor team-a/web unavailable: no worker has room for the actor",
    )
    assert metrics.outcomes() == [Outcome.BUDGET_EXHAUSTED]
    assert metrics.waits[0][0] == pytest.approx(5.0)
    # The retries follow the schedule: 0.1 s growing by 1.1x, plus [0, 10%) jitter.
    times = [at for _, at in control.calls]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert len(gaps) > 10
    for n, gap in enumerate(gaps):
        base = 0.1 * 1.1**n
        assert base - 1e-9 <= gap < base * 1.1 + 1e-9


@pytest.mark.anyio
async def test_a_late_joiner_is_exhausted_with_the_flight() -> None:
    control = FakeControlPlane(then=Aborted("another operation is in progress for this actor"))
    metrics = RecordingMetrics()
    errors: dict[str, tuple[SubstrateError, float]] = {}

    async def call(name: str) -> None:
        errors[name] = await expect_error(lambda: parking.resolve(WEB), Aborted)

    async with resumer(control, metrics=metrics) as parking, anyio.create_task_group() as tg:
        tg.start_soon(call, "first")
        await anyio.sleep(4.0)
        tg.start_soon(call, "late")

    assert errors["first"][1] == pytest.approx(5.0)
    assert errors["late"][1] == pytest.approx(1.0)
    assert http_response(errors["late"][0], str(WEB))[0] == 503
    assert sorted(seconds for seconds, _ in metrics.waits) == [
        pytest.approx(1.0),
        pytest.approx(5.0),
    ]
    assert set(metrics.outcomes()) == {Outcome.BUDGET_EXHAUSTED}


@pytest.mark.anyio
async def test_a_slow_resume_is_cut_at_the_budget_and_adopted_by_the_next_request() -> None:
    control = FakeControlPlane(latency=7.0)
    async with resumer(control) as parking:
        error, waited = await expect_error(lambda: parking.resolve(WEB), Unavailable)
        assert waited == pytest.approx(5.0)
        assert error.description == BUDGET_RAN_OUT
        await anyio.sleep(1.0)
        # The attempt started at 0 is still running; this request waits for it.
        assert await parking.resolve(WEB) == "10.0.0.7"
        assert anyio.current_time() == pytest.approx(control.calls[0][1] + 7.0)
    assert len(control.calls) == 1


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        (NotFound("actor team-a/web not found"), 404),
        (DeadlineExceeded("ateapi deadline"), 504),
        (Internal("boom"), 500),
    ],
)
@pytest.mark.anyio
async def test_non_retryable_errors_fail_fast(answer: SubstrateError, status: int) -> None:
    control = FakeControlPlane(answer, latency=0.05)
    metrics = RecordingMetrics()
    async with resumer(control, metrics=metrics) as parking:
        error, waited = await expect_error(lambda: parking.resolve(WEB), type(answer))

    assert waited == pytest.approx(0.05)
    assert error.description == answer.description
    assert isinstance(error.__cause__, type(answer))  # chained to what resume raised
    assert http_response(error, str(WEB))[0] == status
    assert len(control.calls) == 1
    assert metrics.outcomes() == [Outcome.ERROR]


@pytest.mark.anyio
async def test_an_unexpected_exception_becomes_internal() -> None:
    control = FakeControlPlane(ValueError("bug in the client"))
    async with resumer(control) as parking:
        error, _ = await expect_error(lambda: parking.resolve(WEB), Internal)
    assert isinstance(error.__cause__, ValueError)
    assert http_response(error, str(WEB)) == (500, "error resuming actor team-a/web")


@pytest.mark.anyio
async def test_the_request_deadline_answers_504_and_leaves_the_flight_running() -> None:
    control = FakeControlPlane(FailedPrecondition("actor is suspending"), latency=1.5)
    metrics = RecordingMetrics()
    timed_out: list[tuple[SubstrateError, float]] = []
    served: list[str] = []

    async def hasty() -> None:
        deadline = anyio.current_time() + 1.0
        timed_out.append(
            await expect_error(lambda: parking.resolve(WEB, deadline=deadline), DeadlineExceeded)
        )

    async def patient() -> None:
        served.append(await parking.resolve(WEB))

    async with resumer(control, metrics=metrics) as parking, anyio.create_task_group() as tg:
        tg.start_soon(hasty)
        tg.start_soon(patient)

    [(error, waited)] = timed_out
    assert waited == pytest.approx(1.0)
    assert http_response(error, str(WEB)) == (504, "actor team-a/web: deadline exceeded")
    assert served == ["10.0.0.7"]
    assert len(control.calls) == 2  # FailedPrecondition was retried once
    assert sorted(o.value for o in metrics.outcomes()) == ["served", "timeout"]


# --- capacity --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_full_lot_sheds_with_router_at_capacity() -> None:
    control = FakeControlPlane(latency=1.0)
    metrics = RecordingMetrics()
    async with resumer(control, ParkingConfig(max_parked=2), metrics=metrics) as parking:
        async with anyio.create_task_group() as tg:
            tg.start_soon(parking.resolve, WEB)
            tg.start_soon(parking.resolve, API)
            await anyio.sleep(0.1)
            status = parking.stats()
            assert status == ParkingStatus(
                enabled=True,
                parked=2,
                max_parked=2,
                max_parked_seen=2,
                max_wait=5.0,
                longest_wait=0.0,
                waiting=2,
                rejected=0,
                flights=2,
            )
            error, waited = await expect_error(lambda: parking.resolve(WEB), ResourceExhausted)
            assert waited == 0.0
            assert error.description == "router at capacity"
            assert http_response(error, str(WEB)) == (
                503,
                "actor team-a/web unavailable: router at capacity",
            )
            assert metrics.rejected == 1
            assert metrics.waits == []  # a shed request is never a wait sample
        assert parking.stats().rejected == 1
    assert metrics.outcomes() == [Outcome.SERVED, Outcome.SERVED]
    assert len(control.calls) == 2


@pytest.mark.anyio
async def test_park_sheds_without_waiting_and_a_given_up_ticket_frees_its_slot() -> None:
    control = FakeControlPlane(latency=1.0)
    metrics = RecordingMetrics()
    async with resumer(control, ParkingConfig(max_parked=1), metrics=metrics) as parking:
        ticket = parking.park(WEB)  # admitted at once; nothing awaited yet
        assert parking.stats().parked == 1
        with pytest.raises(ResourceExhausted, match="router at capacity"):
            parking.park(API)  # shed synchronously: no task, no checkpoint
        ticket.cancel()
        ticket.cancel()  # idempotent
        assert parking.stats().parked == 0
        assert await parking.park(API).wait() == "10.0.0.7"
    assert metrics.rejected == 1
    assert metrics.outcomes() == [Outcome.CANCELED, Outcome.SERVED]
    # the given-up request's resume still ran (a departing caller never cancels it)
    assert sorted(str(actor) for actor, _ in control.calls) == [str(API), str(WEB)]


@pytest.mark.anyio
async def test_cancel_after_a_ticket_resolved_changes_nothing() -> None:
    control = FakeControlPlane()
    metrics = RecordingMetrics()
    async with resumer(control, metrics=metrics) as parking:
        ticket = parking.park(WEB)
        assert await ticket.wait() == "10.0.0.7"
        ticket.cancel()
    assert metrics.outcomes() == [Outcome.SERVED]


@pytest.mark.anyio
async def test_disabled_parking_retries_aborted_without_cap_or_metrics() -> None:
    metrics = RecordingMetrics()
    aborted = Aborted("another operation is in progress for this actor")
    control = FakeControlPlane(aborted, aborted, aborted, latency=0.01)
    async with resumer(control, ParkingConfig(max_parked=0), metrics=metrics) as parking:
        async with anyio.create_task_group() as tg:
            for _ in range(100):  # no admission cap
                tg.start_soon(parking.resolve, WEB)
        assert len(control.calls) == 4
        status = parking.stats()
        assert (status.enabled, status.parked, status.max_parked, status.max_wait) == (
            False,
            0,
            0,
            15.0,
        )
    assert (metrics.active_calls, metrics.waits, metrics.rejected) == (0, [], 0)


@pytest.mark.parametrize(
    "answer",
    [
        ResourceExhausted(NO_ROOM),
        FailedPrecondition("actor is suspending"),
        Unavailable("ateapi is restarting"),
    ],
)
@pytest.mark.anyio
async def test_disabled_parking_fails_fast_on_capacity(answer: SubstrateError) -> None:
    control = FakeControlPlane(answer, latency=0.01)
    async with resumer(control, ParkingConfig(max_parked=0)) as parking:
        error, waited = await expect_error(lambda: parking.resolve(API), type(answer))
    assert waited == pytest.approx(0.01)
    assert error.description == answer.description
    assert len(control.calls) == 1


@pytest.mark.anyio
async def test_disabled_parking_gives_up_on_aborted_after_fifteen_seconds() -> None:
    control = FakeControlPlane(then=Aborted("another operation is in progress for this actor"))
    async with resumer(control, ParkingConfig(max_parked=0)) as parking:
        _, waited = await expect_error(lambda: parking.resolve(WEB), Aborted)
    assert waited == pytest.approx(15.0)


# --- lifetime --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_shutdown_lets_parked_requests_finish_their_budget() -> None:
    control = FakeControlPlane(then=ResourceExhausted(NO_ROOM))
    results: list[tuple[SubstrateError, float]] = []

    async def call() -> None:
        results.append(await expect_error(lambda: parking.resolve(WEB), ResourceExhausted))

    async with anyio.create_task_group() as outer:
        parking = resumer(control)
        async with parking:
            outer.start_soon(call)
            await anyio.sleep(1.0)
        # Leaving the block drained: the parked request got its full budget and a 503.
        [(error, waited)] = results
        assert error.description == NO_ROOM
        assert waited == pytest.approx(5.0)
        error, _ = await expect_error(lambda: parking.resolve(WEB), Unavailable)
        assert error.description == SHUTTING_DOWN


@pytest.mark.anyio
async def test_leaving_with_an_exception_fails_parked_callers_at_once() -> None:
    control = FakeControlPlane(latency=60.0)
    results: list[tuple[SubstrateError, float]] = []

    async def call() -> None:
        results.append(await expect_error(lambda: parking.resolve(WEB), Unavailable))

    parking = resumer(control)
    async with anyio.create_task_group() as outer:
        with anyio.CancelScope() as scope:
            async with parking:
                outer.start_soon(call)
                await anyio.sleep(1.0)
                scope.cancel()
                await anyio.sleep(1.0)
        assert scope.cancelled_caught
    [(error, waited)] = results
    assert error.description == SHUTTING_DOWN
    assert waited == pytest.approx(1.0)
    assert control.finished == 0  # the resume itself was cancelled with the service


@pytest.mark.anyio
async def test_cancelling_the_drain_fails_parked_callers_at_once() -> None:
    control = FakeControlPlane(then=ResourceExhausted(NO_ROOM))
    results: list[tuple[SubstrateError, float]] = []

    async def call() -> None:
        results.append(await expect_error(lambda: parking.resolve(WEB), Unavailable))

    parking = resumer(control)
    async with anyio.create_task_group() as outer:
        with anyio.CancelScope() as scope:
            async with parking:
                outer.start_soon(call)
                await anyio.sleep(1.0)
                outer.start_soon(cancel_later, scope, 1.0)
            # The block was left normally; the drain was cut short 1 s into it.
        assert scope.cancelled_caught
    [(error, waited)] = results
    assert error.description == SHUTTING_DOWN
    assert waited == pytest.approx(2.0)


async def cancel_later(scope: anyio.CancelScope, delay: float) -> None:
    await anyio.sleep(delay)
    scope.cancel()


@pytest.mark.anyio
async def test_resolve_needs_a_running_resumer() -> None:
    parking = resumer(FakeControlPlane())
    error, _ = await expect_error(lambda: parking.resolve(WEB), Unavailable)
    assert error.description == NOT_RUNNING


@pytest.mark.anyio
async def test_time_comes_from_the_injected_clock() -> None:
    offset = 1000.0

    def clock() -> float:
        return anyio.current_time() + offset

    control = FakeControlPlane(then=ResourceExhausted(NO_ROOM))
    async with resumer(control, clock=clock) as parking:
        # The deadline is on the resumer's clock, not anyio's.
        deadline = clock() + 2.0
        _, waited = await expect_error(
            lambda: parking.resolve(WEB, deadline=deadline), DeadlineExceeded
        )
    assert waited == pytest.approx(2.0)


def test_drain_timeout_is_validated_against_the_budget() -> None:
    from substrate.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="drain timeout must be >= the park budget"):
        resumer(FakeControlPlane(), drain_timeout=1.0)


def test_the_resumer_runs_on_asyncio_with_a_real_clock() -> None:
    """The router runs on asyncio (grpclib); nothing here may depend on trio."""

    async def main() -> tuple[list[str], int]:
        control = FakeControlPlane(ResourceExhausted(NO_ROOM), latency=0.01)
        results: list[str] = []

        async def call() -> None:
            results.append(await parking.resolve(WEB))

        config = ParkingConfig(budget=1.0, retry_interval=0.02)
        async with resumer(control, config) as parking, anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(call)
        return results, len(control.calls)

    results, calls = anyio.run(main, backend="asyncio")
    assert results == ["10.0.0.7"] * 20
    assert calls == 2
