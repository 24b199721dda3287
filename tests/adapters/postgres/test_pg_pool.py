"""The store's connection pool, with stand-in connections (no server needed)."""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import pytest

from substrate.adapters.postgres.pool import ConnectionPool, PoolClosed

pytestmark = pytest.mark.anyio


class FakeConnection:
    def __init__(self, n: int) -> None:
        self.n = n
        self.closed = False
        self.terminated = False
        self.in_transaction = False

    def is_closed(self) -> bool:
        return self.closed or self.terminated

    def is_in_transaction(self) -> bool:
        return self.in_transaction

    def terminate(self) -> None:
        self.terminated = True

    async def close(self) -> None:
        self.closed = True


class Opener:
    def __init__(self) -> None:
        self.made: list[FakeConnection] = []

    async def __call__(self) -> FakeConnection:
        await anyio.lowlevel.checkpoint()
        conn = FakeConnection(len(self.made))
        self.made.append(conn)
        return conn


async def test_min_size_is_opened_and_idle_connections_are_reused() -> None:
    opener = Opener()
    pool = ConnectionPool(opener, min_size=2, max_size=4)
    await pool.start()
    assert len(opener.made) == 2
    a = await pool.acquire()
    pool.release(a, clean=True)
    assert await pool.acquire() is a, "the most recently released connection is reused"
    assert len(opener.made) == 2


async def test_at_most_max_size_and_waiters_are_served_in_order() -> None:
    opener = Opener()
    pool = ConnectionPool(opener, min_size=0, max_size=2)
    first, second = await pool.acquire(), await pool.acquire()
    served: list[int] = []

    async def wait(i: int) -> None:
        conn = await pool.acquire()
        served.append(i)
        await anyio.sleep(0.01)
        pool.release(conn, clean=True)

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(wait, i)
            await anyio.sleep(0.001)
        assert served == []
        pool.release(first, clean=True)
        pool.release(second, clean=True)
    assert served == [0, 1, 2, 3]
    assert len(opener.made) == 2


@pytest.mark.parametrize("how", ["unclean", "in transaction", "closed"])
async def test_a_connection_left_dirty_is_terminated_not_reused(how: str) -> None:
    opener = Opener()
    pool = ConnectionPool(opener, min_size=0, max_size=1)
    conn = await pool.acquire()
    if how == "in transaction":
        conn.in_transaction = True
    if how == "closed":
        conn.closed = True
    pool.release(conn, clean=how != "unclean")
    assert conn.is_closed()
    fresh = await pool.acquire()
    assert fresh is not conn
    assert len(opener.made) == 2


async def test_a_cancelled_waiter_passes_its_turn_on() -> None:
    pool = ConnectionPool(Opener(), min_size=0, max_size=1)
    held = await pool.acquire()
    impatient = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0.01)
    patient = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0.01)
    pool.release(held, clean=True)  # wakes the first waiter...
    impatient.cancel()  # ...which is cancelled before it runs
    with anyio.fail_after(5):
        assert await patient is held
    assert impatient.cancelled()


async def test_close_waits_for_busy_connections_and_refuses_new_ones() -> None:
    opener = Opener()
    pool = ConnectionPool(opener, min_size=1, max_size=2)
    await pool.start()
    busy = await pool.acquire()
    closed = anyio.Event()

    async def close() -> None:
        await pool.close()
        closed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(close)
        await anyio.sleep(0.01)
        assert not closed.is_set(), "a busy connection is waited for"
        with pytest.raises(PoolClosed):
            await pool.acquire()
        pool.release(busy, clean=True)
    assert all(c.closed for c in opener.made)


async def test_a_failed_connect_frees_its_slot() -> None:
    attempts = 0

    async def flaky() -> FakeConnection:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise OSError("refused")
        return FakeConnection(attempts)

    pool = ConnectionPool(flaky, min_size=0, max_size=1)
    with pytest.raises(OSError, match="refused"):
        await pool.acquire()
    assert (await pool.acquire()).n == 2


async def test_a_connection_released_after_terminate_is_not_kept() -> None:
    pool = ConnectionPool(Opener(), min_size=0, max_size=2)
    busy = await pool.acquire()
    pool.terminate()
    pool.release(busy, clean=True)
    assert busy.terminated
    with pytest.raises(PoolClosed):
        await pool.acquire()
