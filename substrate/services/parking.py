"""The async shell around the parking lot: parks callers and runs the shared resumes."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Generic, Protocol, Self, TypeVar, cast

import anyio
import anyio.abc
import attrs
import structlog

from substrate.core.ids import ActorRef
from substrate.errors import GrpcCode, SubstrateError, Unavailable
from substrate.net.parking import (
    Failure,
    FlightView,
    Outcome,
    ParkingConfig,
    ParkingLot,
    RequestId,
    Resolution,
    Shed,
)

T = TypeVar("T")

SHUTTING_DOWN = "router is shutting down"
NOT_RUNNING = "request parking is not running"

_log = structlog.get_logger(__name__)


class ParkingMetrics(Protocol):
    """Receives the three parking metrics of seed 001 (the router binds them to Prometheus).

    Called only while parking is enabled, synchronously, from the event loop; a hook must
    not block or raise.
    """

    def parking_active(self, delta: int) -> None:
        """``parking.active`` up/down counter: +1 on admission, -1 on resolution."""

    def parking_wait(self, seconds: float, outcome: Outcome) -> None:
        """``parking.wait.duration``: exactly once per admitted request, with its outcome."""

    def parking_rejected(self) -> None:
        """``parking.rejected``: a request was shed because the lot was full."""


@attrs.frozen(slots=True, kw_only=True)
class ParkingStatus:
    """The ``/statusz`` "Request Parking" card."""

    enabled: bool
    parked: int
    """Requests parked now (0 when parking is disabled)."""
    max_parked: int
    """The lot's capacity (``--parked-request-max``)."""
    max_parked_seen: int
    max_wait: float
    """The longest any request may wait: the effective budget, in seconds."""
    longest_wait: float
    """The longest wait observed so far, in seconds."""
    waiting: int
    """Callers waiting now, in either mode."""
    rejected: int
    flights: int


class _Waiter(Generic[T]):
    __slots__ = ("cause", "event", "resolution")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.resolution: Resolution[T] | None = None
        self.cause: BaseException | None = None


class Parked(Generic[T]):
    """One admitted request (:meth:`ParkingResumer.park`): wait for it, or give it up."""

    __slots__ = ("_request", "_resumer", "_waiter")

    def __init__(self, resumer: ParkingResumer[T], request: RequestId, waiter: _Waiter[T]) -> None:
        self._resumer = resumer
        self._request = request
        self._waiter = waiter

    async def wait(self) -> T:
        """The resume's result, or its failure raised as :meth:`ParkingResumer.resolve`
        raises it. Cancelling the wait gives the request up (outcome canceled)."""
        waiter = self._waiter
        try:
            await waiter.event.wait()
        finally:
            self.cancel()
        resolution = waiter.resolution
        assert resolution is not None
        if resolution.outcome is Outcome.SERVED:
            return cast(T, resolution.result)
        assert resolution.failure is not None
        raise resolution.failure.to_error() from waiter.cause

    def cancel(self) -> None:
        """Give the request up (outcome canceled) unless it is already resolved."""
        self._resumer._give_up(self._request, self._waiter)


class ParkingResumer(Generic[T]):
    """Resolves actors for the router: one shared resume per actor, parked callers, retries.

    ``resume(actor)`` is one ResumeActor attempt: it returns the result (e.g. the worker
    assignment) or raises a :class:`~substrate.errors.SubstrateError`. The resumer owns a
    task group for its ``async with`` lifetime; every resume runs there, detached from the
    callers, so a caller that goes away never cancels it (house-style rule 11).

    How :meth:`resolve` answers, by outcome (HTTP per :func:`substrate.errors.http_response`):

    * served: returns the result;
    * shed (lot full): raises ``ResourceExhausted("router at capacity")`` → 503;
    * budget_exhausted: raises the last retryable failure rebuilt by code, e.g.
      ``ResourceExhausted("no worker has room for the actor")`` → 503 ``actor <id>
      unavailable: no worker has room for the actor`` (every retryable code maps to 503 with
      its description), or ``Unavailable(BUDGET_RAN_OUT)`` if no attempt had answered;
    * error: raises the non-retryable failure rebuilt by code (NotFound → 404, ...),
      chained to the exception ``resume`` raised;
    * timeout (``deadline`` passed): raises ``DeadlineExceeded`` → 504;
    * canceled: the caller's cancellation propagates unchanged.

    Leaving the ``async with`` block normally drains: new calls get
    ``Unavailable("router is shutting down")``, parked callers keep their budget (for at
    most ``drain_timeout``), then whoever is left gets that same error and the running
    resumes are cancelled. Leaving with an exception skips the drain, and cancelling the
    exit cuts it short; either way parked callers get that error at once.
    """

    def __init__(
        self,
        resume: Callable[[ActorRef], Awaitable[T]],
        config: ParkingConfig | None = None,
        *,
        clock: Callable[[], float] = anyio.current_time,
        rng: random.Random | None = None,
        metrics: ParkingMetrics | None = None,
        drain_timeout: float | None = None,
    ) -> None:
        self._resume = resume
        self._config = config if config is not None else ParkingConfig()
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._metrics = metrics if self._config.enabled else None
        self._drain_timeout = self._config.drain_timeout(drain_timeout)
        self._lot: ParkingLot[T] = ParkingLot(self._config)
        self._waiters: dict[RequestId, _Waiter[T]] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._closing = False
        self._timer_wake: anyio.Event | None = None
        self._idle: anyio.Event | None = None

    @property
    def config(self) -> ParkingConfig:
        return self._config

    async def __aenter__(self) -> Self:
        if self._tg is not None or self._closing:
            raise RuntimeError("a ParkingResumer can be entered only once")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._run_timer)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg = self._tg
        assert tg is not None, "ParkingResumer exited without being entered"
        self._closing = True
        interrupted: BaseException | None = None
        if exc_type is None and self._waiters:
            self._idle = anyio.Event()
            try:
                with anyio.move_on_after(self._drain_timeout):
                    await self._idle.wait()
            except BaseException as error:  # cancelled while draining: stop draining
                interrupted = error
        self._lot.fail_all(Failure(GrpcCode.UNAVAILABLE, SHUTTING_DOWN), now=self._clock())
        self._dispatch()
        tg.cancel_scope.cancel()
        if interrupted is not None:
            await tg.__aexit__(type(interrupted), interrupted, interrupted.__traceback__)
            raise interrupted
        return await tg.__aexit__(exc_type, exc, tb)

    async def resolve(self, actor: ActorRef, *, deadline: float | None = None) -> T:
        """Wait until ``actor`` is resumed (or the wait ends) and return the resume's result.

        ``deadline`` is this request's own deadline on the resumer's clock; when it passes
        first the request ends with outcome timeout. Cancelling the caller (e.g. with
        ``anyio.fail_after`` around this call) records outcome canceled and leaves the
        shared resume running for the others.
        """
        return await self.park(actor, deadline=deadline).wait()

    def park(
        self, actor: ActorRef, *, deadline: float | None = None, arrived: float | None = None
    ) -> Parked[T]:
        """Admit a request for ``actor`` now, without waiting: :meth:`resolve` in two steps.

        Sheds at once (raises, as :meth:`resolve` does) when the lot is full, so a caller
        can answer a shed request before it sets up anything to wait with. The returned
        ticket must be awaited (:meth:`Parked.wait`) or given up (:meth:`Parked.cancel`).
        ``arrived``: when the request reached the host, on the resumer's clock (see
        :meth:`~substrate.net.parking.ParkingLot.admit`).
        """
        tg = self._tg
        if tg is None or self._closing:
            raise Unavailable(SHUTTING_DOWN if self._closing else NOT_RUNNING)
        admission = self._lot.admit(actor, now=self._clock(), deadline=deadline, arrived=arrived)
        if isinstance(admission, Shed):
            if self._metrics is not None:
                self._metrics.parking_rejected()
            raise admission.failure.to_error()
        request = admission.request
        waiter: _Waiter[T] = _Waiter()
        self._waiters[request] = waiter
        if self._metrics is not None:
            self._metrics.parking_active(1)
        if admission.start_attempt:
            tg.start_soon(self._attempt, actor)
        self._dispatch()
        self._wake_timer()
        return Parked(self, request, waiter)

    def _give_up(self, request: RequestId, waiter: _Waiter[T]) -> None:
        if waiter.resolution is None and self._lot.cancel(request, now=self._clock()):
            self._dispatch()

    def flight(self, actor: ActorRef) -> FlightView | None:
        """The actor's current flight, if one runs (e.g. for deadline-aware admission)."""
        return self._lot.flight(actor)

    def stats(self) -> ParkingStatus:
        lot = self._lot.stats()
        return ParkingStatus(
            enabled=lot.enabled,
            parked=lot.parked,
            max_parked=lot.capacity,
            max_parked_seen=lot.max_parked_seen,
            max_wait=self._config.effective_budget,
            longest_wait=lot.longest_wait,
            waiting=lot.waiting,
            rejected=lot.rejected,
            flights=lot.flights,
        )

    # --- the service's own tasks --------------------------------------------------------

    async def _attempt(self, actor: ActorRef) -> None:
        try:
            result = await self._resume(actor)
        except Exception as exc:
            if not isinstance(exc, SubstrateError):
                _log.error("resume raised a non-substrate error", actor=str(actor), exc_info=exc)
            self._lot.attempt_failed(
                actor, Failure.from_error(exc), now=self._clock(), rng=self._rng
            )
            self._dispatch(cause=exc, actor=actor)
        else:
            self._lot.attempt_succeeded(actor, result, now=self._clock())
            self._dispatch()
        self._wake_timer()

    async def _run_timer(self) -> None:
        lot = self._lot
        tg = self._tg
        assert tg is not None
        while True:
            wake = self._timer_wake = anyio.Event()
            due_at = lot.next_deadline()
            if due_at is None:
                await wake.wait()
                continue
            delay = due_at - self._clock()
            if delay > 0:
                with anyio.move_on_after(delay):
                    await wake.wait()
                if wake.is_set():
                    continue
            # A sleep may end a hair before due_at on a float clock; the lot's time is
            # what counts, so never poll earlier than the deadline that woke us.
            for due in lot.poll(now=max(self._clock(), due_at)):
                tg.start_soon(self._attempt, due)
            self._dispatch()

    def _wake_timer(self) -> None:
        if self._timer_wake is not None:
            self._timer_wake.set()

    def _dispatch(
        self, *, cause: BaseException | None = None, actor: ActorRef | None = None
    ) -> None:
        resolutions = self._lot.take_resolutions()
        if not resolutions:
            return
        metrics = self._metrics
        waiters = self._waiters
        for resolution in resolutions:
            if metrics is not None:
                metrics.parking_active(-1)
                metrics.parking_wait(resolution.waited, resolution.outcome)
            waiter = waiters.pop(resolution.request, None)
            if waiter is None:
                continue
            waiter.resolution = resolution
            if (
                cause is not None
                and resolution.outcome is Outcome.ERROR
                and resolution.actor == actor
            ):
                waiter.cause = cause
            waiter.event.set()
        if not waiters and self._idle is not None:
            self._idle.set()


__all__ = [
    "NOT_RUNNING",
    "SHUTTING_DOWN",
    "Parked",
    "ParkingMetrics",
    "ParkingResumer",
    "ParkingStatus",
]
