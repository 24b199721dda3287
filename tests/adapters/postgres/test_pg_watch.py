"""The LISTEN/NOTIFY worker feed: across replicas, in commit order, and when it falls behind."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import asyncpg
import attrs
import pytest

from substrate.adapters.postgres import PostgresStore
from substrate.adapters.postgres import store as store_module
from substrate.adapters.postgres.queries import INLINE_EVENT_MAX
from substrate.core.ids import Labels
from substrate.core.model import Worker, WorkerState
from substrate.core.ports import WorkerEvent, WorkerEventKind
from substrate.errors import Unavailable
from substrate.testing.contracts.store import worker

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


async def test_a_replica_sees_another_replicas_changes(pg_url: str) -> None:
    async with (
        await PostgresStore.connect(pg_url) as writer,
        await PostgresStore.connect(pg_url) as reader,
        reader.watch_workers() as events,
    ):
        w = await writer.create_worker(worker("w1"))
        w2 = await writer.update_worker(
            w.ref,
            expected_version=1,
            expected_uid=w.metadata.uid,
            mutate=lambda x: attrs.evolve(x, state=WorkerState.DRAINING),
        )
        gone = await writer.delete_worker(w.ref)
        with anyio.fail_after(10):
            seen = [await anext(events) for _ in range(3)]
        assert seen == [
            WorkerEvent(kind=WorkerEventKind.CREATED, worker=w),
            WorkerEvent(kind=WorkerEventKind.UPDATED, worker=w2),
            WorkerEvent(kind=WorkerEventKind.DELETED, worker=gone),
        ]
        assert await reader.list_workers() == []


async def test_a_rolled_back_change_is_not_delivered(pg_url: str) -> None:
    async with await PostgresStore.connect(pg_url) as store, store.watch_workers() as events:
        w = await store.create_worker(worker("w1"))

        def refuse(_: Worker) -> Worker:
            raise RuntimeError("no")

        with pytest.raises(RuntimeError):
            await store.update_worker(
                w.ref,
                expected_version=1,
                expected_uid=w.metadata.uid,
                mutate=refuse,
            )
        sentinel = await store.create_worker(worker("w2"))
        with anyio.fail_after(10):
            seen = [await anext(events) for _ in range(2)]
        assert [e.worker for e in seen] == [w, sentinel]


def big_worker(name: str) -> Worker:
    """A worker whose document is too big to ride in a notification."""
    labels = Labels({f"label-{i:03d}": "v" * 60 for i in range(INLINE_EVENT_MAX // 60 + 10)})
    return attrs.evolve(worker(name), labels=labels)


async def test_a_big_document_is_read_back_by_seq(pg_url: str) -> None:
    async with await PostgresStore.connect(pg_url) as store, store.watch_workers() as events:
        big = await store.create_worker(big_worker("w-big"))
        small = await store.create_worker(worker("w-small"))
        with anyio.fail_after(10):
            seen = [await anext(events) for _ in range(2)]
        assert seen == [
            WorkerEvent(kind=WorkerEventKind.CREATED, worker=big),
            WorkerEvent(kind=WorkerEventKind.CREATED, worker=small),
        ]


async def test_a_watch_behind_the_retention_is_dropped(pg_url: str) -> None:
    async with await PostgresStore.connect(pg_url) as store, store.watch_workers() as events:
        await store.create_worker(big_worker("w1"))
        admin = await asyncpg.connect(pg_url)
        try:
            # Prune the event's row before the watcher reads it.
            await admin.execute("DELETE FROM worker_events")
        finally:
            await admin.close()
        with anyio.fail_after(10), pytest.raises(Unavailable, match="fell behind"):
            await anext(events)
        await store.create_worker(worker("w2"))
        with anyio.fail_after(10), pytest.raises(Unavailable, match="fell behind"):
            await anext(events)  # the watch stays dropped: no later event slips through


async def test_a_small_document_needs_no_read_back(pg_url: str) -> None:
    async with await PostgresStore.connect(pg_url) as store, store.watch_workers() as events:
        created = await store.create_worker(worker("w1"))
        admin = await asyncpg.connect(pg_url)
        try:
            await admin.execute("DELETE FROM worker_events")
        finally:
            await admin.close()
        with anyio.fail_after(10):
            assert await anext(events) == WorkerEvent(kind=WorkerEventKind.CREATED, worker=created)


async def test_leaving_the_watch_releases_its_connection(pg_url: str) -> None:
    count_listeners = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
    )
    async with await PostgresStore.connect(pg_url) as store:
        admin = await asyncpg.connect(pg_url)
        try:
            async with store.watch_workers():
                assert await admin.fetchval(count_listeners) == 1
            with anyio.fail_after(10):
                # The server notices the disconnect asynchronously.
                while True:
                    if not await admin.fetchval(count_listeners):
                        break
                    await anyio.sleep(0.01)
        finally:
            await admin.close()


async def test_a_watch_keeps_up_with_a_burst_while_the_loop_is_busy(pg_url: str) -> None:
    """Many writers, a busy event loop and a consumer that yields after every event: the
    listener drains every pending notification per wakeup and reads nothing back, so it
    is never dropped and every event arrives, per worker in version order."""
    async with (
        await PostgresStore.connect(pg_url, max_size=8) as store,
        store.watch_workers() as events,
    ):
        made = [await store.create_worker(worker(f"w{i}")) for i in range(8)]
        per_task = 40

        async def churn(w: Worker) -> None:
            current = w
            for _ in range(per_task):
                current = await store.update_worker(
                    current.ref,
                    expected_version=current.metadata.version,
                    expected_uid=current.metadata.uid,
                    mutate=lambda x: attrs.evolve(x, last_heartbeat=x.last_heartbeat + 1),
                )

        async def busy(stop: anyio.Event) -> None:
            while not stop.is_set():
                await anyio.lowlevel.checkpoint()

        seen: list[WorkerEvent] = []
        stop = anyio.Event()
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(16):
                    tg.start_soon(busy, stop)
                async with anyio.create_task_group() as writers:
                    for w in made:
                        writers.start_soon(churn, w)
                while len(seen) < len(made) * (per_task + 1):
                    seen.append(await anext(events))
                    await anyio.lowlevel.checkpoint()
                stop.set()
        for w in made:
            versions = [e.version for e in seen if e.ref == w.ref]
            assert versions == list(range(1, per_task + 2)), w.ref


async def test_a_watch_that_is_not_read_is_dropped_never_silently(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "WATCH_BUFFER", 4)
    async with await PostgresStore.connect(pg_url) as store, store.watch_workers() as events:
        made = [await store.create_worker(worker(f"w{i}")) for i in range(10)]
        got: list[WorkerEvent] = []

        async def read_all() -> None:
            while True:
                got.append(await anext(events))

        with anyio.fail_after(10), pytest.raises(Unavailable, match="fell behind"):
            await read_all()
        assert [e.worker for e in got] == made[: len(got)], "what did arrive is in order"
        assert len(got) < len(made)
