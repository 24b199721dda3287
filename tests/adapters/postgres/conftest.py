"""Fixtures of the PostgreSQL adapter tests: a session server, one database per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.pg import PgHandle


@pytest.fixture
async def pg_url(pg_server: PgHandle) -> AsyncIterator[str]:
    """The URL of a fresh database cloned from the migrated template."""
    database = await pg_server.take_database()
    try:
        yield pg_server.url(database)
    finally:
        await pg_server.discard_database(database)


@pytest.fixture
async def empty_pg_url(pg_server: PgHandle) -> AsyncIterator[str]:
    """The URL of a fresh database without the schema."""
    database = await pg_server.create_database(migrated=False)
    try:
        yield pg_server.url(database)
    finally:
        await pg_server.discard_database(database)
