"""The router's request-parking lot and per-actor singleflight, as a sans-I/O state machine."""

# Theory of operation
# ===================
#
# A request for a suspended actor cannot be routed until a ResumeActor call succeeds, and
# in an oversubscribed fleet the answer is often "not yet" (no worker has room, another
# operation holds the actor, ateapi is restarting). Instead of failing, the router *parks*
# the request and retries the resume until it succeeds or a budget runs out
# (seed 001, design §6). This module decides everything about that wait; it performs no
# I/O, never reads a clock and never draws randomness on its own. Time is the ``now``
# argument of every method, randomness the ``rng`` argument of ``attempt_failed``, and an
# async shell (``substrate.services.parking``) runs the resume calls it asks for.
#
# Nouns
# -----
# * A *request* is one caller waiting for one actor. ``admit`` either sheds it (the lot is
#   full) or gives it a ``RequestId``; from then on it is *waiting* until it is resolved,
#   exactly once, with one of five outcomes (``Outcome``: served, budget_exhausted,
#   canceled, timeout, error). With parking enabled every waiting request holds one *slot*
#   of the lot for its whole wait, so at most ``max_parked`` requests wait at once; a hot
#   actor with N waiting requests holds N slots. With parking disabled (``max_parked ==
#   0``) nothing is capped and no slot is counted, but requests are still deduplicated.
# * A *flight* is the shared resume of one actor: at most one per actor, joined by every
#   request for it. Its budget clock starts when its first request is admitted
#   (``deadline = now + budget``); later requests join it and share the remaining budget
#   and the outcome, so a late joiner may see budget_exhausted after a short wait of its
#   own. A flight ends when an attempt succeeds (all waiters served), when an attempt
#   fails with a non-retryable code (all waiters get that error), or at its deadline (all
#   waiters budget_exhausted). A departing request never ends a flight: it only resolves
#   itself (canceled), and the flight keeps going for everyone else, even for nobody.
# * An *attempt* is one ResumeActor call, run by the shell. At most one attempt per actor
#   is in progress at any time. The lot asks for one by returning
#   ``Admitted(start_attempt=True)`` (a new flight) or by listing the actor in ``poll``'s
#   result (a retry is due); the shell reports the answer with ``attempt_succeeded`` or
#   ``attempt_failed``.
#
# A flight's states (``FlightState``)
# -----------------------------------
#   ATTEMPTING       an attempt is in progress.
#       -- success ----------------------------------> ended: waiters served
#       -- non-retryable failure ---------------------> ended: waiters error
#       -- retryable failure, next retry < deadline --> BACKING_OFF
#       -- retryable failure, next retry >= deadline -> AWAITING_BUDGET
#       -- deadline ----------------------------------> ended: waiters budget_exhausted
#   BACKING_OFF      waiting for ``retry_at``.
#       -- poll(now >= retry_at) ---------------------> ATTEMPTING (shell starts an attempt)
#       -- deadline ----------------------------------> ended: waiters budget_exhausted
#   AWAITING_BUDGET  the next retry would start at or after the deadline, so none is made.
#       -- deadline ----------------------------------> ended: waiters budget_exhausted
#
# The budget is a hard bound on waiting: no request waits past its flight's deadline, even
# if an attempt is still in progress then. That attempt is *not* cancelled (rule 11 of the
# house style, and ateapi's resume is not safe to abandon half way); it becomes an
# *orphan*. If a new request for the actor arrives before the orphan answers, the new
# flight adopts the running attempt (``Admitted(start_attempt=False)``) instead of issuing
# a second concurrent ResumeActor; if nobody arrives, the orphan's answer is dropped
# (``NoFlight``). A budget_exhausted request carries the last retryable failure of its
# flight (e.g. ResourceExhausted "no worker has room for the actor"), or, if no attempt
# had answered yet, Unavailable ``BUDGET_RAN_OUT``.
#
# Retries follow ``Backoff``: the n-th retry (from 0) waits ``retry_interval *
# retry_factor**n`` plus a random fraction in [0, retry_jitter) of that, measured from the
# moment the failed attempt answered. There is no cap and no attempt limit; the budget
# alone bounds the wait.
#
# Which failures are retried (``classify``): Aborted always; ResourceExhausted,
# FailedPrecondition and Unavailable only while parking is enabled; everything else
# (NotFound, DeadlineExceeded, PermissionDenied, Unauthenticated, ...) ends the flight at
# once with outcome error. With parking disabled the budget is ``disabled_abort_budget``
# (15 s), so only Aborted conflicts are retried, for at most 15 s.
#
# Time
# ----
# Every method that takes ``now`` first fires what is due by then: flight deadlines and
# request deadlines less than or equal to ``now``, in the order they fall (a tie goes to
# the entry scheduled first). A request resolved by a deadline is resolved *at that
# deadline*, however late the shell calls in, so recorded waits never exceed the budget.
# Retries, by contrast, only start inside ``poll`` (so the shell always learns about
# them), and only while the flight's deadline is still ahead. Time never runs backwards:
# a ``now`` earlier than one already seen is treated as the latest one.
# ``next_deadline`` tells the shell when to call ``poll`` next.
#
# Resolutions are queued; ``take_resolutions`` hands them over (and forgets them). The
# shell wakes the waiting callers and feeds the metrics (``parking.wait.duration`` by
# outcome, ``parking.active``) from them.

from __future__ import annotations

import enum
import heapq
import math
import random
from typing import Final, Generic, NewType, TypeAlias, TypeVar

import attrs

from substrate.core.ids import ActorRef
from substrate.errors import (
    GrpcCode,
    IllegalTransition,
    InvalidArgument,
    SubstrateError,
    from_grpc,
    grpc_code,
)
from substrate.net.backoff import Backoff, check_factor, check_jitter, check_positive

R = TypeVar("R")

RequestId = NewType("RequestId", int)
"""Identifies one admitted request within one :class:`ParkingLot`."""

DEFAULT_BUDGET: Final = 5.0
DEFAULT_MAX_PARKED: Final = 1024
DEFAULT_RETRY_INTERVAL: Final = 0.1
DEFAULT_RETRY_FACTOR: Final = 1.1
DEFAULT_RETRY_JITTER: Final = 0.1
DISABLED_ABORT_BUDGET: Final = 15.0
DRAIN_HEADROOM: Final = 5.0
"""Added to the budget for the default drain timeout: room for the last answers to go out."""

ROUTER_AT_CAPACITY: Final = "router at capacity"
BUDGET_RAN_OUT: Final = "resume did not finish within the park budget"
REQUEST_DEADLINE_PASSED: Final = "request deadline exceeded while parked"
CLIENT_WENT_AWAY: Final = "client went away while parked"


class Outcome(enum.Enum):
    """How a parked request ended; the value is the ``outcome`` metric label of seed 001."""

    SERVED = "served"
    """The resume succeeded; the request is routed to the worker."""
    BUDGET_EXHAUSTED = "budget_exhausted"
    """The flight's budget elapsed while the resume was still blocked or unanswered."""
    CANCELED = "canceled"
    """The client went away while parked."""
    TIMEOUT = "timeout"
    """The request's own deadline expired while parked (distinct from the budget)."""
    ERROR = "error"
    """The resume failed with a non-retryable error."""


class Verdict(enum.Enum):
    """What one failed resume attempt means for its flight."""

    RETRY = "retry"
    FAIL = "fail"


ALWAYS_RETRIED: Final = frozenset({GrpcCode.ABORTED})
"""Retried whether or not parking is enabled: another operation holds the actor."""

RETRIED_WHEN_PARKING: Final = frozenset(
    {GrpcCode.RESOURCE_EXHAUSTED, GrpcCode.FAILED_PRECONDITION, GrpcCode.UNAVAILABLE}
)
"""Retried only while parking is enabled: no room, a transient state, a restarting dependency."""


def classify(code: GrpcCode, parking_enabled: bool) -> Verdict:
    """Whether a resume attempt that failed with ``code`` is retried (seed 001's table).

    Raises :class:`InvalidArgument` for ``OK``, which is not a failure.
    """
    if code is GrpcCode.OK:
        raise InvalidArgument("OK is not a failed attempt")
    if code in ALWAYS_RETRIED or (parking_enabled and code in RETRIED_WHEN_PARKING):
        return Verdict.RETRY
    return Verdict.FAIL


def _check_max_parked(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(
            f"parking max_parked must be an integer >= 0 (0 disables parking), got {value!r}"
        )
    return value


@attrs.frozen(slots=True, kw_only=True)
class ParkingConfig:
    """The parking knobs (seed 001's flags); construction validates them.

    Raises :class:`InvalidArgument` naming the offending field.
    """

    budget: float = DEFAULT_BUDGET
    """``--parked-request-budget``: seconds a flight may wait, shared by its requests."""
    max_parked: int = DEFAULT_MAX_PARKED
    """``--parked-request-max``: slots in the lot; 0 disables parking."""
    retry_interval: float = DEFAULT_RETRY_INTERVAL
    """``--parked-request-retry-interval``: seconds before the first retry."""
    retry_factor: float = DEFAULT_RETRY_FACTOR
    """``--parked-request-retry-factor``: multiplier per retry (>= 1)."""
    retry_jitter: float = DEFAULT_RETRY_JITTER
    """``--parked-request-retry-jitter``: random fraction in [0, 1) added to each delay."""
    disabled_abort_budget: float = DISABLED_ABORT_BUDGET
    """The budget for retrying Aborted when parking is disabled."""

    def __attrs_post_init__(self) -> None:
        check_positive(self.budget, what="parking budget")
        _check_max_parked(self.max_parked)
        check_positive(self.retry_interval, what="parking retry_interval")
        check_factor(self.retry_factor, what="parking retry_factor")
        check_jitter(self.retry_jitter, what="parking retry_jitter")
        check_positive(self.disabled_abort_budget, what="parking disabled_abort_budget")

    @property
    def enabled(self) -> bool:
        """Parking is on unless ``max_parked`` is 0."""
        return self.max_parked > 0

    @property
    def effective_budget(self) -> float:
        """The budget in force: ``budget`` when enabled, else ``disabled_abort_budget``."""
        return self.budget if self.enabled else self.disabled_abort_budget

    @property
    def backoff(self) -> Backoff:
        return Backoff(
            interval=self.retry_interval, factor=self.retry_factor, jitter=self.retry_jitter
        )

    def drain_timeout(self, requested: float | None = None) -> float:
        """The graceful-shutdown drain timeout: ``requested``, validated, or a derived default.

        The default is the effective budget plus :data:`DRAIN_HEADROOM`. An explicit value
        must be at least the effective budget, so a request parked when shutdown begins
        still gets its whole budget and a normal answer; otherwise raises
        :class:`InvalidArgument`.
        """
        budget = self.effective_budget
        if requested is None:
            return budget + DRAIN_HEADROOM
        value = check_positive(requested, what="drain timeout")
        if value < budget:
            raise InvalidArgument(
                f"drain timeout must be >= the park budget ({budget:g}s), got {value:g}s"
            )
        return value


@attrs.frozen(slots=True)
class Failure:
    """A failed resume attempt (or a parking verdict), as a gRPC code and description."""

    code: GrpcCode
    description: str = ""

    @classmethod
    def from_error(cls, error: BaseException) -> Failure:
        """The code and description of ``error``; a non-substrate exception is INTERNAL."""
        if isinstance(error, SubstrateError):
            return cls(grpc_code(error), error.description)
        return cls(GrpcCode.INTERNAL, f"unexpected {type(error).__name__}")

    def to_error(self) -> SubstrateError:
        """The substrate error to raise for this failure (via :func:`from_grpc`)."""
        return from_grpc(self.code, self.description)


SHED_FAILURE: Final = Failure(GrpcCode.RESOURCE_EXHAUSTED, ROUTER_AT_CAPACITY)
"""A shed request's answer: HTTP 503 ``actor <id> unavailable: router at capacity``."""
BUDGET_RAN_OUT_FAILURE: Final = Failure(GrpcCode.UNAVAILABLE, BUDGET_RAN_OUT)
TIMEOUT_FAILURE: Final = Failure(GrpcCode.DEADLINE_EXCEEDED, REQUEST_DEADLINE_PASSED)
CANCELED_FAILURE: Final = Failure(GrpcCode.CANCELLED, CLIENT_WENT_AWAY)


# --- what the lot answers -----------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class Admitted:
    """The request waits; ``start_attempt`` asks the shell to call ResumeActor now."""

    request: RequestId
    new_flight: bool
    """This request started the actor's flight (and its budget clock)."""
    start_attempt: bool
    """No attempt is in progress for the actor: the shell must start one."""


@attrs.frozen(slots=True, kw_only=True)
class Shed:
    """The lot is full; the request is answered at once and never waits."""

    failure: Failure = SHED_FAILURE


Admission: TypeAlias = Admitted | Shed


@attrs.frozen(slots=True, kw_only=True)
class RetryAt:
    """The flight retries: ``poll`` will return the actor at ``at`` (retry number ``retry``)."""

    at: float
    retry: int


@attrs.frozen(slots=True, kw_only=True)
class AwaitBudget:
    """No further attempt fits the budget; the flight ends budget_exhausted at ``deadline``."""

    deadline: float


@attrs.frozen(slots=True, kw_only=True)
class FlightEnded:
    """The attempt ended the flight: ``resolved`` waiting requests got ``outcome``."""

    outcome: Outcome
    resolved: int


@attrs.frozen(slots=True)
class NoFlight:
    """The attempt was an orphan whose flight had already ended; its answer is dropped."""


AttemptDecision: TypeAlias = RetryAt | AwaitBudget | FlightEnded | NoFlight


@attrs.frozen(slots=True, kw_only=True)
class Resolution(Generic[R]):
    """How one admitted request ended. ``result`` is set when served, ``failure`` otherwise."""

    request: RequestId
    actor: ActorRef
    outcome: Outcome
    admitted_at: float
    resolved_at: float
    result: R | None = None
    failure: Failure | None = None

    @property
    def waited(self) -> float:
        """The request's own parked time (``parking.wait.duration``)."""
        return self.resolved_at - self.admitted_at


class FlightState(enum.Enum):
    ATTEMPTING = "attempting"
    BACKING_OFF = "backing_off"
    AWAITING_BUDGET = "awaiting_budget"


@attrs.frozen(slots=True, kw_only=True)
class FlightView:
    """A read-only snapshot of one actor's flight."""

    actor: ActorRef
    state: FlightState
    started_at: float
    deadline: float
    waiting: int
    attempts: int
    """Attempts of this flight that have answered."""
    retry_at: float | None
    last_failure: Failure | None


@attrs.frozen(slots=True, kw_only=True)
class LotStats:
    """Counters for metrics and ``/statusz``."""

    enabled: bool
    capacity: int
    """``max_parked`` (0 when parking is disabled)."""
    parked: int
    """Slots in use: waiting requests when enabled, always 0 when disabled."""
    waiting: int
    """Admitted requests not resolved yet (counted in both modes)."""
    max_parked_seen: int
    rejected: int
    admitted: int
    resolved: int
    flights: int
    attempts_in_progress: int
    """Including orphan attempts whose flight already ended."""
    longest_wait: float
    """The longest wait of any resolved request so far, in seconds."""


# --- internal state ---------------------------------------------------------------------


class _Request:
    __slots__ = ("actor", "admitted_at", "deadline", "done", "flight", "id")

    def __init__(
        self,
        id: RequestId,
        actor: ActorRef,
        admitted_at: float,
        deadline: float | None,
        flight: _Flight,
    ) -> None:
        self.id = id
        self.actor = actor
        self.admitted_at = admitted_at
        self.deadline = deadline
        self.flight = flight
        self.done = False


class _Flight:
    __slots__ = (
        "actor",
        "attempts",
        "deadline",
        "done",
        "last_failure",
        "retries",
        "retry_at",
        "started_at",
        "state",
        "waiters",
    )

    def __init__(self, actor: ActorRef, started_at: float, deadline: float) -> None:
        self.actor = actor
        self.started_at = started_at
        self.deadline = deadline
        self.state = FlightState.ATTEMPTING
        self.waiters: dict[RequestId, _Request] = {}
        self.attempts = 0
        self.retries = 0
        self.retry_at: float | None = None
        self.last_failure: Failure | None = None
        self.done = False


_NO_FLIGHT: Final = NoFlight()
_SHED: Final = Shed()


class ParkingLot(Generic[R]):
    """The parking lot and singleflight of one router; see the theory of operation above.

    ``R`` is the type of a successful resume's result (e.g. the actor's worker assignment).
    The lot is not thread-safe; a shell drives it from one thread.
    """

    def __init__(self, config: ParkingConfig | None = None) -> None:
        self._config = config if config is not None else ParkingConfig()
        self._enabled = self._config.enabled
        self._capacity = self._config.max_parked
        self._budget = self._config.effective_budget
        self._backoff = self._config.backoff
        self._now = -math.inf
        self._seq = 0
        self._next_request = 1
        self._flights: dict[ActorRef, _Flight] = {}
        self._requests: dict[RequestId, _Request] = {}
        self._attempting: set[ActorRef] = set()
        # (time, seq, flight or request): flight budgets and request deadlines.
        self._deadlines: list[tuple[float, int, _Flight | _Request]] = []
        # (time, seq, flight): scheduled retries.
        self._retries: list[tuple[float, int, _Flight]] = []
        self._resolved: list[Resolution[R]] = []
        self._max_parked_seen = 0
        self._rejected = 0
        self._admitted = 0
        self._resolved_count = 0
        self._longest_wait = 0.0

    @property
    def config(self) -> ParkingConfig:
        return self._config

    # --- events ---------------------------------------------------------------------------

    def admit(
        self,
        actor: ActorRef,
        *,
        now: float,
        deadline: float | None = None,
        arrived: float | None = None,
    ) -> Admission:
        """Admit a request for ``actor``, or shed it if the lot is full.

        ``deadline`` is the request's own deadline (absolute, same clock as ``now``); when
        it passes first the request resolves with outcome timeout. A deadline already past
        admits the request and resolves it at once. The first request of a flight starts
        its budget clock; if the flight needs a ResumeActor call the answer says so.

        ``arrived`` (at most ``now``) is when the request reached the host, if it waited
        before it could be admitted (e.g. in the kernel's accept queue while the router was
        busy): a flight it starts counts its budget from then, and its recorded wait
        includes that time, so the budget bounds what the client waits, not only what the
        lot saw. A flight whose budget ran out before admission ends at the next call that
        fires deadlines (its attempt still starts: the actor wakes for a retry).
        """
        now = self._tick(now)
        if deadline is not None and math.isnan(deadline):
            raise InvalidArgument("request deadline must be a number, got nan")
        if arrived is not None and math.isnan(arrived):
            raise InvalidArgument("request arrival time must be a number, got nan")
        started = now if arrived is None else min(arrived, now)
        self._expire(now)
        requests = self._requests
        waiting = len(requests)
        if self._enabled and waiting >= self._capacity:
            self._rejected += 1
            return _SHED
        request = RequestId(self._next_request)
        self._next_request += 1
        self._admitted += 1
        flight = self._flights.get(actor)
        new_flight = flight is None
        start_attempt = False
        if flight is None:
            flight = _Flight(actor, started, started + self._budget)
            self._flights[actor] = flight
            self._push_deadline(flight.deadline, flight)
            if actor not in self._attempting:
                # Otherwise the flight adopts the orphan attempt still in progress.
                self._attempting.add(actor)
                start_attempt = True
        entry = _Request(request, actor, started, deadline, flight)
        requests[request] = entry
        flight.waiters[request] = entry
        if self._enabled and waiting >= self._max_parked_seen:
            self._max_parked_seen = waiting + 1
        if deadline is not None:
            if deadline <= now:
                self._resolve_one(entry, Outcome.TIMEOUT, now, TIMEOUT_FAILURE)
            else:
                self._push_deadline(deadline, entry)
                self._maybe_compact()
        return Admitted(request=request, new_flight=new_flight, start_attempt=start_attempt)

    def attempt_succeeded(self, actor: ActorRef, result: R, *, now: float) -> AttemptDecision:
        """The attempt for ``actor`` answered OK: its flight's waiters are served now.

        Raises :class:`IllegalTransition` if no attempt for ``actor`` is in progress.
        """
        self._check_attempting(actor)
        now = self._tick(now)
        self._expire(now)
        self._attempting.discard(actor)
        flight = self._flights.get(actor)
        if flight is None:
            return _NO_FLIGHT
        flight.attempts += 1
        resolved = self._end_flight(flight, Outcome.SERVED, now, result, None)
        return FlightEnded(outcome=Outcome.SERVED, resolved=resolved)

    def attempt_failed(
        self, actor: ActorRef, failure: Failure, *, now: float, rng: random.Random
    ) -> AttemptDecision:
        """The attempt for ``actor`` failed with ``failure``; decide what the flight does.

        A non-retryable failure ends the flight with outcome error. A retryable one
        schedules the next retry (:class:`RetryAt`) if it starts before the deadline, else
        leaves the flight to end budget_exhausted at its deadline (:class:`AwaitBudget`).
        Raises :class:`IllegalTransition` if no attempt for ``actor`` is in progress and
        :class:`InvalidArgument` for an OK code.
        """
        if failure.code is GrpcCode.OK:
            raise InvalidArgument("OK is not a failed attempt")
        self._check_attempting(actor)
        now = self._tick(now)
        self._expire(now)
        self._attempting.discard(actor)
        flight = self._flights.get(actor)
        if flight is None:
            return _NO_FLIGHT
        flight.attempts += 1
        if classify(failure.code, self._enabled) is Verdict.FAIL:
            resolved = self._end_flight(flight, Outcome.ERROR, now, None, failure)
            return FlightEnded(outcome=Outcome.ERROR, resolved=resolved)
        flight.last_failure = failure
        retry = flight.retries
        at = now + self._backoff.delay(retry, rng)
        if at < flight.deadline:
            flight.retries += 1
            flight.state = FlightState.BACKING_OFF
            flight.retry_at = at
            heapq.heappush(self._retries, (at, self._seq, flight))
            self._seq += 1
            return RetryAt(at=at, retry=retry)
        flight.state = FlightState.AWAITING_BUDGET
        return AwaitBudget(deadline=flight.deadline)

    def cancel(self, request: RequestId, *, now: float) -> bool:
        """The client of ``request`` went away: resolve it canceled; its flight goes on.

        Returns False if the request is unknown or already resolved (deadlines due at
        ``now`` are fired first, so a request whose deadline has passed is a timeout).
        """
        now = self._tick(now)
        self._expire(now)
        entry = self._requests.get(request)
        if entry is None:
            return False
        self._resolve_one(entry, Outcome.CANCELED, now, CANCELED_FAILURE)
        return True

    def poll(self, *, now: float) -> list[ActorRef]:
        """Fire everything due at ``now``; return the actors whose retry attempt starts now.

        The shell must start one ResumeActor call for each returned actor and report it.
        """
        now = self._tick(now)
        self._expire(now)
        due: list[ActorRef] = []
        retries = self._retries
        while retries and retries[0][0] <= now:
            at, _, flight = heapq.heappop(retries)
            if flight.done or flight.retry_at != at:
                continue
            flight.state = FlightState.ATTEMPTING
            flight.retry_at = None
            self._attempting.add(flight.actor)
            due.append(flight.actor)
        return due

    def fail_all(self, failure: Failure, *, now: float) -> int:
        """End every flight now, resolving all waiting requests with outcome error.

        For shutting down. Attempts in progress become orphans. Returns how many requests
        were resolved.
        """
        now = self._tick(now)
        self._expire(now)
        return sum(
            self._end_flight(flight, Outcome.ERROR, now, None, failure)
            for flight in list(self._flights.values())
        )

    # --- reading ------------------------------------------------------------------------

    def take_resolutions(self) -> list[Resolution[R]]:
        """The resolutions since the last call, in the order they happened."""
        resolved, self._resolved = self._resolved, []
        return resolved

    def next_deadline(self) -> float | None:
        """When ``poll`` next has something to do (a deadline or a retry), if ever."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][2].done:
            heapq.heappop(deadlines)
        retries = self._retries
        while retries and (retries[0][2].done or retries[0][2].retry_at != retries[0][0]):
            heapq.heappop(retries)
        if deadlines and retries:
            return min(deadlines[0][0], retries[0][0])
        if deadlines:
            return deadlines[0][0]
        if retries:
            return retries[0][0]
        return None

    def is_waiting(self, request: RequestId) -> bool:
        return request in self._requests

    def flight(self, actor: ActorRef) -> FlightView | None:
        """The actor's current flight, if it has one."""
        flight = self._flights.get(actor)
        if flight is None:
            return None
        return FlightView(
            actor=actor,
            state=flight.state,
            started_at=flight.started_at,
            deadline=flight.deadline,
            waiting=len(flight.waiters),
            attempts=flight.attempts,
            retry_at=flight.retry_at,
            last_failure=flight.last_failure,
        )

    def stats(self) -> LotStats:
        waiting = len(self._requests)
        return LotStats(
            enabled=self._enabled,
            capacity=self._capacity,
            parked=waiting if self._enabled else 0,
            waiting=waiting,
            max_parked_seen=self._max_parked_seen,
            rejected=self._rejected,
            admitted=self._admitted,
            resolved=self._resolved_count,
            flights=len(self._flights),
            attempts_in_progress=len(self._attempting),
            longest_wait=self._longest_wait,
        )

    # --- internals ----------------------------------------------------------------------

    def _tick(self, now: float) -> float:
        if now >= self._now:
            self._now = now
            return now
        if now < self._now:
            return self._now
        raise InvalidArgument("now must be a number, got nan")

    def _check_attempting(self, actor: ActorRef) -> None:
        if actor not in self._attempting:
            raise IllegalTransition(f"no resume attempt is in progress for actor {actor}")

    def _push_deadline(self, at: float, item: _Flight | _Request) -> None:
        heapq.heappush(self._deadlines, (at, self._seq, item))
        self._seq += 1

    def _expire(self, now: float) -> None:
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            at, _, item = heapq.heappop(deadlines)
            if item.done:
                continue
            if isinstance(item, _Flight):
                # An attempt still in progress stays in _attempting: it is now an orphan.
                failure = item.last_failure or BUDGET_RAN_OUT_FAILURE
                self._end_flight(item, Outcome.BUDGET_EXHAUSTED, at, None, failure)
            else:
                self._resolve_one(item, Outcome.TIMEOUT, at, TIMEOUT_FAILURE)

    def _end_flight(
        self,
        flight: _Flight,
        outcome: Outcome,
        at: float,
        result: R | None,
        failure: Failure | None,
    ) -> int:
        waiters = flight.waiters
        for entry in waiters.values():
            self._resolve(entry, outcome, at, result, failure)
        count = len(waiters)
        waiters.clear()
        flight.done = True
        flight.retry_at = None
        del self._flights[flight.actor]
        return count

    def _resolve_one(
        self, entry: _Request, outcome: Outcome, at: float, failure: Failure | None
    ) -> None:
        del entry.flight.waiters[entry.id]
        self._resolve(entry, outcome, at, None, failure)

    def _resolve(
        self,
        entry: _Request,
        outcome: Outcome,
        at: float,
        result: R | None,
        failure: Failure | None,
    ) -> None:
        entry.done = True
        del self._requests[entry.id]
        resolved_at = at if at > entry.admitted_at else entry.admitted_at
        waited = resolved_at - entry.admitted_at
        if waited > self._longest_wait:
            self._longest_wait = waited
        self._resolved_count += 1
        self._resolved.append(
            Resolution(
                request=entry.id,
                actor=entry.actor,
                outcome=outcome,
                admitted_at=entry.admitted_at,
                resolved_at=resolved_at,
                result=result,
                failure=failure,
            )
        )

    def _maybe_compact(self) -> None:
        # Deadlines of requests resolved early linger in the heap until their time comes;
        # rebuild it when they dominate, so memory tracks the live requests.
        deadlines = self._deadlines
        if len(deadlines) > 1024 and len(deadlines) > 4 * (
            len(self._requests) + len(self._flights)
        ):
            self._deadlines = [item for item in deadlines if not item[2].done]
            heapq.heapify(self._deadlines)


__all__ = [
    "ALWAYS_RETRIED",
    "BUDGET_RAN_OUT",
    "BUDGET_RAN_OUT_FAILURE",
    "CANCELED_FAILURE",
    "CLIENT_WENT_AWAY",
    "DEFAULT_BUDGET",
    "DEFAULT_MAX_PARKED",
    "DEFAULT_RETRY_FACTOR",
    "DEFAULT_RETRY_INTERVAL",
    "DEFAULT_RETRY_JITTER",
    "DISABLED_ABORT_BUDGET",
    "DRAIN_HEADROOM",
    "REQUEST_DEADLINE_PASSED",
    "RETRIED_WHEN_PARKING",
    "ROUTER_AT_CAPACITY",
    "SHED_FAILURE",
    "TIMEOUT_FAILURE",
    "Admission",
    "Admitted",
    "AttemptDecision",
    "AwaitBudget",
    "Failure",
    "FlightEnded",
    "FlightState",
    "FlightView",
    "LotStats",
    "NoFlight",
    "Outcome",
    "ParkingConfig",
    "ParkingLot",
    "RequestId",
    "Resolution",
    "RetryAt",
    "Shed",
    "Verdict",
    "classify",
]
