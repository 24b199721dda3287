"""Versioned schema migrations, applied in order under a PostgreSQL advisory lock."""

from __future__ import annotations

import hashlib
import importlib.resources
import re
from importlib.resources.abc import Traversable
from typing import Any, Final

import attrs

from substrate.adapters.postgres.errors import TRANSLATED, translate
from substrate.errors import FailedPrecondition, Internal

MIGRATION_LOCK_KEY: Final = 0x7375627374726174
"""The advisory lock (``b"substrat"`` as a bigint) every migrator holds while it runs."""

_FILE_RE: Final = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

CREATE_MIGRATIONS_TABLE: Final = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
APPLIED: Final = "SELECT version, name, checksum FROM schema_migrations ORDER BY version"
RECORD: Final = "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)"
LOCK: Final = "SELECT pg_advisory_lock($1)"
UNLOCK: Final = "SELECT pg_advisory_unlock($1)"


@attrs.frozen(slots=True, kw_only=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations(root: Traversable | None = None) -> tuple[Migration, ...]:
    """The ``NNNN_<name>.sql`` files of ``root`` (default: the shipped ``migrations/``).

    Raises :class:`Internal` unless they are numbered 1, 2, ... without gaps.
    """
    if root is None:
        root = importlib.resources.files("substrate.adapters.postgres").joinpath("migrations")
    found: list[Migration] = []
    for entry in root.iterdir():
        match = _FILE_RE.match(entry.name)
        if match is None:
            continue
        found.append(
            Migration(
                version=int(match.group(1)),
                name=match.group(2),
                sql=entry.read_text(encoding="utf-8"),
            )
        )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise Internal(f"migrations must be numbered 1..n without gaps, found {versions}")
    return tuple(found)


async def migrate(conn: Any, migrations: tuple[Migration, ...] | None = None) -> list[int]:
    """Bring the database of ``conn`` (an asyncpg connection) up to date.

    Holds the advisory lock :data:`MIGRATION_LOCK_KEY` for the whole run, so concurrent
    migrators (several ateapi replicas starting at once) apply each migration exactly
    once; each migration and its ``schema_migrations`` row commit in one transaction.
    Returns the versions applied by this call. Raises :class:`FailedPrecondition` if an
    applied migration differs from the shipped file (it was edited after release), and
    :class:`Unavailable` if the database cannot be reached.
    """
    todo = load_migrations() if migrations is None else migrations
    try:
        await conn.execute(LOCK, MIGRATION_LOCK_KEY)
        try:
            await conn.execute(CREATE_MIGRATIONS_TABLE)
            applied = {row["version"]: row for row in await conn.fetch(APPLIED)}
            done: list[int] = []
            for migration in todo:
                row = applied.get(migration.version)
                if row is not None:
                    if row["checksum"] != migration.checksum:
                        raise FailedPrecondition(
                            f"migration {migration.version:04d}_{migration.name} was changed "
                            "after it was applied to this database"
                        )
                    continue
                async with conn.transaction():
                    await conn.execute(migration.sql)
                    await conn.execute(
                        RECORD, migration.version, migration.name, migration.checksum
                    )
                done.append(migration.version)
            return done
        finally:
            if not conn.is_closed():
                await conn.execute(UNLOCK, MIGRATION_LOCK_KEY)
    except TRANSLATED as exc:
        raise translate(exc) from exc
