"""Adapters chosen by URL: ``open_<port>(url)`` gives an async context manager per port."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from substrate.adapters.memory import MemoryStore
from substrate.adapters.postgres import PostgresStore
from substrate.core.ports import Store
from substrate.errors import InvalidArgument


@contextlib.asynccontextmanager
async def open_store(url: str) -> AsyncIterator[Store]:
    """Open the store named by ``url`` and close it on exit.

    ``memory://`` is the embedded in-memory store (state lives as long as the context);
    ``postgresql://user@host:port/db`` (or ``postgres://``) is PostgreSQL, with pending
    migrations applied first. Raises :class:`InvalidArgument` for any other URL and
    :class:`Unavailable` if PostgreSQL cannot be reached.
    """
    scheme = urlsplit(url).scheme.lower()
    store: Store
    match scheme:
        case "memory":
            store = MemoryStore()
        case "postgresql" | "postgres":
            store = await PostgresStore.connect(url)
        case _:
            raise InvalidArgument(
                f"unsupported store URL {url!r}: use memory:// or postgresql://..."
            )
    async with store:
        yield store


__all__ = ["open_store"]
