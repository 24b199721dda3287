"""A session-wide PostgreSQL test server, usable from tests on any event loop.

The database housekeeping (a migrated template, clones made and dropped in the background)
runs on its own event loop in a portal thread, so no async session fixture keeps an anyio
runner alive across tests of other backends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal

from tests.contracts.pgdb import PgServer


class PgHandle:
    """Thread-hopping access to a :class:`PgServer` running in a portal."""

    def __init__(self, server: PgServer, portal: BlockingPortal) -> None:
        self._server = server
        self._portal = portal

    @property
    def dsn(self) -> str:
        return self._server.dsn

    def url(self, database: str) -> str:
        return self._server.url(database)

    async def take_database(self) -> str:
        return await anyio.to_thread.run_sync(self._portal.call, self._server.take_database)

    async def discard_database(self, name: str) -> None:
        await anyio.to_thread.run_sync(self._portal.call, self._server.discard_database, name)

    async def create_database(self, *, migrated: bool = True) -> str:
        call = partial(self._server.create_database, migrated=migrated)
        return await anyio.to_thread.run_sync(self._portal.call, call)


@contextmanager
def pg_session() -> Iterator[PgHandle]:
    with start_blocking_portal("asyncio") as portal:
        server = portal.call(PgServer.start)
        try:
            with portal.wrap_async_context_manager(server.prefetching()):
                yield PgHandle(server, portal)
        finally:
            portal.call(server.close)
