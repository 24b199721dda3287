"""The in-memory store: a synchronous state core (reference semantics) and its async facade."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, MutableMapping
from types import TracebackType
from typing import Final, Self, TypeVar

import anyio
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from substrate.adapters import _store_rules as rules
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
    FailedPrecondition,
    LeaseHeld,
    NotFound,
    Unavailable,
)

DEFAULT_WATCH_BUFFER: Final = 1024
"""Events a watcher may fall behind before its subscription is dropped (Unavailable)."""

K = TypeVar("K")
Refd = TypeVar("Refd", ActorTemplate, Actor, Tag, Worker)
Scoped = TypeVar("Scoped", ActorTemplate, Actor, Tag)


def _uuid4() -> str:
    return str(uuid.uuid4())


class MemoryStoreState:
    """The whole store as plain dictionaries; every method is one atomic step.

    Synchronous and free of I/O so that a simulator can drive it directly; the async
    :class:`MemoryStore` wraps it. Worker events go to the callbacks registered with
    :meth:`subscribe`, synchronously, in commit order.
    """

    def __init__(
        self, *, clock: Callable[[], float], uid_factory: Callable[[], str] = _uuid4
    ) -> None:
        self._clock = clock
        self._new_uid = uid_factory
        self._atespaces: dict[str, Atespace] = {}
        self._templates: dict[TemplateRef, ActorTemplate] = {}
        self._actors: dict[ActorRef, Actor] = {}
        self._tags: dict[TagRef, Tag] = {}
        self._workers: dict[WorkerRef, Worker] = {}
        self._bindings: dict[str, ActorBinding] = {}
        self._leases: dict[str, Lease] = {}
        self._listeners: list[Callable[[WorkerEvent], None]] = []

    # --- events ---------------------------------------------------------------------

    def subscribe(self, listener: Callable[[WorkerEvent], None]) -> Callable[[], None]:
        """Call ``listener`` with every later worker event; returns the unsubscribe."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return unsubscribe

    def _emit(self, kind: WorkerEventKind, worker: Worker) -> None:
        event = WorkerEvent(kind=kind, worker=worker)
        for listener in tuple(self._listeners):
            listener(event)

    # --- generic helpers ------------------------------------------------------------

    def _require_atespace(self, name: str, what: str) -> None:
        if name not in self._atespaces:
            raise FailedPrecondition(f"cannot create {what}: atespace {name} does not exist")

    def _scoped_list(self, atespace: str, table: MutableMapping[K, Scoped]) -> list[Scoped]:
        if atespace not in self._atespaces:
            raise NotFound(f"atespace {atespace} not found")
        found = [r for r in table.values() if r.ref.atespace == atespace]
        return sorted(found, key=lambda r: r.ref.name)

    def _get(self, what: str, table: MutableMapping[K, Refd], key: K) -> Refd:
        try:
            return table[key]
        except KeyError:
            raise NotFound(f"{what} {key} not found") from None

    def _update(
        self,
        what: str,
        table: MutableMapping[K, Refd],
        key: K,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Refd], Refd],
        check: Callable[[Refd, Refd], None] | None = None,
    ) -> Refd:
        rules.require_preconditions(f"{what} {key}", expected_version, expected_uid)
        stored = self._get(what, table, key)
        rules.check_preconditions(
            f"{what} {key}",
            stored.metadata,
            expected_version=expected_version,
            expected_uid=expected_uid,
        )
        new = mutate(stored)
        rules.check_same_ref(what, stored.ref, new.ref)
        if check is not None:
            check(stored, new)
        written = rules.stamp_update(stored, new, now=self._clock())
        table[key] = written
        return written

    def _delete(
        self,
        what: str,
        table: MutableMapping[K, Refd],
        key: K,
        *,
        expected_version: int | None,
        expected_uid: str | None,
    ) -> Refd:
        stored = self._get(what, table, key)
        rules.check_preconditions(
            f"{what} {key}",
            stored.metadata,
            expected_version=expected_version,
            expected_uid=expected_uid,
        )
        return stored

    # --- atespaces ------------------------------------------------------------------

    def create_atespace(self, atespace: Atespace) -> Atespace:
        if atespace.name in self._atespaces:
            raise AlreadyExists(f"atespace {atespace.name} already exists")
        stored = rules.stamp_new(atespace, uid=self._new_uid(), now=self._clock())
        self._atespaces[atespace.name] = stored
        return stored

    def get_atespace(self, name: str) -> Atespace:
        try:
            return self._atespaces[name]
        except KeyError:
            raise NotFound(f"atespace {name} not found") from None

    def list_atespaces(self) -> list[Atespace]:
        return [self._atespaces[n] for n in sorted(self._atespaces)]

    def delete_atespace(self, name: str) -> None:
        self.get_atespace(name)
        remaining = [
            kind
            for kind, refs in (
                ("actors", self._actors),
                ("tags", self._tags),
                ("templates", self._templates),
            )
            if any(ref.atespace == name for ref in refs)
        ]
        if remaining:
            raise FailedPrecondition(
                f"atespace {name} is not empty: {', '.join(remaining)} remain in it"
            )
        del self._atespaces[name]

    # --- templates ------------------------------------------------------------------

    def create_template(self, template: ActorTemplate) -> ActorTemplate:
        self._require_atespace(template.ref.atespace, f"template {template.ref}")
        if template.ref in self._templates:
            raise AlreadyExists(f"template {template.ref} already exists")
        stored = rules.stamp_new(template, uid=self._new_uid(), now=self._clock())
        self._templates[template.ref] = stored
        return stored

    def get_template(self, ref: TemplateRef) -> ActorTemplate:
        return self._get("template", self._templates, ref)

    def list_templates(self, atespace: str) -> list[ActorTemplate]:
        return self._scoped_list(atespace, self._templates)

    def update_template(
        self,
        ref: TemplateRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[ActorTemplate], ActorTemplate],
    ) -> ActorTemplate:
        return self._update(
            "template",
            self._templates,
            ref,
            expected_version=expected_version,
            expected_uid=expected_uid,
            mutate=mutate,
        )

    def delete_template(
        self,
        ref: TemplateRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> None:
        self._delete(
            "template",
            self._templates,
            ref,
            expected_version=expected_version,
            expected_uid=expected_uid,
        )
        del self._templates[ref]

    # --- actors ---------------------------------------------------------------------

    def create_actor(self, actor: Actor) -> Actor:
        self._require_atespace(actor.ref.atespace, f"actor {actor.ref}")
        if actor.ref in self._actors:
            raise AlreadyExists(f"actor {actor.ref} already exists")
        stored = rules.stamp_new(actor, uid=self._new_uid(), now=self._clock())
        self._actors[actor.ref] = stored
        return stored

    def get_actor(self, ref: ActorRef) -> Actor:
        return self._get("actor", self._actors, ref)

    def list_actors(
        self, atespace: str | None = None, *, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[Actor], str]:
        size = rules.page_size(page_size)
        after = rules.decode_page_token(page_token, atespace)
        if atespace is not None and atespace not in self._atespaces:
            raise NotFound(f"atespace {atespace} not found")
        refs = sorted(
            ref
            for ref in self._actors
            if (atespace is None or ref.atespace == atespace) and (after is None or ref > after)
        )
        page = [self._actors[ref] for ref in refs[:size]]
        token = rules.encode_page_token(atespace, page[-1].ref) if len(refs) > size else ""
        return page, token

    def update_actor(
        self,
        ref: ActorRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Actor], Actor],
    ) -> Actor:
        return self._update(
            "actor",
            self._actors,
            ref,
            expected_version=expected_version,
            expected_uid=expected_uid,
            mutate=mutate,
        )

    def delete_actor(
        self,
        ref: ActorRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> None:
        stored = self._delete(
            "actor",
            self._actors,
            ref,
            expected_version=expected_version,
            expected_uid=expected_uid,
        )
        if stored.state is not ActorState.DELETING:
            raise FailedPrecondition(
                f"actor {ref} is {stored.state.name}; only a DELETING actor can be deleted"
            )
        self.release_actor(stored.metadata.uid)
        del self._actors[ref]

    # --- tags -----------------------------------------------------------------------

    def create_tag(self, tag: Tag) -> Tag:
        self._require_atespace(tag.ref.atespace, f"tag {tag.ref}")
        if tag.ref in self._tags:
            raise AlreadyExists(f"tag {tag.ref} already exists")
        stored = rules.stamp_new(tag, uid=self._new_uid(), now=self._clock())
        self._tags[tag.ref] = stored
        return stored

    def get_tag(self, ref: TagRef) -> Tag:
        return self._get("tag", self._tags, ref)

    def list_tags(self, atespace: str) -> list[Tag]:
        return self._scoped_list(atespace, self._tags)

    def update_tag(
        self,
        ref: TagRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Tag], Tag],
    ) -> Tag:
        return self._update(
            "tag",
            self._tags,
            ref,
            expected_version=expected_version,
            expected_uid=expected_uid,
            mutate=mutate,
        )

    def delete_tag(
        self,
        ref: TagRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> None:
        self._delete(
            "tag", self._tags, ref, expected_version=expected_version, expected_uid=expected_uid
        )
        del self._tags[ref]

    # --- workers --------------------------------------------------------------------

    def create_worker(self, worker: Worker) -> Worker:
        if worker.ref in self._workers:
            raise AlreadyExists(f"worker {worker.ref} already exists")
        stored = rules.stamp_new(rules.fresh_worker(worker), uid=self._new_uid(), now=self._clock())
        self._workers[worker.ref] = stored
        self._emit(WorkerEventKind.CREATED, stored)
        return stored

    def get_worker(self, ref: WorkerRef) -> Worker:
        return self._get("worker", self._workers, ref)

    def list_workers(self) -> list[Worker]:
        return [self._workers[ref] for ref in sorted(self._workers)]

    def update_worker(
        self,
        ref: WorkerRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Worker], Worker],
    ) -> Worker:
        written = self._update(
            "worker",
            self._workers,
            ref,
            expected_version=expected_version,
            expected_uid=expected_uid,
            mutate=mutate,
            check=rules.check_worker_mutation,
        )
        self._emit(WorkerEventKind.UPDATED, written)
        return written

    def delete_worker(
        self,
        ref: WorkerRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> Worker:
        stored = self._delete(
            "worker",
            self._workers,
            ref,
            expected_version=expected_version,
            expected_uid=expected_uid,
        )
        for uid in [u for u, b in self._bindings.items() if b.worker == ref]:
            del self._bindings[uid]
        del self._workers[ref]
        self._emit(WorkerEventKind.DELETED, stored)
        return stored

    # --- bindings -------------------------------------------------------------------

    def bind_actor(
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
        stored_worker = self.get_worker(worker)
        stored_actor = self.get_actor(actor)
        rules.check_preconditions(
            f"actor {actor}",
            stored_actor.metadata,
            expected_version=expected_actor_version,
            expected_uid=expected_actor_uid,
        )
        uid = stored_actor.metadata.uid
        existing = self._bindings.get(uid)
        rebind = rules.check_bind(
            stored_worker,
            existing,
            actor=actor,
            expected_worker_epoch=expected_worker_epoch,
            resources=resources,
        )
        new_actor = mutate_actor(stored_actor)
        rules.check_same_ref("actor", stored_actor.ref, new_actor.ref)
        now = self._clock()
        written_actor = rules.stamp_update(stored_actor, new_actor, now=now)
        if rebind and existing is not None:
            binding = existing
            written_worker = stored_worker
        else:
            binding = rules.new_binding(actor, uid, worker, expected_worker_epoch, resources)
            written_worker = rules.stamp_update(
                stored_worker, rules.book(stored_worker, resources), now=now
            )
        self._actors[actor] = written_actor
        if not rebind:
            self._bindings[uid] = binding
            self._workers[worker] = written_worker
            self._emit(WorkerEventKind.UPDATED, written_worker)
        return BindResult(actor=written_actor, worker=written_worker, binding=binding)

    def release_actor(self, actor_uid: str) -> ActorBinding | None:
        binding = self._bindings.pop(actor_uid, None)
        if binding is None:
            return None
        stored = self._workers.get(binding.worker)
        if stored is not None:
            written = rules.stamp_update(
                stored, rules.unbook(stored, binding.resources), now=self._clock()
            )
            self._workers[binding.worker] = written
            self._emit(WorkerEventKind.UPDATED, written)
        return binding

    def get_binding(self, actor_uid: str) -> ActorBinding | None:
        return self._bindings.get(actor_uid)

    def list_bindings(self, worker: WorkerRef | None = None) -> list[ActorBinding]:
        found = [b for b in self._bindings.values() if worker is None or b.worker == worker]
        return sorted(found, key=lambda b: (b.actor, b.actor_uid))

    # --- leases ---------------------------------------------------------------------

    def acquire_lease(self, key: str, *, ttl: float) -> Lease:
        rules.check_ttl(ttl)
        now = self._clock()
        held = self._leases.get(key)
        if held is not None and held.expires_at > now:
            raise LeaseHeld(LEASE_HELD_MESSAGE)
        lease = Lease(key=key, token=self._new_uid(), expires_at=now + ttl)
        self._leases[key] = lease
        return lease

    def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        rules.check_ttl(ttl)
        now = self._clock()
        held = self._leases.get(lease.key)
        if held is not None and held.expires_at > now:
            if held.token != lease.token:
                raise LeaseHeld(LEASE_HELD_MESSAGE)
            renewed = Lease(key=lease.key, token=lease.token, expires_at=now + ttl)
            self._leases[lease.key] = renewed
            return renewed
        raise NotFound(f"lease {lease.key} is no longer held (released or expired)")

    def release_lease(self, lease: Lease) -> None:
        held = self._leases.get(lease.key)
        if held is not None and held.token == lease.token:
            del self._leases[lease.key]

    def lease_alive(self, key: str) -> bool:
        held = self._leases.get(key)
        return held is not None and held.expires_at > self._clock()

    def list_leases(self) -> list[Lease]:
        now = self._clock()
        for key in [k for k, lease in self._leases.items() if lease.expires_at <= now]:
            del self._leases[key]
        return [self._leases[k] for k in sorted(self._leases)]

    # --- administration -------------------------------------------------------------

    def clear(self) -> None:
        workers = self.list_workers()
        self._atespaces.clear()
        self._templates.clear()
        self._actors.clear()
        self._tags.clear()
        self._workers.clear()
        self._bindings.clear()
        self._leases.clear()
        for worker in workers:
            self._emit(WorkerEventKind.DELETED, worker)


class _Subscription:
    """One watcher's end of the event feed; dropped (``lagged``) if its buffer fills."""

    def __init__(self, send: MemoryObjectSendStream[WorkerEvent]) -> None:
        self._send = send
        self.lagged = False

    def deliver(self, event: WorkerEvent) -> None:
        try:
            self._send.send_nowait(event)
        except anyio.WouldBlock:
            self.lagged = True
            self._send.close()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    def close(self) -> None:
        self._send.close()


class _WorkerEvents:
    """The async iterator handed out by :meth:`MemoryStore.watch_workers`."""

    def __init__(
        self, receive: MemoryObjectReceiveStream[WorkerEvent], subscription: _Subscription
    ) -> None:
        self._receive = receive
        self._subscription = subscription

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> WorkerEvent:
        try:
            try:
                # Drain what is buffered without a scheduling round per event, so a busy
                # loop cannot make a consumer fall behind the writers.
                return self._receive.receive_nowait()
            except anyio.WouldBlock:
                return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            if self._subscription.lagged:
                raise Unavailable(
                    "worker watch fell behind and was dropped; resubscribe and relist"
                ) from None
            raise StopAsyncIteration from None


class MemoryStore:
    """The embedded default :class:`~substrate.core.ports.Store`, and its reference model.

    ``clock`` stamps records and times leases (inject a ``ManualClock`` in tests);
    ``uid_factory`` makes record uids and lease tokens (UUID4 by default, a counter for
    deterministic simulation). ``state`` is the synchronous core.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        uid_factory: Callable[[], str] = _uuid4,
        watch_buffer: int = DEFAULT_WATCH_BUFFER,
    ) -> None:
        self.state = MemoryStoreState(clock=clock, uid_factory=uid_factory)
        self._watch_buffer = watch_buffer
        self._subscriptions: set[_Subscription] = set()
        self._closed = False

    async def _ready(self) -> None:
        # A checkpoint per call lets concurrent callers interleave the way they would
        # against a real database, while each state step itself stays atomic.
        await anyio.lowlevel.checkpoint()
        if self._closed:
            raise Unavailable(STORE_CLOSED_MESSAGE)

    # --- atespaces ------------------------------------------------------------------

    async def create_atespace(self, atespace: Atespace) -> Atespace:
        await self._ready()
        return self.state.create_atespace(atespace)

    async def get_atespace(self, name: str) -> Atespace:
        await self._ready()
        return self.state.get_atespace(name)

    async def list_atespaces(self) -> list[Atespace]:
        await self._ready()
        return self.state.list_atespaces()

    async def delete_atespace(self, name: str) -> None:
        await self._ready()
        self.state.delete_atespace(name)

    # --- templates ------------------------------------------------------------------

    async def create_template(self, template: ActorTemplate) -> ActorTemplate:
        await self._ready()
        return self.state.create_template(template)

    async def get_template(self, ref: TemplateRef) -> ActorTemplate:
        await self._ready()
        return self.state.get_template(ref)

    async def list_templates(self, atespace: str) -> list[ActorTemplate]:
        await self._ready()
        return self.state.list_templates(atespace)

    async def update_template(
        self,
        ref: TemplateRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[ActorTemplate], ActorTemplate],
    ) -> ActorTemplate:
        await self._ready()
        return self.state.update_template(
            ref, expected_version=expected_version, expected_uid=expected_uid, mutate=mutate
        )

    async def delete_template(
        self,
        ref: TemplateRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> None:
        await self._ready()
        self.state.delete_template(
            ref, expected_version=expected_version, expected_uid=expected_uid
        )

    # --- actors ---------------------------------------------------------------------

    async def create_actor(self, actor: Actor) -> Actor:
        await self._ready()
        return self.state.create_actor(actor)

    async def get_actor(self, ref: ActorRef) -> Actor:
        await self._ready()
        return self.state.get_actor(ref)

    async def list_actors(
        self, atespace: str | None = None, *, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[Actor], str]:
        await self._ready()
        return self.state.list_actors(atespace, page_size=page_size, page_token=page_token)

    async def update_actor(
        self,
        ref: ActorRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Actor], Actor],
    ) -> Actor:
        await self._ready()
        return self.state.update_actor(
            ref, expected_version=expected_version, expected_uid=expected_uid, mutate=mutate
        )

    async def delete_actor(
        self,
        ref: ActorRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> None:
        await self._ready()
        self.state.delete_actor(ref, expected_version=expected_version, expected_uid=expected_uid)

    # --- tags -----------------------------------------------------------------------

    async def create_tag(self, tag: Tag) -> Tag:
        await self._ready()
        return self.state.create_tag(tag)

    async def get_tag(self, ref: TagRef) -> Tag:
        await self._ready()
        return self.state.get_tag(ref)

    async def list_tags(self, atespace: str) -> list[Tag]:
        await self._ready()
        return self.state.list_tags(atespace)

    async def update_tag(
        self,
        ref: TagRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Tag], Tag],
    ) -> Tag:
        await self._ready()
        return self.state.update_tag(
            ref, expected_version=expected_version, expected_uid=expected_uid, mutate=mutate
        )

    async def delete_tag(
        self,
        ref: TagRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> None:
        await self._ready()
        self.state.delete_tag(ref, expected_version=expected_version, expected_uid=expected_uid)

    # --- workers --------------------------------------------------------------------

    async def create_worker(self, worker: Worker) -> Worker:
        await self._ready()
        return self.state.create_worker(worker)

    async def get_worker(self, ref: WorkerRef) -> Worker:
        await self._ready()
        return self.state.get_worker(ref)

    async def list_workers(self) -> list[Worker]:
        await self._ready()
        return self.state.list_workers()

    async def update_worker(
        self,
        ref: WorkerRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Worker], Worker],
    ) -> Worker:
        await self._ready()
        return self.state.update_worker(
            ref, expected_version=expected_version, expected_uid=expected_uid, mutate=mutate
        )

    async def delete_worker(
        self,
        ref: WorkerRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> Worker:
        await self._ready()
        return self.state.delete_worker(
            ref, expected_version=expected_version, expected_uid=expected_uid
        )

    @contextlib.asynccontextmanager
    async def watch_workers(self) -> AsyncIterator[AsyncIterator[WorkerEvent]]:
        await self._ready()
        send, receive = anyio.create_memory_object_stream[WorkerEvent](self._watch_buffer)
        subscription = _Subscription(send)
        unsubscribe = self.state.subscribe(subscription.deliver)
        self._subscriptions.add(subscription)
        try:
            with receive:
                yield _WorkerEvents(receive, subscription)
        finally:
            unsubscribe()
            self._subscriptions.discard(subscription)
            subscription.close()

    # --- bindings -------------------------------------------------------------------

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
        await self._ready()
        return self.state.bind_actor(
            actor,
            expected_actor_version=expected_actor_version,
            expected_actor_uid=expected_actor_uid,
            worker=worker,
            expected_worker_epoch=expected_worker_epoch,
            resources=resources,
            mutate_actor=mutate_actor,
        )

    async def release_actor(self, actor_uid: str) -> ActorBinding | None:
        await self._ready()
        return self.state.release_actor(actor_uid)

    async def get_binding(self, actor_uid: str) -> ActorBinding | None:
        await self._ready()
        return self.state.get_binding(actor_uid)

    async def list_bindings(self, worker: WorkerRef | None = None) -> list[ActorBinding]:
        await self._ready()
        return self.state.list_bindings(worker)

    # --- leases ---------------------------------------------------------------------

    async def acquire_lease(self, key: str, *, ttl: float) -> Lease:
        await self._ready()
        return self.state.acquire_lease(key, ttl=ttl)

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        await self._ready()
        return self.state.renew_lease(lease, ttl=ttl)

    async def release_lease(self, lease: Lease) -> None:
        await self._ready()
        self.state.release_lease(lease)

    async def lease_alive(self, key: str) -> bool:
        await self._ready()
        return self.state.lease_alive(key)

    async def list_leases(self) -> list[Lease]:
        await self._ready()
        return self.state.list_leases()

    # --- administration -------------------------------------------------------------

    async def clear(self) -> None:
        await self._ready()
        self.state.clear()

    async def close(self) -> None:
        self._closed = True
        for subscription in tuple(self._subscriptions):
            subscription.close()
        self._subscriptions.clear()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
