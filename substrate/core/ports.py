"""The ports of the core: the ``Store`` protocol and the records that travel through it."""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Final, Protocol, Self

import attrs

from substrate.core.ids import ActorRef, TagRef, TemplateRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorBinding,
    ActorTemplate,
    Atespace,
    Resources,
    Tag,
    Worker,
)

DEFAULT_PAGE_SIZE: Final = 100
"""Page size used by :meth:`Store.list_actors` when ``page_size`` is 0."""

MAX_PAGE_SIZE: Final = 1000
"""Larger page sizes are clamped to this."""

CONFLICT_MESSAGE: Final = "concurrent update conflict, please retry"
"""Description of the :class:`Conflict` raised on a stale ``expected_version``."""

LEASE_HELD_MESSAGE: Final = "another operation is in progress for this actor"
"""Description of the :class:`LeaseHeld` raised when a lease is taken."""

NO_ROOM_MESSAGE: Final = "no worker has room for the actor"
"""Description of the :class:`ResourceExhausted` raised when a bind finds no room."""

STORE_CLOSED_MESSAGE: Final = "store is closed"
"""Description of the :class:`Unavailable` raised by any call on a closed store."""


class WorkerEventKind(enum.Enum):
    CREATED = 1
    UPDATED = 2
    DELETED = 3


@attrs.frozen(slots=True, kw_only=True)
class WorkerEvent:
    """One committed change of a worker record.

    ``worker`` is the record as written by that change; for ``DELETED`` it is the record
    as it was when it was removed.
    """

    kind: WorkerEventKind
    worker: Worker

    @property
    def ref(self) -> WorkerRef:
        return self.worker.ref

    @property
    def version(self) -> int:
        return self.worker.metadata.version


@attrs.frozen(slots=True, kw_only=True)
class Lease:
    """A time-limited exclusive claim on ``key``, held by whoever knows ``token``.

    ``expires_at`` is in seconds since the epoch on the *store's* clock (the injected
    clock of the memory store, the database clock of PostgreSQL).
    """

    key: str
    token: str
    expires_at: float


@attrs.frozen(slots=True, kw_only=True)
class BindResult:
    """What :meth:`Store.bind_actor` wrote, all in one transaction."""

    actor: Actor
    worker: Worker
    binding: ActorBinding


class Store(Protocol):
    """The ateapi store: atespaces, templates, actors, tags, workers, bindings, leases.

    Every adapter (``substrate.adapters.memory.MemoryStore``,
    ``substrate.adapters.postgres.PostgresStore``) passes the one conformance suite in
    ``substrate.testing.contracts.store``; these docstrings are the contract it checks.
    Conventions shared by every method:

    * Records are frozen, so a returned record never changes behind the caller's back,
      and the record passed in is never modified.
    * The store owns ``metadata``: on create it assigns a fresh ``uid`` (a UUID4 string
      from the adapter's ``uid_factory``), ``version`` 1 and ``create_time ==
      update_time`` (from the adapter's clock); the metadata the caller passes is
      ignored. Every successful update or bind writes ``version + 1`` and a new
      ``update_time`` and keeps ``uid`` and ``create_time``, whatever ``mutate`` returned.
    * Optimistic concurrency: ``update_*`` need both ``expected_version`` and
      ``expected_uid``; a missing one (``None`` or ``""``) raises :class:`InvalidArgument`
      ("precondition required"). A uid mismatch (the record was deleted and re-created)
      raises :class:`Conflict` whose description names the uid, and ``mutate`` never
      runs; a version mismatch raises ``Conflict("concurrent update conflict, please
      retry")``. ``delete_*`` take the same preconditions, optional: ``None`` skips a check.
    * ``mutate`` callbacks are synchronous and pure: they get the stored record and return
      the new one. An exception raised by ``mutate`` propagates unchanged (the very same
      object) and nothing is written.
    * Any call may raise :class:`Unavailable` if the backing service cannot be reached,
      and every call on a closed store raises ``Unavailable("store is closed")``.
    """

    # --- atespaces ------------------------------------------------------------------

    async def create_atespace(self, atespace: Atespace) -> Atespace:
        """Create ``atespace`` and return the stored record.

        Raises :class:`AlreadyExists` if an atespace of that name exists.
        """
        ...

    async def get_atespace(self, name: str) -> Atespace:
        """Return the atespace ``name``. Raises :class:`NotFound` if missing."""
        ...

    async def list_atespaces(self) -> list[Atespace]:
        """Every atespace, ordered by name."""
        ...

    async def delete_atespace(self, name: str) -> None:
        """Delete the atespace ``name``.

        Raises :class:`NotFound` if missing, and :class:`FailedPrecondition` while any
        actor, tag or template remains in it. Atomic with a concurrent create in it: a
        create either lands before the delete (and blocks it) or fails.
        """
        ...

    # --- actor templates ------------------------------------------------------------

    async def create_template(self, template: ActorTemplate) -> ActorTemplate:
        """Create ``template`` and return the stored record (uid, version 1, times set).

        Raises :class:`FailedPrecondition` if its atespace does not exist and
        :class:`AlreadyExists` if the ref is taken.
        """
        ...

    async def get_template(self, ref: TemplateRef) -> ActorTemplate:
        """Return the template ``ref``. Raises :class:`NotFound` if missing."""
        ...

    async def list_templates(self, atespace: str) -> list[ActorTemplate]:
        """Every template of ``atespace``, ordered by name.

        Raises :class:`NotFound` if the atespace does not exist.
        """
        ...

    async def update_template(
        self,
        ref: TemplateRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[ActorTemplate], ActorTemplate],
    ) -> ActorTemplate:
        """Replace the template with ``mutate(stored)`` and return the new record.

        Raises :class:`InvalidArgument` if a precondition is missing or ``mutate`` changed
        the ref; :class:`NotFound` if missing; :class:`Conflict` on a uid or version
        mismatch (``mutate`` does not run); whatever ``mutate`` raised (nothing written).
        """
        ...

    async def delete_template(
        self,
        ref: TemplateRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> None:
        """Delete the template ``ref``.

        Raises :class:`NotFound` if missing and :class:`Conflict` if a given precondition
        does not hold. Actors created from the template are not affected.
        """
        ...

    # --- actors ---------------------------------------------------------------------

    async def create_actor(self, actor: Actor) -> Actor:
        """Create ``actor`` and return the stored record (uid, version 1, times set).

        Raises :class:`FailedPrecondition` if its atespace does not exist and
        :class:`AlreadyExists` if ``actor.ref`` is taken. The template is not checked.
        """
        ...

    async def get_actor(self, ref: ActorRef) -> Actor:
        """Return the actor ``ref``. Raises :class:`NotFound` if missing."""
        ...

    async def list_actors(
        self, atespace: str | None = None, *, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[Actor], str]:
        """One page of actors ordered by ``(atespace, name)`` and the next page token.

        ``atespace=None`` lists every atespace. ``page_size`` 0 means
        :data:`DEFAULT_PAGE_SIZE`; sizes above :data:`MAX_PAGE_SIZE` are clamped. The next
        token is ``""`` after the last page. Tokens are keyset cursors: walking the pages
        never yields an actor twice, keeps the order, and is not disturbed by concurrent
        inserts or deletes (an actor inserted behind the cursor is simply not seen).

        Raises :class:`InvalidArgument` for a negative ``page_size`` or a token that is
        malformed or belongs to another listing, and :class:`NotFound` if ``atespace`` is
        given (including ``""``) and does not exist.
        """
        ...

    async def update_actor(
        self,
        ref: ActorRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Actor], Actor],
    ) -> Actor:
        """Replace the actor with ``mutate(stored)`` and return the new record.

        Raises :class:`InvalidArgument` if a precondition is missing or ``mutate`` changed
        the ref; :class:`NotFound` if missing; :class:`Conflict` on a uid mismatch
        (``mutate`` does not run) or a stale version
        (``"concurrent update conflict, please retry"``); whatever ``mutate`` raised
        (nothing written).
        """
        ...

    async def delete_actor(
        self,
        ref: ActorRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> None:
        """Delete the actor ``ref``; only an actor in state ``DELETING`` is deleted.

        A binding the actor still holds is released in the same transaction. Raises
        :class:`NotFound` if missing, :class:`Conflict` if a given precondition does not
        hold, and :class:`FailedPrecondition` if the actor is not ``DELETING``.
        """
        ...

    # --- tags -----------------------------------------------------------------------

    async def create_tag(self, tag: Tag) -> Tag:
        """Create ``tag`` and return the stored record (uid, version 1, times set).

        Raises :class:`FailedPrecondition` if its atespace does not exist and
        :class:`AlreadyExists` if the ref is taken. A tag blocks its atespace's deletion.
        """
        ...

    async def get_tag(self, ref: TagRef) -> Tag:
        """Return the tag ``ref``. Raises :class:`NotFound` if missing."""
        ...

    async def list_tags(self, atespace: str) -> list[Tag]:
        """Every tag of ``atespace``, ordered by name.

        Raises :class:`NotFound` if the atespace does not exist.
        """
        ...

    async def update_tag(
        self,
        ref: TagRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Tag], Tag],
    ) -> Tag:
        """Replace the tag with ``mutate(stored)``; errors as :meth:`update_actor`."""
        ...

    async def delete_tag(
        self,
        ref: TagRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> None:
        """Delete the tag ``ref``.

        Raises :class:`NotFound` if missing and :class:`Conflict` if a given precondition
        does not hold.
        """
        ...

    # --- workers --------------------------------------------------------------------

    async def create_worker(self, worker: Worker) -> Worker:
        """Create ``worker`` and return the stored record (uid, version 1, times set).

        ``allocated`` starts at zero whatever is passed (there are no bindings yet).
        Raises :class:`AlreadyExists` if the name is taken. Emits ``CREATED``.
        """
        ...

    async def get_worker(self, ref: WorkerRef) -> Worker:
        """Return the worker ``ref``. Raises :class:`NotFound` if missing."""
        ...

    async def list_workers(self) -> list[Worker]:
        """Every worker, ordered by name."""
        ...

    async def update_worker(
        self,
        ref: WorkerRef,
        *,
        expected_version: int | None,
        expected_uid: str | None,
        mutate: Callable[[Worker], Worker],
    ) -> Worker:
        """Replace the worker with ``mutate(stored)`` and return it. Emits ``UPDATED``.

        ``ref``, ``node``, ``pool`` and ``sandbox_class`` are immutable, ``allocated``
        belongs to :meth:`bind_actor`/:meth:`release_actor`, and ``epoch`` may only
        increase: a change that breaks this raises :class:`InvalidArgument` naming the
        field. Otherwise errors as :meth:`update_actor`.
        """
        ...

    async def delete_worker(
        self,
        ref: WorkerRef,
        *,
        expected_version: int | None = None,
        expected_uid: str | None = None,
    ) -> Worker:
        """Delete the worker and its bindings; return the removed record. Emits ``DELETED``.

        The actors that were bound are not changed. Raises :class:`NotFound` if missing
        and :class:`Conflict` if a given precondition does not hold.
        """
        ...

    def watch_workers(self) -> AbstractAsyncContextManager[AsyncIterator[WorkerEvent]]:
        """Subscribe to worker changes: ``async with store.watch_workers() as events``.

        The subscription is live when ``__aenter__`` returns, so a consumer subscribes
        first and then relists. Every change committed afterwards is delivered once, in
        commit order (bindings and releases are ``UPDATED`` events, since they change
        ``allocated``). The iterator ends (``StopAsyncIteration``) when the store is
        closed; it raises :class:`Unavailable` when the subscription is lost (connection
        loss, or the consumer fell too far behind), after which the consumer must
        resubscribe and relist. Leaving the ``async with`` ends the subscription.
        """
        ...

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
        """Book ``resources`` and one slot on ``worker`` for ``actor``, in one transaction.

        Under the worker's row lock it re-checks that the worker is ``ACTIVE``, that its
        epoch is ``expected_worker_epoch`` and that it has room (capacity reported, a free
        actor slot, cpu and memory for ``allocated + resources``); then it records the
        binding, adds to the worker's ``allocated`` (``UPDATED`` event) and writes the
        actor as ``mutate_actor(stored)`` (version + 1). Of concurrent claimants for the
        last slot exactly one wins.

        Binding an actor again to the worker it is already bound to books nothing new:
        the existing binding is kept, the worker is unchanged and only the actor is
        written. Raises :class:`InvalidArgument` if an actor precondition is missing or
        ``mutate_actor`` changed the ref; :class:`NotFound` if the actor or worker is
        missing; :class:`Conflict` on an actor uid/version mismatch or a worker epoch
        other than expected; :class:`ResourceExhausted` if the worker is not ``ACTIVE``
        or has no room (``"no worker has room for the actor"``);
        :class:`FailedPrecondition` if the actor is bound to another worker; whatever
        ``mutate_actor`` raised. On any error nothing is written.
        """
        ...

    async def release_actor(self, actor_uid: str) -> ActorBinding | None:
        """Remove the binding of ``actor_uid`` and return it, or None if there was none.

        Subtracts its resources and slot from the worker's ``allocated`` (never below
        zero; ``UPDATED`` event). Idempotent; the actor record is not touched.
        """
        ...

    async def get_binding(self, actor_uid: str) -> ActorBinding | None:
        """The binding of ``actor_uid``, or None."""
        ...

    async def list_bindings(self, worker: WorkerRef | None = None) -> list[ActorBinding]:
        """The bindings on ``worker`` (every binding if None), ordered by actor ref.

        A worker's ``allocated`` always equals the sum of its bindings.
        """
        ...

    # --- leases ---------------------------------------------------------------------

    async def acquire_lease(self, key: str, *, ttl: float) -> Lease:
        """Take the lease ``key`` for ``ttl`` seconds with a fresh token.

        An expired lease is reclaimed. Raises :class:`InvalidArgument` if ``ttl <= 0`` and
        ``LeaseHeld("another operation is in progress for this actor")`` if the lease is
        held and unexpired, by anyone, including the caller (leases are not re-entrant).
        """
        ...

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        """Extend a lease still held by ``lease.token`` to ``now + ttl``.

        Raises :class:`InvalidArgument` if ``ttl <= 0``, :class:`LeaseHeld` if someone
        else holds the key now, and :class:`NotFound` if the lease is gone or has
        expired (an expired lease is lost even if nobody reclaimed it yet).
        """
        ...

    async def release_lease(self, lease: Lease) -> None:
        """Release the lease if ``lease.token`` still holds it.

        Idempotent; a lease held by another token is left alone.
        """
        ...

    async def lease_alive(self, key: str) -> bool:
        """Whether some token holds an unexpired lease on ``key``."""
        ...

    async def list_leases(self) -> list[Lease]:
        """Every unexpired lease, ordered by key."""
        ...

    # --- administration -------------------------------------------------------------

    async def clear(self) -> None:
        """Debug wipe: delete every record, binding and lease (``DELETED`` per worker)."""
        ...

    async def close(self) -> None:
        """Release resources and end every worker watch. Idempotent."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


__all__ = [
    "CONFLICT_MESSAGE",
    "DEFAULT_PAGE_SIZE",
    "LEASE_HELD_MESSAGE",
    "MAX_PAGE_SIZE",
    "NO_ROOM_MESSAGE",
    "STORE_CLOSED_MESSAGE",
    "BindResult",
    "Lease",
    "Store",
    "WorkerEvent",
    "WorkerEventKind",
]
