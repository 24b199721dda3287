"""The PostgreSQL store: asyncpg pool, JSONB documents, row locks for every read-modify-write."""

from __future__ import annotations

import collections
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, Final, Self, TypeVar

import anyio
import asyncpg
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from substrate.adapters import _store_rules as rules
from substrate.adapters.postgres import queries as q
from substrate.adapters.postgres.codec import Codec
from substrate.adapters.postgres.errors import TRANSLATED, translate
from substrate.adapters.postgres.migrate import migrate
from substrate.core.ids import ActorRef, TagRef, TemplateRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorBinding,
    ActorState,
    ActorTemplate,
    Atespace,
    Resources,
    Tag,
    Worker,
)
from substrate.core.ports import (
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


def _uuid4() -> str:
    return str(uuid.uuid4())


class _Tx:
    """One transaction's connection, remembering an exception raised by user code."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.user_error: BaseException | None = None

    def apply(self, mutate: Callable[[Any], Any], record: Any) -> Any:
        try:
            return mutate(record)
        except BaseException as exc:
            self.user_error = exc
            raise


class PostgresStore:
    """A :class:`~substrate.core.ports.Store` on PostgreSQL (asyncpg).

    Create with :meth:`connect` (pool plus migrations). Record times come from ``clock``
    and uids from ``uid_factory``; leases use the database clock (``clock_timestamp()``),
    so every ateapi replica agrees on expiry. Read-modify-write operations lock the rows
    they change (``SELECT ... FOR UPDATE``), always a worker before an actor.
    """

    def __init__(
        self,
        pool: Any,
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

        Raises :class:`Unavailable` if the server cannot be reached.
        """
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                command_timeout=command_timeout,
                timeout=connect_timeout,
            )
        except TRANSLATED as exc:
            raise translate(exc) from exc
        store = cls(
            pool,
            dsn=dsn,
            clock=clock,
            uid_factory=uid_factory,
            command_timeout=command_timeout,
        )
        if run_migrations:
            try:
                async with store._conn() as conn:
                    await migrate(conn)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await store.close()
                raise
        return store

    # --- plumbing -------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable(STORE_CLOSED_MESSAGE)

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[Any]:
        """A pooled connection outside a transaction, errors translated."""
        self._check_open()
        try:
            async with self._pool.acquire() as conn:
                yield conn
        except TRANSLATED as exc:
            raise translate(exc) from exc

    @contextlib.asynccontextmanager
    async def _tx(self) -> AsyncIterator[_Tx]:
        """A transaction; driver errors become substrate errors, ``mutate``'s propagate."""
        self._check_open()
        tx: _Tx | None = None
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                tx = _Tx(conn)
                yield tx
        except TRANSLATED as exc:
            if tx is not None and exc is tx.user_error:
                raise
            raise translate(exc) from exc

    def _load(self, cls: type[Any], text: str) -> Any:
        return self._codec.loads(cls, text)

    async def _emit(self, conn: Any, kind: WorkerEventKind, worker: Worker) -> None:
        row = await conn.fetchrow(
            q.WORKER_EVENT_EMIT,
            kind.name,
            worker.ref.name,
            worker.metadata.version,
            self._codec.dumps(worker),
        )
        if row["seq"] % PRUNE_EVERY == 0:
            await conn.execute(q.WORKER_EVENTS_PRUNE, EVENT_RETENTION)

    # --- atespaces ------------------------------------------------------------------

    async def create_atespace(self, atespace: Atespace) -> Atespace:
        stored = rules.stamp_new(atespace, uid=self._new_uid(), now=self._clock())
        async with self._tx() as tx:
            inserted = await tx.conn.fetchval(
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
        async with self._conn() as conn:
            doc = await conn.fetchval(q.ATESPACE_GET, name)
        if doc is None:
            raise NotFound(f"atespace {name} not found")
        return self._codec.loads(Atespace, doc)

    async def list_atespaces(self) -> list[Atespace]:
        async with self._conn() as conn:
            rows = await conn.fetch(q.ATESPACE_LIST)
        return [self._codec.loads(Atespace, r["doc"]) for r in rows]

    async def delete_atespace(self, name: str) -> None:
        async with self._tx() as tx:
            if await tx.conn.fetchval(q.ATESPACE_LOCK, name) is None:
                raise NotFound(f"atespace {name} not found")
            contents = await tx.conn.fetchrow(q.ATESPACE_CONTENTS, name)
            remaining = [kind for kind in ("actors", "tags", "templates") if contents[kind]]
            if remaining:
                raise FailedPrecondition(
                    f"atespace {name} is not empty: {', '.join(remaining)} remain in it"
                )
            await tx.conn.execute(q.ATESPACE_DELETE, name)

    async def _share_atespace(self, tx: _Tx, name: str, what: str) -> None:
        if await tx.conn.fetchval(q.ATESPACE_SHARE, name) is None:
            raise FailedPrecondition(f"cannot create {what}: atespace {name} does not exist")

    async def _require_atespace(self, conn: Any, name: str) -> None:
        if not await conn.fetchval(q.ATESPACE_EXISTS, name):
            raise NotFound(f"atespace {name} not found")

    # --- templates and tags (same table shape) --------------------------------------

    async def _create_scoped(
        self, what: str, sql: q.ScopedQueries, record: Scoped, ref: TemplateRef | TagRef
    ) -> Scoped:
        stored = rules.stamp_new(record, uid=self._new_uid(), now=self._clock())
        async with self._tx() as tx:
            await self._share_atespace(tx, ref.atespace, f"{what} {ref}")
            inserted = await tx.conn.fetchval(
                sql.insert,
                ref.atespace,
                ref.name,
                stored.metadata.uid,
                1,
                self._codec.dumps(stored),
            )
            if inserted is None:
                raise AlreadyExists(f"{what} {ref} already exists")
        return stored

    async def _get_scoped(
        self, what: str, sql: q.ScopedQueries, cls: type[Scoped], ref: TemplateRef | TagRef
    ) -> Scoped:
        async with self._conn() as conn:
            doc = await conn.fetchval(sql.get, ref.atespace, ref.name)
        if doc is None:
            raise NotFound(f"{what} {ref} not found")
        loaded: Scoped = self._codec.loads(cls, doc)
        return loaded

    async def _list_scoped(
        self, sql: q.ScopedQueries, cls: type[Scoped], atespace: str
    ) -> list[Scoped]:
        async with self._conn() as conn, conn.transaction(readonly=True):
            await self._require_atespace(conn, atespace)
            rows = await conn.fetch(sql.list_in, atespace)
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
        rules.require_preconditions(f"{what} {ref}", expected_version, expected_uid)
        async with self._tx() as tx:
            doc = await tx.conn.fetchval(sql.lock, ref.atespace, ref.name)
            if doc is None:
                raise NotFound(f"{what} {ref} not found")
            stored: Scoped = self._codec.loads(cls, doc)
            rules.check_preconditions(
                f"{what} {ref}",
                stored.metadata,
                expected_version=expected_version,
                expected_uid=expected_uid,
            )
            new: Scoped = tx.apply(mutate, stored)
            rules.check_same_ref(what, stored.ref, new.ref)
            written = rules.stamp_update(stored, new, now=self._clock())
            await tx.conn.execute(
                sql.update,
                ref.atespace,
                ref.name,
                written.metadata.version,
                self._codec.dumps(written),
            )
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
        async with self._tx() as tx:
            doc = await tx.conn.fetchval(sql.lock, ref.atespace, ref.name)
            if doc is None:
                raise NotFound(f"{what} {ref} not found")
            stored: Scoped = self._codec.loads(cls, doc)
            rules.check_preconditions(
                f"{what} {ref}",
                stored.metadata,
                expected_version=expected_version,
                expected_uid=expected_uid,
            )
            await tx.conn.execute(sql.delete, ref.atespace, ref.name)

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

    async def _write_actor(self, tx: _Tx, actor: Actor) -> None:
        await tx.conn.execute(
            q.ACTOR_UPDATE,
            actor.ref.atespace,
            actor.ref.name,
            actor.metadata.version,
            actor.state.name,
            self._codec.dumps(actor),
        )

    async def _lock_actor(self, tx: _Tx, ref: ActorRef) -> Actor:
        doc = await tx.conn.fetchval(q.ACTOR_LOCK, ref.atespace, ref.name)
        if doc is None:
            raise NotFound(f"actor {ref} not found")
        actor: Actor = self._codec.loads(Actor, doc)
        return actor

    async def create_actor(self, actor: Actor) -> Actor:
        stored = rules.stamp_new(actor, uid=self._new_uid(), now=self._clock())
        async with self._tx() as tx:
            await self._share_atespace(tx, actor.ref.atespace, f"actor {actor.ref}")
            inserted = await tx.conn.fetchval(
                q.ACTOR_INSERT,
                actor.ref.atespace,
                actor.ref.name,
                stored.metadata.uid,
                1,
                stored.state.name,
                self._codec.dumps(stored),
            )
            if inserted is None:
                raise AlreadyExists(f"actor {actor.ref} already exists")
        return stored

    async def get_actor(self, ref: ActorRef) -> Actor:
        async with self._conn() as conn:
            doc = await conn.fetchval(q.ACTOR_GET, ref.atespace, ref.name)
        if doc is None:
            raise NotFound(f"actor {ref} not found")
        actor: Actor = self._codec.loads(Actor, doc)
        return actor

    async def list_actors(
        self, atespace: str | None = None, *, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[Actor], str]:
        size = rules.page_size(page_size)
        after = rules.decode_page_token(page_token, atespace)
        async with self._conn() as conn:
            if atespace is None:
                start = after or ActorRef("", "")
                rows = await conn.fetch(q.ACTOR_PAGE_ALL, start.atespace, start.name, size + 1)
            else:
                async with conn.transaction(readonly=True):
                    await self._require_atespace(conn, atespace)
                    start_name = after.name if after is not None else ""
                    rows = await conn.fetch(q.ACTOR_PAGE_IN, atespace, start_name, size + 1)
        page: list[Actor] = [self._codec.loads(Actor, r["doc"]) for r in rows[:size]]
        token = rules.encode_page_token(atespace, page[-1].ref) if len(rows) > size else ""
        return page, token

    async def update_actor(
        self,
        ref: ActorRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Actor], Actor],
    ) -> Actor:
        rules.require_preconditions(f"actor {ref}", expected_version, expected_uid)
        async with self._tx() as tx:
            stored = await self._lock_actor(tx, ref)
            rules.check_preconditions(
                f"actor {ref}",
                stored.metadata,
                expected_version=expected_version,
                expected_uid=expected_uid,
            )
            new: Actor = tx.apply(mutate, stored)
            rules.check_same_ref("actor", stored.ref, new.ref)
            written = rules.stamp_update(stored, new, now=self._clock())
            await self._write_actor(tx, written)
        return written

    async def delete_actor(
        self,
        ref: ActorRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> None:
        for _ in range(RETRIES):
            async with self._tx() as tx:
                doc = await tx.conn.fetchval(q.ACTOR_GET, ref.atespace, ref.name)
                if doc is None:
                    raise NotFound(f"actor {ref} not found")
                seen: Actor = self._codec.loads(Actor, doc)
                binding = await self._binding(tx.conn, seen.metadata.uid)
                # Lock order is worker, then actor: take the worker row first.
                worker = None
                if binding is not None:
                    worker = await self._lock_worker_or_none(tx, binding.worker)
                stored = await self._lock_actor(tx, ref)
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
                current = await self._binding(tx.conn, stored.metadata.uid, lock=True)
                if current != binding:
                    continue  # the binding moved between our reads: start over
                if binding is not None:
                    await self._unbind(tx, binding, worker)
                await tx.conn.execute(q.ACTOR_DELETE, ref.atespace, ref.name)
                return
        raise Conflict(f"actor {ref} kept changing while being deleted, please retry")

    # --- workers --------------------------------------------------------------------

    async def _lock_worker_or_none(self, tx: _Tx, ref: WorkerRef) -> Worker | None:
        doc = await tx.conn.fetchval(q.WORKER_LOCK, ref.name)
        if doc is None:
            return None
        worker: Worker = self._codec.loads(Worker, doc)
        return worker

    async def _lock_worker(self, tx: _Tx, ref: WorkerRef) -> Worker:
        worker = await self._lock_worker_or_none(tx, ref)
        if worker is None:
            raise NotFound(f"worker {ref} not found")
        return worker

    async def _write_worker(self, tx: _Tx, worker: Worker) -> None:
        await tx.conn.execute(
            q.WORKER_UPDATE,
            worker.ref.name,
            worker.metadata.version,
            worker.state.name,
            self._codec.dumps(worker),
        )
        await self._emit(tx.conn, WorkerEventKind.UPDATED, worker)

    async def create_worker(self, worker: Worker) -> Worker:
        stored = rules.stamp_new(rules.fresh_worker(worker), uid=self._new_uid(), now=self._clock())
        async with self._tx() as tx:
            inserted = await tx.conn.fetchval(
                q.WORKER_INSERT,
                stored.ref.name,
                stored.metadata.uid,
                1,
                stored.state.name,
                stored.node.name,
                stored.pool,
                self._codec.dumps(stored),
            )
            if inserted is None:
                raise AlreadyExists(f"worker {worker.ref} already exists")
            await self._emit(tx.conn, WorkerEventKind.CREATED, stored)
        return stored

    async def get_worker(self, ref: WorkerRef) -> Worker:
        async with self._conn() as conn:
            doc = await conn.fetchval(q.WORKER_GET, ref.name)
        if doc is None:
            raise NotFound(f"worker {ref} not found")
        worker: Worker = self._codec.loads(Worker, doc)
        return worker

    async def list_workers(self) -> list[Worker]:
        async with self._conn() as conn:
            rows = await conn.fetch(q.WORKER_LIST)
        return [self._codec.loads(Worker, r["doc"]) for r in rows]

    async def update_worker(
        self,
        ref: WorkerRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Worker], Worker],
    ) -> Worker:
        rules.require_preconditions(f"worker {ref}", expected_version, expected_uid)
        async with self._tx() as tx:
            stored = await self._lock_worker(tx, ref)
            rules.check_preconditions(
                f"worker {ref}",
                stored.metadata,
                expected_version=expected_version,
                expected_uid=expected_uid,
            )
            new: Worker = tx.apply(mutate, stored)
            rules.check_worker_mutation(stored, new)
            written = rules.stamp_update(stored, new, now=self._clock())
            await self._write_worker(tx, written)
        return written

    async def delete_worker(
        self,
        ref: WorkerRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> Worker:
        async with self._tx() as tx:
            stored = await self._lock_worker(tx, ref)
            rules.check_preconditions(
                f"worker {ref}",
                stored.metadata,
                expected_version=expected_version,
                expected_uid=expected_uid,
            )
            await tx.conn.execute(q.BINDING_DELETE_ON, ref.name)
            await tx.conn.execute(q.WORKER_DELETE, ref.name)
            await self._emit(tx.conn, WorkerEventKind.DELETED, stored)
        return stored

    @contextlib.asynccontextmanager
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
                contextlib.suppress(*TRANSLATED),
            ):
                await conn.close()
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

    async def _unbind(self, tx: _Tx, binding: ActorBinding, worker: Worker | None) -> bool:
        """Delete ``binding`` (its worker row already locked); False if it was gone."""
        deleted = await tx.conn.fetchval(q.BINDING_DELETE, binding.actor_uid, binding.worker.name)
        if deleted is None:
            return False
        if worker is not None:
            unbooked = rules.unbook(worker, binding.resources)
            await self._write_worker(tx, rules.stamp_update(worker, unbooked, now=self._clock()))
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
        rules.require_preconditions(f"actor {actor}", expected_actor_version, expected_actor_uid)
        async with self._tx() as tx:
            stored_worker = await self._lock_worker(tx, worker)
            stored_actor = await self._lock_actor(tx, actor)
            rules.check_preconditions(
                f"actor {actor}",
                stored_actor.metadata,
                expected_version=expected_actor_version,
                expected_uid=expected_actor_uid,
            )
            uid = stored_actor.metadata.uid
            existing = await self._binding(tx.conn, uid, lock=True)
            rebind = rules.check_bind(
                stored_worker,
                existing,
                actor=actor,
                expected_worker_epoch=expected_worker_epoch,
                resources=resources,
            )
            new_actor: Actor = tx.apply(mutate_actor, stored_actor)
            rules.check_same_ref("actor", stored_actor.ref, new_actor.ref)
            now = self._clock()
            written_actor = rules.stamp_update(stored_actor, new_actor, now=now)
            await self._write_actor(tx, written_actor)
            if rebind and existing is not None:
                return BindResult(actor=written_actor, worker=stored_worker, binding=existing)
            binding = rules.new_binding(actor, uid, worker, expected_worker_epoch, resources)
            await tx.conn.execute(q.BINDING_INSERT, uid, worker.name, self._codec.dumps(binding))
            written_worker = rules.stamp_update(
                stored_worker, rules.book(stored_worker, resources), now=now
            )
            await self._write_worker(tx, written_worker)
        return BindResult(actor=written_actor, worker=written_worker, binding=binding)

    async def release_actor(self, actor_uid: str) -> ActorBinding | None:
        for _ in range(RETRIES):
            async with self._tx() as tx:
                binding = await self._binding(tx.conn, actor_uid)
                if binding is None:
                    return None
                worker = await self._lock_worker_or_none(tx, binding.worker)
                if await self._unbind(tx, binding, worker):
                    return binding
        raise Conflict(f"the binding of actor uid {actor_uid} kept moving, please retry")

    async def get_binding(self, actor_uid: str) -> ActorBinding | None:
        async with self._conn() as conn:
            return await self._binding(conn, actor_uid)

    async def list_bindings(self, worker: WorkerRef | None = None) -> list[ActorBinding]:
        async with self._conn() as conn:
            if worker is None:
                rows = await conn.fetch(q.BINDING_LIST_ALL)
            else:
                rows = await conn.fetch(q.BINDING_LIST_ON, worker.name)
        found: list[ActorBinding] = [self._codec.loads(ActorBinding, r["doc"]) for r in rows]
        return sorted(found, key=lambda b: (b.actor, b.actor_uid))

    # --- leases ---------------------------------------------------------------------

    async def acquire_lease(self, key: str, *, ttl: float) -> Lease:
        rules.check_ttl(ttl)
        token = self._new_uid()
        async with self._conn() as conn:
            expires_at = await conn.fetchval(q.LEASE_ACQUIRE, key, token, float(ttl))
        if expires_at is None:
            raise LeaseHeld(LEASE_HELD_MESSAGE)
        return Lease(key=key, token=token, expires_at=float(expires_at))

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        rules.check_ttl(ttl)
        async with self._conn() as conn:
            expires_at = await conn.fetchval(q.LEASE_RENEW, lease.key, lease.token, float(ttl))
            if expires_at is not None:
                return Lease(key=lease.key, token=lease.token, expires_at=float(expires_at))
            holder = await conn.fetchrow(q.LEASE_HOLDER, lease.key)
        if holder is not None and holder["alive"] and holder["token"] != lease.token:
            raise LeaseHeld(LEASE_HELD_MESSAGE)
        raise NotFound(f"lease {lease.key} is no longer held (released or expired)")

    async def release_lease(self, lease: Lease) -> None:
        async with self._conn() as conn:
            await conn.execute(q.LEASE_RELEASE, lease.key, lease.token)

    async def lease_alive(self, key: str) -> bool:
        async with self._conn() as conn:
            return bool(await conn.fetchval(q.LEASE_ALIVE, key))

    async def list_leases(self) -> list[Lease]:
        async with self._conn() as conn:
            await conn.execute(q.LEASE_PRUNE)
            rows = await conn.fetch(q.LEASE_LIST)
        return [
            Lease(key=r["key"], token=r["token"], expires_at=float(r["expires_at"])) for r in rows
        ]

    # --- administration -------------------------------------------------------------

    async def clear(self) -> None:
        async with self._tx() as tx:
            rows = await tx.conn.fetch(q.WORKER_LOCK_ALL)
            await tx.conn.execute(q.CLEAR)
            for row in rows:
                await self._emit(tx.conn, WorkerEventKind.DELETED, self._load(Worker, row["doc"]))

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

    Notifications arrive in commit order; each names the ``worker_events`` row that
    holds the record, which is read back on the same connection.
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

    def on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            self._send.send_nowait(payload)
        except anyio.WouldBlock:
            self._fail("the worker watch fell behind and was dropped; resubscribe and relist")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    def on_terminate(self, _conn: object) -> None:
        self._fail("the worker watch lost its database connection; resubscribe and relist")

    def _fail(self, reason: str) -> None:
        if not self._lost:
            self._lost = reason
        self._send.close()

    def end(self) -> None:
        """End the iteration (the store closed or the watch's scope ended)."""
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
            await self._load(payloads)
        return self._pending.popleft()

    async def _load(self, payloads: list[str]) -> None:
        seqs = [int(json.loads(p)["s"]) for p in payloads]
        try:
            rows = await self._conn.fetch(q.WORKER_EVENTS_FETCH, seqs)
        except TRANSLATED as exc:
            raise Unavailable(f"the worker watch failed to read events: {exc}") from exc
        found = {r["seq"]: r for r in rows}
        for seq in seqs:
            row = found.get(seq)
            if row is None:
                raise Unavailable(
                    "the worker watch fell behind the event retention; resubscribe and relist"
                )
            self._pending.append(
                WorkerEvent(
                    kind=WorkerEventKind[row["kind"]],
                    worker=self._codec.loads(Worker, row["doc"]),
                )
            )
