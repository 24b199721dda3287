"""Every SQL statement of the Postgres store, by name (the schema is in ``migrations/``)."""

from __future__ import annotations

from typing import Final

import attrs

WORKER_EVENTS_CHANNEL: Final = "substrate_worker_events"
"""The LISTEN/NOTIFY channel of the worker change feed."""

# --- atespaces ----------------------------------------------------------------------------

ATESPACE_INSERT: Final = """
INSERT INTO atespaces (name, uid, version, doc) VALUES ($1, $2, $3, $4::jsonb)
ON CONFLICT (name) DO NOTHING
RETURNING name
"""
ATESPACE_GET: Final = "SELECT doc FROM atespaces WHERE name = $1"
ATESPACE_EXISTS: Final = "SELECT EXISTS (SELECT 1 FROM atespaces WHERE name = $1)"
ATESPACE_LIST: Final = "SELECT doc FROM atespaces ORDER BY name"
ATESPACE_LOCK: Final = "SELECT name FROM atespaces WHERE name = $1 FOR UPDATE"
ATESPACE_SHARE: Final = "SELECT name FROM atespaces WHERE name = $1 FOR KEY SHARE"
"""Taken by every create in an atespace, so a concurrent delete of it waits or wins."""
ATESPACE_CONTENTS: Final = """
SELECT EXISTS (SELECT 1 FROM actors WHERE atespace = $1) AS actors,
       EXISTS (SELECT 1 FROM tags WHERE atespace = $1) AS tags,
       EXISTS (SELECT 1 FROM actor_templates WHERE atespace = $1) AS templates
"""
ATESPACE_DELETE: Final = "DELETE FROM atespaces WHERE name = $1"


# --- records scoped to an atespace (templates, tags) --------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class ScopedQueries:
    """The statements of one table keyed by ``(atespace, name)``."""

    insert: str
    get: str
    lock: str
    list_in: str
    update: str
    delete: str


def _scoped(table: str) -> ScopedQueries:
    return ScopedQueries(
        insert=f"""
INSERT INTO {table} (atespace, name, uid, version, doc) VALUES ($1, $2, $3, $4, $5::jsonb)
ON CONFLICT (atespace, name) DO NOTHING
RETURNING name
""",
        get=f"SELECT doc FROM {table} WHERE atespace = $1 AND name = $2",
        lock=f"SELECT doc FROM {table} WHERE atespace = $1 AND name = $2 FOR UPDATE",
        list_in=f"SELECT doc FROM {table} WHERE atespace = $1 ORDER BY name",
        update=(
            f"UPDATE {table} SET version = $3, doc = $4::jsonb WHERE atespace = $1 AND name = $2"
        ),
        delete=f"DELETE FROM {table} WHERE atespace = $1 AND name = $2",
    )


TEMPLATES: Final = _scoped("actor_templates")
TAGS: Final = _scoped("tags")

# --- actors -------------------------------------------------------------------------------

ACTOR_INSERT: Final = """
INSERT INTO actors (atespace, name, uid, version, state, doc)
VALUES ($1, $2, $3, $4, $5, $6::jsonb)
ON CONFLICT (atespace, name) DO NOTHING
RETURNING name
"""
ACTOR_GET: Final = "SELECT doc FROM actors WHERE atespace = $1 AND name = $2"
ACTOR_LOCK: Final = "SELECT doc FROM actors WHERE atespace = $1 AND name = $2 FOR UPDATE"
ACTOR_UPDATE: Final = """
UPDATE actors SET version = $3, state = $4, doc = $5::jsonb WHERE atespace = $1 AND name = $2
"""
ACTOR_DELETE: Final = "DELETE FROM actors WHERE atespace = $1 AND name = $2"
ACTOR_PAGE_ALL: Final = """
SELECT doc FROM actors WHERE (atespace, name) > ($1, $2) ORDER BY atespace, name LIMIT $3
"""
"""Keyset page over every atespace; the first page starts after ``('', '')``."""
ACTOR_PAGE_IN: Final = """
SELECT doc FROM actors WHERE atespace = $1 AND name > $2 ORDER BY name LIMIT $3
"""

# --- workers ------------------------------------------------------------------------------

WORKER_INSERT: Final = """
INSERT INTO workers (name, uid, version, state, node, pool, doc)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb)
ON CONFLICT (name) DO NOTHING
RETURNING name
"""
WORKER_GET: Final = "SELECT doc FROM workers WHERE name = $1"
WORKER_LOCK: Final = "SELECT doc FROM workers WHERE name = $1 FOR UPDATE"
WORKER_LIST: Final = "SELECT doc FROM workers ORDER BY name"
WORKER_LOCK_ALL: Final = "SELECT doc FROM workers ORDER BY name FOR UPDATE"
WORKER_UPDATE: Final = (
    "UPDATE workers SET version = $2, state = $3, doc = $4::jsonb WHERE name = $1"
)
WORKER_DELETE: Final = "DELETE FROM workers WHERE name = $1"

WORKER_EVENT_EMIT: Final = f"""
WITH event AS (
    INSERT INTO worker_events (kind, name, version, doc) VALUES ($1, $2, $3, $4::jsonb)
    RETURNING seq
)
SELECT seq, pg_notify(
    '{WORKER_EVENTS_CHANNEL}',
    json_build_object('s', seq, 'k', $1::text, 'n', $2::text, 'v', $3::bigint)::text
)
FROM event
"""
"""Record one worker change and notify listeners at commit (payload: seq, kind, name,
version); listeners read the row by seq."""
WORKER_EVENTS_FETCH: Final = (
    "SELECT seq, kind, doc FROM worker_events WHERE seq = ANY($1::bigint[])"
)
WORKER_EVENTS_PRUNE: Final = """
DELETE FROM worker_events WHERE created_at < clock_timestamp() - make_interval(secs => $1)
"""

# --- bindings -----------------------------------------------------------------------------

BINDING_GET: Final = "SELECT doc FROM actor_bindings WHERE actor_uid = $1"
BINDING_LOCK: Final = "SELECT doc FROM actor_bindings WHERE actor_uid = $1 FOR UPDATE"
BINDING_INSERT: Final = """
INSERT INTO actor_bindings (actor_uid, worker, doc) VALUES ($1, $2, $3::jsonb)
"""
BINDING_DELETE: Final = """
DELETE FROM actor_bindings WHERE actor_uid = $1 AND worker = $2 RETURNING doc
"""
BINDING_LIST_ALL: Final = "SELECT doc FROM actor_bindings"
BINDING_LIST_ON: Final = "SELECT doc FROM actor_bindings WHERE worker = $1"
BINDING_DELETE_ON: Final = "DELETE FROM actor_bindings WHERE worker = $1"

# --- leases (database clock) --------------------------------------------------------------

LEASE_ACQUIRE: Final = """
INSERT INTO leases AS held (key, token, expires_at)
VALUES ($1, $2, clock_timestamp() + make_interval(secs => $3))
ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
    WHERE held.expires_at <= clock_timestamp()
RETURNING extract(epoch FROM expires_at)::float8 AS expires_at
"""
"""Take the lease if it is free or expired; no row returned means it is held."""
LEASE_RENEW: Final = """
UPDATE leases SET expires_at = clock_timestamp() + make_interval(secs => $3)
WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp()
RETURNING extract(epoch FROM expires_at)::float8 AS expires_at
"""
LEASE_HOLDER: Final = """
SELECT token, expires_at > clock_timestamp() AS alive FROM leases WHERE key = $1
"""
LEASE_RELEASE: Final = "DELETE FROM leases WHERE key = $1 AND token = $2"
LEASE_ALIVE: Final = """
SELECT EXISTS (SELECT 1 FROM leases WHERE key = $1 AND expires_at > clock_timestamp())
"""
LEASE_LIST: Final = """
SELECT key, token, extract(epoch FROM expires_at)::float8 AS expires_at
FROM leases WHERE expires_at > clock_timestamp() ORDER BY key
"""
LEASE_PRUNE: Final = """
DELETE FROM leases WHERE key IN (
    SELECT key FROM leases WHERE expires_at <= clock_timestamp()
    LIMIT 1000 FOR UPDATE SKIP LOCKED
)
"""
"""Delete up to 1000 expired leases, skipping rows another transaction is reclaiming."""

# --- administration -----------------------------------------------------------------------

CLEAR: Final = """
TRUNCATE actor_bindings, actors, actor_templates, tags, workers, atespaces, leases
"""
