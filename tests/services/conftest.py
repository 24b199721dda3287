"""Workflow tests run on asyncio, against every Store adapter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from substrate.adapters.memory.clock import ManualClock
from substrate.adapters.postgres import PostgresStore
from substrate.core.ports import Store
from tests.pg import PgHandle

from .harness import StoreFactory, memory_store


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def postgres_store(pg: PgHandle) -> StoreFactory:
    @asynccontextmanager
    async def open_store(clock: ManualClock) -> AsyncIterator[Store]:
        database = await pg.take_database()
        try:
            async with await PostgresStore.connect(pg.url(database), clock=clock) as store:
                yield store
        finally:
            await pg.discard_database(database)

    return open_store


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def make_store(request: pytest.FixtureRequest) -> StoreFactory:
    if request.param == "postgres":
        return postgres_store(request.getfixturevalue("pg_server"))
    return memory_store
