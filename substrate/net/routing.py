"""The router's decisions, without I/O: routing headers, the assignment cache, admission.

The router (:mod:`substrate.services.router`) is the HTTP ingress of the actors. For every
request it asks this module:

* which actor and port the request is for (:func:`parse_target_actor`,
  :func:`parse_connect_port`) and how long its client is willing to wait
  (:func:`parse_request_timeout`, the ``ate-request-timeout-ms`` header);
* where the actor runs: :class:`AssignmentCache` keeps, per actor, the :class:`Route`
  the last successful ResumeActor gave, *fresh* for ``ttl`` seconds (a hit routes with no
  ateapi call) and *last known* afterwards (static stability: the route a RUNNING actor
  had when the control plane went away); :class:`WorkerDirectory` maps a worker's name to
  its atunnel address;
* whether a request whose deadline cannot be met by the actor's resume should be answered
  at once (:func:`admit_deadline`, fed by :class:`ResumeCost`'s prediction);
* which headers travel to atunnel (:func:`upstream_headers`: ``Host`` untouched, the
  routing headers overwritten with the resolved values) and back to the client
  (:func:`downstream_headers`, with :func:`provenance_headers` after a resume), and whether
  an answer is atunnel's "stale assignment" 421 (:func:`is_stale_answer`);
* what to remember of a request for ``/statusz`` (:class:`RecentRequests`, with query
  strings redacted by :func:`redact_target`) and its outcome label (:class:`RouteOutcome`).

Time is always the ``now`` argument (the router's monotonic clock).
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

import attrs

from substrate.core.ids import ActorRef, TemplateRef, WorkerRef
from substrate.core.model import ResumeResult
from substrate.errors import InvalidArgument, Unavailable
from substrate.net.parking import FlightState, FlightView
from substrate.net.tunnel import (
    STALE_HEADER,
    TARGET_ACTOR_HEADER,
    TARGET_PORT_HEADER,
    forward_request_headers,
    forward_response_headers,
)

DEFAULT_PORT: Final = 80
"""The actor port of a plain request (one not inside a CONNECT tunnel)."""
DEFAULT_CACHE_TTL: Final = 5.0
"""Seconds an assignment stays fresh (a hit routes with no ateapi call)."""
DEFAULT_CACHE_ENTRIES: Final = 100_000
"""Actors whose route the cache remembers at most (least recently stored go first)."""

TIMEOUT_HEADER: Final = b"ate-request-timeout-ms"
"""The client's own deadline for the request, in milliseconds from its arrival."""
MAX_TIMEOUT_MS: Final = 24 * 3600 * 1000

RESTORED_FROM_HEADER: Final = b"X-Ate-Restored-From"
"""After a resume: ``local``, ``durable``, ``tag`` or ``cold-boot``."""
SNAPSHOT_GENERATION_HEADER: Final = b"X-Ate-Snapshot-Generation"
SNAPSHOT_AGE_HEADER: Final = b"X-Ate-Snapshot-Age-Seconds"
RESUME_DURATION_HEADER: Final = b"X-Ate-Resume-Duration-Seconds"
RETRY_AFTER_HEADER: Final = b"Retry-After"

_TARGET_NAME: Final = TARGET_ACTOR_HEADER.decode()


# --- the request head --------------------------------------------------------------------


def _values(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    return [value for key, value in headers if key.lower() == name]


def parse_target_actor(headers: Iterable[tuple[bytes, bytes]]) -> ActorRef:
    """The actor named by ``ate-target-actor``; :class:`InvalidArgument` if missing or bad.

    The header must appear exactly once, as ``<atespace>/<name>`` (two DNS-1123 labels);
    surrounding whitespace is ignored. The router answers a failure with 404.
    """
    values = _values(headers, TARGET_ACTOR_HEADER)
    if not values:
        raise InvalidArgument(f"missing {_TARGET_NAME} header (want <atespace>/<name>)")
    if len(values) > 1:
        raise InvalidArgument(f"the {_TARGET_NAME} header must appear exactly once")
    try:
        text = values[0].decode("ascii").strip()
    except UnicodeDecodeError:
        raise InvalidArgument(f"the {_TARGET_NAME} header must be ASCII") from None
    try:
        return ActorRef.parse(text)
    except InvalidArgument as exc:
        raise InvalidArgument(f"bad {_TARGET_NAME} header: {exc.description}") from None


def parse_connect_port(target: bytes) -> int:
    """The port of a ``CONNECT host:port`` request target (``[v6]:port`` too).

    :class:`InvalidArgument` unless it is an authority with a decimal port in 1..65535.
    """
    shown = target.decode("ascii", "replace")
    if target.startswith(b"["):
        host, sep, rest = target[1:].partition(b"]")
        ok = bool(sep and host) and rest.startswith(b":")
        port = rest[1:]
    else:
        host, sep, port = target.rpartition(b":")
        ok = bool(sep and host) and b":" not in host and b"/" not in host
    if not ok or not port.isdigit() or len(port) > 5 or not 1 <= int(port) <= 65535:
        raise InvalidArgument(f"CONNECT target {shown!r} must be host:port (port in 1..65535)")
    return int(port)


def parse_request_timeout(headers: Iterable[tuple[bytes, bytes]]) -> float | None:
    """Seconds the client allows for the request (``ate-request-timeout-ms``), if it says.

    The header, at most once, is a non-negative decimal number of milliseconds (at most a
    day); :class:`InvalidArgument` otherwise (the router answers 400).
    """
    values = _values(headers, TIMEOUT_HEADER)
    if not values:
        return None
    name = TIMEOUT_HEADER.decode()
    if len(values) > 1:
        raise InvalidArgument(f"the {name} header must appear at most once")
    raw = values[0].strip()
    if not raw.isdigit() or len(raw) > 12 or int(raw) > MAX_TIMEOUT_MS:
        shown = raw.decode("ascii", "replace")
        raise InvalidArgument(
            f"the {name} header {shown!r} must be a whole number of milliseconds "
            f"in 0..{MAX_TIMEOUT_MS}"
        )
    return int(raw) / 1000.0


def actor_host(actor: ActorRef) -> str:
    """The authority given to a request that came without ``Host`` (HTTP/1.0)."""
    return f"{actor.name}.{actor.atespace}.actors"


def upstream_headers(
    headers: Sequence[tuple[bytes, bytes]], actor: ActorRef, port: int
) -> list[tuple[bytes, bytes]]:
    """The request's headers as sent to atunnel.

    Drops hop-by-hop fields (keeping ``Upgrade`` + ``Connection: upgrade`` for a protocol
    switch and re-marking a chunked body), keeps ``Host`` exactly as sent (a request
    without one gets :func:`actor_host`), and overwrites the routing headers with the
    resolved actor and port: whatever the client sent as ``ate-target-actor`` or
    ``ate-target-port`` is replaced, never passed on.
    """
    out = forward_request_headers(headers, upstream_host=actor_host(actor))
    out.append((TARGET_ACTOR_HEADER, f"{actor.atespace}/{actor.name}".encode("ascii")))
    out.append((TARGET_PORT_HEADER, str(port).encode("ascii")))
    return out


def downstream_headers(
    headers: Sequence[tuple[bytes, bytes]],
    *,
    switching: bool = False,
    extra: Iterable[tuple[bytes, bytes]] = (),
    close: bool = False,
) -> list[tuple[bytes, bytes]]:
    """atunnel's response headers as sent to the client.

    Drops hop-by-hop fields (the framing is redone for the client's connection), keeps
    ``Upgrade`` + ``Connection: upgrade`` on a ``101`` (``switching``), appends ``extra``
    (e.g. :func:`provenance_headers`) and ``Connection: close`` when ``close``.
    """
    out = forward_response_headers(headers, switching=switching)
    out.extend(extra)
    if close and not switching:
        out.append((b"Connection", b"close"))
    return out


def is_stale_answer(status: int, headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether an answer is atunnel's "the actor is not here" (421 + stale marker).

    Any other 421 is the application's own and goes back to the client unchanged.
    """
    if status != 421:
        return False
    stale = STALE_HEADER.lower()
    return any(value.strip().lower() == b"true" for value in _values(headers, stale))


def _seconds(value: float) -> bytes:
    return f"{max(value, 0.0):.3f}".encode("ascii")


def provenance_headers(result: ResumeResult) -> tuple[tuple[bytes, bytes], ...]:
    """What a resume restored the actor from, for the response that waited on it.

    ``X-Ate-Restored-From`` (``local`` | ``durable`` | ``tag`` | ``cold-boot``),
    ``X-Ate-Snapshot-Generation`` and ``X-Ate-Snapshot-Age-Seconds`` (only when a snapshot
    was restored) and ``X-Ate-Resume-Duration-Seconds`` (ateapi's own measure). Empty when
    the actor was not resumed (it was RUNNING already).
    """
    if not result.resumed:
        return ()
    out = [(RESTORED_FROM_HEADER, result.provenance.encode("ascii"))]
    if not result.cold_boot:
        out.append((SNAPSHOT_GENERATION_HEADER, str(result.generation).encode("ascii")))
        out.append((SNAPSHOT_AGE_HEADER, _seconds(result.snapshot_age_seconds)))
    out.append((RESUME_DURATION_HEADER, _seconds(result.resume_duration_seconds)))
    return tuple(out)


def retry_after(seconds: float) -> int:
    """A ``Retry-After`` value: whole seconds, rounded up, at least 1."""
    if not math.isfinite(seconds):
        return 1
    return max(1, math.ceil(seconds))


def redact_target(target: str) -> str:
    """The request target with its query string (which may carry secrets) redacted."""
    path, sep, _query = target.partition("?")
    return f"{path}?<redacted>" if sep else path


# --- where actors run --------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class Route:
    """Where to send an actor's requests: its worker's atunnel."""

    actor: ActorRef
    worker: WorkerRef
    address: str
    """``host:port`` of the worker's atunnel."""
    worker_epoch: int = 0
    template: TemplateRef | None = None
    running: bool = True
    """The actor was RUNNING when ateapi answered (only such routes serve as last known)."""


@attrs.frozen(slots=True)
class _Entry:
    route: Route
    fresh_until: float


@attrs.frozen(slots=True, kw_only=True)
class CacheStats:
    entries: int
    hits: int
    misses: int
    evictions: int


class AssignmentCache:
    """Per actor, the route of its last successful resolution.

    An entry is *fresh* for ``ttl`` seconds after :meth:`put` and answers :meth:`fresh`;
    after that it is only *last known* (:meth:`last_known`), which the router uses when
    ateapi cannot answer. :meth:`evict` forgets an actor entirely (atunnel said the route
    is stale, or its worker is gone). At most ``max_entries`` actors are remembered; the
    least recently stored go first.
    """

    def __init__(self, ttl: float = DEFAULT_CACHE_TTL, max_entries: int = DEFAULT_CACHE_ENTRIES):
        if not ttl >= 0 or not math.isfinite(ttl):
            raise InvalidArgument(f"assignment cache ttl must be >= 0 seconds, got {ttl!r}")
        if max_entries < 1:
            raise InvalidArgument(f"assignment cache size must be >= 1, got {max_entries!r}")
        self._ttl = ttl
        self._max = max_entries
        self._entries: OrderedDict[ActorRef, _Entry] = OrderedDict()
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    @property
    def ttl(self) -> float:
        return self._ttl

    def __len__(self) -> int:
        return len(self._entries)

    def fresh(self, actor: ActorRef, now: float) -> Route | None:
        """The actor's route if it is still fresh at ``now`` (counted as a hit or a miss)."""
        entry = self._entries.get(actor)
        if entry is not None and now < entry.fresh_until:
            self._hits += 1
            return entry.route
        self._misses += 1
        return None

    def last_known(self, actor: ActorRef) -> Route | None:
        """The actor's last route, fresh or not."""
        entry = self._entries.get(actor)
        return None if entry is None else entry.route

    def put(self, route: Route, now: float) -> None:
        """Remember ``route`` for its actor, fresh until ``now + ttl``."""
        entries = self._entries
        entries[route.actor] = _Entry(route, now + self._ttl)
        entries.move_to_end(route.actor)
        while len(entries) > self._max:
            entries.popitem(last=False)

    def evict(self, actor: ActorRef, route: Route | None = None) -> bool:
        """Forget the actor's route; with ``route``, only if that is still the one stored.

        The condition keeps a request that failed on an old route from evicting a newer
        one another request stored meanwhile. Returns whether an entry was removed.
        """
        entry = self._entries.get(actor)
        if entry is None or (route is not None and entry.route != route):
            return False
        del self._entries[actor]
        self._evictions += 1
        return True

    def replace(self, old: Route, new: Route) -> bool:
        """Swap ``old`` for ``new`` (same actor) keeping its freshness, if ``old`` is stored."""
        entry = self._entries.get(old.actor)
        if entry is None or entry.route != old or new.actor != old.actor:
            return False
        self._entries[old.actor] = _Entry(new, entry.fresh_until)
        return True

    def stats(self) -> CacheStats:
        return CacheStats(
            entries=len(self._entries),
            hits=self._hits,
            misses=self._misses,
            evictions=self._evictions,
        )


class WorkerDirectory:
    """Worker name → ``host:port`` of its atunnel, as ateapi last reported it."""

    def __init__(self) -> None:
        self._addresses: dict[WorkerRef, str] = {}

    def __len__(self) -> int:
        return len(self._addresses)

    def get(self, worker: WorkerRef) -> str | None:
        return self._addresses.get(worker)

    def put(self, worker: WorkerRef, address: str) -> None:
        if address:
            self._addresses[worker] = address
        else:
            self._addresses.pop(worker, None)

    def forget(self, worker: WorkerRef) -> None:
        self._addresses.pop(worker, None)

    def replace_all(self, workers: Iterable[tuple[WorkerRef, str]]) -> None:
        """The full list from a ListWorkers: workers not in it are forgotten."""
        self._addresses = {worker: address for worker, address in workers if address}

    def items(self) -> Iterator[tuple[WorkerRef, str]]:
        return iter(self._addresses.items())


# --- deadline-aware admission -------------------------------------------------------------


class ResumeCost:
    """Predicts how long a ResumeActor call takes, from the last ``window`` calls.

    Two predictions: *warm* (the actor was RUNNING already: one read in ateapi) and *cold*
    (a real resume). Each is the median of its window; None until one call was seen.
    """

    def __init__(self, window: int = 64) -> None:
        if window < 1:
            raise InvalidArgument(f"resume cost window must be >= 1, got {window!r}")
        self._warm: deque[float] = deque(maxlen=window)
        self._cold: deque[float] = deque(maxlen=window)

    def record(self, seconds: float, *, resumed: bool) -> None:
        if math.isfinite(seconds) and seconds >= 0:
            (self._cold if resumed else self._warm).append(seconds)

    def expected(self, *, warm: bool) -> float | None:
        samples = self._warm if warm else self._cold
        if not samples:
            return None
        ordered = sorted(samples)
        return ordered[len(ordered) // 2]


class DeadlineRejected(Unavailable):
    """A request's deadline cannot be met: answered 503 with ``Retry-After`` at once."""

    def __init__(self, description: str, retry_after: int = 1) -> None:
        super().__init__(description)
        self.retry_after = retry_after


@attrs.frozen(slots=True, kw_only=True)
class Reject:
    """Answer the request at once: 503 with ``Retry-After: retry_after`` and ``reason``."""

    retry_after: int
    reason: str


def admit_deadline(
    *,
    now: float,
    deadline: float,
    flight: FlightView | None,
    expected: float | None,
) -> Reject | None:
    """Whether a request that must wait for a resume can still meet its ``deadline``.

    The earliest the actor can be routable is estimated from its flight (a parked resume
    already under way) or, without one, ``now + expected`` (the predicted resume cost):

    * no flight and no prediction, or an attempt in progress: admit (it may answer now);
    * a flight backing off: ready no earlier than its next retry;
    * a flight with no retry left in its budget: every request that joins it ends
      budget_exhausted at the flight's deadline, so the request is rejected whatever its
      own deadline, with ``Retry-After`` pointing past the flight;
    * no flight: ready no earlier than ``now + expected``.

    Returns None to admit, or a :class:`Reject` when the deadline falls before that
    earliest time (or has passed already).
    """
    if deadline <= now:
        return Reject(retry_after=1, reason="the request's deadline has passed")
    budget_ms = round((deadline - now) * 1000)
    if flight is None:
        if expected is None:
            return None
        ready = now + expected
        why = f"a resume is expected to take {expected * 1000:.0f} ms"
    elif flight.state is FlightState.ATTEMPTING:
        return None
    elif flight.state is FlightState.BACKING_OFF and flight.retry_at is not None:
        ready = flight.retry_at
        why = f"the next resume attempt starts in {(ready - now) * 1000:.0f} ms"
    else:
        return Reject(
            retry_after=retry_after(flight.deadline - now),
            reason="the actor's resume has no attempt left in its park budget",
        )
    if ready < deadline:
        return None
    return Reject(
        retry_after=retry_after(ready - now),
        reason=f"the request allows {budget_ms} ms but {why}",
    )


# --- what the router reports --------------------------------------------------------------


class RouteOutcome(enum.Enum):
    """The ``outcome`` label of ``route.duration``: how the router ended a request."""

    OK = "ok"
    """Forwarded to the actor, whatever the actor answered."""
    NOT_FOUND = "not_found"
    """No (valid) target actor, or ateapi does not know it."""
    BAD_REQUEST = "bad_request"
    UNAVAILABLE = "unavailable"
    """503: parked past the budget, shed, a worker unreachable, ateapi unreachable."""
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    """The client went away before the answer."""
    ERROR = "error"


def outcome_for_status(status: int) -> RouteOutcome:
    """The outcome of a request the router answered itself with ``status``."""
    match status:
        case 404:
            return RouteOutcome.NOT_FOUND
        case 400:
            return RouteOutcome.BAD_REQUEST
        case 503:
            return RouteOutcome.UNAVAILABLE
        case 504:
            return RouteOutcome.TIMEOUT
        case _:
            return RouteOutcome.ERROR


@attrs.frozen(slots=True, kw_only=True)
class RequestRecord:
    """One finished request, as ``/statusz`` lists it (the target already redacted)."""

    at: float
    """Wall-clock time it arrived (seconds since the epoch)."""
    method: str
    target: str
    actor: str
    port: int
    status: int
    outcome: RouteOutcome
    seconds: float
    """From arrival (the kernel's receipt of the request) to the end of the answer."""
    resolution: str = ""
    """``cache``, ``resume``, ``last-known`` or empty (not resolved)."""
    worker: str = ""
    provenance: str = ""
    queued_seconds: float = 0.0
    """Of ``seconds``: waiting in the kernel (accept queue, socket buffer) before the router
    read the request."""
    route_seconds: float | None = None
    """Of ``seconds``: from arrival until a route was in hand (a cache hit, or the end of a
    park); None if the request never got one. The rest is the exchange with the worker."""


class RecentRequests:
    """The last ``size`` finished requests, newest last."""

    def __init__(self, size: int = 100) -> None:
        if size < 1:
            raise InvalidArgument(f"recent requests size must be >= 1, got {size!r}")
        self._records: deque[RequestRecord] = deque(maxlen=size)

    def add(self, record: RequestRecord) -> None:
        self._records.append(record)

    def snapshot(self) -> tuple[RequestRecord, ...]:
        return tuple(self._records)

    def __len__(self) -> int:
        return len(self._records)


__all__ = [
    "DEFAULT_CACHE_ENTRIES",
    "DEFAULT_CACHE_TTL",
    "DEFAULT_PORT",
    "MAX_TIMEOUT_MS",
    "RESTORED_FROM_HEADER",
    "RESUME_DURATION_HEADER",
    "RETRY_AFTER_HEADER",
    "SNAPSHOT_AGE_HEADER",
    "SNAPSHOT_GENERATION_HEADER",
    "TIMEOUT_HEADER",
    "AssignmentCache",
    "CacheStats",
    "DeadlineRejected",
    "RecentRequests",
    "Reject",
    "RequestRecord",
    "ResumeCost",
    "Route",
    "RouteOutcome",
    "WorkerDirectory",
    "actor_host",
    "admit_deadline",
    "downstream_headers",
    "is_stale_answer",
    "outcome_for_status",
    "parse_connect_port",
    "parse_request_timeout",
    "parse_target_actor",
    "provenance_headers",
    "redact_target",
    "retry_after",
    "upstream_headers",
]
