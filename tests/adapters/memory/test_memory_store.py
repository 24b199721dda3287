"""Memory store behaviour outside the Store contract: determinism, the sync core, overflow."""

from __future__ import annotations

import itertools

import anyio
import pytest

from substrate.adapters.memory import ManualClock, MemoryStore, MemoryStoreState
from substrate.adapters.urls import open_store
from substrate.core.model import Actor, Atespace, Worker
from substrate.core.ports import Lease, WorkerEvent, WorkerEventKind
from substrate.errors import InvalidArgument, LeaseHeld, Unavailable
from substrate.testing.contracts.store import actor, worker


def test_the_sync_core_is_deterministic() -> None:
    def run() -> tuple[Actor, Worker, Lease, list[WorkerEvent]]:
        numbers = itertools.count(1)
        clock = ManualClock(start=100.0)
        state = MemoryStoreState(clock=clock, uid_factory=lambda: f"uid-{next(numbers)}")
        seen: list[WorkerEvent] = []
        state.subscribe(seen.append)
        state.create_atespace(Atespace(name="as1"))
        a = state.create_actor(actor())
        clock.advance(5)
        w = state.create_worker(worker())
        lease = state.acquire_lease("k", ttl=10)
        return a, w, lease, seen

    first, second = run(), run()
    assert first == second
    a, w, lease, seen = first
    assert a.metadata.uid == "uid-2"
    assert w.metadata.create_time == 105.0
    assert lease.expires_at == 115.0
    assert seen == [WorkerEvent(kind=WorkerEventKind.CREATED, worker=w)]


def test_unsubscribe_stops_events() -> None:
    state = MemoryStoreState(clock=ManualClock())
    seen: list[WorkerEvent] = []
    unsubscribe = state.subscribe(seen.append)
    state.create_worker(worker("w1"))
    unsubscribe()
    unsubscribe()
    state.create_worker(worker("w2"))
    assert [e.ref.name for e in seen] == ["w1"]


def test_lease_expiry_follows_the_injected_clock() -> None:
    clock = ManualClock()
    state = MemoryStoreState(clock=clock)
    state.acquire_lease("k", ttl=30)
    clock.advance(29.999)
    with pytest.raises(LeaseHeld):
        state.acquire_lease("k", ttl=30)
    clock.advance(0.001)
    state.acquire_lease("k", ttl=30)


def test_manual_clock_never_goes_back() -> None:
    with pytest.raises(InvalidArgument):
        ManualClock().advance(-1)


@pytest.mark.anyio
async def test_a_watcher_that_falls_behind_is_dropped() -> None:
    async with MemoryStore(watch_buffer=2) as store, store.watch_workers() as events:
        for i in range(3):
            await store.create_worker(worker(f"w{i}"))
        assert (await anext(events)).ref.name == "w0"
        assert (await anext(events)).ref.name == "w1"
        with pytest.raises(Unavailable, match="fell behind"):
            await anext(events)


@pytest.mark.anyio
async def test_open_store_by_url() -> None:
    async with open_store("memory://") as store:
        assert isinstance(store, MemoryStore)
        await store.create_atespace(Atespace(name="as1"))
    with pytest.raises(Unavailable):
        await store.list_atespaces()
    for url in ("redis://localhost", "file:///tmp/x", "nonsense"):
        with pytest.raises(InvalidArgument, match="unsupported store URL"):
            async with open_store(url):
                pass


@pytest.mark.anyio
async def test_watch_ends_when_its_scope_ends() -> None:
    async with MemoryStore() as store:
        async with store.watch_workers() as events:
            pass
        await store.create_worker(worker())
        with anyio.fail_after(1):
            assert [e async for e in events] == []
