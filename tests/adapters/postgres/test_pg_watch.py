"""The LISTEN/NOTIFY worker feed: across replicas, in commit order, and when it falls behind."""

from __future__ import annotations

import anyio
import asyncpg
import attrs
import pytest

from substrate.adapters.postgres import PostgresStore
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


async def test_a_watch_behind_the_retention_is_dropped(pg_url: str) -> None:
    async with await PostgresStore.connect(pg_url) as store, store.watch_workers() as events:
        await store.create_worker(worker("w1"))
        admin = await asyncpg.connect(pg_url)
        try:
            # Prune the event's row before the watcher reads it.
            await admin.execute("DELETE FROM worker_events")
        finally:
            await admin.close()
        with anyio.fail_after(10), pytest.raises(Unavailable, match="fell behind"):
            await anext(events)


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
