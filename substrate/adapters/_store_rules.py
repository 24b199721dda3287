"""The store semantics every adapter shares (checks, stamping, page tokens, room)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Final, TypeVar

import attrs

from substrate.core.ids import ActorRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorBinding,
    ActorTemplate,
    Atespace,
    Capacity,
    Metadata,
    Resources,
    Tag,
    Worker,
    WorkerState,
)
from substrate.core.ports import (
    CONFLICT_MESSAGE,
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    NO_ROOM_MESSAGE,
)
from substrate.errors import (
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
)

_TOKEN_VERSION: Final = 1


R = TypeVar("R", Atespace, ActorTemplate, Actor, Tag, Worker)
"""Any stored record (each has ``metadata``)."""


def require_preconditions(
    what: str, expected_version: int | None, expected_uid: str | None
) -> tuple[int, str]:
    """Both optimistic-concurrency guards, or :class:`InvalidArgument`."""
    if expected_version is None or not expected_uid:
        raise InvalidArgument(
            f"precondition required: updating {what} needs both expected_version and expected_uid"
        )
    return expected_version, expected_uid


def check_preconditions(
    what: str,
    stored: Metadata,
    *,
    expected_version: int | None,
    expected_uid: str | None,
) -> None:
    """Raise :class:`Conflict` unless the given guards match ``stored`` (uid first)."""
    if expected_uid and expected_uid != stored.uid:
        raise Conflict(
            f"{what} has uid {stored.uid}, not {expected_uid}: it was deleted and "
            "re-created, re-read it"
        )
    if expected_version is not None and expected_version != stored.version:
        raise Conflict(CONFLICT_MESSAGE)


def stamp_new(record: R, *, uid: str, now: float) -> R:
    """``record`` as first stored: fresh uid, version 1, both times ``now``."""
    return attrs.evolve(
        record, metadata=Metadata(uid=uid, version=1, create_time=now, update_time=now)
    )


def stamp_update(stored: R, new: R, *, now: float) -> R:
    """``new`` as written over ``stored``: uid and create time kept, version + 1."""
    old = stored.metadata
    meta = Metadata(
        uid=old.uid,
        version=old.version + 1,
        create_time=old.create_time,
        update_time=max(now, old.update_time),
    )
    return attrs.evolve(new, metadata=meta)


def check_same_ref(what: str, old: object, new: object) -> None:
    if old != new:
        raise InvalidArgument(f"{what} ref is immutable (was {old}, mutate returned {new})")


def check_worker_mutation(old: Worker, new: Worker) -> None:
    """Raise :class:`InvalidArgument` naming the first field ``update_worker`` may not change."""
    check_same_ref("worker", old.ref, new.ref)
    for field in ("node", "pool", "sandbox_class"):
        if getattr(old, field) != getattr(new, field):
            raise InvalidArgument(f"worker {old.ref} field {field} is immutable")
    if old.allocated != new.allocated:
        raise InvalidArgument(
            f"worker {old.ref} field allocated is managed by bind_actor/release_actor"
        )
    if new.epoch < old.epoch:
        raise InvalidArgument(
            f"worker {old.ref} field epoch may only increase ({old.epoch} -> {new.epoch})"
        )


def fresh_worker(worker: Worker) -> Worker:
    """A worker as created: nothing is allocated on it yet."""
    return attrs.evolve(worker, allocated=Capacity())


def check_bind(
    worker: Worker,
    existing: ActorBinding | None,
    *,
    actor: ActorRef,
    expected_worker_epoch: int,
    resources: Resources,
) -> bool:
    """Whether the bind is an idempotent re-bind; raise if it may not proceed.

    Called under the worker's lock with the actor's current binding (``existing``).
    """
    if worker.epoch != expected_worker_epoch:
        raise Conflict(
            f"worker {worker.ref} is at epoch {worker.epoch}, not {expected_worker_epoch}"
        )
    if existing is not None:
        if existing.worker == worker.ref and existing.worker_epoch == expected_worker_epoch:
            return True
        raise FailedPrecondition(
            f"actor {actor} is already bound to worker {existing.worker} "
            f"(epoch {existing.worker_epoch}); release it first"
        )
    if worker.state is not WorkerState.ACTIVE:
        raise ResourceExhausted(f"{NO_ROOM_MESSAGE}: worker {worker.ref} is {worker.state.name}")
    if worker.capacity is None or not worker.capacity.covers(worker.allocated.plus(resources)):
        raise ResourceExhausted(NO_ROOM_MESSAGE)
    return False


def book(worker: Worker, resources: Resources) -> Worker:
    return attrs.evolve(worker, allocated=worker.allocated.plus(resources))


def unbook(worker: Worker, resources: Resources) -> Worker:
    return attrs.evolve(worker, allocated=worker.allocated.minus(resources))


def new_binding(
    actor: ActorRef, actor_uid: str, worker: WorkerRef, epoch: int, resources: Resources
) -> ActorBinding:
    return ActorBinding(
        actor=actor, actor_uid=actor_uid, worker=worker, worker_epoch=epoch, resources=resources
    )


def check_ttl(ttl: float) -> None:
    if not ttl > 0:
        raise InvalidArgument(f"lease ttl must be positive (got {ttl})")


# --- pagination ---------------------------------------------------------------------------


def page_size(requested: int) -> int:
    """The effective page size: 0 is the default, large values are clamped."""
    if requested < 0:
        raise InvalidArgument(f"page_size must not be negative (got {requested})")
    if requested == 0:
        return DEFAULT_PAGE_SIZE
    return min(requested, MAX_PAGE_SIZE)


def encode_page_token(scope: str | None, last: ActorRef) -> str:
    """An opaque keyset cursor: the listing's scope and the last ref returned."""
    doc = {"v": _TOKEN_VERSION, "s": scope, "a": last.atespace, "n": last.name}
    raw = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii")


def decode_page_token(token: str, scope: str | None) -> ActorRef | None:
    """The cursor in ``token`` (None for ``""``); :class:`InvalidArgument` if it is bad."""
    if not token:
        return None
    try:
        raw = base64.b64decode(token.encode("ascii"), altchars=b"-_", validate=True)
        doc = json.loads(raw)
    except (UnicodeError, binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"invalid page token {token!r}") from exc
    if (
        not isinstance(doc, dict)
        or doc.get("v") != _TOKEN_VERSION
        or not isinstance(doc.get("a"), str)
        or not isinstance(doc.get("n"), str)
    ):
        raise InvalidArgument(f"invalid page token {token!r}")
    if doc.get("s") != scope:
        raise InvalidArgument(f"page token {token!r} belongs to another listing")
    return ActorRef(atespace=doc["a"], name=doc["n"])
