"""The router: the HTTP ingress that resolves actors and forwards through workers' atunnels.

Theory of operation
===================

*Naming.* A request names its actor only with ``ate-target-actor: <atespace>/<name>``
(missing or malformed: 404); ``Host`` passes through untouched. A plain request goes to
the actor's port 80. ``CONNECT host:port`` answers ``200`` and turns the connection into a
tunnel of plain HTTP/1.1 requests, each routed (and its actor resumed) independently, to
``port``. The HTTP mechanics live in :mod:`substrate.services.router_http`.

*Resolution.* :meth:`Router.cached` answers from the assignment cache (fresh for
``cache_ttl``; no ateapi call). On a miss :meth:`Router.resolve` goes through the parking
resumer (:class:`~substrate.services.parking.ParkingResumer`: one flight per actor, the
lot's budget, retries and outcomes exactly as seed 001 says). One *attempt* of a flight is
one ResumeActor call, run in the router's own task group so that no departing client
cancels it; a successful answer must name a RUNNING actor with a worker assignment, whose
atunnel address comes from the worker directory (``GetWorker`` on a miss, ``ListWorkers``
every ``health_interval``). The route is cached, and every request that waited on the
flight gets it, with the restore provenance when the call really resumed the actor.

*Static stability.* When the cache holds a last-known route of a RUNNING actor, an
attempt does not depend on ateapi: if ResumeActor fails with Unavailable or
DeadlineExceeded, or has not answered within ``stale_route_after``, the attempt succeeds
with the last-known route (the call, if still running, finishes in the background and
refreshes the cache). atunnel's ``421`` + ``X-Ate-Assignment-Stale`` makes this safe: if
the actor is no longer there, the route is evicted, resolved again and the request
retried once.

*Deadlines.* A request may carry ``ate-request-timeout-ms``. On a cache miss,
:func:`~substrate.net.routing.admit_deadline` compares it with the earliest moment the
actor can be routable (its flight's next retry, or the predicted resume cost); a request
that cannot make it is answered at once with 503 and ``Retry-After``, and, if no resume
is under way, one is started so a retry finds the actor awake. An admitted request parks
with its deadline (outcome timeout → 504).

*Shutdown.* :meth:`Router.shutdown` stops accepting, closes idle client connections, and
waits (at most the drain timeout, which is validated to be at least the park budget) for
every request in progress, parked or forwarding, to finish; responses written meanwhile
carry ``Connection: close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Final, Protocol, Self

import anyio
import anyio.abc
import attrs
import structlog
from anyio.abc import SocketStream

from substrate.core.ids import ActorRef, WorkerRef
from substrate.core.model import ActorState, ResumeResult, Worker
from substrate.errors import (
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    SubstrateError,
    Unavailable,
    grpc_code,
)
from substrate.identity.spiffe import DEFAULT_TRUST_DOMAIN
from substrate.net.parking import ParkingConfig
from substrate.net.routing import (
    DEFAULT_CACHE_TTL,
    AssignmentCache,
    DeadlineRejected,
    RecentRequests,
    Reject,
    RequestRecord,
    ResumeCost,
    Route,
    RouteOutcome,
    WorkerDirectory,
    admit_deadline,
)
from substrate.services.listeners import Listeners
from substrate.services.parking import Parked, ParkingMetrics, ParkingResumer, ParkingStatus
from substrate.services.router_http import serve_connection
from substrate.services.router_upstream import TunnelPool, TunnelUnreachable, Upstream

log = structlog.get_logger("substrate.router")

DEFAULT_LISTEN_PORT: Final = 8080
RECENT_REQUESTS: Final = 100


class ControlPlane(Protocol):
    """What the router needs from ateapi (:class:`substrate.client.AteClient` fits)."""

    async def resume_actor(self, ref: ActorRef) -> ResumeResult:
        """Resume (or look up) the actor. Raises the substrate error of a failed call."""

    async def get_worker(self, name: WorkerRef) -> Worker:
        """One worker; :class:`~substrate.errors.NotFound` if it is not registered."""

    async def list_workers(self) -> list[Worker]:
        """Every registered worker."""


class ClientConnection(Protocol):
    """A client connection as the router tracks it (for draining)."""

    def close_if_idle(self) -> None:
        """Close the connection now if it is waiting for its next request."""


class RouterMetrics(ParkingMetrics, Protocol):
    """The router's metrics (see :mod:`substrate.adapters.observability.router_metrics`)."""

    def route_finished(self, outcome: RouteOutcome, seconds: float) -> None:
        """``route.duration``: once per request, with how the router ended it."""

    def request_queued(self, seconds: float) -> None:
        """Once per request: how long it waited in the kernel before the router read it."""

    def resume_call(self, code: str, seconds: float) -> None:
        """One ResumeActor call answered (``OK`` or the error's gRPC code name)."""

    def stale_assignment(self) -> None:
        """atunnel said the cached assignment is stale."""

    def last_known_route(self) -> None:
        """A resolution used a last-known route because ateapi could not answer."""

    def deadline_rejected(self) -> None:
        """A request was answered at once because its deadline could not be met."""


def _positive(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise InvalidArgument(f"router {attribute.name} must be greater than 0, got {value!r}")


@attrs.frozen(slots=True, kw_only=True)
class RouterConfig:
    """The router's knobs (the daemon's flags); construction validates them."""

    parking: ParkingConfig = ParkingConfig()
    drain_timeout: float | None = None
    """Seconds a shutdown waits for requests in progress; None derives it from the budget."""
    cache_ttl: float = DEFAULT_CACHE_TTL
    stale_route_after: float = attrs.field(default=1.0, validator=_positive)
    """How long a resolution with a last-known RUNNING route waits for ateapi before using it."""
    connect_timeout: float = attrs.field(default=5.0, validator=_positive)
    idle_timeout: float = attrs.field(default=75.0, validator=_positive)
    """Seconds an idle keep-alive client connection is kept open."""
    upstream_idle_timeout: float = attrs.field(default=30.0, validator=_positive)
    health_interval: float = attrs.field(default=1.0, validator=_positive)
    health_timeout: float = attrs.field(default=2.0, validator=_positive)
    replay_limit: int = 64 * 1024
    """Request-body bytes kept to replay a request after a stale 421 (beyond: no retry)."""
    linger: float = attrs.field(default=1.0, validator=_positive)
    """Seconds spent finishing a request body or a close after the answer was sent."""
    trust_domain: str = DEFAULT_TRUST_DOMAIN

    def __attrs_post_init__(self) -> None:
        if not self.cache_ttl >= 0:
            raise InvalidArgument(f"router cache_ttl must be >= 0, got {self.cache_ttl!r}")
        if self.replay_limit < 0:
            raise InvalidArgument(f"router replay_limit must be >= 0, got {self.replay_limit}")
        self.parking.drain_timeout(self.drain_timeout)  # validates

    @property
    def effective_drain_timeout(self) -> float:
        return self.parking.drain_timeout(self.drain_timeout)


@attrs.frozen(slots=True, kw_only=True)
class Resolution:
    """Where one request goes, and how the router learned it."""

    route: Route
    via: str
    """``cache``, ``resume`` (a ResumeActor answer) or ``last-known`` (static stability)."""
    result: ResumeResult | None = None
    """The ResumeActor answer when it really resumed the actor (for provenance headers)."""


@attrs.define(slots=True)
class AteapiHealth:
    """What the router last saw of ateapi (``/statusz``)."""

    address: str = ""
    healthy: bool | None = None
    checked_at: float = 0.0
    """Wall-clock time of the last check."""
    latency: float = 0.0
    error: str = ""
    workers: int = 0


class _Call:
    """One ResumeActor call, possibly outliving the attempt that started it."""

    __slots__ = ("done", "error", "resolution")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.resolution: Resolution | None = None
        self.error: Exception | None = None


class Router:
    """The router service; an async context manager owning its tasks (see the module doc).

    ``control`` is ateapi (``ResumeActor``, ``GetWorker``, ``ListWorkers``), ``pool`` the
    mTLS connections to atunnels. Call :meth:`listen` to accept HTTP, :meth:`shutdown` to
    drain; leaving the block stops everything that is left.
    """

    def __init__(
        self,
        control: ControlPlane,
        pool: TunnelPool,
        config: RouterConfig | None = None,
        *,
        metrics: RouterMetrics | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = anyio.current_time,
        info: Mapping[str, object] | None = None,
        ateapi_address: str = "",
    ) -> None:
        self.config = config if config is not None else RouterConfig()
        self._control = control
        self.pool = pool
        self.metrics = metrics
        self.clock = clock
        """The router's clock (anyio's by default; on asyncio, the loop's own ``time``, which
        is what anyio's returns there, without looking up the backend on every call)."""
        self._default_clock = clock is anyio.current_time
        self.info: Mapping[str, object] = dict(info or {})
        self.cache = AssignmentCache(self.config.cache_ttl)
        self.workers = WorkerDirectory()
        self.cost = ResumeCost()
        self.recent = RecentRequests(RECENT_REQUESTS)
        self.health = AteapiHealth(address=ateapi_address)
        self.started_at = time.time()
        self.draining = False
        self._resumer = ParkingResumer[Resolution](
            self._attempt,
            self.config.parking,
            clock=clock,
            rng=rng,
            metrics=metrics,
            drain_timeout=self.config.drain_timeout,
        )
        self._calls: dict[ActorRef, _Call] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._listeners: list[Listeners] = []
        self._clients: set[ClientConnection] = set()
        self._active = 0
        self._quiet: anyio.Event | None = None
        self.counters: dict[str, int] = {
            "requests": 0,
            "stale_assignments": 0,
            "last_known_routes": 0,
            "deadline_rejections": 0,
            "tunnel_refreshes": 0,
        }

    # --- lifetime ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._tg is not None:
            raise RuntimeError("a Router can be entered only once")
        if self._default_clock:
            with contextlib.suppress(RuntimeError):  # RuntimeError: not on asyncio
                self.clock = asyncio.get_running_loop().time  # the same clock, read directly
        await self._resumer.__aenter__()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._health_loop)
        tg.start_soon(self._reap_loop)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg, self._tg = self._tg, None
        assert tg is not None, "Router exited without being entered"
        self.draining = True
        await self._close_listeners()
        tg.cancel_scope.cancel()
        try:
            await tg.__aexit__(exc_type, exc, tb)
        finally:
            try:
                # Entered before our task group, so exited after it (and not inside any
                # other cancel scope: scopes must nest).
                await self._resumer.__aexit__(exc_type, exc, tb)
            finally:
                with anyio.CancelScope(shield=True):
                    await self.pool.aclose()
        return None

    @property
    def task_group(self) -> anyio.abc.TaskGroup:
        assert self._tg is not None, "the router is not running"
        return self._tg

    async def listen(self, host: str = "127.0.0.1", port: int = DEFAULT_LISTEN_PORT) -> int:
        """Accept HTTP on ``host:port`` (0: any free port); returns the bound port."""
        listeners = await Listeners.bind(host, port, name="router")
        self._listeners.append(listeners)
        listeners.serve(self.task_group, self._serve_client)
        log.info("router.listening", host=host, port=listeners.port)
        return listeners.port

    async def _serve_client(self, stream: SocketStream, sock: socket.socket) -> None:
        await serve_connection(self, stream, sock)

    async def shutdown(self, within: float | None = None) -> bool:
        """Stop accepting and drain: wait (at most ``within`` seconds, default the drain
        timeout) for the requests in progress. Whether they all finished in time."""
        self.draining = True
        await self._close_listeners()
        for client in list(self._clients):
            client.close_if_idle()
        limit = self.config.effective_drain_timeout if within is None else within
        if self._active:
            self._quiet = anyio.Event()
            with anyio.move_on_after(limit):
                await self._quiet.wait()
        drained = self._active == 0
        log.info("router.drained" if drained else "router.drain_timeout", left=self._active)
        return drained

    async def _close_listeners(self) -> None:
        listeners, self._listeners = self._listeners, []
        for each in listeners:
            await each.aclose()

    # --- bookkeeping for the HTTP side ----------------------------------------------------

    def client_opened(self, client: ClientConnection) -> None:
        self._clients.add(client)

    def client_closed(self, client: ClientConnection) -> None:
        self._clients.discard(client)

    def request_started(self) -> None:
        self._active += 1
        self.counters["requests"] += 1

    def request_finished(self, record: RequestRecord) -> None:
        self._active -= 1
        self.recent.add(record)
        if self.metrics is not None:
            self.metrics.route_finished(record.outcome, record.seconds)
            self.metrics.request_queued(record.queued_seconds)
        log.info(
            "router.request",
            method=record.method,
            target=record.target,
            actor=record.actor,
            port=record.port,
            status=record.status,
            outcome=record.outcome.value,
            ms=round(record.seconds * 1000, 3),
            queued_ms=round(record.queued_seconds * 1000, 3),
            route_ms=(
                None if record.route_seconds is None else round(record.route_seconds * 1000, 3)
            ),
            via=record.resolution,
            worker=record.worker,
            provenance=record.provenance,
        )
        if self._active == 0 and self._quiet is not None:
            self._quiet.set()

    @property
    def active_requests(self) -> int:
        return self._active

    # --- resolution -----------------------------------------------------------------------

    def cached(self, actor: ActorRef) -> Resolution | None:
        """The actor's fresh route from the cache, without any call."""
        route = self.cache.fresh(actor, self.clock())
        return None if route is None else Resolution(route=route, via="cache")

    async def resolve(self, actor: ActorRef, *, deadline: float | None = None) -> Resolution:
        """Where ``actor``'s request goes: the cache, else a (parked) resume.

        ``deadline`` is the request's own, on :attr:`clock`. Raises a substrate error for
        :func:`~substrate.errors.http_response` (e.g. :class:`DeadlineRejected`).
        """
        begun = self.begin_resolve(actor, deadline=deadline)
        return begun if isinstance(begun, Resolution) else await begun.wait()

    def begin_resolve(
        self, actor: ActorRef, *, deadline: float | None = None, arrived: float | None = None
    ) -> Resolution | Parked[Resolution]:
        """:meth:`resolve` up to the wait: the cached route, or the parked request to wait
        for. Raises at once what needs no wait (shed, deadline rejected, shutting down).

        ``arrived`` is when the request reached this host (on :attr:`clock`): the park
        budget counts from then, so time spent waiting to be read is not added to it.
        """
        cached = self.cached(actor)
        if cached is not None:
            return cached
        if deadline is not None:
            reject = self._admit(actor, deadline)
            if reject is not None:
                raise DeadlineRejected(reject.reason, reject.retry_after)
        return self._resumer.park(actor, deadline=deadline, arrived=arrived)

    def _admit(self, actor: ActorRef, deadline: float) -> Reject | None:
        last = self.cache.last_known(actor)
        flight = self._resumer.flight(actor)
        reject = admit_deadline(
            now=self.clock(),
            deadline=deadline,
            flight=flight,
            expected=self.cost.expected(warm=last is not None and last.running),
        )
        if reject is None:
            return None
        self.counters["deadline_rejections"] += 1
        if self.metrics is not None:
            self.metrics.deadline_rejected()
        if flight is None and not self.draining:
            # Nobody is resuming the actor: start, so that the client's retry finds it up.
            self.task_group.start_soon(self._warm_up, actor)
        return reject

    async def _warm_up(self, actor: ActorRef) -> None:
        with contextlib.suppress(SubstrateError):
            await self._resumer.resolve(actor)

    def stale(self, route: Route) -> None:
        """atunnel answered 421 + stale for ``route``: forget it (if still cached)."""
        self.counters["stale_assignments"] += 1
        if self.metrics is not None:
            self.metrics.stale_assignment()
        self.cache.evict(route.actor, route)
        log.info("router.stale_assignment", actor=str(route.actor), worker=str(route.worker))

    async def _attempt(self, actor: ActorRef) -> Resolution:
        """One attempt of the actor's flight (run by the parking resumer)."""
        last = self.cache.last_known(actor)
        fallback = last if last is not None and last.running else None
        call = self._calls.get(actor)
        if call is None:
            call = self._calls[actor] = _Call()
            self.task_group.start_soon(self._run_call, actor, call)
        if fallback is None:
            await call.done.wait()
        else:
            with anyio.move_on_after(self.config.stale_route_after):
                await call.done.wait()
            if not call.done.is_set():
                return self._last_known(fallback, "ateapi has not answered")
        error = call.error
        if error is None and call.resolution is None:
            raise Unavailable("the router is shutting down")  # the call was cancelled
        if isinstance(error, NotFound):
            self.cache.evict(actor)  # deleted: its last-known route must not serve again
        if error is not None:
            if (
                fallback is not None
                and isinstance(error, Unavailable | DeadlineExceeded)
                and self.cache.last_known(actor) == fallback
            ):
                return self._last_known(fallback, error.description)
            raise error
        assert call.resolution is not None
        return call.resolution

    def _last_known(self, route: Route, why: str) -> Resolution:
        self.counters["last_known_routes"] += 1
        if self.metrics is not None:
            self.metrics.last_known_route()
        log.info("router.last_known_route", actor=str(route.actor), reason=why)
        return Resolution(route=route, via="last-known")

    async def _run_call(self, actor: ActorRef, call: _Call) -> None:
        started = self.clock()
        code = "OK"
        try:
            result = await self._control.resume_actor(actor)
            self.cost.record(self.clock() - started, resumed=result.resumed)
            route = await self._route_for(actor, result)
            self.cache.put(route, self.clock())
            call.resolution = Resolution(
                route=route, via="resume", result=result if result.resumed else None
            )
        except Exception as exc:
            code = grpc_code(exc).name
            call.error = exc
        finally:
            if self.metrics is not None:
                self.metrics.resume_call(code, self.clock() - started)
            if self._calls.get(actor) is call:
                del self._calls[actor]
            call.done.set()

    async def _route_for(self, actor: ActorRef, result: ResumeResult) -> Route:
        status = result.actor.status
        assignment = status.assignment
        if status.state is not ActorState.RUNNING or assignment is None:
            raise Unavailable(
                f"actor {actor} is {status.state.name} with no worker to route to yet"
            )
        address = self.workers.get(assignment.worker)
        if address is None:
            address = await self._lookup_worker(assignment.worker)
        return Route(
            actor=actor,
            worker=assignment.worker,
            address=address,
            worker_epoch=assignment.worker_epoch,
            template=result.actor.template,
            running=True,
        )

    async def _lookup_worker(self, worker: WorkerRef) -> str:
        try:
            record = await self._control.get_worker(worker)
        except NotFound:
            raise Unavailable(f"worker {worker} is not registered") from None
        if not record.tunnel_address:
            raise Unavailable(f"worker {worker} has no atunnel address yet")
        self.workers.put(worker, record.tunnel_address)
        return record.tunnel_address

    # --- upstream connections -----------------------------------------------------------

    async def connect(self, route: Route, *, fresh: bool = False) -> tuple[Upstream, Route]:
        """A connection to ``route``'s atunnel; the route it really used.

        A connection failure refreshes the worker's address from ateapi and tries once more
        if it changed; otherwise the route is evicted and :class:`TunnelUnreachable` raised.
        ``fresh`` skips idle connections.
        """
        try:
            return await self._acquire(route, fresh=fresh), route
        except TunnelUnreachable as failure:
            self.workers.forget(route.worker)
            address: str | None = None
            with (
                contextlib.suppress(SubstrateError),
                anyio.move_on_after(self.config.connect_timeout),
            ):
                address = await self._lookup_worker(route.worker)
            if address is None or address == route.address:
                self.cache.evict(route.actor, route)
                log.info(
                    "router.worker_unreachable",
                    actor=str(route.actor),
                    worker=str(route.worker),
                    error=failure.description,
                )
                raise
            self.counters["tunnel_refreshes"] += 1
            moved = attrs.evolve(route, address=address)
            self.cache.replace(route, moved)
            try:
                return await self._acquire(moved, fresh=True), moved
            except TunnelUnreachable:
                self.cache.evict(route.actor, moved)
                raise

    async def _acquire(self, route: Route, *, fresh: bool) -> Upstream:
        return await self.pool.acquire(route.worker, route.address, now=self.clock(), fresh=fresh)

    def release(self, upstream: Upstream) -> None:
        """Return ``upstream`` to the pool if its exchange ended cleanly, else close it."""
        if not self.pool.release(upstream, now=self.clock()):
            self.task_group.start_soon(upstream.aclose)

    # --- background -----------------------------------------------------------------------

    async def _health_loop(self) -> None:
        while True:
            await self.check_ateapi()
            await anyio.sleep(self.config.health_interval)

    async def check_ateapi(self) -> None:
        """ListWorkers once: ateapi's health for ``/statusz`` and fresh worker addresses."""
        started = self.clock()
        health = self.health
        try:
            with anyio.fail_after(self.config.health_timeout):
                workers = await self._control.list_workers()
        except (SubstrateError, TimeoutError) as exc:
            health.healthy = False
            health.error = (
                exc.description if isinstance(exc, SubstrateError) else "health check timed out"
            )
        else:
            self.workers.replace_all((w.ref, w.tunnel_address) for w in workers)
            health.healthy = True
            health.error = ""
            health.workers = len(workers)
        health.latency = self.clock() - started
        health.checked_at = time.time()

    async def _reap_loop(self) -> None:
        interval = max(1.0, self.config.upstream_idle_timeout / 2)
        while True:
            await anyio.sleep(interval)
            await self.pool.close_idle(now=self.clock())

    # --- status ---------------------------------------------------------------------------

    def parking_status(self) -> ParkingStatus:
        return self._resumer.stats()

    def client_count(self) -> int:
        return len(self._clients)


__all__ = [
    "DEFAULT_LISTEN_PORT",
    "AteapiHealth",
    "ClientConnection",
    "ControlPlane",
    "Resolution",
    "Router",
    "RouterConfig",
    "RouterMetrics",
]
