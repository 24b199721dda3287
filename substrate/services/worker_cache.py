"""ateapi's in-memory view of the fleet: a store watch plus relists, feeding a FleetIndex."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Self

import anyio
import structlog
from anyio.abc import TaskGroup

from substrate.core.ids import NodeRef, WorkerRef
from substrate.core.model import Worker, WorkerState
from substrate.core.ports import Store, WorkerEventKind
from substrate.errors import SubstrateError, Unavailable
from substrate.sched import FleetIndex

log = structlog.get_logger("substrate.worker_cache")

NOT_READY: str = "worker cache not ready"


class WorkerCache:
    """Keeps a :class:`FleetIndex` in step with the store's workers.

    It subscribes to ``store.watch_workers()`` first and then relists, so no change is
    missed; it also relists every ``relist_every`` seconds. When the watch breaks (the
    store went away) the cache is not ready and resubscribes with a backoff that starts at
    ``retry_initial`` and is capped at ``retry_cap`` (1 s by default). The original capped
    it at 30 s, which kept resumes failing for about half a minute after its database was
    back; with a 1 s cap the cache is ready again at most about a second after the store
    answers.
    """

    def __init__(
        self,
        store: Store,
        *,
        relist_every: float = 60.0,
        retry_initial: float = 0.05,
        retry_cap: float = 1.0,
        clock: Callable[[], float] = anyio.current_time,
    ) -> None:
        self._store = store
        self.index = FleetIndex()
        self._relist_every = relist_every
        self._retry_initial = retry_initial
        self._retry_cap = retry_cap
        self._clock = clock
        self._ready = anyio.Event()
        self._is_ready = False
        self._tg: TaskGroup | None = None
        self.synced_at: float | None = None
        self.resyncs = 0

    # --- lifetime ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._run)
        self._tg.start_soon(self._periodic_relist)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(exc_type, exc, tb)
        self._tg = None

    # --- queries ----------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._is_ready

    def require_ready(self) -> FleetIndex:
        """The index, or :class:`Unavailable` ("worker cache not ready") during a resync."""
        if not self._is_ready:
            raise Unavailable(NOT_READY)
        return self.index

    async def wait_ready(self) -> None:
        """Wait until the first sync (or the next resync) has completed."""
        await self._ready.wait()

    def get(self, ref: WorkerRef) -> Worker | None:
        return self.index.get(ref)

    def live_nodes(self) -> frozenset[NodeRef]:
        """Nodes with at least one worker that is not UNAVAILABLE."""
        return frozenset(w.node for w in self.index if w.state is not WorkerState.UNAVAILABLE)

    def note(self, worker: Worker) -> None:
        """Apply a record the caller just read or wrote (newer versions win)."""
        self._apply(worker)

    async def refresh(self, ref: WorkerRef) -> Worker | None:
        """Re-read one worker from the store into the index."""
        try:
            worker = await self._store.get_worker(ref)
        except SubstrateError:
            return None
        self._apply(worker)
        return worker

    # --- the loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        delay = self._retry_initial
        while True:
            try:
                await self._sync_and_watch()
                return  # the store was closed
            except SubstrateError as exc:
                if self._is_ready:
                    log.warning("worker cache lost its watch; resyncing", error=str(exc))
                self._set_ready(False)
                self.resyncs += 1
                await anyio.sleep(delay)
                delay = min(delay * 2, self._retry_cap)
            else:  # pragma: no cover - loop exits by return above
                delay = self._retry_initial

    async def _sync_and_watch(self) -> None:
        async with self._store.watch_workers() as events:
            await self._relist()
            self._set_ready(True)
            self.synced_at = self._clock()
            log.info("worker cache synced", workers=len(self.index))
            async for event in events:
                if event.kind is WorkerEventKind.DELETED:
                    current = self.index.get(event.worker.ref)
                    if current is None or current.metadata.uid == event.worker.metadata.uid:
                        self.index.remove(event.worker.ref)
                else:
                    self._apply(event.worker)

    async def _periodic_relist(self) -> None:
        """Relist now and then, in case a change was missed; a failure waits for the next."""
        while True:
            await anyio.sleep(self._relist_every)
            if not self._is_ready:
                continue
            try:
                await self._relist()
            except SubstrateError as exc:
                log.info("periodic relist failed", error=str(exc))

    async def _relist(self) -> None:
        workers = await self._store.list_workers()
        seen = set()
        for w in workers:
            seen.add(w.ref)
            self._apply(w)
        for w in list(self.index):
            if w.ref not in seen:
                self.index.remove(w.ref)

    def _apply(self, worker: Worker) -> None:
        """Take ``worker`` if it is newer; a record re-created under the name replaces the old."""
        current = self.index.get(worker.ref)
        if current is not None and current.metadata.uid != worker.metadata.uid:
            self.index.remove(worker.ref)
        self.index.upsert(worker)

    def _set_ready(self, ready: bool) -> None:
        self._is_ready = ready
        if ready:
            self._ready.set()
        elif self._ready.is_set():
            self._ready = anyio.Event()


__all__ = ["NOT_READY", "WorkerCache"]
