"""The Store conformance suite: every case runs unchanged against every Store adapter."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Final, Generic, Protocol, TypeVar

import anyio
import attrs

from substrate.core.ids import ActorRef, Labels, NodeRef, TagRef, TemplateRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorState,
    ActorStatus,
    ActorTemplate,
    Atespace,
    Capacity,
    Container,
    Crash,
    Durability,
    EnvVar,
    Fidelity,
    Metadata,
    Probe,
    Resources,
    SandboxClass,
    Snapshot,
    SnapshotConfig,
    SnapshotOwner,
    SnapshotStorage,
    StorageStatus,
    Tag,
    Worker,
    WorkerAssignment,
    WorkerState,
)
from substrate.core.ports import (
    CONFLICT_MESSAGE,
    DEFAULT_PAGE_SIZE,
    LEASE_HELD_MESSAGE,
    MAX_PAGE_SIZE,
    NO_ROOM_MESSAGE,
    BindResult,
    Store,
    WorkerEvent,
    WorkerEventKind,
)
from substrate.errors import (
    AlreadyExists,
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    LeaseHeld,
    NotFound,
    ResourceExhausted,
    SubstrateError,
    Unavailable,
)

E = TypeVar("E", bound=BaseException)

EVENT_TIMEOUT: Final = 10.0
"""Seconds a case waits for a worker event before failing."""

GIB: Final = 1 << 30


class MakeStore(Protocol):
    """What a case gets: a factory of fresh, empty stores plus the lease clock.

    A case opens stores with ``async with make_store() as store`` and checks the contract
    in the docstrings of :class:`substrate.core.ports.Store` with plain ``assert`` and
    :func:`raises`, so the suite needs no pytest. ``lease_ttl`` is the TTL the lease
    cases use and ``await make_store.advance(seconds)`` lets that much time pass on the
    store's lease clock (a manual clock for the memory store, a real sleep for a
    database). Run the suite with, e.g.::

        @pytest.mark.parametrize("case", STORE_CASES, ids=lambda c: c.__name__)
        async def test_store_contract(case, make_store):
            await case(make_store)
    """

    def __call__(self) -> AbstractAsyncContextManager[Store]: ...

    @property
    def lease_ttl(self) -> float:
        """The lease TTL the cases use (short for a real clock)."""
        ...

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on the clock the store's leases use."""
        ...


StoreCase = Callable[[MakeStore], Awaitable[None]]


@attrs.frozen(slots=True, kw_only=True)
class StoreFactory:
    """A ready-made :class:`MakeStore` from an opener and an ``advance`` coroutine."""

    open: Callable[[], AbstractAsyncContextManager[Store]]
    advance_by: Callable[[float], Awaitable[None]]
    lease_ttl: float = 30.0

    def __call__(self) -> AbstractAsyncContextManager[Store]:
        return self.open()

    async def advance(self, seconds: float) -> None:
        await self.advance_by(seconds)


# --- helpers ------------------------------------------------------------------------------


class Caught(Generic[E]):
    """What :func:`raises` caught."""

    value: E


@contextlib.contextmanager
def raises(expected: type[E], *, match: str = "") -> Iterator[Caught[E]]:
    """Assert the block raises ``expected`` (a subclass counts) whose text contains ``match``."""
    caught: Caught[E] = Caught()
    try:
        yield caught
    except expected as exc:
        caught.value = exc
    except Exception as exc:
        raise AssertionError(f"expected {expected.__name__}, got {exc!r}") from exc
    else:
        raise AssertionError(f"expected {expected.__name__}, nothing was raised")
    if match not in str(caught.value):
        raise AssertionError(f"{caught.value!r} does not mention {match!r}")


def atespace(name: str = "as1") -> Atespace:
    return Atespace(name=name)


def template(space: str = "as1", name: str = "tmpl") -> ActorTemplate:
    return ActorTemplate(
        ref=TemplateRef(space, name),
        containers=(Container(name="main", image="registry.local/app:1"),),
        resources=Resources(cpu_milli=500, memory_bytes=GIB),
    )


def actor(space: str = "as1", name: str = "a1", state: ActorState = ActorState.SUSPENDED) -> Actor:
    return Actor(
        ref=ActorRef(space, name),
        template=TemplateRef(space, "tmpl"),
        status=ActorStatus(state=state),
    )


def tag(space: str = "as1", name: str = "t1") -> Tag:
    return Tag(ref=TagRef(space, name), source_actor=ActorRef(space, "a1"))


def worker(
    name: str = "w1",
    *,
    slots: int = 1,
    cpu_milli: int = 4000,
    memory_bytes: int = 8 * GIB,
    state: WorkerState = WorkerState.ACTIVE,
    epoch: int = 1,
    capacity: bool = True,
) -> Worker:
    return Worker(
        ref=WorkerRef(name),
        node=NodeRef("node-1"),
        pool="default",
        ips=("10.0.0.7",),
        labels=Labels.of({"zone": "a"}),
        epoch=epoch,
        state=state,
        capacity=(
            Capacity(cpu_milli=cpu_milli, memory_bytes=memory_bytes, actors=slots)
            if capacity
            else None
        ),
    )


SMALL: Final = Resources(cpu_milli=500, memory_bytes=GIB)


def resuming_on(w: Worker, resources: Resources = SMALL) -> Callable[[Actor], Actor]:
    """A ``mutate_actor`` that records the assignment the way a resume would."""

    def mutate(a: Actor) -> Actor:
        assignment = WorkerAssignment(
            worker=w.ref, node=w.node, worker_epoch=w.epoch, resources=resources
        )
        return attrs.evolve(
            a, status=attrs.evolve(a.status, state=ActorState.RESUMING, assignment=assignment)
        )

    return mutate


def keep(a: Actor) -> Actor:
    return a


def set_state(state: ActorState) -> Callable[[Actor], Actor]:
    def mutate(a: Actor) -> Actor:
        return attrs.evolve(a, status=attrs.evolve(a.status, state=state))

    return mutate


async def bind(
    store: Store,
    a: Actor,
    w: Worker,
    resources: Resources = SMALL,
    *,
    epoch: int | None = None,
) -> BindResult:
    return await store.bind_actor(
        a.ref,
        expected_actor_version=a.metadata.version,
        expected_actor_uid=a.metadata.uid,
        worker=w.ref,
        expected_worker_epoch=w.epoch if epoch is None else epoch,
        resources=resources,
        mutate_actor=resuming_on(w, resources),
    )


def assert_fresh(meta: Metadata) -> None:
    assert meta.uid, "the store assigns a uid"
    assert meta.version == 1
    assert meta.create_time > 0
    assert meta.update_time == meta.create_time


def assert_bumped(before: Metadata, after: Metadata) -> None:
    assert after.uid == before.uid
    assert after.version == before.version + 1
    assert after.create_time == before.create_time
    assert after.update_time >= before.update_time


async def assert_allocations_consistent(store: Store) -> None:
    """Every worker's ``allocated`` is the sum of its bindings."""
    for w in await store.list_workers():
        total = Capacity()
        for b in await store.list_bindings(w.ref):
            total = total.plus(b.resources)
        assert w.allocated == total, f"{w.ref}: allocated {w.allocated} != bindings {total}"


async def next_events(events: AsyncIterator[WorkerEvent], n: int) -> list[WorkerEvent]:
    with anyio.fail_after(EVENT_TIMEOUT):
        return [await anext(events) for _ in range(n)]


async def events_until_sentinel(
    store: Store, events: AsyncIterator[WorkerEvent]
) -> list[WorkerEvent]:
    """Every event before the ``CREATED`` of a sentinel worker created now."""
    sentinel = await store.create_worker(worker("zz-sentinel"))
    seen: list[WorkerEvent] = []
    with anyio.fail_after(EVENT_TIMEOUT):
        async for event in events:
            if event.ref == sentinel.ref:
                assert event.kind is WorkerEventKind.CREATED
                return seen
            seen.append(event)
    raise AssertionError(f"the watch ended before the sentinel; saw {seen}")


def full_actor(space: str = "as1", name: str = "rich") -> Actor:
    """An actor with every nested field populated (adapters must round-trip all of it)."""
    storages = (
        SnapshotStorage(
            durability=Durability.LOCAL,
            status=StorageStatus.COMPLETED,
            fidelity=Fidelity.MEMORY,
            local_name="snap-1",
            node=NodeRef("node-1"),
        ),
        SnapshotStorage(
            durability=Durability.DURABLE,
            status=StorageStatus.IN_PROGRESS,
            fidelity=Fidelity.ROOTFS,
            uri="s3://bucket/atespaces/as1/actors/u/snapshots/s1",
        ),
    )
    snap = Snapshot(
        generation=3,
        snapshot_id="s1",
        owner=SnapshotOwner.TAG,
        template_uid="tmpl-uid",
        sandbox_class=SandboxClass.MICROVM,
        runtime_version="runsc-2022",
        captured_at=1_700_000_123.25,
        source_tag=TagRef(space, "golden"),
        storages=storages,
    )
    return Actor(
        ref=ActorRef(space, name),
        template=TemplateRef(space, "tmpl"),
        worker_selector=Labels.of({"zone": "a", "example.com/gpu": "yes"}),
        source_tag=TagRef(space, "golden"),
        status=ActorStatus(
            state=ActorState.RUNNING,
            assignment=WorkerAssignment(
                worker=WorkerRef("w1"),
                node=NodeRef("node-1"),
                worker_epoch=4,
                pod_ips=("10.0.0.7", "fd00::7"),
                resources=Resources(cpu_milli=250, memory_bytes=3 * GIB),
            ),
            snapshots=(snap, Snapshot(generation=4, snapshot_id="s2")),
            crash=Crash(message="restore failed: \u00e9\u4e2d", time=1_700_000_000.5),
            assigned_node=NodeRef("node-1"),
            last_assigned_generation=4,
            in_progress_generation=5,
        ),
    )


def full_worker(name: str = "w-rich") -> Worker:
    return Worker(
        ref=WorkerRef(name),
        pool="gpu",
        node=NodeRef("node-2"),
        ips=("10.0.0.8", "10.0.0.9"),
        sandbox_class=SandboxClass.MICROVM,
        runtime_versions=frozenset({"runsc-2022", "runsc-2024"}),
        labels=Labels.of({"zone": "b", "tier": ""}),
        epoch=7,
        state=WorkerState.DRAINING,
        capacity=Capacity(cpu_milli=16000, memory_bytes=64 * GIB, actors=40),
        last_heartbeat=1_700_000_001.125,
        spiffe_id="spiffe://ate/worker/w-rich",
        tunnel_address="10.0.0.8:15001",
    )


def full_template(space: str = "as1", name: str = "rich") -> ActorTemplate:
    return ActorTemplate(
        ref=TemplateRef(space, name),
        containers=(
            Container(
                name="main",
                image="registry.local/app:1",
                command=("python", "-m", "app"),
                env=(EnvVar(name="A", value="1"), EnvVar(name="EMPTY")),
                ports=(8080, 9090),
                wakeup_probe=Probe(path="/healthz", port=8080, timeout_seconds=5),
            ),
            Container(name="side", image="registry.local/side:2", ports=()),
        ),
        resources=Resources(cpu_milli=1500, memory_bytes=2 * GIB),
        worker_selector=Labels.of({"zone": "a"}),
        sandbox_class=SandboxClass.FAKE,
        snapshot_config=SnapshotConfig(
            preferred_fidelity=Fidelity.VOLUMES, storage_location="file:///var/lib/ate/objects"
        ),
        golden_snapshot=True,
        golden_tag=TagRef(space, "golden"),
        golden_error="none yet",
    )


def without_metadata(record: Actor | Worker | ActorTemplate | Tag) -> object:
    return attrs.evolve(record, metadata=Metadata())


# --- atespaces ----------------------------------------------------------------------------


async def case_atespace_create_get_list(make_store: MakeStore) -> None:
    async with make_store() as store:
        assert await store.list_atespaces() == []
        given = atespace("beta")
        b = await store.create_atespace(given)
        assert given.metadata == Metadata(), "the input record is not changed"
        assert_fresh(b.metadata)
        a = await store.create_atespace(atespace("alpha"))
        assert a.metadata.uid != b.metadata.uid
        assert await store.get_atespace("beta") == b
        assert await store.list_atespaces() == [a, b]


async def case_atespace_create_already_exists(make_store: MakeStore) -> None:
    async with make_store() as store:
        first = await store.create_atespace(atespace())
        with raises(AlreadyExists):
            await store.create_atespace(atespace())
        assert await store.get_atespace("as1") == first


async def case_atespace_get_not_found(make_store: MakeStore) -> None:
    async with make_store() as store:
        with raises(NotFound, match="as1"):
            await store.get_atespace("as1")


async def case_atespace_delete(make_store: MakeStore) -> None:
    async with make_store() as store:
        with raises(NotFound):
            await store.delete_atespace("as1")
        await store.create_atespace(atespace())
        await store.delete_atespace("as1")
        with raises(NotFound):
            await store.get_atespace("as1")
        assert await store.list_atespaces() == []


async def case_atespace_delete_blocked_by_actor(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor(state=ActorState.DELETING))
        with raises(FailedPrecondition, match="actors"):
            await store.delete_atespace("as1")
        await store.delete_actor(a.ref)
        await store.delete_atespace("as1")


async def case_atespace_delete_blocked_by_template(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        t = await store.create_template(template())
        with raises(FailedPrecondition, match="templates"):
            await store.delete_atespace("as1")
        await store.delete_template(t.ref)
        await store.delete_atespace("as1")


async def case_atespace_delete_blocked_by_tag(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        t = await store.create_tag(tag())
        with raises(FailedPrecondition, match="tags"):
            await store.delete_atespace("as1")
        await store.delete_tag(t.ref)
        await store.delete_atespace("as1")


async def case_atespace_delete_scoped_to_target(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace("as1"))
        await store.create_atespace(atespace("as2"))
        await store.create_actor(actor("as2", "a1"))
        await store.create_template(template("as2"))
        await store.create_tag(tag("as2"))
        await store.delete_atespace("as1")
        assert [s.name for s in await store.list_atespaces()] == ["as2"]
        with raises(FailedPrecondition):
            await store.delete_atespace("as2")


async def _create_or_delete_first(store: Store, n: int) -> tuple[bool, bool]:
    """Race a create in ``as1`` against deleting ``as1``; which of them succeeded."""
    won: dict[str, bool] = {}

    async def create() -> None:
        try:
            await store.create_actor(actor("as1", f"a{n}", ActorState.DELETING))
            won["create"] = True
        except FailedPrecondition:
            won["create"] = False

    async def delete() -> None:
        try:
            await store.delete_atespace("as1")
            won["delete"] = True
        except FailedPrecondition:
            won["delete"] = False

    async with anyio.create_task_group() as tg:
        tg.start_soon(create)
        tg.start_soon(delete)
    return won["create"], won["delete"]


async def case_atespace_delete_races_create(make_store: MakeStore) -> None:
    """A create in an atespace and its deletion are atomic: never an orphan actor."""
    async with make_store() as store:
        for n in range(5):
            await store.create_atespace(atespace())
            created, deleted = await _create_or_delete_first(store, n)
            assert created != deleted, "exactly one of create and delete wins"
            if created:
                page, _ = await store.list_actors("as1")
                assert [a.ref.name for a in page] == [f"a{n}"]
                await store.delete_actor(page[0].ref)
                await store.delete_atespace("as1")
            assert await store.list_actors() == ([], "")
            assert await store.list_atespaces() == []


# --- templates ----------------------------------------------------------------------------


async def case_template_lifecycle(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        given = full_template()
        t = await store.create_template(given)
        assert_fresh(t.metadata)
        assert without_metadata(t) == given
        assert await store.get_template(t.ref) == t
        other = await store.create_template(template("as1", "another"))
        assert await store.list_templates("as1") == [other, t]

        def bump(x: ActorTemplate) -> ActorTemplate:
            return attrs.evolve(
                x, resources=Resources(cpu_milli=2000), metadata=Metadata(uid="x", version=9)
            )

        t2 = await store.update_template(
            t.ref, expected_version=1, expected_uid=t.metadata.uid, mutate=bump
        )
        assert_bumped(t.metadata, t2.metadata)
        assert t2.resources == Resources(cpu_milli=2000)
        assert await store.get_template(t.ref) == t2
        with raises(Conflict, match=CONFLICT_MESSAGE):
            await store.update_template(
                t.ref, expected_version=1, expected_uid=t.metadata.uid, mutate=bump
            )
        with raises(Conflict):
            await store.delete_template(t.ref, expected_version=1)
        with raises(Conflict):
            await store.delete_template(t.ref, expected_uid="someone-else")
        await store.delete_template(t.ref, expected_version=2, expected_uid=t.metadata.uid)
        with raises(NotFound):
            await store.get_template(t.ref)
        with raises(NotFound):
            await store.delete_template(t.ref)
        with raises(NotFound):
            await store.update_template(
                t.ref, expected_version=2, expected_uid=t.metadata.uid, mutate=bump
            )


async def case_template_create_errors(make_store: MakeStore) -> None:
    async with make_store() as store:
        with raises(FailedPrecondition, match="as1"):
            await store.create_template(template())
        await store.create_atespace(atespace())
        await store.create_template(template())
        with raises(AlreadyExists):
            await store.create_template(template())
        with raises(NotFound):
            await store.get_template(TemplateRef("as1", "missing"))
        with raises(NotFound):
            await store.list_templates("nope")


async def case_template_update_missing_precondition(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        t = await store.create_template(template())
        for version, uid in ((None, None), (None, t.metadata.uid), (1, None), (1, "")):
            with raises(InvalidArgument, match="precondition required"):
                await store.update_template(
                    t.ref, expected_version=version, expected_uid=uid, mutate=lambda x: x
                )
        assert await store.get_template(t.ref) == t


async def case_template_update_uid_conflict(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        old = await store.create_template(template())
        await store.delete_template(old.ref)
        new = await store.create_template(template())
        calls: list[ActorTemplate] = []

        def record(x: ActorTemplate) -> ActorTemplate:
            calls.append(x)
            return x

        with raises(Conflict, match=old.metadata.uid):
            await store.update_template(
                old.ref, expected_version=1, expected_uid=old.metadata.uid, mutate=record
            )
        assert calls == []
        assert await store.get_template(new.ref) == new


# --- actors: create / get -----------------------------------------------------------------


async def case_actor_get_not_found(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        with raises(NotFound, match="as1/a1"):
            await store.get_actor(ActorRef("as1", "a1"))


async def case_actor_create_success(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        given = attrs.evolve(actor(), metadata=Metadata(uid="mine", version=42))
        a = await store.create_actor(given)
        assert given.metadata == Metadata(uid="mine", version=42), "input not mutated"
        assert_fresh(a.metadata)
        assert a.metadata.uid != "mine", "the uid is assigned by the store"
        assert without_metadata(a) == without_metadata(given)
        assert await store.get_actor(a.ref) == a


async def case_actor_round_trips_every_field(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        given = full_actor()
        a = await store.create_actor(given)
        assert without_metadata(a) == given
        assert await store.get_actor(a.ref) == a
        page, _ = await store.list_actors("as1")
        assert page == [a]


async def case_actor_create_already_exists(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        first = await store.create_actor(actor())
        with raises(AlreadyExists, match="as1/a1"):
            await store.create_actor(actor(state=ActorState.RUNNING))
        assert await store.get_actor(first.ref) == first


async def case_actor_create_missing_atespace(make_store: MakeStore) -> None:
    async with make_store() as store:
        with raises(FailedPrecondition, match="as1"):
            await store.create_actor(actor())
        assert (await store.list_actors())[0] == []


async def case_actor_same_name_in_two_atespaces(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace("as1"))
        await store.create_atespace(atespace("as2"))
        a1 = await store.create_actor(actor("as1", "same"))
        a2 = await store.create_actor(actor("as2", "same", ActorState.DELETING))
        assert a1.metadata.uid != a2.metadata.uid
        assert await store.get_actor(ActorRef("as1", "same")) == a1
        assert await store.get_actor(ActorRef("as2", "same")) == a2
        await store.delete_actor(a2.ref)
        assert await store.get_actor(a1.ref) == a1


# --- actors: update -----------------------------------------------------------------------


async def case_actor_update_success(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())

        def mutate(x: Actor) -> Actor:
            assert x == a, "mutate gets the stored record"
            forged = Metadata(uid="forged", version=99, create_time=1.0, update_time=2.0)
            return attrs.evolve(set_state(ActorState.RESUMING)(x), metadata=forged)

        a2 = await store.update_actor(
            a.ref, expected_version=1, expected_uid=a.metadata.uid, mutate=mutate
        )
        assert_bumped(a.metadata, a2.metadata)
        assert a2.state is ActorState.RESUMING
        assert a.state is ActorState.SUSPENDED, "the earlier record is not changed"
        assert await store.get_actor(a.ref) == a2
        a3 = await store.update_actor(
            a.ref, expected_version=2, expected_uid=a.metadata.uid, mutate=keep
        )
        assert a3.metadata.version == 3


async def case_actor_update_conflict(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        a2 = await store.update_actor(
            a.ref, expected_version=1, expected_uid=a.metadata.uid, mutate=keep
        )
        calls: list[Actor] = []

        def record(x: Actor) -> Actor:
            calls.append(x)
            return set_state(ActorState.RUNNING)(x)

        with raises(Conflict) as caught:
            await store.update_actor(
                a.ref, expected_version=1, expected_uid=a.metadata.uid, mutate=record
            )
        assert caught.value.description == CONFLICT_MESSAGE
        assert calls == []
        assert await store.get_actor(a.ref) == a2


async def case_actor_update_uid_conflict(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        old = await store.create_actor(actor(state=ActorState.DELETING))
        await store.delete_actor(old.ref)
        new = await store.create_actor(actor())
        calls: list[Actor] = []

        def record(x: Actor) -> Actor:
            calls.append(x)
            return x

        with raises(Conflict, match=old.metadata.uid):
            await store.update_actor(
                old.ref, expected_version=1, expected_uid=old.metadata.uid, mutate=record
            )
        assert calls == [], "mutate never runs on a re-created record"
        assert await store.get_actor(new.ref) == new


async def case_actor_update_mutate_error(make_store: MakeStore) -> None:
    class Boom(Exception):
        pass

    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        boom = Boom("from mutate")

        def fail(x: Actor) -> Actor:
            raise boom

        with raises(Boom) as caught:
            await store.update_actor(
                a.ref, expected_version=1, expected_uid=a.metadata.uid, mutate=fail
            )
        assert caught.value is boom, "the mutate error propagates verbatim"
        assert await store.get_actor(a.ref) == a, "nothing was written"


async def case_actor_update_missing_precondition(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        for version, uid in ((None, None), (None, a.metadata.uid), (1, None), (1, "")):
            with raises(InvalidArgument, match="precondition required"):
                await store.update_actor(
                    a.ref, expected_version=version, expected_uid=uid, mutate=keep
                )
        assert await store.get_actor(a.ref) == a


async def case_actor_update_not_found(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        with raises(NotFound):
            await store.update_actor(
                ActorRef("as1", "ghost"), expected_version=1, expected_uid="u", mutate=keep
            )


async def case_actor_update_ref_is_immutable(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        with raises(InvalidArgument, match="immutable"):
            await store.update_actor(
                a.ref,
                expected_version=1,
                expected_uid=a.metadata.uid,
                mutate=lambda x: attrs.evolve(x, ref=ActorRef("as1", "moved")),
            )
        assert await store.get_actor(a.ref) == a
        with raises(NotFound):
            await store.get_actor(ActorRef("as1", "moved"))


async def case_actor_concurrent_updates_one_wins(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        outcomes: list[Actor | SubstrateError] = []

        async def update() -> None:
            try:
                outcomes.append(
                    await store.update_actor(
                        a.ref,
                        expected_version=1,
                        expected_uid=a.metadata.uid,
                        mutate=set_state(ActorState.RESUMING),
                    )
                )
            except Conflict as exc:
                outcomes.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(update)
        winners = [o for o in outcomes if isinstance(o, Actor)]
        assert len(winners) == 1, outcomes
        assert all(isinstance(o, Conflict) for o in outcomes if o not in winners)
        assert (await store.get_actor(a.ref)).metadata.version == 2


# --- actors: delete -----------------------------------------------------------------------


async def case_actor_delete_only_when_deleting(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        for state in ActorState:
            a = await store.create_actor(actor(name=f"s-{state.name.lower()}", state=state))
            if state is ActorState.DELETING:
                await store.delete_actor(a.ref)
                with raises(NotFound):
                    await store.get_actor(a.ref)
            else:
                with raises(FailedPrecondition, match=state.name):
                    await store.delete_actor(a.ref)
                assert await store.get_actor(a.ref) == a


async def case_actor_delete_not_found(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        with raises(NotFound):
            await store.delete_actor(ActorRef("as1", "ghost"))


async def case_actor_delete_preconditions(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor(state=ActorState.DELETING))
        with raises(Conflict):
            await store.delete_actor(a.ref, expected_version=2)
        with raises(Conflict):
            await store.delete_actor(a.ref, expected_uid="foreign")
        await store.delete_actor(a.ref, expected_version=1, expected_uid=a.metadata.uid)
        with raises(NotFound):
            await store.get_actor(a.ref)


# --- actors: list -------------------------------------------------------------------------


async def _populate(store: Store, spaces: dict[str, list[str]]) -> dict[ActorRef, Actor]:
    made: dict[ActorRef, Actor] = {}
    for space, names in spaces.items():
        await store.create_atespace(atespace(space))
        for name in names:
            a = await store.create_actor(actor(space, name))
            made[a.ref] = a
    return made


async def _walk(store: Store, space: str | None, size: int) -> list[Actor]:
    seen: list[Actor] = []
    token = ""
    for _ in range(1000):
        page, token = await store.list_actors(space, page_size=size, page_token=token)
        assert len(page) <= size
        seen.extend(page)
        if not token:
            return seen
        assert page, "a page before the last is never empty"
    raise AssertionError("pagination did not terminate")


async def case_actor_list_empty(make_store: MakeStore) -> None:
    async with make_store() as store:
        assert await store.list_actors() == ([], "")
        await store.create_atespace(atespace())
        assert await store.list_actors("as1") == ([], "")
        assert await store.list_actors("as1", page_size=5) == ([], "")


async def case_actor_list_all(make_store: MakeStore) -> None:
    async with make_store() as store:
        made = await _populate(store, {"bs": ["z", "a"], "as": ["m"]})
        page, token = await store.list_actors()
        assert token == ""
        assert page == [made[r] for r in sorted(made)]


async def case_actor_list_pagination(make_store: MakeStore) -> None:
    async with make_store() as store:
        made = await _populate(store, {"as1": ["a", "b", "c"], "as2": ["a", "d"]})
        expected = [made[r] for r in sorted(made)]
        for size in (1, 2, 3, 5, 6):
            assert await _walk(store, None, size) == expected, f"page_size {size}"
        page, token = await store.list_actors(page_size=2)
        assert [a.ref for a in page] == [ActorRef("as1", "a"), ActorRef("as1", "b")]
        assert token
        page, token = await store.list_actors(page_size=2, page_token=token)
        assert [a.ref for a in page] == [ActorRef("as1", "c"), ActorRef("as2", "a")]
        page, token = await store.list_actors(page_size=2, page_token=token)
        assert [a.ref for a in page] == [ActorRef("as2", "d")]
        assert token == ""


async def case_actor_list_scoped_by_atespace(make_store: MakeStore) -> None:
    async with make_store() as store:
        made = await _populate(store, {"as1": ["a", "b", "c"], "as2": ["a", "d"], "as3": []})
        as2 = [made[ActorRef("as2", "a")], made[ActorRef("as2", "d")]]
        assert await store.list_actors("as2") == (as2, "")
        assert await _walk(store, "as2", 1) == as2
        assert await _walk(store, "as1", 2) == [made[ActorRef("as1", n)] for n in ("a", "b", "c")]
        assert await store.list_actors("as3") == ([], "")
        with raises(NotFound, match="missing"):
            await store.list_actors("missing")
        with raises(NotFound):
            await store.list_actors("")


async def case_actor_list_page_size(make_store: MakeStore) -> None:
    async with make_store() as store:
        names = [f"a{i:03d}" for i in range(DEFAULT_PAGE_SIZE + 1)]
        await _populate(store, {"as1": names})
        with raises(InvalidArgument, match="page_size"):
            await store.list_actors(page_size=-1)
        page, token = await store.list_actors(page_size=0)
        assert len(page) == DEFAULT_PAGE_SIZE
        assert token
        rest, token = await store.list_actors(page_size=0, page_token=token)
        assert [a.ref.name for a in rest] == [names[-1]]
        assert token == ""
        page, token = await store.list_actors("as1", page_size=MAX_PAGE_SIZE + 1)
        assert len(page) == len(names)
        assert token == ""


async def case_actor_list_invalid_page_token(make_store: MakeStore) -> None:
    async with make_store() as store:
        await _populate(store, {"as1": ["a", "b", "c"], "as2": ["a"]})
        for bad in ("%%%", "bm90LWpzb24=", "e30=", "not base64!"):
            with raises(InvalidArgument, match="page token"):
                await store.list_actors(page_token=bad)
        _, token = await store.list_actors("as1", page_size=1)
        assert token
        with raises(InvalidArgument, match="page token"):
            await store.list_actors("as2", page_size=1, page_token=token)
        with raises(InvalidArgument, match="page token"):
            await store.list_actors(None, page_size=1, page_token=token)


async def case_actor_list_stable_under_concurrent_writes(make_store: MakeStore) -> None:
    async with make_store() as store:
        made = await _populate(store, {"as1": ["b", "d", "f", "h"]})
        page, token = await store.list_actors("as1", page_size=2)
        assert [a.ref.name for a in page] == ["b", "d"]
        await store.create_actor(actor("as1", "a"))
        await store.create_actor(actor("as1", "e"))
        await store.update_actor(
            ActorRef("as1", "f"),
            expected_version=1,
            expected_uid=made[ActorRef("as1", "f")].metadata.uid,
            mutate=set_state(ActorState.DELETING),
        )
        await store.delete_actor(ActorRef("as1", "f"))
        rest = []
        while token:
            more, token = await store.list_actors("as1", page_size=2, page_token=token)
            rest.extend(more)
        assert [a.ref.name for a in rest] == ["e", "h"]


# --- tags ---------------------------------------------------------------------------------


async def case_tag_lifecycle(make_store: MakeStore) -> None:
    async with make_store() as store:
        with raises(FailedPrecondition):
            await store.create_tag(tag())
        await store.create_atespace(atespace())
        given = Tag(
            ref=TagRef("as1", "golden"),
            source_actor=ActorRef("as1", "a1"),
            template=TemplateRef("as1", "tmpl"),
            snapshot=full_actor().status.snapshots[0],
        )
        t = await store.create_tag(given)
        assert_fresh(t.metadata)
        assert without_metadata(t) == given
        assert await store.get_tag(t.ref) == t
        with raises(AlreadyExists):
            await store.create_tag(given)
        t0 = await store.create_tag(tag("as1", "another"))
        assert await store.list_tags("as1") == [t0, t]
        with raises(NotFound):
            await store.list_tags("nope")

        t2 = await store.update_tag(
            t.ref,
            expected_version=1,
            expected_uid=t.metadata.uid,
            mutate=lambda x: attrs.evolve(x, snapshot=None),
        )
        assert_bumped(t.metadata, t2.metadata)
        assert t2.snapshot is None
        with raises(Conflict):
            await store.update_tag(
                t.ref, expected_version=1, expected_uid=t.metadata.uid, mutate=lambda x: x
            )
        with raises(InvalidArgument, match="precondition required"):
            await store.update_tag(
                t.ref, expected_version=None, expected_uid=t.metadata.uid, mutate=lambda x: x
            )
        with raises(Conflict):
            await store.delete_tag(t.ref, expected_version=1)
        await store.delete_tag(t.ref, expected_version=2)
        with raises(NotFound):
            await store.get_tag(t.ref)
        with raises(NotFound):
            await store.delete_tag(t.ref)
        assert await store.list_tags("as1") == [t0]


# --- workers ------------------------------------------------------------------------------


async def case_worker_get_not_found(make_store: MakeStore) -> None:
    async with make_store() as store:
        with raises(NotFound, match="w1"):
            await store.get_worker(WorkerRef("w1"))


async def case_worker_create_success(make_store: MakeStore) -> None:
    async with make_store() as store, store.watch_workers() as events:
        given = attrs.evolve(full_worker(), allocated=Capacity(actors=3, cpu_milli=9))
        w = await store.create_worker(given)
        assert_fresh(w.metadata)
        assert w.allocated == Capacity(), "nothing is allocated on a new worker"
        assert without_metadata(w) == attrs.evolve(given, allocated=Capacity())
        assert await store.get_worker(w.ref) == w
        assert await next_events(events, 1) == [WorkerEvent(kind=WorkerEventKind.CREATED, worker=w)]


async def case_worker_create_already_exists(make_store: MakeStore) -> None:
    async with make_store() as store:
        first = await store.create_worker(worker())
        with raises(AlreadyExists, match="w1"):
            await store.create_worker(worker(slots=9))
        assert await store.get_worker(first.ref) == first


async def case_worker_list(make_store: MakeStore) -> None:
    async with make_store() as store:
        assert await store.list_workers() == []
        b = await store.create_worker(worker("w-b"))
        a = await store.create_worker(full_worker("w-a"))
        assert await store.list_workers() == [a, b]


async def case_worker_update_success(make_store: MakeStore) -> None:
    async with make_store() as store:
        w = await store.create_worker(worker(capacity=False, state=WorkerState.UNAVAILABLE))
        async with store.watch_workers() as events:

            def register(x: Worker) -> Worker:
                return attrs.evolve(
                    x,
                    state=WorkerState.ACTIVE,
                    epoch=2,
                    capacity=Capacity(cpu_milli=1000, memory_bytes=GIB, actors=4),
                    ips=("10.0.0.99",),
                    metadata=Metadata(uid="forged"),
                )

            w2 = await store.update_worker(
                w.ref, expected_version=1, expected_uid=w.metadata.uid, mutate=register
            )
            assert_bumped(w.metadata, w2.metadata)
            assert w2.state is WorkerState.ACTIVE
            assert w2.capacity == Capacity(cpu_milli=1000, memory_bytes=GIB, actors=4)
            assert await store.get_worker(w.ref) == w2
            assert await next_events(events, 1) == [
                WorkerEvent(kind=WorkerEventKind.UPDATED, worker=w2)
            ]


async def case_worker_update_errors(make_store: MakeStore) -> None:
    async with make_store() as store:
        with raises(NotFound):
            await store.update_worker(
                WorkerRef("ghost"), expected_version=1, expected_uid="u", mutate=lambda x: x
            )
        w = await store.create_worker(worker())
        for version, uid in ((None, None), (None, w.metadata.uid), (1, None)):
            with raises(InvalidArgument, match="precondition required"):
                await store.update_worker(
                    w.ref, expected_version=version, expected_uid=uid, mutate=lambda x: x
                )
        with raises(Conflict, match=CONFLICT_MESSAGE):
            await store.update_worker(
                w.ref, expected_version=2, expected_uid=w.metadata.uid, mutate=lambda x: x
            )
        with raises(Conflict, match="uid"):
            await store.update_worker(
                w.ref, expected_version=1, expected_uid="foreign", mutate=lambda x: x
            )

        class Boom(Exception):
            pass

        def fail(x: Worker) -> Worker:
            raise Boom("no")

        with raises(Boom):
            await store.update_worker(
                w.ref, expected_version=1, expected_uid=w.metadata.uid, mutate=fail
            )
        assert await store.get_worker(w.ref) == w, "no write, no version bump"


async def case_worker_update_uid_conflict(make_store: MakeStore) -> None:
    async with make_store() as store:
        old = await store.create_worker(worker())
        await store.delete_worker(old.ref)
        new = await store.create_worker(worker())
        calls: list[Worker] = []

        def record(x: Worker) -> Worker:
            calls.append(x)
            return x

        with raises(Conflict, match=old.metadata.uid):
            await store.update_worker(
                old.ref, expected_version=1, expected_uid=old.metadata.uid, mutate=record
            )
        assert calls == []
        assert await store.get_worker(new.ref) == new


async def case_worker_update_immutable_fields(make_store: MakeStore) -> None:
    async with make_store() as store:
        w = await store.create_worker(worker())
        changes: dict[str, Callable[[Worker], Worker]] = {
            "ref": lambda x: attrs.evolve(x, ref=WorkerRef("w2")),
            "node": lambda x: attrs.evolve(x, node=NodeRef("node-9")),
            "pool": lambda x: attrs.evolve(x, pool="other"),
            "sandbox_class": lambda x: attrs.evolve(x, sandbox_class=SandboxClass.MICROVM),
            "allocated": lambda x: attrs.evolve(x, allocated=Capacity(actors=1)),
            "epoch": lambda x: attrs.evolve(x, epoch=0),
        }
        for field, mutate in changes.items():
            with raises(InvalidArgument, match=field):
                await store.update_worker(
                    w.ref, expected_version=1, expected_uid=w.metadata.uid, mutate=mutate
                )
        assert await store.get_worker(w.ref) == w
        w2 = await store.update_worker(
            w.ref,
            expected_version=1,
            expected_uid=w.metadata.uid,
            mutate=lambda x: attrs.evolve(x, epoch=5, capacity=None, labels=Labels()),
        )
        assert (w2.epoch, w2.capacity, w2.labels) == (5, None, Labels())


async def case_worker_concurrent_update_one_wins(make_store: MakeStore) -> None:
    async with make_store() as store:
        w = await store.create_worker(worker())
        outcomes: list[Worker | SubstrateError] = []

        async def claim(i: int) -> None:
            try:
                outcomes.append(
                    await store.update_worker(
                        w.ref,
                        expected_version=1,
                        expected_uid=w.metadata.uid,
                        mutate=lambda x: attrs.evolve(x, labels=Labels.of({"owner": f"c{i}"})),
                    )
                )
            except Conflict as exc:
                outcomes.append(exc)

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(claim, i)
        winners = [o for o in outcomes if isinstance(o, Worker)]
        assert len(winners) == 1, outcomes
        assert sum(isinstance(o, Conflict) for o in outcomes) == 7
        final = await store.get_worker(w.ref)
        assert final == winners[0]
        assert final.metadata.version == 2


async def case_worker_delete(make_store: MakeStore) -> None:
    async with make_store() as store:
        with raises(NotFound):
            await store.delete_worker(WorkerRef("ghost"))
        w = await store.create_worker(full_worker())
        async with store.watch_workers() as events:
            with raises(Conflict):
                await store.delete_worker(w.ref, expected_version=2)
            with raises(Conflict):
                await store.delete_worker(w.ref, expected_uid="foreign")
            removed = await store.delete_worker(
                w.ref, expected_version=1, expected_uid=w.metadata.uid
            )
            assert removed == w
            with raises(NotFound):
                await store.get_worker(w.ref)
            with raises(NotFound):
                await store.delete_worker(w.ref)
            assert await next_events(events, 1) == [
                WorkerEvent(kind=WorkerEventKind.DELETED, worker=w)
            ]
        assert await store.list_workers() == []


async def case_worker_watch_in_commit_order(make_store: MakeStore) -> None:
    async with make_store() as store:
        async with store.watch_workers() as events:
            a = await store.create_worker(worker("w-a"))
            b = await store.create_worker(worker("w-b"))
            a2 = await store.update_worker(
                a.ref,
                expected_version=1,
                expected_uid=a.metadata.uid,
                mutate=lambda x: attrs.evolve(x, state=WorkerState.DRAINING),
            )
            removed = await store.delete_worker(b.ref)
            a3 = await store.update_worker(
                a.ref,
                expected_version=2,
                expected_uid=a.metadata.uid,
                mutate=lambda x: attrs.evolve(x, epoch=2),
            )
            seen = await events_until_sentinel(store, events)
        assert seen == [
            WorkerEvent(kind=WorkerEventKind.CREATED, worker=a),
            WorkerEvent(kind=WorkerEventKind.CREATED, worker=b),
            WorkerEvent(kind=WorkerEventKind.UPDATED, worker=a2),
            WorkerEvent(kind=WorkerEventKind.DELETED, worker=removed),
            WorkerEvent(kind=WorkerEventKind.UPDATED, worker=a3),
        ]


async def case_worker_watch_fan_out(make_store: MakeStore) -> None:
    async with make_store() as store:
        async with store.watch_workers() as first, store.watch_workers() as second:
            w = await store.create_worker(worker())
            expected = [WorkerEvent(kind=WorkerEventKind.CREATED, worker=w)]
            assert await next_events(first, 1) == expected
            assert await next_events(second, 1) == expected
        async with store.watch_workers() as late:
            await store.delete_worker(w.ref)
            seen = await events_until_sentinel(store, late)
        assert seen == [WorkerEvent(kind=WorkerEventKind.DELETED, worker=w)], (
            "a watch sees only changes committed after it subscribed"
        )


async def case_worker_watch_ends_on_close(make_store: MakeStore) -> None:
    async with make_store() as store, store.watch_workers() as events:
        await store.close()
        with anyio.fail_after(EVENT_TIMEOUT):
            rest = [e async for e in events]
        assert rest == []


async def case_worker_watch_concurrent_writers(make_store: MakeStore) -> None:
    async with make_store() as store:
        made = [await store.create_worker(worker(f"w{i}", slots=4)) for i in range(4)]
        async with store.watch_workers() as events:

            async def churn(w: Worker) -> None:
                current = w
                for _ in range(5):
                    current = await store.update_worker(
                        current.ref,
                        expected_version=current.metadata.version,
                        expected_uid=current.metadata.uid,
                        mutate=lambda x: attrs.evolve(x, last_heartbeat=x.last_heartbeat + 1),
                    )

            async with anyio.create_task_group() as tg:
                for w in made:
                    tg.start_soon(churn, w)
            seen = await events_until_sentinel(store, events)
        assert len(seen) == 20
        for w in made:
            versions = [e.version for e in seen if e.ref == w.ref]
            assert versions == [2, 3, 4, 5, 6], f"{w.ref}: {versions}"
        final = {w.ref: w for w in await store.list_workers()}
        for e in seen:
            if e.version == 6:
                assert e.worker == final[e.ref]


# --- bindings -----------------------------------------------------------------------------


async def case_bind_success(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        w = await store.create_worker(worker(slots=2))
        async with store.watch_workers() as events:
            result = await bind(store, a, w)
            assert result.binding.actor == a.ref
            assert result.binding.actor_uid == a.metadata.uid
            assert result.binding.worker == w.ref
            assert result.binding.worker_epoch == w.epoch
            assert result.binding.resources == SMALL
            assert_bumped(a.metadata, result.actor.metadata)
            assert result.actor.state is ActorState.RESUMING
            assert result.actor.status.assignment is not None
            assert result.actor.status.assignment.worker == w.ref
            assert_bumped(w.metadata, result.worker.metadata)
            assert result.worker.allocated == Capacity().plus(SMALL)
            assert await store.get_actor(a.ref) == result.actor
            assert await store.get_worker(w.ref) == result.worker
            assert await store.get_binding(a.metadata.uid) == result.binding
            assert await store.list_bindings(w.ref) == [result.binding]
            assert await store.list_bindings() == [result.binding]
            assert await next_events(events, 1) == [
                WorkerEvent(kind=WorkerEventKind.UPDATED, worker=result.worker)
            ]
        await assert_allocations_consistent(store)


async def case_bind_eight_claimants_one_slot(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        w = await store.create_worker(worker(slots=1))
        claimants = [await store.create_actor(actor(name=f"c{i}")) for i in range(8)]
        outcomes: dict[str, BindResult | SubstrateError] = {}

        async def claim(a: Actor) -> None:
            try:
                outcomes[a.ref.name] = await bind(store, a, w)
            except (ResourceExhausted, Conflict) as exc:
                outcomes[a.ref.name] = exc

        async with anyio.create_task_group() as tg:
            for a in claimants:
                tg.start_soon(claim, a)
        winners = [o for o in outcomes.values() if isinstance(o, BindResult)]
        losers = [o for o in outcomes.values() if not isinstance(o, BindResult)]
        assert len(winners) == 1, outcomes
        assert len(losers) == 7
        for loser in losers:
            assert isinstance(loser, ResourceExhausted), loser
            assert loser.description == NO_ROOM_MESSAGE
        final = await store.get_worker(w.ref)
        assert final.allocated == Capacity().plus(SMALL)
        assert final.metadata.version == 2
        assert await store.list_bindings(w.ref) == [winners[0].binding]
        for a in claimants:
            if a.ref != winners[0].actor.ref:
                assert await store.get_actor(a.ref) == a, "a loser's actor is not written"
                assert await store.get_binding(a.metadata.uid) is None


async def case_bind_concurrent_claimants_fill_capacity(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        w = await store.create_worker(worker(slots=3))
        claimants = [await store.create_actor(actor(name=f"c{i}")) for i in range(8)]
        wins: list[BindResult] = []
        losses: list[ResourceExhausted] = []

        async def claim(a: Actor) -> None:
            try:
                wins.append(await bind(store, a, w))
            except ResourceExhausted as exc:
                losses.append(exc)

        async with anyio.create_task_group() as tg:
            for a in claimants:
                tg.start_soon(claim, a)
        assert (len(wins), len(losses)) == (3, 5)
        final = await store.get_worker(w.ref)
        assert final.allocated.actors == 3
        assert final.metadata.version == 4
        await assert_allocations_consistent(store)


async def case_bind_rechecks_room(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        cases = {
            "no-capacity": (worker("no-capacity", capacity=False), SMALL),
            "no-slot": (worker("no-slot", slots=0), SMALL),
            "no-cpu": (worker("no-cpu", slots=4, cpu_milli=400), SMALL),
            "no-memory": (worker("no-memory", slots=4, memory_bytes=GIB - 1), SMALL),
        }
        for name, (spec, resources) in cases.items():
            w = await store.create_worker(spec)
            with raises(ResourceExhausted, match=NO_ROOM_MESSAGE):
                await bind(store, a, w, resources)
            assert await store.get_worker(w.ref) == w, name
        exact = await store.create_worker(worker("exact", slots=1, cpu_milli=500, memory_bytes=GIB))
        result = await bind(store, a, exact)
        assert result.worker.allocated == Capacity(cpu_milli=500, memory_bytes=GIB, actors=1)
        assert await store.get_actor(a.ref) == result.actor
        await assert_allocations_consistent(store)


async def case_bind_rechecks_cpu_and_memory_across_bindings(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        w = await store.create_worker(worker(slots=10, cpu_milli=1000, memory_bytes=3 * GIB))
        a1, a2, a3 = [await store.create_actor(actor(name=f"a{i}")) for i in range(3)]
        await bind(store, a1, w, Resources(cpu_milli=600, memory_bytes=GIB))
        with raises(ResourceExhausted):
            await bind(store, a2, w, Resources(cpu_milli=500, memory_bytes=GIB))
        await bind(store, a2, w, Resources(cpu_milli=400, memory_bytes=GIB))
        with raises(ResourceExhausted):
            await bind(store, a3, w, Resources(cpu_milli=0, memory_bytes=GIB + 1))
        await bind(store, a3, w, Resources(cpu_milli=0, memory_bytes=GIB))
        final = await store.get_worker(w.ref)
        assert final.allocated == Capacity(cpu_milli=1000, memory_bytes=3 * GIB, actors=3)
        await assert_allocations_consistent(store)


async def case_bind_rechecks_state_and_epoch(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        for state in (WorkerState.DRAINING, WorkerState.UNAVAILABLE):
            w = await store.create_worker(worker(f"w-{state.name.lower()}", slots=4, state=state))
            with raises(ResourceExhausted, match=state.name):
                await bind(store, a, w)
            assert await store.get_worker(w.ref) == w
        w = await store.create_worker(worker("w-epoch", slots=4, epoch=3))
        with raises(Conflict, match="epoch"):
            await bind(store, a, w, epoch=2)
        assert await store.get_worker(w.ref) == w
        assert await store.get_actor(a.ref) == a
        assert await store.list_bindings() == []


async def case_bind_actor_preconditions(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        w = await store.create_worker(worker(slots=4))
        for version, uid in ((None, a.metadata.uid), (1, None), (None, None)):
            with raises(InvalidArgument, match="precondition required"):
                await store.bind_actor(
                    a.ref,
                    expected_actor_version=version,
                    expected_actor_uid=uid,
                    worker=w.ref,
                    expected_worker_epoch=w.epoch,
                    resources=SMALL,
                    mutate_actor=keep,
                )
        stale = attrs.evolve(a, metadata=attrs.evolve(a.metadata, version=7))
        with raises(Conflict, match=CONFLICT_MESSAGE):
            await bind(store, stale, w)
        foreign = attrs.evolve(a, metadata=attrs.evolve(a.metadata, uid="foreign"))
        with raises(Conflict, match="uid"):
            await bind(store, foreign, w)
        ghost = attrs.evolve(actor(name="ghost"), metadata=Metadata(uid="u-ghost", version=1))
        with raises(NotFound):
            await bind(store, ghost, w)
        with raises(NotFound):
            await bind(store, a, worker("ghost"))

        class Boom(Exception):
            pass

        def fail(x: Actor) -> Actor:
            raise Boom("no")

        with raises(Boom):
            await store.bind_actor(
                a.ref,
                expected_actor_version=1,
                expected_actor_uid=a.metadata.uid,
                worker=w.ref,
                expected_worker_epoch=w.epoch,
                resources=SMALL,
                mutate_actor=fail,
            )
        with raises(InvalidArgument, match="immutable"):
            await store.bind_actor(
                a.ref,
                expected_actor_version=1,
                expected_actor_uid=a.metadata.uid,
                worker=w.ref,
                expected_worker_epoch=w.epoch,
                resources=SMALL,
                mutate_actor=lambda x: attrs.evolve(x, ref=ActorRef("as1", "other")),
            )
        assert await store.get_actor(a.ref) == a
        assert await store.get_worker(w.ref) == w
        assert await store.list_bindings() == []


async def case_bind_same_worker_is_idempotent(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        w = await store.create_worker(worker(slots=1))
        first = await bind(store, a, w)
        again = await bind(store, first.actor, first.worker)
        assert again.binding == first.binding
        assert again.worker == first.worker, "nothing new is booked"
        assert_bumped(first.actor.metadata, again.actor.metadata)
        assert await store.get_worker(w.ref) == first.worker
        assert await store.list_bindings() == [first.binding]
        await assert_allocations_consistent(store)


async def case_bind_elsewhere_while_bound_fails(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        w1 = await store.create_worker(worker("w1", slots=2))
        w2 = await store.create_worker(worker("w2", slots=2))
        first = await bind(store, a, w1)
        with raises(FailedPrecondition, match="w1"):
            await bind(store, first.actor, w2)
        assert await store.get_worker(w2.ref) == w2
        assert await store.get_actor(a.ref) == first.actor
        await store.release_actor(a.metadata.uid)
        moved = await bind(store, first.actor, w2)
        assert moved.binding.worker == w2.ref
        await assert_allocations_consistent(store)


async def case_release_restores_allocation(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        b = await store.create_actor(actor(name="b"))
        w = await store.create_worker(worker(slots=1))
        bound = await bind(store, a, w)
        with raises(ResourceExhausted):
            await bind(store, b, w)
        async with store.watch_workers() as events:
            released = await store.release_actor(a.metadata.uid)
            assert released == bound.binding
            after = await store.get_worker(w.ref)
            assert after.allocated == Capacity()
            assert_bumped(bound.worker.metadata, after.metadata)
            assert await next_events(events, 1) == [
                WorkerEvent(kind=WorkerEventKind.UPDATED, worker=after)
            ]
        assert await store.get_binding(a.metadata.uid) is None
        assert await store.get_actor(a.ref) == bound.actor, "release leaves the actor alone"
        assert await store.release_actor(a.metadata.uid) is None, "release is idempotent"
        assert await store.release_actor("never-bound") is None
        assert await store.get_worker(w.ref) == after
        await bind(store, b, w)
        await assert_allocations_consistent(store)


async def case_allocated_equals_sum_of_bindings(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        w1 = await store.create_worker(worker("w1", slots=4, cpu_milli=10_000))
        w2 = await store.create_worker(worker("w2", slots=4, cpu_milli=10_000))
        actors = [await store.create_actor(actor(name=f"a{i}")) for i in range(6)]
        sizes = [Resources(cpu_milli=100 * (i + 1), memory_bytes=i * 1000) for i in range(6)]
        current: dict[ActorRef, Actor] = {}
        for i, a in enumerate(actors):
            current[a.ref] = (await bind(store, a, (w1, w2)[i % 2], sizes[i])).actor
        await assert_allocations_consistent(store)
        for a in actors[::2]:
            assert await store.release_actor(a.metadata.uid) is not None
        await assert_allocations_consistent(store)
        moved = await bind(store, current[actors[0].ref], w2, sizes[0])
        assert moved.binding.worker == w2.ref
        await assert_allocations_consistent(store)
        expected = {w1.ref: Capacity(), w2.ref: Capacity()}
        for b in await store.list_bindings():
            expected[b.worker] = expected[b.worker].plus(b.resources)
        assert {w.ref: w.allocated for w in await store.list_workers()} == expected
        assert expected[w1.ref] == Capacity()
        assert expected[w2.ref].actors == 4


async def case_delete_actor_releases_its_binding(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        w = await store.create_worker(worker(slots=1))
        bound = await bind(store, a, w)
        doomed = await store.update_actor(
            a.ref,
            expected_version=bound.actor.metadata.version,
            expected_uid=a.metadata.uid,
            mutate=set_state(ActorState.DELETING),
        )
        await store.delete_actor(a.ref, expected_version=doomed.metadata.version)
        assert await store.get_binding(a.metadata.uid) is None
        assert (await store.get_worker(w.ref)).allocated == Capacity()
        await assert_allocations_consistent(store)


async def case_delete_worker_drops_its_bindings(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        b = await store.create_actor(actor(name="b"))
        w1 = await store.create_worker(worker("w1", slots=2))
        w2 = await store.create_worker(worker("w2", slots=2))
        bound_a = await bind(store, a, w1)
        bound_b = await bind(store, b, w2)
        removed = await store.delete_worker(w1.ref)
        assert removed == bound_a.worker
        assert await store.get_binding(a.metadata.uid) is None
        assert await store.list_bindings() == [bound_b.binding]
        assert await store.get_actor(a.ref) == bound_a.actor, "bound actors are not changed"
        assert await store.release_actor(a.metadata.uid) is None
        await assert_allocations_consistent(store)


# --- leases -------------------------------------------------------------------------------


async def case_lease_acquire_and_conflict(make_store: MakeStore) -> None:
    key = ActorRef("as1", "a1").lease_key
    async with make_store() as store:
        assert not await store.lease_alive(key)
        lease = await store.acquire_lease(key, ttl=make_store.lease_ttl)
        assert lease.key == key
        assert lease.token
        assert await store.lease_alive(key)
        assert await store.list_leases() == [lease]
        with raises(LeaseHeld) as caught:
            await store.acquire_lease(key, ttl=make_store.lease_ttl)
        assert caught.value.description == LEASE_HELD_MESSAGE
        other = await store.acquire_lease(ActorRef("as2", "a1").lease_key, ttl=60)
        assert other.token != lease.token
        assert [x.key for x in await store.list_leases()] == sorted([key, other.key])
        with raises(InvalidArgument, match="ttl"):
            await store.acquire_lease("lease:other", ttl=0)


async def case_lease_not_reentrant(make_store: MakeStore) -> None:
    async with make_store() as store:
        lease = await store.acquire_lease("k", ttl=make_store.lease_ttl)
        for _ in range(2):
            with raises(LeaseHeld):
                await store.acquire_lease("k", ttl=make_store.lease_ttl)
        assert await store.list_leases() == [lease]


async def case_lease_concurrent_acquire_one_wins(make_store: MakeStore) -> None:
    async with make_store() as store:
        wins: list[object] = []
        losses: list[LeaseHeld] = []

        async def take() -> None:
            try:
                wins.append(await store.acquire_lease("k", ttl=60))
            except LeaseHeld as exc:
                losses.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(take)
        assert (len(wins), len(losses)) == (1, 7)


async def case_lease_release(make_store: MakeStore) -> None:
    async with make_store() as store:
        lease = await store.acquire_lease("k", ttl=make_store.lease_ttl)
        await store.release_lease(lease)
        assert not await store.lease_alive("k")
        assert await store.list_leases() == []
        await store.release_lease(lease)
        again = await store.acquire_lease("k", ttl=make_store.lease_ttl)
        assert again.token != lease.token
        await store.release_lease(lease)
        assert await store.lease_alive("k"), "a stale token does not release a new holder"
        await store.release_lease(again)
        assert not await store.lease_alive("k")


async def case_lease_foreign_token_does_not_release(make_store: MakeStore) -> None:
    async with make_store() as store:
        lease = await store.acquire_lease("k", ttl=make_store.lease_ttl)
        await store.release_lease(attrs.evolve(lease, token="forged"))
        assert await store.lease_alive("k")
        with raises(LeaseHeld):
            await store.acquire_lease("k", ttl=make_store.lease_ttl)
        with raises(LeaseHeld):
            await store.renew_lease(attrs.evolve(lease, token="forged"), ttl=make_store.lease_ttl)


async def case_lease_expiry_reclaim(make_store: MakeStore) -> None:
    ttl = make_store.lease_ttl
    async with make_store() as store:
        lease = await store.acquire_lease("k", ttl=ttl)
        await make_store.advance(ttl * 1.5)
        assert not await store.lease_alive("k")
        assert await store.list_leases() == []
        successor = await store.acquire_lease("k", ttl=ttl * 4)
        assert successor.token != lease.token
        assert successor.expires_at > lease.expires_at
        await store.release_lease(lease)
        assert await store.lease_alive("k"), "the expired holder cannot release the successor"
        with raises(LeaseHeld):
            await store.renew_lease(lease, ttl=ttl)
        with raises(LeaseHeld):
            await store.acquire_lease("k", ttl=ttl)


async def case_lease_renew(make_store: MakeStore) -> None:
    ttl = make_store.lease_ttl
    async with make_store() as store:
        lease = await store.acquire_lease("k", ttl=ttl)
        await make_store.advance(ttl * 0.5)
        renewed = await store.renew_lease(lease, ttl=ttl)
        assert renewed.token == lease.token
        assert renewed.expires_at > lease.expires_at
        await make_store.advance(ttl * 0.6)
        assert await store.lease_alive("k"), "renewal moved the expiry"
        with raises(LeaseHeld):
            await store.acquire_lease("k", ttl=ttl)
        await make_store.advance(ttl * 0.9)
        assert not await store.lease_alive("k")
        with raises(NotFound):
            await store.renew_lease(renewed, ttl=ttl)
        with raises(InvalidArgument, match="ttl"):
            await store.renew_lease(renewed, ttl=-1)
        fresh = await store.acquire_lease("k", ttl=ttl)
        await store.release_lease(fresh)
        with raises(NotFound):
            await store.renew_lease(fresh, ttl=ttl)
        with raises(NotFound):
            await store.renew_lease(attrs.evolve(fresh, key="never"), ttl=ttl)


# --- administration -----------------------------------------------------------------------


async def case_clear_wipes_everything(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        await store.create_template(template())
        await store.create_tag(tag())
        a = await store.create_actor(actor())
        w = await store.create_worker(worker())
        bound = await bind(store, a, w)
        await store.acquire_lease("k", ttl=60)
        async with store.watch_workers() as events:
            await store.clear()
            seen = await events_until_sentinel(store, events)
        assert seen == [WorkerEvent(kind=WorkerEventKind.DELETED, worker=bound.worker)]
        await store.delete_worker(WorkerRef("zz-sentinel"))
        assert await store.list_atespaces() == []
        assert await store.list_actors() == ([], "")
        assert await store.list_workers() == []
        assert await store.list_bindings() == []
        assert await store.get_binding(a.metadata.uid) is None
        assert await store.list_leases() == []
        assert not await store.lease_alive("k")
        await store.create_atespace(atespace())
        assert await store.list_templates("as1") == []
        assert await store.list_tags("as1") == []
        await store.acquire_lease("k", ttl=60)


async def case_closed_store_is_unavailable(make_store: MakeStore) -> None:
    async with make_store() as store:
        await store.create_atespace(atespace())
        await store.close()
        await store.close()
        with raises(Unavailable):
            await store.get_atespace("as1")
        with raises(Unavailable):
            await store.acquire_lease("k", ttl=60)
        with raises(Unavailable):
            async with store.watch_workers():
                pass


STORE_CASES: Final[tuple[StoreCase, ...]] = (
    case_atespace_create_get_list,
    case_atespace_create_already_exists,
    case_atespace_get_not_found,
    case_atespace_delete,
    case_atespace_delete_blocked_by_actor,
    case_atespace_delete_blocked_by_template,
    case_atespace_delete_blocked_by_tag,
    case_atespace_delete_scoped_to_target,
    case_atespace_delete_races_create,
    case_template_lifecycle,
    case_template_create_errors,
    case_template_update_missing_precondition,
    case_template_update_uid_conflict,
    case_actor_get_not_found,
    case_actor_create_success,
    case_actor_round_trips_every_field,
    case_actor_create_already_exists,
    case_actor_create_missing_atespace,
    case_actor_same_name_in_two_atespaces,
    case_actor_update_success,
    case_actor_update_conflict,
    case_actor_update_uid_conflict,
    case_actor_update_mutate_error,
    case_actor_update_missing_precondition,
    case_actor_update_not_found,
    case_actor_update_ref_is_immutable,
    case_actor_concurrent_updates_one_wins,
    case_actor_delete_only_when_deleting,
    case_actor_delete_not_found,
    case_actor_delete_preconditions,
    case_actor_list_empty,
    case_actor_list_all,
    case_actor_list_pagination,
    case_actor_list_scoped_by_atespace,
    case_actor_list_page_size,
    case_actor_list_invalid_page_token,
    case_actor_list_stable_under_concurrent_writes,
    case_tag_lifecycle,
    case_worker_get_not_found,
    case_worker_create_success,
    case_worker_create_already_exists,
    case_worker_list,
    case_worker_update_success,
    case_worker_update_errors,
    case_worker_update_uid_conflict,
    case_worker_update_immutable_fields,
    case_worker_concurrent_update_one_wins,
    case_worker_delete,
    case_worker_watch_in_commit_order,
    case_worker_watch_fan_out,
    case_worker_watch_ends_on_close,
    case_worker_watch_concurrent_writers,
    case_bind_success,
    case_bind_eight_claimants_one_slot,
    case_bind_concurrent_claimants_fill_capacity,
    case_bind_rechecks_room,
    case_bind_rechecks_cpu_and_memory_across_bindings,
    case_bind_rechecks_state_and_epoch,
    case_bind_actor_preconditions,
    case_bind_same_worker_is_idempotent,
    case_bind_elsewhere_while_bound_fails,
    case_release_restores_allocation,
    case_allocated_equals_sum_of_bindings,
    case_delete_actor_releases_its_binding,
    case_delete_worker_drops_its_bindings,
    case_lease_acquire_and_conflict,
    case_lease_not_reentrant,
    case_lease_concurrent_acquire_one_wins,
    case_lease_release,
    case_lease_foreign_token_does_not_release,
    case_lease_expiry_reclaim,
    case_lease_renew,
    case_clear_wipes_everything,
    case_closed_store_is_unavailable,
)
"""Every Store case, in a stable order."""


__all__ = [
    "STORE_CASES",
    "Caught",
    "MakeStore",
    "StoreCase",
    "StoreFactory",
    "raises",
]
