"""The store's connection pool: what it needs of ``asyncpg.Pool``, with less work per call.

``asyncpg.Pool`` spends about as much Python time acquiring and releasing a connection as
running a short statement on it (a shielded task and timers per release, a queue per
acquire). The store holds a connection for one call at a time and keeps no session state
on it, so this pool does the least that is safe:

* ``acquire`` takes the most recently released open connection, opens a new one while
  fewer than ``max_size`` exist, or waits (first come, first served) for a release;
* ``release`` is synchronous: a connection comes back to the pool only if the call left it
  clean (it says so: no statement was interrupted) and idle (not in a transaction);
  otherwise (cancellation, timeout, a broken connection) it is terminated and a later
  ``acquire`` opens a fresh one;
* ``close`` closes idle connections, waits for busy ones to come back and closes those.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any

Connect = Callable[[], Awaitable[Any]]


class PoolClosed(Exception):
    """``acquire`` on a pool that is closed (or closing)."""


class ConnectionPool:
    """Up to ``max_size`` asyncpg connections made by ``connect``."""

    def __init__(self, connect: Connect, *, min_size: int, max_size: int) -> None:
        if max_size < 1 or not 0 <= min_size <= max_size:
            raise ValueError(f"bad pool sizes: min_size={min_size}, max_size={max_size}")
        self._connect = connect
        self._min_size = min_size
        self._max_size = max_size
        self._idle: list[Any] = []
        self._busy: set[Any] = set()
        self._opening = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False
        self._finished = False  # closed, and no closer waits for busy connections anymore
        self._returned: asyncio.Event | None = None

    @property
    def size(self) -> int:
        """Connections open or being opened."""
        return len(self._idle) + len(self._busy) + self._opening

    async def start(self) -> None:
        """Open ``min_size`` connections (a failure closes what was opened and raises)."""
        try:
            while self.size < self._min_size:
                self._opening += 1
                try:
                    conn = await self._connect()
                finally:
                    self._opening -= 1
                self._idle.append(conn)
        except BaseException:
            self.terminate()
            raise

    async def acquire(self) -> Any:
        while True:
            if self._closed:
                raise PoolClosed
            while self._idle:
                conn = self._idle.pop()
                if not conn.is_closed():
                    self._busy.add(conn)
                    return conn
            if self.size < self._max_size:
                self._opening += 1
                try:
                    conn = await self._connect()
                except BaseException:
                    self._wake()  # a waiter may open one instead
                    raise
                finally:
                    self._opening -= 1
                if self._closed:
                    conn.terminate()
                    raise PoolClosed
                self._busy.add(conn)
                return conn
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, but leaving: pass the turn on
                else:
                    waiter.cancel()
                raise

    def release(self, conn: Any, *, clean: bool) -> None:
        """Give ``conn`` back; ``clean`` means no statement on it was interrupted."""
        self._busy.discard(conn)
        if not clean or self._finished or conn.is_closed() or conn.is_in_transaction():
            conn.terminate()
        else:
            self._idle.append(conn)
        self._wake()
        if self._returned is not None:
            self._returned.set()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        """Refuse new acquires, close idle connections, then each busy one once released."""
        self._closed = True
        while self._waiters:
            self._wake()
        try:
            while self._idle or self._busy:
                while self._idle:
                    conn = self._idle.pop()
                    try:
                        await conn.close()
                    except Exception:
                        conn.terminate()
                if self._busy:
                    self._returned = asyncio.Event()
                    await self._returned.wait()
                    self._returned = None
        finally:
            if not self._idle and not self._busy:
                self._finished = True

    def terminate(self) -> None:
        """Close every connection at once (after a ``close`` that took too long)."""
        self._closed = True
        self._finished = True
        while self._waiters:
            self._wake()
        for conn in (*self._idle, *self._busy):
            conn.terminate()
        self._idle.clear()
        self._busy.clear()
