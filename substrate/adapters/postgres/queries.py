"""Every SQL statement of the Postgres store, by name (the schema is in ``migrations/``).

Hot paths are one statement each where the semantics allow it: single-row updates are
optimistic (``UPDATE ... WHERE uid = .. AND version = .. RETURNING``, no explicit
transaction), and a worker write carries its change-feed event (``worker_events`` row
plus ``pg_notify``) in the same statement as data-modifying CTEs.
"""

from __future__ import annotations

from typing import Final

import attrs

WORKER_EVENTS_CHANNEL: Final = "substrate_worker_events"
"""The LISTEN/NOTIFY channel of the worker change feed."""

INLINE_EVENT_MAX: Final = 7000
"""Largest worker document (bytes of its ``jsonb`` text and name) carried in the
notification itself.

PostgreSQL refuses payloads of 8000 bytes or more; a larger document is only named by
the event's ``seq`` and read back from ``worker_events`` by the listener."""

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
ATESPACE_CONTENTS: Final = """
SELECT EXISTS (SELECT 1 FROM actors WHERE atespace = $1) AS actors,
       EXISTS (SELECT 1 FROM tags WHERE atespace = $1) AS tags,
       EXISTS (SELECT 1 FROM actor_templates WHERE atespace = $1) AS templates
"""
ATESPACE_DELETE: Final = "DELETE FROM atespaces WHERE name = $1"


def _insert_in_atespace(table: str, columns: str, values: str) -> str:
    """Insert a row of an atespace-scoped table in one statement.

    The atespace row is taken ``FOR KEY SHARE`` (so a concurrent delete of the atespace
    waits for this insert, or wins and this insert sees no atespace); the result says
    whether the atespace existed and whether the row was inserted (not a duplicate).
    """
    return f"""
WITH space AS (SELECT name FROM atespaces WHERE name = $1 FOR KEY SHARE),
inserted AS (
    INSERT INTO {table} ({columns}) SELECT {values} FROM space
    ON CONFLICT (atespace, name) DO NOTHING
    RETURNING name
)
SELECT EXISTS (SELECT 1 FROM space) AS space, EXISTS (SELECT 1 FROM inserted) AS inserted
"""


# --- records scoped to an atespace (templates, tags) --------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class ScopedQueries:
    """The statements of one table keyed by ``(atespace, name)``."""

    insert: str
    get: str
    read: str
    lock: str
    list_in: str
    update: str
    delete: str


def _scoped(table: str) -> ScopedQueries:
    return ScopedQueries(
        insert=_insert_in_atespace(
            table,
            "atespace, name, uid, version, doc",
            "$1::text, $2::text, $3::text, $4::bigint, $5::jsonb",
        ),
        get=f"SELECT doc FROM {table} WHERE atespace = $1 AND name = $2",
        read=f"SELECT uid, version, xmin, doc FROM {table} WHERE atespace = $1 AND name = $2",
        lock=f"SELECT doc FROM {table} WHERE atespace = $1 AND name = $2 FOR UPDATE",
        list_in=f"SELECT doc FROM {table} WHERE atespace = $1 ORDER BY name",
        update=f"""
UPDATE {table} SET version = $5, doc = $6::jsonb
WHERE atespace = $1 AND name = $2 AND uid = $3 AND version = $4
RETURNING xmin
""",
        delete=f"DELETE FROM {table} WHERE atespace = $1 AND name = $2",
    )


TEMPLATES: Final = _scoped("actor_templates")
TAGS: Final = _scoped("tags")

# --- actors -------------------------------------------------------------------------------

ACTOR_INSERT: Final = _insert_in_atespace(
    "actors",
    "atespace, name, uid, version, state, doc",
    "$1::text, $2::text, $3::text, $4::bigint, $5::text, $6::jsonb",
)
ACTOR_GET: Final = "SELECT doc FROM actors WHERE atespace = $1 AND name = $2"
ACTOR_READ: Final = "SELECT uid, version, xmin, doc FROM actors WHERE atespace = $1 AND name = $2"
"""The row's identity (uid, version and ``xmin``, the transaction that wrote this row
version) with the document: a document already decoded for that identity is reused."""
ACTOR_LOCK: Final = "SELECT doc FROM actors WHERE atespace = $1 AND name = $2 FOR UPDATE"
ACTOR_UPDATE: Final = """
UPDATE actors SET version = $5, state = $6, doc = $7::jsonb
WHERE atespace = $1 AND name = $2 AND uid = $3 AND version = $4
RETURNING xmin
"""
"""Optimistic write: applies only over the very record (uid and version) it was made from."""
ACTOR_DELETE: Final = "DELETE FROM actors WHERE atespace = $1 AND name = $2"
ACTOR_PAGE_ALL: Final = """
SELECT doc FROM actors WHERE (atespace, name) > ($1, $2) ORDER BY atespace, name LIMIT $3
"""
"""Keyset page over every atespace; the first page starts after ``('', '')``."""
ACTOR_PAGE_IN: Final = """
SELECT doc FROM actors WHERE atespace = $1 AND name > $2 ORDER BY name LIMIT $3
"""

# --- worker change feed -------------------------------------------------------------------


def _emitting(changes: str, kind: str, also: str = "") -> str:
    """``changes`` (CTEs ending in ``changed``, returning a worker's ``name, version,
    doc``) followed by its event: a ``worker_events`` row and a notification per changed
    worker, in the same statement. Returns one ``seq`` per event; no row, no change.

    ``kind`` is an SQL text expression (a literal, or a parameter for a generic emit);
    ``also`` adds columns to each row returned.
    The payload names the row (``s``, plus kind, name and version, as listeners of the
    first release expect) and carries the document itself (``d``) unless it is too big
    for a notification.
    """
    return f"""
{changes},
event AS (
    INSERT INTO worker_events (kind, name, version, doc)
    SELECT {kind}, name, version, doc FROM changed
    RETURNING seq, kind, name, version, doc
)
SELECT seq, pg_notify(
    '{WORKER_EVENTS_CHANNEL}',
    CASE WHEN octet_length(doc::text) + octet_length(name) <= {INLINE_EVENT_MAX}
        THEN json_build_object('s', seq, 'k', kind, 'n', name, 'v', version, 'd', doc)
        ELSE json_build_object('s', seq, 'k', kind, 'n', name, 'v', version)
    END::text
){also}
FROM event ORDER BY seq
"""


WORKER_EVENT_EMIT: Final = _emitting(
    """
WITH changed AS (SELECT $2::text AS name, $3::bigint AS version, $4::jsonb AS doc)""",
    "$1::text",
)
"""Record one worker change of kind ``$1`` inside a larger transaction (notified at commit)."""

WORKER_EVENTS_FETCH: Final = (
    "SELECT seq, kind, doc FROM worker_events WHERE seq = ANY($1::bigint[])"
)
WORKER_EVENTS_PRUNE: Final = """
DELETE FROM worker_events WHERE created_at < clock_timestamp() - make_interval(secs => $1)
"""

# --- workers ------------------------------------------------------------------------------

WORKER_INSERT: Final = _emitting(
    """
WITH changed AS (
    INSERT INTO workers (name, uid, version, state, node, pool, doc)
    VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb)
    ON CONFLICT (name) DO NOTHING
    RETURNING name, version, doc
)""",
    "'CREATED'",
)
WORKER_GET: Final = "SELECT doc FROM workers WHERE name = $1"
WORKER_READ: Final = "SELECT uid, version, xmin, doc FROM workers WHERE name = $1"
WORKER_LOCK: Final = "SELECT doc FROM workers WHERE name = $1 FOR UPDATE"
WORKER_LIST: Final = "SELECT doc FROM workers ORDER BY name"
WORKER_LOCK_ALL: Final = "SELECT doc FROM workers ORDER BY name FOR UPDATE"
WORKER_UPDATE: Final = _emitting(
    """
WITH changed AS (
    UPDATE workers SET version = $4, state = $5, doc = $6::jsonb
    WHERE name = $1 AND uid = $2 AND version = $3
    RETURNING name, version, doc
)""",
    "'UPDATED'",
)
"""Optimistic worker write with its event; no row means the record moved (or is gone)."""
WORKER_DELETE: Final = _emitting(
    """
WITH changed AS (
    DELETE FROM workers WHERE name = $1 AND uid = $2 AND version = $3
    RETURNING name, version, doc
)""",
    "'DELETED'",
)
"""Delete the very record checked (uid and version), and its event; its bindings go with
it (``ON DELETE CASCADE``)."""

# --- bindings -----------------------------------------------------------------------------

BINDING_GET: Final = "SELECT doc FROM actor_bindings WHERE actor_uid = $1"
BINDING_LOCK: Final = "SELECT doc FROM actor_bindings WHERE actor_uid = $1 FOR UPDATE"
BINDING_LIST_ALL: Final = "SELECT doc FROM actor_bindings"
BINDING_LIST_ON: Final = "SELECT doc FROM actor_bindings WHERE worker = $1"

BIND_LOAD: Final = """
WITH locked AS (SELECT doc FROM workers WHERE name = $1 FOR UPDATE)
SELECT (SELECT doc FROM locked) AS worker,
       actor.doc AS actor, actor.uid AS actor_uid, actor.version AS actor_version,
       actor.xmin AS actor_xmin,
       (SELECT b.doc FROM actor_bindings b WHERE b.actor_uid = actor.uid) AS binding
FROM (SELECT 1) AS one LEFT JOIN actors actor ON actor.atespace = $2 AND actor.name = $3
"""
"""Inside the bind transaction: lock the worker row (its room is checked on the locked
row) and read the actor and its binding. The actor is not locked here: the write below
applies only over the version read."""
BIND_WRITE: Final = _emitting(
    """
WITH actor AS (
    UPDATE actors SET version = $5, state = $6, doc = $7::jsonb
    WHERE atespace = $1 AND name = $2 AND uid = $3 AND version = $4
    RETURNING uid, xmin
),
binding AS (
    INSERT INTO actor_bindings (actor_uid, worker, doc)
    SELECT uid, $8::text, $9::jsonb FROM actor
    RETURNING worker
),
changed AS (
    UPDATE workers SET version = $11, state = $12, doc = $13::jsonb
    WHERE name = $8 AND version = $10 AND EXISTS (SELECT 1 FROM binding)
    RETURNING name, version, doc
)""",
    "'UPDATED'",
    also=", (SELECT xmin FROM actor) AS actor_xmin",
)
"""The actor (if still at the version read), its binding and the worker's booking with its
event, all or nothing: each step runs only if the one before it wrote."""

RELEASE_LOAD: Final = """
SELECT b.doc AS binding, w.doc AS worker
FROM actor_bindings b JOIN workers w ON w.name = b.worker
WHERE b.actor_uid = $1
"""
RELEASE_LOCK: Final = RELEASE_LOAD + "FOR UPDATE OF w"
RELEASE_WRITE: Final = _emitting(
    """
WITH still AS (
    SELECT 1 FROM actor_bindings WHERE actor_uid = $1 AND worker = $2
),
changed AS (
    UPDATE workers SET version = $4, state = $5, doc = $6::jsonb
    WHERE name = $2 AND version = $3 AND EXISTS (SELECT 1 FROM still)
    RETURNING name, version, doc
),
released AS (
    DELETE FROM actor_bindings
    WHERE actor_uid = $1 AND worker = $2 AND EXISTS (SELECT 1 FROM changed)
)""",
    "'UPDATED'",
)
"""Unbook and delete a binding over the worker version it was computed from.

Every statement that deletes a binding also writes (or deletes) its worker row in the
same transaction, with the worker row locked first. So once this statement's
conditional update has the worker row (its version unchanged), nobody can delete the
binding before this transaction ends: the binding seen is deleted, and the worker is
unbooked exactly once."""

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
