"""Losing the database: every failure surfaces as Unavailable, and the store recovers."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg
import pytest

from substrate.adapters.postgres import PostgresStore
from substrate.adapters.urls import open_store
from substrate.cli.stack import free_port
from substrate.core.ids import WorkerRef
from substrate.core.model import Atespace
from substrate.errors import Unavailable
from substrate.testing.contracts.store import worker
from tests.adapters.postgres.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


def via(url: str, port: int) -> str:
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))


async def test_unreachable_server_is_unavailable(pg_url: str) -> None:
    url = via(pg_url, free_port())
    with pytest.raises(Unavailable, match="unreachable"):
        await PostgresStore.connect(url, connect_timeout=2)
    with pytest.raises(Unavailable):
        async with open_store(url):
            pass


async def test_cut_connection_is_unavailable_then_recovers(pg_url: str) -> None:
    target = urlsplit(pg_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        store = await PostgresStore.connect(
            via(pg_url, port), min_size=2, max_size=2, connect_timeout=2, command_timeout=5
        )
        async with store:
            await store.create_atespace(Atespace(name="as1"))
            proxy.cut()
            for _ in range(3):
                with pytest.raises(Unavailable):
                    await store.get_atespace("as1")
            with pytest.raises(Unavailable):
                await store.create_atespace(Atespace(name="as2"))
            proxy.restore()
            with anyio.fail_after(10):
                assert (await store.get_atespace("as1")).name == "as1"
                await store.create_atespace(Atespace(name="as2"))
        tg.cancel_scope.cancel()


async def test_terminated_backends_are_replaced(pg_url: str) -> None:
    async with await PostgresStore.connect(pg_url, min_size=2, max_size=2) as store:
        await store.create_atespace(Atespace(name="as1"))
        admin = await asyncpg.connect(pg_url)
        try:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await admin.close()
        # A call may land on a connection that died a moment ago (Unavailable); the pool
        # then replaces it, and the store works again without being reopened.
        recovered = False
        for _ in range(5):
            try:
                recovered = (await store.get_atespace("as1")).name == "as1"
                break
            except Unavailable:
                await anyio.sleep(0.05)
        assert recovered


async def test_watch_reports_a_lost_connection(pg_url: str) -> None:
    async with await PostgresStore.connect(pg_url) as store, store.watch_workers() as events:
        admin = await asyncpg.connect(pg_url)
        try:
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND query LIKE 'LISTEN%'"
            )
        finally:
            await admin.close()
        assert killed == 1
        with anyio.fail_after(10), pytest.raises(Unavailable, match="lost"):
            await anext(events)
        # The store itself is fine; a new watch works.
        async with store.watch_workers() as again:
            created = await store.create_worker(worker("w1"))
            with anyio.fail_after(10):
                event = await anext(again)
        assert event.worker == created
        assert (await store.get_worker(WorkerRef("w1"))) == created
