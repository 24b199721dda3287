"""Schema migrations: ordered, idempotent, atomic, and serialized by the advisory lock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from substrate.adapters.postgres import PostgresStore, load_migrations, migrate
from substrate.adapters.postgres.migrate import MIGRATION_LOCK_KEY, Migration
from substrate.adapters.urls import open_store
from substrate.core.model import Atespace
from substrate.errors import FailedPrecondition, Internal, InvalidArgument

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

TABLES = {
    "actor_bindings",
    "actor_templates",
    "actors",
    "atespaces",
    "leases",
    "schema_migrations",
    "tags",
    "worker_events",
    "workers",
}


@asynccontextmanager
async def connect(url: str) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()


async def tables(conn: Any) -> set[str]:
    rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    return {r["tablename"] for r in rows}


async def applied(conn: Any) -> list[int]:
    return [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")]


def test_shipped_migrations_are_numbered_from_one() -> None:
    migrations = load_migrations()
    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))
    assert migrations[0].name == "initial"
    assert all(len(m.checksum) == 64 for m in migrations)


async def test_migrate_applies_once(empty_pg_url: str) -> None:
    async with connect(empty_pg_url) as conn:
        assert await tables(conn) == set()
        assert await migrate(conn) == [m.version for m in load_migrations()]
        assert await tables(conn) == TABLES
        assert await migrate(conn) == []
        assert await migrate(conn) == []
        assert await applied(conn) == [m.version for m in load_migrations()]


async def test_concurrent_migrators_apply_each_migration_once(empty_pg_url: str) -> None:
    results: list[list[int]] = []

    async def run() -> None:
        async with connect(empty_pg_url) as conn:
            results.append(await migrate(conn))

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(run)
    everything = [m.version for m in load_migrations()]
    assert sorted(results) == [[]] * 5 + [everything]
    async with connect(empty_pg_url) as conn:
        assert await applied(conn) == everything
        assert await tables(conn) == TABLES


async def test_migrate_waits_for_the_advisory_lock(empty_pg_url: str) -> None:
    async with connect(empty_pg_url) as holder, connect(empty_pg_url) as conn:
        await holder.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        done = anyio.Event()

        async def run() -> None:
            await migrate(conn)
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            with anyio.move_on_after(0.5):
                await done.wait()
            assert not done.is_set(), "migrate ran while another migrator held the lock"
            assert await tables(holder) == set()
            await holder.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
            with anyio.fail_after(10):
                await done.wait()
        assert await tables(holder) == TABLES


async def test_new_migration_applies_on_top(pg_url: str) -> None:
    extra = Migration(version=2, name="extra", sql="CREATE TABLE extra (id integer);")
    async with connect(pg_url) as conn:
        assert await migrate(conn, (*load_migrations(), extra)) == [2]
        assert "extra" in await tables(conn)
        assert await migrate(conn, (*load_migrations(), extra)) == []


async def test_failed_migration_rolls_back_and_releases_the_lock(pg_url: str) -> None:
    broken = Migration(
        version=2, name="broken", sql="CREATE TABLE half (id integer); SELECT 1 / 0;"
    )
    async with connect(pg_url) as conn:
        with pytest.raises(InvalidArgument, match="22012"):
            await migrate(conn, (*load_migrations(), broken))
        assert "half" not in await tables(conn)
        assert await applied(conn) == [1]
    async with connect(pg_url) as other:
        got = await other.fetchval("SELECT pg_try_advisory_lock($1)", MIGRATION_LOCK_KEY)
        assert got, "the failed migrator released the advisory lock"


async def test_edited_migration_is_refused(pg_url: str) -> None:
    async with connect(pg_url) as conn:
        await conn.execute("UPDATE schema_migrations SET checksum = 'x' WHERE version = 1")
        with pytest.raises(FailedPrecondition, match="0001_initial"):
            await migrate(conn)


def test_gap_in_migrations_is_refused(tmp_path: Path) -> None:
    (tmp_path / "0001_first.sql").write_text("SELECT 1;")
    (tmp_path / "0003_third.sql").write_text("SELECT 3;")
    (tmp_path / "README.md").write_text("not a migration")
    with pytest.raises(Internal, match=r"\[1, 3\]"):
        load_migrations(tmp_path)
    (tmp_path / "0002_second.sql").write_text("SELECT 2;")
    assert [m.name for m in load_migrations(tmp_path)] == ["first", "second", "third"]


async def test_open_store_migrates_an_empty_database(empty_pg_url: str) -> None:
    async with open_store(empty_pg_url) as store:
        assert isinstance(store, PostgresStore)
        created = await store.create_atespace(Atespace(name="as1"))
        assert await store.list_atespaces() == [created]
    async with connect(empty_pg_url) as conn:
        assert await tables(conn) == TABLES
