"""atelet registers its node's workers with ateapi and keeps them alive with heartbeats.

:class:`WorkerRegistrar` asks every :class:`~substrate.sandbox.worker_ports.WorkerApi` of the
node who it is (``info()``) and reports it through a :class:`Registry` (ateapi's
``WorkerRegistry`` service; :class:`substrate.client.registry.GrpcRegistry` over gRPC):

* a worker not registered yet, or whose epoch changed (its process restarted), is
  registered with everything ateapi schedules on: the node's atelet address, the worker's
  tunnel address and IPs, labels, sandbox class, restorable runtime versions, capacity;
* a registered worker gets a heartbeat every ``heartbeat_every`` seconds, carrying its
  capacity only when that changed (re-registering with another capacity would make ateapi
  forget the worker); a heartbeat answered ``FailedPrecondition`` ("register again") or
  ``NotFound`` registers the worker again at once;
* nothing crashes the loop: a worker that does not answer, ateapi being unreachable or
  refusing a call, is logged and retried for that worker alone, with exponential backoff
  (:class:`~substrate.net.backoff.Backoff`, capped), so one broken worker never delays
  the heartbeats of the others.

Time and sleeping are injectable (``clock``, ``sleep``) so tests drive the loop.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import NoReturn, Protocol

import anyio
import attrs
import structlog

from substrate.core.ids import Labels, NodeRef, WorkerRef
from substrate.core.model import Capacity, Worker
from substrate.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    SubstrateError,
)
from substrate.net.backoff import Backoff
from substrate.sandbox.worker_ports import WorkerApi, WorkerInfo

log = structlog.get_logger("substrate.registration")


class Registry(Protocol):
    """ateapi's worker registry, as an atelet sees it."""

    async def register(self, worker: Worker) -> Worker:
        """Register (or re-register) ``worker`` for its epoch; the worker as stored."""
        ...

    async def heartbeat(
        self, ref: WorkerRef, epoch: int, capacity: Capacity | None = None
    ) -> Worker:
        """Record a heartbeat (``FailedPrecondition``: register again); the worker as stored."""
        ...


WorkerSource = Mapping[WorkerRef, WorkerApi] | Callable[[], Mapping[WorkerRef, WorkerApi]]
"""The node's workers now: a mapping, or a function returning the current one."""


@attrs.frozen(slots=True, kw_only=True)
class RegistrarConfig:
    heartbeat_every: float = 10.0
    """Seconds between two heartbeats of a healthy worker."""
    retry: Backoff = Backoff(interval=0.5, factor=2.0, jitter=0.2)
    """Delay before retrying a worker whose last sync failed."""
    retry_cap: float = 30.0
    """Longest delay between retries."""
    call_timeout: float = 10.0
    """Seconds one ``info()``, registration or heartbeat may take."""


@attrs.define
class WorkerState:
    """What the registrar knows of one worker."""

    registered_epoch: int = 0
    """The epoch ateapi has for the worker (0 = not registered by us yet)."""
    reported_capacity: Capacity | None = None
    failures: int = 0
    next_at: float = 0.0
    last_error: str = ""
    registrations: int = 0
    heartbeats: int = 0


def _host_of(address: str) -> str:
    if address.startswith("["):
        return address[1:].partition("]")[0]
    host, sep, _port = address.rpartition(":")
    return host if sep else ""


class WorkerRegistrar:
    """Registers the workers of ``node`` with ateapi and heartbeats them (see module doc)."""

    def __init__(
        self,
        registry: Registry,
        workers: WorkerSource,
        *,
        node: NodeRef,
        atelet_address: str,
        ips: Sequence[str] = (),
        labels: Mapping[str, str] | None = None,
        config: RegistrarConfig = RegistrarConfig(),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.registry = registry
        self.node = node
        self.atelet_address = atelet_address
        self.ips = tuple(ips)
        self.labels = dict(labels or {})
        self.config = config
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.states: dict[WorkerRef, WorkerState] = {}
        self._workers = workers

    def _current(self) -> Mapping[WorkerRef, WorkerApi]:
        if isinstance(self._workers, Mapping):
            return self._workers
        return self._workers()

    def worker_record(self, info: WorkerInfo) -> Worker:
        """The registration of the worker ``info`` describes."""
        ips = self.ips
        if not ips and info.tunnel_address:
            host = _host_of(info.tunnel_address)
            ips = (host,) if host else ()
        labels = dict(self.labels)
        labels.update(info.labels)
        return Worker(
            ref=WorkerRef(info.name),
            pool=info.pool,
            node=info.node,
            ips=ips,
            sandbox_class=info.sandbox_class,
            runtime_versions=frozenset(info.runtime_versions),
            labels=Labels(labels),
            epoch=info.epoch,
            capacity=info.capacity,
            tunnel_address=info.tunnel_address,
            atelet_address=self.atelet_address,
        )

    # --- one pass -----------------------------------------------------------------------

    async def sync_once(self, *, force: bool = False) -> bool:
        """Sync every worker that is due (all with ``force``); True if all of them worked."""
        workers = self._current()
        for gone in set(self.states) - set(workers):
            del self.states[gone]
        now = self.clock()
        due = [
            (ref, api)
            for ref, api in workers.items()
            if force or self.states.setdefault(ref, WorkerState()).next_at <= now
        ]
        results: dict[WorkerRef, bool] = {}

        async def one(ref: WorkerRef, api: WorkerApi) -> None:
            results[ref] = await self._sync_worker(ref, api)

        async with anyio.create_task_group() as tg:
            for ref, api in due:
                tg.start_soon(one, ref, api)
        return all(results.values())

    async def _sync_worker(self, ref: WorkerRef, api: WorkerApi) -> bool:
        state = self.states.setdefault(ref, WorkerState())
        try:
            with anyio.fail_after(self.config.call_timeout):
                await self._sync(ref, api, state)
        except TimeoutError:
            self._failed(ref, state, f"no answer within {self.config.call_timeout} s")
            return False
        except SubstrateError as exc:
            self._failed(ref, state, f"{type(exc).__name__}: {exc.description}")
            return False
        state.failures = 0
        state.last_error = ""
        state.next_at = self.clock() + self.config.heartbeat_every
        return True

    def _failed(self, ref: WorkerRef, state: WorkerState, error: str) -> None:
        delay = min(self.config.retry.delay(state.failures, self.rng), self.config.retry_cap)
        state.failures += 1
        state.last_error = error
        state.next_at = self.clock() + delay
        log.warning(
            "worker.sync_failed",
            worker=ref.name,
            error=error,
            failures=state.failures,
            retry_in=round(delay, 3),
        )

    async def _sync(self, ref: WorkerRef, api: WorkerApi, state: WorkerState) -> None:
        info = await api.info()
        if info.name != ref.name:
            raise InvalidArgument(f"worker {ref} reports itself as {info.name!r}")
        if info.node != self.node:
            raise InvalidArgument(f"worker {ref} reports node {info.node}, not {self.node}")
        if state.registered_epoch != info.epoch:
            await self._register(info, state)
            return
        capacity = None if state.reported_capacity == info.capacity else info.capacity
        try:
            stored = await self.registry.heartbeat(ref, info.epoch, capacity)
        except (FailedPrecondition, NotFound) as exc:
            log.info("worker.register_again", worker=ref.name, reason=exc.description)
            await self._register(info, state)
            return
        state.heartbeats += 1
        state.reported_capacity = stored.capacity

    async def _register(self, info: WorkerInfo, state: WorkerState) -> None:
        state.registered_epoch = 0
        stored = await self.registry.register(self.worker_record(info))
        state.registered_epoch = info.epoch
        state.reported_capacity = stored.capacity
        state.registrations += 1
        log.info(
            "worker.registered",
            worker=info.name,
            epoch=info.epoch,
            state=stored.state.name,
            atelet_address=self.atelet_address,
        )

    # --- the loop -----------------------------------------------------------------------

    def next_due(self) -> float:
        """When the next worker is due (now if any worker is new)."""
        workers = self._current()
        times = [self.states[r].next_at if r in self.states else 0.0 for r in workers]
        return min(times, default=self.clock() + self.config.heartbeat_every)

    async def run(self) -> NoReturn:
        """Register and heartbeat forever (cancel the task to stop)."""
        while True:
            await self.sync_once()
            await self.sleep(max(0.0, self.next_due() - self.clock()))


__all__ = [
    "RegistrarConfig",
    "Registry",
    "WorkerRegistrar",
    "WorkerSource",
    "WorkerState",
]
