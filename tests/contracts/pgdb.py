"""Throwaway PostgreSQL databases for tests: one migrated template, cheap clones per test.

Uses ``PG_DSN`` if set, else the local server. Every database made here has a random
name and is dropped (``WITH (FORCE)``) when its test ends or, at the latest, when the
session ends.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from substrate.adapters.postgres import migrate

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def admin_dsn() -> str:
    return os.environ.get("PG_DSN") or DEFAULT_DSN


def with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PgServer:
    """A reachable server with a migrated template database to clone from."""

    def __init__(self, dsn: str, template: str) -> None:
        self.dsn = dsn
        self.template = template
        self._databases: set[str] = set()
        self._ready: MemoryObjectReceiveStream[str] | None = None
        self._to_drop: MemoryObjectSendStream[str] | None = None

    @classmethod
    async def start(cls, dsn: str | None = None) -> PgServer:
        """Connect, create and migrate the template; skip if the server is unreachable."""
        dsn = dsn or admin_dsn()
        try:
            conn = await asyncpg.connect(dsn, timeout=5)
        except (OSError, TimeoutError, asyncpg.CannotConnectNowError) as exc:
            pytest.skip(f"PostgreSQL not reachable at {dsn}: {type(exc).__name__}: {exc}")
        template = f"substrate_tmpl_{secrets.token_hex(6)}"
        try:
            await conn.execute(f"CREATE DATABASE {_quote(template)}")
        finally:
            await conn.close()
        server = cls(dsn, template)
        server._databases.add(template)
        tconn = await asyncpg.connect(with_database(dsn, template))
        try:
            await migrate(tconn)
        finally:
            await tconn.close()
        return server

    def url(self, database: str) -> str:
        return with_database(self.dsn, database)

    async def create_database(self, *, migrated: bool = True) -> str:
        """A new database: a clone of the migrated template, or empty."""
        name = f"t_{secrets.token_hex(8)}"
        sql = f"CREATE DATABASE {_quote(name)}"
        if migrated:
            sql += f" TEMPLATE {_quote(self.template)}"
        # Recorded first: if creation is interrupted, close() still drops it (IF EXISTS).
        self._databases.add(name)
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()
        return name

    async def take_database(self) -> str:
        """A migrated clone: a prefetched one while :meth:`prefetching`, else a new one."""
        if self._ready is not None:
            return await self._ready.receive()
        return await self.create_database()

    async def discard_database(self, name: str) -> None:
        """Drop ``name``: in the background while :meth:`prefetching`, else right away."""
        if self._to_drop is not None:
            self._to_drop.send_nowait(name)
        else:
            await self.drop_database(name)

    @asynccontextmanager
    async def prefetching(self, *, ready: int = 2, workers: int = 2) -> AsyncIterator[None]:
        """Clone and drop databases in the background, so tests rarely wait for either.

        ``CREATE DATABASE`` and ``DROP DATABASE`` cost far more than most tests; they run
        while other tests do. Whatever is left is dropped by :meth:`close`.
        """
        send, receive = anyio.create_memory_object_stream[str](ready)
        drop_send, drop_receive = anyio.create_memory_object_stream[str](float("inf"))
        async with anyio.create_task_group() as tg:
            for _ in range(workers):
                tg.start_soon(self._produce, send.clone())
            tg.start_soon(self._drop_all, drop_receive)
            send.close()
            self._ready = receive
            self._to_drop = drop_send
            try:
                yield
            finally:
                self._ready = None
                self._to_drop = None
                receive.close()
                drop_send.close()
                tg.cancel_scope.cancel()

    async def _produce(self, send: MemoryObjectSendStream[str]) -> None:
        with send:
            while True:
                name = await self.create_database()
                try:
                    await send.send(name)
                except anyio.BrokenResourceError:
                    return

    async def _drop_all(self, receive: MemoryObjectReceiveStream[str]) -> None:
        with receive:
            async for name in receive:
                await self.drop_database(name)

    async def drop_database(self, name: str) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")
            self._databases.discard(name)
        finally:
            await conn.close()

    async def close(self) -> None:
        """Drop every database this server object made (clones before the template)."""
        for name in sorted(self._databases, key=lambda n: n == self.template):
            await self.drop_database(name)
