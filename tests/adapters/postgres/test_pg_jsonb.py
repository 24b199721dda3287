"""Documents survive a trip through PostgreSQL ``jsonb`` exactly (numbers, text, nesting)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from hypothesis import given, settings

from substrate.adapters.postgres.codec import Codec
from tests.adapters import model_strategies as ms
from tests.pg import PgHandle

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


@pytest.fixture(scope="module")
async def jsonb_conn(pg_server: PgHandle) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(pg_server.dsn)
    try:
        yield conn
    finally:
        await conn.close()


@settings(max_examples=60)
@given(ms.records)
async def test_record_round_trips_through_jsonb(jsonb_conn: Any, record: object) -> None:
    codec = Codec()
    text = await jsonb_conn.fetchval("SELECT $1::jsonb", codec.dumps(record))
    assert codec.loads(type(record), text) == record
