"""The PostgreSQL store: JSONB documents, few round trips per call.

How each kind of call reaches the database (connections come from the store's own
:class:`~substrate.adapters.postgres.pool.ConnectionPool`):

* Reads are one statement. A document already decoded for the same row version (uid,
  version and ``xmin``) is not decoded again.
* Single-row updates are optimistic: read the row, check the preconditions, run
  ``mutate``, then ``UPDATE ... WHERE uid = <read> AND version = <read>``; an update that
  finds the row moved re-reads it to say why (``Conflict`` or ``NotFound``). PostgreSQL
  re-evaluates that ``WHERE`` under the row lock, so of concurrent writers over the same
  version exactly one wins, and a write never lands over a version it was not made from.
* A worker change and its change-feed event (``worker_events`` row plus ``pg_notify``)
  are one statement (data-modifying CTEs); the notification carries the document, so a
  listener reads nothing back (except for a document too big for a notification).
* ``bind_actor`` is a transaction that locks the worker row and re-checks its room on the
  locked row, then writes actor (over the version read), binding and booking in one
  statement, all or nothing.
* ``release_actor`` first tries one conditional statement over the worker version it
  read; if the worker moved meanwhile it falls back to a transaction holding the row lock.

Lock order is always worker before actor.
"""

from __future__ import annotations

import collections
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Final, Self, TypeVar

import anyio
import asyncpg
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from substrate.adapters import _store_rules as rules
from substrate.adapters.postgres import queries as q
from substrate.adapters.postgres.codec import Codec
from substrate.adapters.postgres.errors import DRIVER_UNAVAILABLE, TRANSLATED, translate
from substrate.adapters.postgres.migrate import migrate
from substrate.adapters.postgres.pool import ConnectionPool, PoolClosed
from substrate.core.ids import ActorRef, TagRef, TemplateRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorBinding,
    ActorState,
    ActorTemplate,
    Atespace,
    Metadata,
    Resources,
    Tag,
    Worker,
)
from substrate.core.ports import (
    CONFLICT_MESSAGE,
    LEASE_HELD_MESSAGE,
    STORE_CLOSED_MESSAGE,
    BindResult,
    Lease,
    WorkerEvent,
    WorkerEventKind,
)
from substrate.errors import (
    AlreadyExists,
    Conflict,
    FailedPrecondition,
    LeaseHeld,
    NotFound,
    Unavailable,
)

DEFAULT_COMMAND_TIMEOUT: Final = 30.0
"""Seconds a statement may take before it fails (as Unavailable)."""

EVENT_RETENTION: Final = 600.0
"""Seconds a worker event row is kept for listeners that are behind."""

PRUNE_EVERY: Final = 256
"""A writer prunes old worker events when its event's seq is a multiple of this."""

WATCH_BUFFER: Final = 16384
"""Notifications a watcher may have pending before it is dropped (Unavailable)."""

RETRIES: Final = 5
"""Attempts of a transaction that found a binding moving under it."""

Scoped = TypeVar("Scoped", ActorTemplate, Tag)
R = TypeVar("R", ActorTemplate, Tag, Actor, Worker)


def _uuid4() -> str:
    return str(uuid.uuid4())


class _Session:
    """One store call's pooled connection; driver errors become substrate errors.

    An exception raised by user code run through :meth:`apply` (``mutate``) propagates
    unchanged, whatever its type. The connection goes back to the pool for reuse only if
    the call ended cleanly: normally or by an error that interrupted no statement (our
    checks, ``mutate``, a server-side error); after a cancellation, a timeout or a
    broken connection it is closed instead.
    """

    __slots__ = ("_pool", "conn", "user_error")

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self.conn: Any = None
        self.user_error: BaseException | None = None

    async def __aenter__(self) -> Self:
        try:
            self.conn = await self._pool.acquire()
        except PoolClosed:
            raise Unavailable(STORE_CLOSED_MESSAGE) from None
        except TRANSLATED as exc:
            raise translate(exc) from exc
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        clean = exc is None or (
            isinstance(exc, Exception)
            and (exc is self.user_error or not isinstance(exc, DRIVER_UNAVAILABLE))
        )
        self._pool.release(self.conn, clean=clean)
        if isinstance(exc, TRANSLATED) and exc is not self.user_error:
            raise translate(exc) from exc

    def apply(self, mutate: Callable[[Any], Any], record: Any) -> Any:
        try:
            return mutate(record)
        except BaseException as exc:
            self.user_error = exc
            raise


class _Known:
    """The records this store last read or wrote, by key, with their row identity.

    A row version is identified by the record's uid and version and the row's ``xmin``
    (the transaction that wrote it): every write of a row bumps its version, and a
    deleted and re-created record gets a new uid (and a new ``xmin`` even if a
    ``uid_factory`` repeats itself). Reads skip decoding a document already decoded for
    the same identity (the row is always read: only the decoding is saved). Records are
    frozen, so sharing them is safe. At most ``limit`` are kept.
    """

    __slots__ = ("_limit", "_records")

    def __init__(self, limit: int = 1024) -> None:
        self._limit = limit
        self._records: dict[tuple[str, ...], tuple[str, int, int, Any]] = {}

    def get(self, key: tuple[str, ...], uid: str, version: int, xmin: int) -> Any:
        """The record known for exactly this row version, or None."""
        known = self._records.get(key)
        if known is not None and known[0] == uid and known[1] == version and known[2] == xmin:
            return known[3]
        return None

    def put(self, key: tuple[str, ...], xmin: int, record: Any) -> None:
        records = self._records
        records.pop(key, None)
        records[key] = (record.metadata.uid, record.metadata.version, xmin, record)
        if len(records) > self._limit:
            del records[next(iter(records))]

    def drop(self, key: tuple[str, ...]) -> None:
        self._records.pop(key, None)

    def clear(self) -> None:
        self._records.clear()


def _moved(what: str, now: Metadata | None, expected_version: int, expected_uid: str) -> Exception:
    """Why a conditional write over ``expected_*`` found no row, given the row now."""
    if now is None:
        return NotFound(f"{what} not found")
    try:
        rules.check_preconditions(
            what, now, expected_version=expected_version, expected_uid=expected_uid
        )
    except Conflict as exc:
        return exc
    return Conflict(CONFLICT_MESSAGE)


class PostgresStore:
    """A :class:`~substrate.core.ports.Store` on PostgreSQL (asyncpg).

    Create with :meth:`connect` (pool plus migrations). Record times come from ``clock``
    and uids from ``uid_factory``; leases use the database clock (``clock_timestamp()``),
    so every ateapi replica agrees on expiry. See the module docstring for how each call
    keeps its guarantees in few round trips.
    """

    def __init__(
        self,
        pool: ConnectionPool,
        *,
        dsn: str,
        clock: Callable[[], float] = time.time,
        uid_factory: Callable[[], str] = _uuid4,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
    ) -> None:
        self._pool = pool
        self._dsn = dsn
        self._clock = clock
        self._new_uid = uid_factory
        self._command_timeout = command_timeout
        self._codec = Codec()
        self._known = _Known()
        self._watches: set[_PgWorkerEvents] = set()
        self._closed = False

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
        connect_timeout: float = 10.0,
        run_migrations: bool = True,
        clock: Callable[[], float] = time.time,
        uid_factory: Callable[[], str] = _uuid4,
    ) -> PostgresStore:
        """Open a pool on ``dsn``, apply pending migrations and return the store.

        The pool (:class:`~substrate.adapters.postgres.pool.ConnectionPool`) keeps
        ``min_size`` to ``max_size`` connections.

        Raises :class:`Unavailable` if the server cannot be reached.
        """
        if run_migrations:
            # On a connection of its own: the migrator holds a session advisory lock,
            # which must not outlive it on a pooled connection (the pool does not reset).
            try:
                conn = await asyncpg.connect(
                    dsn, command_timeout=command_timeout, timeout=connect_timeout
                )
            except TRANSLATED as exc:
                raise translate(exc) from exc
            try:
                await migrate(conn)
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    try:
                        await conn.close()
                    except TRANSLATED:
                        conn.terminate()
                if not conn.is_closed():
                    conn.terminate()

        async def open_connection() -> Any:
            return await asyncpg.connect(
                dsn, command_timeout=command_timeout, timeout=connect_timeout
            )

        pool = ConnectionPool(open_connection, min_size=min_size, max_size=max_size)
        try:
            await pool.start()
        except TRANSLATED as exc:
            raise translate(exc) from exc
        return cls(
            pool,
            dsn=dsn,
            clock=clock,
            uid_factory=uid_factory,
            command_timeout=command_timeout,
        )

    # --- plumbing -------------------------------------------------------------------

    def _session(self) -> _Session:
        """A pooled connection for one call (``async with``); Unavailable once closed."""
        if self._closed:
            raise Unavailable(STORE_CLOSED_MESSAGE)
        return _Session(self._pool)

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable(STORE_CLOSED_MESSAGE)

    def _load(self, cls: type[Any], text: str) -> Any:
        return self._codec.loads(cls, text)

    async def _fetch_doc(self, sql: str, *args: Any) -> str | None:
        async with self._session() as s:
            doc: str | None = await s.conn.fetchval(sql, *args)
            return doc

    async def _read(
        self, conn: Any, sql: str, key: tuple[str, ...], cls: type[R], *args: Any
    ) -> R | None:
        """The record ``sql`` (selecting ``uid, version, xmin, doc``) finds, or None."""
        row = await conn.fetchrow(sql, *args)
        if row is None:
            return None
        known: R | None = self._known.get(key, row["uid"], row["version"], row["xmin"])
        if known is not None:
            return known
        record: R = self._codec.loads(cls, row["doc"])
        self._known.put(key, row["xmin"], record)
        return record

    async def _events_written(self, conn: Any, rows: list[Any]) -> None:
        """After a write that emitted ``rows`` (one ``seq`` each): prune now and then."""
        for row in rows:
            if row["seq"] % PRUNE_EVERY == 0:
                await conn.execute(q.WORKER_EVENTS_PRUNE, EVENT_RETENTION)
                return

    async def _emit(
        self, conn: Any, kind: WorkerEventKind, name: str, version: int, doc: str
    ) -> None:
        """Record one worker change inside a larger transaction (notified at commit)."""
        rows = await conn.fetch(q.WORKER_EVENT_EMIT, kind.name, name, version, doc)
        await self._events_written(conn, rows)

    # --- atespaces ------------------------------------------------------------------

    async def create_atespace(self, atespace: Atespace) -> Atespace:
        stored = rules.stamp_new(atespace, uid=self._new_uid(), now=self._clock())
        async with self._session() as s:
            inserted = await s.conn.fetchval(
                q.ATESPACE_INSERT,
                stored.name,
                stored.metadata.uid,
                1,
                self._codec.dumps(stored),
            )
        if inserted is None:
            raise AlreadyExists(f"atespace {atespace.name} already exists")
        return stored

    async def get_atespace(self, name: str) -> Atespace:
        doc = await self._fetch_doc(q.ATESPACE_GET, name)
        if doc is None:
            raise NotFound(f"atespace {name} not found")
        return self._codec.loads(Atespace, doc)

    async def list_atespaces(self) -> list[Atespace]:
        async with self._session() as s:
            rows = await s.conn.fetch(q.ATESPACE_LIST)
        return [self._codec.loads(Atespace, r["doc"]) for r in rows]

    async def delete_atespace(self, name: str) -> None:
        async with self._session() as s, s.conn.transaction():
            if await s.conn.fetchval(q.ATESPACE_LOCK, name) is None:
                raise NotFound(f"atespace {name} not found")
            contents = await s.conn.fetchrow(q.ATESPACE_CONTENTS, name)
            remaining = [kind for kind in ("actors", "tags", "templates") if contents[kind]]
            if remaining:
                raise FailedPrecondition(
                    f"atespace {name} is not empty: {', '.join(remaining)} remain in it"
                )
            await s.conn.execute(q.ATESPACE_DELETE, name)

    async def _require_atespace(self, conn: Any, name: str) -> None:
        if not await conn.fetchval(q.ATESPACE_EXISTS, name):
            raise NotFound(f"atespace {name} not found")

    async def _insert_in_atespace(self, what: str, atespace: str, sql: str, *args: Any) -> None:
        """Run an :func:`~queries._insert_in_atespace` statement; raise if it inserted nothing."""
        async with self._session() as s:
            row = await s.conn.fetchrow(sql, *args)
        if not row["space"]:
            raise FailedPrecondition(f"cannot create {what}: atespace {atespace} does not exist")
        if not row["inserted"]:
            raise AlreadyExists(f"{what} already exists")

    # --- templates and tags (same table shape) --------------------------------------

    async def _create_scoped(
        self, what: str, sql: q.ScopedQueries, record: Scoped, ref: TemplateRef | TagRef
    ) -> Scoped:
        stored = rules.stamp_new(record, uid=self._new_uid(), now=self._clock())
        await self._insert_in_atespace(
            f"{what} {ref}",
            ref.atespace,
            sql.insert,
            ref.atespace,
            ref.name,
            stored.metadata.uid,
            1,
            self._codec.dumps(stored),
        )
        return stored

    async def _get_scoped(
        self, what: str, sql: q.ScopedQueries, cls: type[Scoped], ref: TemplateRef | TagRef
    ) -> Scoped:
        async with self._session() as s:
            found = await self._read(
                s.conn, sql.read, (what, ref.atespace, ref.name), cls, ref.atespace, ref.name
            )
        if found is None:
            raise NotFound(f"{what} {ref} not found")
        return found

    async def _list_scoped(
        self, sql: q.ScopedQueries, cls: type[Scoped], atespace: str
    ) -> list[Scoped]:
        async with self._session() as s, s.conn.transaction(readonly=True):
            await self._require_atespace(s.conn, atespace)
            rows = await s.conn.fetch(sql.list_in, atespace)
        return [self._codec.loads(cls, r["doc"]) for r in rows]

    async def _update_scoped(
        self,
        what: str,
        sql: q.ScopedQueries,
        cls: type[Scoped],
        ref: TemplateRef | TagRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Scoped], Scoped],
    ) -> Scoped:
        version, uid = rules.require_preconditions(f"{what} {ref}", expected_version, expected_uid)
        key = (what, ref.atespace, ref.name)
        async with self._session() as s:
            stored = await self._read(s.conn, sql.read, key, cls, ref.atespace, ref.name)
            if stored is None:
                raise NotFound(f"{what} {ref} not found")
            rules.check_preconditions(
                f"{what} {ref}", stored.metadata, expected_version=version, expected_uid=uid
            )
            new: Scoped = s.apply(mutate, stored)
            rules.check_same_ref(what, stored.ref, new.ref)
            written = rules.stamp_update(stored, new, now=self._clock())
            xmin = await s.conn.fetchval(
                sql.update,
                ref.atespace,
                ref.name,
                uid,
                version,
                written.metadata.version,
                self._codec.dumps(written),
            )
            if xmin is None:
                now = await s.conn.fetchval(sql.get, ref.atespace, ref.name)
                meta = None if now is None else self._codec.loads(cls, now).metadata
                raise _moved(f"{what} {ref}", meta, version, uid)
            self._known.put(key, xmin, written)
        return written

    async def _delete_scoped(
        self,
        what: str,
        sql: q.ScopedQueries,
        cls: type[Scoped],
        ref: TemplateRef | TagRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
    ) -> None:
        async with self._session() as s, s.conn.transaction():
            doc = await s.conn.fetchval(sql.lock, ref.atespace, ref.name)
            if doc is None:
                raise NotFound(f"{what} {ref} not found")
            stored: Scoped = self._codec.loads(cls, doc)
            rules.check_preconditions(
                f"{what} {ref}",
                stored.metadata,
                expected_version=expected_version,
                expected_uid=expected_uid,
            )
            await s.conn.execute(sql.delete, ref.atespace, ref.name)

    async def create_template(self, template: ActorTemplate) -> ActorTemplate:
        return await self._create_scoped("template", q.TEMPLATES, template, template.ref)

    async def get_template(self, ref: TemplateRef) -> ActorTemplate:
        return await self._get_scoped("template", q.TEMPLATES, ActorTemplate, ref)

    async def list_templates(self, atespace: str) -> list[ActorTemplate]:
        return await self._list_scoped(q.TEMPLATES, ActorTemplate, atespace)

    async def update_template(
        self,
        ref: TemplateRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[ActorTemplate], ActorTemplate],
    ) -> ActorTemplate:
        return await self._update_scoped(
            "template",
            q.TEMPLATES,
            ActorTemplate,
            ref,
            expected_version=expected_version,
            expected_uid=expected_uid,
            mutate=mutate,
        )

    async def delete_template(
        self,
        ref: TemplateRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> None:
        await self._delete_scoped(
            "template",
            q.TEMPLATES,
            ActorTemplate,
            ref,
            expected_version=expected_version,
            expected_uid=expected_uid,
        )

    async def create_tag(self, tag: Tag) -> Tag:
        return await self._create_scoped("tag", q.TAGS, tag, tag.ref)

    async def get_tag(self, ref: TagRef) -> Tag:
        return await self._get_scoped("tag", q.TAGS, Tag, ref)

    async def list_tags(self, atespace: str) -> list[Tag]:
        return await self._list_scoped(q.TAGS, Tag, atespace)

    async def update_tag(
        self,
        ref: TagRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Tag], Tag],
    ) -> Tag:
        return await self._update_scoped(
            "tag",
            q.TAGS,
            Tag,
            ref,
            expected_version=expected_version,
            expected_uid=expected_uid,
            mutate=mutate,
        )

    async def delete_tag(
        self,
        ref: TagRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> None:
        await self._delete_scoped(
            "tag",
            q.TAGS,
            Tag,
            ref,
            expected_version=expected_version,
            expected_uid=expected_uid,
        )

    # --- actors ---------------------------------------------------------------------

    async def create_actor(self, actor: Actor) -> Actor:
        stored = rules.stamp_new(actor, uid=self._new_uid(), now=self._clock())
        await self._insert_in_atespace(
            f"actor {actor.ref}",
            actor.ref.atespace,
            q.ACTOR_INSERT,
            actor.ref.atespace,
            actor.ref.name,
            stored.metadata.uid,
            1,
            stored.state.name,
            self._codec.dumps(stored),
        )
        return stored

    async def get_actor(self, ref: ActorRef) -> Actor:
        async with self._session() as s:
            actor = await self._read(
                s.conn,
                q.ACTOR_READ,
                ("actor", ref.atespace, ref.name),
                Actor,
                ref.atespace,
                ref.name,
            )
        if actor is None:
            raise NotFound(f"actor {ref} not found")
        return actor

    async def list_actors(
        self, atespace: str | None = None, *, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[Actor], str]:
        size = rules.page_size(page_size)
        after = rules.decode_page_token(page_token, atespace)
        async with self._session() as s:
            if atespace is None:
                start = after or ActorRef("", "")
                rows = await s.conn.fetch(q.ACTOR_PAGE_ALL, start.atespace, start.name, size + 1)
            else:
                async with s.conn.transaction(readonly=True):
                    await self._require_atespace(s.conn, atespace)
                    start_name = after.name if after is not None else ""
                    rows = await s.conn.fetch(q.ACTOR_PAGE_IN, atespace, start_name, size + 1)
        page: list[Actor] = [self._codec.loads(Actor, r["doc"]) for r in rows[:size]]
        token = rules.encode_page_token(atespace, page[-1].ref) if len(rows) > size else ""
        return page, token

    async def _actor_moved(self, conn: Any, ref: ActorRef, version: int, uid: str) -> Exception:
        now = await conn.fetchval(q.ACTOR_GET, ref.atespace, ref.name)
        meta = None if now is None else self._codec.loads(Actor, now).metadata
        return _moved(f"actor {ref}", meta, version, uid)

    async def _write_actor(self, conn: Any, stored: Actor, written: Actor) -> None:
        """Write ``written`` over exactly ``stored`` (its uid and version), or raise why not."""
        ref = stored.ref
        xmin = await conn.fetchval(
            q.ACTOR_UPDATE,
            ref.atespace,
            ref.name,
            stored.metadata.uid,
            stored.metadata.version,
            written.metadata.version,
            written.state.name,
            self._codec.dumps(written),
        )
        if xmin is None:
            raise await self._actor_moved(conn, ref, stored.metadata.version, stored.metadata.uid)
        self._known.put(("actor", ref.atespace, ref.name), xmin, written)

    async def update_actor(
        self,
        ref: ActorRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Actor], Actor],
    ) -> Actor:
        version, uid = rules.require_preconditions(f"actor {ref}", expected_version, expected_uid)
        async with self._session() as s:
            stored = await self._read(
                s.conn,
                q.ACTOR_READ,
                ("actor", ref.atespace, ref.name),
                Actor,
                ref.atespace,
                ref.name,
            )
            if stored is None:
                raise NotFound(f"actor {ref} not found")
            rules.check_preconditions(
                f"actor {ref}", stored.metadata, expected_version=version, expected_uid=uid
            )
            new: Actor = s.apply(mutate, stored)
            rules.check_same_ref("actor", stored.ref, new.ref)
            written = rules.stamp_update(stored, new, now=self._clock())
            await self._write_actor(s.conn, stored, written)
        return written

    async def delete_actor(
        self,
        ref: ActorRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> None:
        for _ in range(RETRIES):
            async with self._session() as s, s.conn.transaction():
                conn = s.conn
                doc = await conn.fetchval(q.ACTOR_GET, ref.atespace, ref.name)
                if doc is None:
                    raise NotFound(f"actor {ref} not found")
                seen: Actor = self._codec.loads(Actor, doc)
                binding = await self._binding(conn, seen.metadata.uid)
                # Lock order is worker, then actor: take the worker row first.
                worker = None
                if binding is not None:
                    worker = await self._lock_worker_or_none(conn, binding.worker)
                locked = await conn.fetchval(q.ACTOR_LOCK, ref.atespace, ref.name)
                if locked is None:
                    raise NotFound(f"actor {ref} not found")
                stored: Actor = self._codec.loads(Actor, locked)
                rules.check_preconditions(
                    f"actor {ref}",
                    stored.metadata,
                    expected_version=expected_version,
                    expected_uid=expected_uid,
                )
                if stored.state is not ActorState.DELETING:
                    raise FailedPrecondition(
                        f"actor {ref} is {stored.state.name}; only a DELETING actor can be deleted"
                    )
                current = await self._binding(conn, stored.metadata.uid, lock=True)
                if current != binding:
                    continue  # the binding moved between our reads: start over
                if binding is not None and not await self._unbind(conn, binding, worker):
                    continue
                await conn.execute(q.ACTOR_DELETE, ref.atespace, ref.name)
                self._known.drop(("actor", ref.atespace, ref.name))
                return
        raise Conflict(f"actor {ref} kept changing while being deleted, please retry")

    # --- workers --------------------------------------------------------------------

    async def _lock_worker_or_none(self, conn: Any, ref: WorkerRef) -> Worker | None:
        doc = await conn.fetchval(q.WORKER_LOCK, ref.name)
        if doc is None:
            return None
        worker: Worker = self._codec.loads(Worker, doc)
        return worker

    async def create_worker(self, worker: Worker) -> Worker:
        stored = rules.stamp_new(rules.fresh_worker(worker), uid=self._new_uid(), now=self._clock())
        async with self._session() as s:
            rows = await s.conn.fetch(
                q.WORKER_INSERT,
                stored.ref.name,
                stored.metadata.uid,
                1,
                stored.state.name,
                stored.node.name,
                stored.pool,
                self._codec.dumps(stored),
            )
            if not rows:
                raise AlreadyExists(f"worker {worker.ref} already exists")
            await self._events_written(s.conn, rows)
        return stored

    async def get_worker(self, ref: WorkerRef) -> Worker:
        async with self._session() as s:
            worker = await self._read(s.conn, q.WORKER_READ, ("worker", ref.name), Worker, ref.name)
        if worker is None:
            raise NotFound(f"worker {ref} not found")
        return worker

    async def list_workers(self) -> list[Worker]:
        async with self._session() as s:
            rows = await s.conn.fetch(q.WORKER_LIST)
        return [self._codec.loads(Worker, r["doc"]) for r in rows]

    async def _worker_moved(self, conn: Any, ref: WorkerRef, version: int, uid: str) -> Exception:
        now = await conn.fetchval(q.WORKER_GET, ref.name)
        meta = None if now is None else self._codec.loads(Worker, now).metadata
        return _moved(f"worker {ref}", meta, version, uid)

    async def update_worker(
        self,
        ref: WorkerRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Worker], Worker],
    ) -> Worker:
        version, uid = rules.require_preconditions(f"worker {ref}", expected_version, expected_uid)
        async with self._session() as s:
            doc = await s.conn.fetchval(q.WORKER_GET, ref.name)
            if doc is None:
                raise NotFound(f"worker {ref} not found")
            stored: Worker = self._codec.loads(Worker, doc)
            rules.check_preconditions(
                f"worker {ref}", stored.metadata, expected_version=version, expected_uid=uid
            )
            new: Worker = s.apply(mutate, stored)
            rules.check_worker_mutation(stored, new)
            written = rules.stamp_update(stored, new, now=self._clock())
            rows = await s.conn.fetch(
                q.WORKER_UPDATE,
                ref.name,
                uid,
                version,
                written.metadata.version,
                written.state.name,
                self._codec.dumps(written),
            )
            if not rows:
                raise await self._worker_moved(s.conn, ref, version, uid)
            await self._events_written(s.conn, rows)
        return written

    async def delete_worker(
        self,
        ref: WorkerRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> Worker:
        async with self._session() as s:
            for _ in range(RETRIES):
                doc = await s.conn.fetchval(q.WORKER_GET, ref.name)
                if doc is None:
                    raise NotFound(f"worker {ref} not found")
                stored: Worker = self._codec.loads(Worker, doc)
                rules.check_preconditions(
                    f"worker {ref}",
                    stored.metadata,
                    expected_version=expected_version,
                    expected_uid=expected_uid,
                )
                # Deletes exactly the record checked; if it moved meanwhile, check again.
                rows = await s.conn.fetch(
                    q.WORKER_DELETE, ref.name, stored.metadata.uid, stored.metadata.version
                )
                if rows:
                    await self._events_written(s.conn, rows)
                    return stored
        raise Conflict(f"worker {ref} kept changing while being deleted, please retry")

    @asynccontextmanager
    async def watch_workers(self) -> AsyncIterator[AsyncIterator[WorkerEvent]]:
        self._check_open()
        try:
            conn = await asyncpg.connect(self._dsn, command_timeout=self._command_timeout)
        except TRANSLATED as exc:
            raise translate(exc) from exc
        send, receive = anyio.create_memory_object_stream[str](WATCH_BUFFER)
        events = _PgWorkerEvents(conn, send, receive, self._codec)
        try:
            try:
                await conn.add_listener(q.WORKER_EVENTS_CHANNEL, events.on_notify)
            except TRANSLATED as exc:
                raise translate(exc) from exc
            conn.add_termination_listener(events.on_terminate)
            self._watches.add(events)
            if self._closed:
                events.end()
            with receive:
                yield events
        finally:
            self._watches.discard(events)
            events.end()
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(5),
            ):
                try:
                    await conn.close()
                except TRANSLATED:
                    conn.terminate()
            if not conn.is_closed():
                conn.terminate()

    # --- bindings -------------------------------------------------------------------

    async def _binding(
        self, conn: Any, actor_uid: str, *, lock: bool = False
    ) -> ActorBinding | None:
        doc = await conn.fetchval(q.BINDING_LOCK if lock else q.BINDING_GET, actor_uid)
        if doc is None:
            return None
        binding: ActorBinding = self._codec.loads(ActorBinding, doc)
        return binding

    async def _unbind(self, conn: Any, binding: ActorBinding, worker: Worker | None) -> bool:
        """Delete ``binding`` and unbook it from ``worker`` as read (the row locked, or its
        version re-checked by the write); False if the binding or worker moved."""
        if worker is None:
            # No worker row: the binding went with it (ON DELETE CASCADE).
            return False
        unbooked = rules.stamp_update(
            worker, rules.unbook(worker, binding.resources), now=self._clock()
        )
        rows = await conn.fetch(
            q.RELEASE_WRITE,
            binding.actor_uid,
            binding.worker.name,
            worker.metadata.version,
            unbooked.metadata.version,
            unbooked.state.name,
            self._codec.dumps(unbooked),
        )
        if not rows:
            return False
        await self._events_written(conn, rows)
        return True

    async def bind_actor(
        self,
        actor: ActorRef,
        *,
        expected_actor_version: int | None,
        expected_actor_uid: str | None,
        worker: WorkerRef,
        expected_worker_epoch: int,
        resources: Resources,
        mutate_actor: Callable[[Actor], Actor],
    ) -> BindResult:
        version, uid = rules.require_preconditions(
            f"actor {actor}", expected_actor_version, expected_actor_uid
        )
        async with self._session() as s, s.conn.transaction():
            conn = s.conn
            # The worker row stays locked until commit: its room is checked on it.
            row = await conn.fetchrow(q.BIND_LOAD, worker.name, actor.atespace, actor.name)
            if row["worker"] is None:
                raise NotFound(f"worker {worker} not found")
            if row["actor"] is None:
                raise NotFound(f"actor {actor} not found")
            stored_worker: Worker = self._codec.loads(Worker, row["worker"])
            actor_key = ("actor", actor.atespace, actor.name)
            stored_actor: Actor = self._known.get(
                actor_key, row["actor_uid"], row["actor_version"], row["actor_xmin"]
            ) or self._codec.loads(Actor, row["actor"])
            rules.check_preconditions(
                f"actor {actor}", stored_actor.metadata, expected_version=version, expected_uid=uid
            )
            existing: ActorBinding | None = (
                None if row["binding"] is None else self._codec.loads(ActorBinding, row["binding"])
            )
            rebind = rules.check_bind(
                stored_worker,
                existing,
                actor=actor,
                expected_worker_epoch=expected_worker_epoch,
                resources=resources,
            )
            new_actor: Actor = s.apply(mutate_actor, stored_actor)
            rules.check_same_ref("actor", stored_actor.ref, new_actor.ref)
            now = self._clock()
            written_actor = rules.stamp_update(stored_actor, new_actor, now=now)
            if rebind and existing is not None:
                await self._write_actor(conn, stored_actor, written_actor)
                return BindResult(actor=written_actor, worker=stored_worker, binding=existing)
            binding = rules.new_binding(actor, uid, worker, expected_worker_epoch, resources)
            written_worker = rules.stamp_update(
                stored_worker, rules.book(stored_worker, resources), now=now
            )
            try:
                rows = await conn.fetch(
                    q.BIND_WRITE,
                    actor.atespace,
                    actor.name,
                    uid,
                    version,
                    written_actor.metadata.version,
                    written_actor.state.name,
                    self._codec.dumps(written_actor),
                    worker.name,
                    self._codec.dumps(binding),
                    stored_worker.metadata.version,
                    written_worker.metadata.version,
                    written_worker.state.name,
                    self._codec.dumps(written_worker),
                )
            except asyncpg.UniqueViolationError as exc:
                # Another binding of this actor landed after ours was read.
                raise Conflict(CONFLICT_MESSAGE) from exc
            if not rows:
                # The worker is locked, so the actor moved since it was read.
                raise await self._actor_moved(conn, actor, version, uid)
            self._known.put(actor_key, rows[0]["actor_xmin"], written_actor)
            await self._events_written(conn, rows)
        return BindResult(actor=written_actor, worker=written_worker, binding=binding)

    async def release_actor(self, actor_uid: str) -> ActorBinding | None:
        # First optimistically (one read, then one write conditional on the worker
        # version read, no transaction); if the worker moved in between, again in a
        # transaction holding the worker's row lock.
        async with self._session() as s:
            row = await s.conn.fetchrow(q.RELEASE_LOAD, actor_uid)
            if row is None:
                return None
            binding: ActorBinding = self._codec.loads(ActorBinding, row["binding"])
            if await self._unbind(s.conn, binding, self._codec.loads(Worker, row["worker"])):
                return binding
            for _ in range(RETRIES):
                async with s.conn.transaction():
                    row = await s.conn.fetchrow(q.RELEASE_LOCK, actor_uid)
                    if row is None:
                        return None
                    binding = self._codec.loads(ActorBinding, row["binding"])
                    worker: Worker = self._codec.loads(Worker, row["worker"])
                    if await self._unbind(s.conn, binding, worker):
                        return binding
        raise Conflict(f"the binding of actor uid {actor_uid} kept moving, please retry")

    async def get_binding(self, actor_uid: str) -> ActorBinding | None:
        async with self._session() as s:
            return await self._binding(s.conn, actor_uid)

    async def list_bindings(self, worker: WorkerRef | None = None) -> list[ActorBinding]:
        async with self._session() as s:
            if worker is None:
                rows = await s.conn.fetch(q.BINDING_LIST_ALL)
            else:
                rows = await s.conn.fetch(q.BINDING_LIST_ON, worker.name)
        found: list[ActorBinding] = [self._codec.loads(ActorBinding, r["doc"]) for r in rows]
        return sorted(found, key=lambda b: (b.actor, b.actor_uid))

    # --- leases ---------------------------------------------------------------------

    async def acquire_lease(self, key: str, *, ttl: float) -> Lease:
        rules.check_ttl(ttl)
        token = self._new_uid()
        async with self._session() as s:
            expires_at = await s.conn.fetchval(q.LEASE_ACQUIRE, key, token, float(ttl))
        if expires_at is None:
            raise LeaseHeld(LEASE_HELD_MESSAGE)
        return Lease(key=key, token=token, expires_at=float(expires_at))

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        rules.check_ttl(ttl)
        async with self._session() as s:
            expires_at = await s.conn.fetchval(q.LEASE_RENEW, lease.key, lease.token, float(ttl))
            if expires_at is not None:
                return Lease(key=lease.key, token=lease.token, expires_at=float(expires_at))
            holder = await s.conn.fetchrow(q.LEASE_HOLDER, lease.key)
        if holder is not None and holder["alive"] and holder["token"] != lease.token:
            raise LeaseHeld(LEASE_HELD_MESSAGE)
        raise NotFound(f"lease {lease.key} is no longer held (released or expired)")

    async def release_lease(self, lease: Lease) -> None:
        async with self._session() as s:
            await s.conn.execute(q.LEASE_RELEASE, lease.key, lease.token)

    async def lease_alive(self, key: str) -> bool:
        async with self._session() as s:
            return bool(await s.conn.fetchval(q.LEASE_ALIVE, key))

    async def list_leases(self) -> list[Lease]:
        async with self._session() as s:
            await s.conn.execute(q.LEASE_PRUNE)
            rows = await s.conn.fetch(q.LEASE_LIST)
        return [
            Lease(key=r["key"], token=r["token"], expires_at=float(r["expires_at"])) for r in rows
        ]

    # --- administration -------------------------------------------------------------

    async def clear(self) -> None:
        async with self._session() as s, s.conn.transaction():
            rows = await s.conn.fetch(q.WORKER_LOCK_ALL)
            await s.conn.execute(q.CLEAR)
            self._known.clear()
            for row in rows:
                gone: Worker = self._load(Worker, row["doc"])
                await self._emit(
                    s.conn,
                    WorkerEventKind.DELETED,
                    gone.ref.name,
                    gone.metadata.version,
                    row["doc"],
                )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for events in tuple(self._watches):
            events.end()
        with anyio.CancelScope(shield=True):
            try:
                with anyio.fail_after(10):
                    await self._pool.close()
            except (TimeoutError, *TRANSLATED):
                self._pool.terminate()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class _PgWorkerEvents:
    """The iterator of one LISTEN connection: notification payloads in, events out.

    Notifications arrive in commit order. Each carries the event's record (``d``) unless
    the document was too big for a notification; then it only names the
    ``worker_events`` row (``s``), which is read back on this connection.
    """

    def __init__(
        self,
        conn: Any,
        send: MemoryObjectSendStream[str],
        receive: MemoryObjectReceiveStream[str],
        codec: Codec,
    ) -> None:
        self._conn = conn
        self._send = send
        self._receive = receive
        self._codec = codec
        self._pending: collections.deque[WorkerEvent] = collections.deque()
        self._lost = ""
        self._ended = False

    def on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            self._send.send_nowait(payload)
        except anyio.WouldBlock:
            self._fail("the worker watch fell behind and was dropped; resubscribe and relist")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    def on_terminate(self, _conn: object) -> None:
        if not self._ended:
            self._fail("the worker watch lost its database connection; resubscribe and relist")

    def _fail(self, reason: str) -> None:
        if not self._lost:
            self._lost = reason
        self._send.close()

    def end(self) -> None:
        """End the iteration (the store closed or the watch's scope ended)."""
        self._ended = True
        self._send.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> WorkerEvent:
        while not self._pending:
            try:
                payloads = [await self._receive.receive()]
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                if self._lost:
                    raise Unavailable(self._lost) from None
                raise StopAsyncIteration from None
            while True:
                try:
                    payloads.append(self._receive.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
            loaded = False
            try:
                await self._load(payloads)
                loaded = True
            except Unavailable as exc:
                self._fail(exc.description)
                raise
            finally:
                if not loaded:
                    # These payloads are gone: the watch must not go on as if they were not.
                    self._fail("the worker watch failed to read events; resubscribe and relist")
        return self._pending.popleft()

    async def _load(self, payloads: list[str]) -> None:
        notes: list[dict[str, Any]] = [json.loads(p) for p in payloads]
        rows: dict[int, Any] = {}
        by_ref = [int(n["s"]) for n in notes if "d" not in n]
        if by_ref:
            try:
                fetched = await self._conn.fetch(q.WORKER_EVENTS_FETCH, by_ref)
            except TRANSLATED as exc:
                raise Unavailable(f"the worker watch failed to read events: {exc}") from exc
            rows = {r["seq"]: r for r in fetched}
        events: list[WorkerEvent] = []
        for note in notes:
            if "d" in note:
                kind, doc = note["k"], note["d"]
            else:
                row = rows.get(int(note["s"]))
                if row is None:
                    raise Unavailable(
                        "the worker watch fell behind the event retention; resubscribe and relist"
                    )
                kind, doc = row["kind"], json.loads(row["doc"])
            worker: Worker = self._codec.from_json(Worker, doc)
            events.append(WorkerEvent(kind=WorkerEventKind[kind], worker=worker))
        self._pending.extend(events)
