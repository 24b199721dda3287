"""Fixtures of the conformance tier: ``make_store`` over every Store adapter."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

if "substrate.testing.contracts" not in sys.modules:
    # The shipped cases use plain asserts; let pytest explain their failures.
    pytest.register_assert_rewrite("substrate.testing.contracts")

from substrate.adapters.memory import ManualClock, MemoryStore
from substrate.adapters.postgres import PostgresStore
from substrate.core.ports import Store
from substrate.testing.contracts.store import MakeStore, StoreFactory
from tests.pg import PgHandle

PG_LEASE_TTL = 0.8
"""Real seconds: the PostgreSQL lease cases sleep on the database clock."""

STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def memory_store_factory() -> MakeStore:
    clock = ManualClock()

    @asynccontextmanager
    async def open_store() -> AsyncIterator[Store]:
        async with MemoryStore(clock=clock) as store:
            yield store

    async def advance(seconds: float) -> None:
        clock.advance(seconds)

    return StoreFactory(open=open_store, advance_by=advance, lease_ttl=30.0)


def postgres_store_factory(server: PgHandle) -> MakeStore:
    @asynccontextmanager
    async def open_store() -> AsyncIterator[Store]:
        database = await server.take_database()
        try:
            async with await PostgresStore.connect(server.url(database)) as store:
                yield store
        finally:
            await server.discard_database(database)

    return StoreFactory(open=open_store, advance_by=anyio.sleep, lease_ttl=PG_LEASE_TTL)


@pytest.fixture(params=STORES)
def make_store(request: pytest.FixtureRequest) -> MakeStore:
    if request.param == "postgres":
        return postgres_store_factory(request.getfixturevalue("pg_server"))
    return memory_store_factory()
