"""The store's short paths keep the guarantees of the long ones.

Single-row updates are optimistic (a conditional ``UPDATE`` over the version read),
releases try one conditional write before locking, and reads reuse a document already
decoded for the same row version. Another replica writing the same rows must never be
overwritten or shadowed by what one store remembers.
"""

from __future__ import annotations

import anyio
import asyncpg
import pytest

from substrate.adapters.postgres import PostgresStore
from substrate.core.model import Actor, ActorState, Atespace, Capacity, Resources
from substrate.errors import Conflict, InvalidArgument, NotFound
from substrate.testing.contracts.store import (
    actor,
    assert_allocations_consistent,
    atespace,
    bind,
    set_state,
    worker,
)

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


async def test_a_replicas_update_is_seen_and_never_overwritten(pg_url: str) -> None:
    async with (
        await PostgresStore.connect(pg_url) as one,
        await PostgresStore.connect(pg_url) as other,
    ):
        await one.create_atespace(atespace())
        a1 = await one.create_actor(actor())
        assert await one.get_actor(a1.ref) == a1  # `one` now knows version 1
        a2 = await other.update_actor(
            a1.ref,
            expected_version=1,
            expected_uid=a1.metadata.uid,
            mutate=set_state(ActorState.RESUMING),
        )
        calls: list[Actor] = []

        def record(x: Actor) -> Actor:
            calls.append(x)
            return x

        with pytest.raises(Conflict):
            await one.update_actor(
                a1.ref, expected_version=1, expected_uid=a1.metadata.uid, mutate=record
            )
        assert await one.get_actor(a1.ref) == a2, "the replica's write stands"
        a3 = await one.update_actor(
            a1.ref,
            expected_version=2,
            expected_uid=a1.metadata.uid,
            mutate=set_state(ActorState.RUNNING),
        )
        assert calls == [], "mutate does not run over a stale version"
        assert a3.metadata.version == 3
        assert a3.state is ActorState.RUNNING
        assert await other.get_actor(a1.ref) == a3


async def rewrite_state_behind_the_store(pg_url: str, state: ActorState) -> None:
    """Change every actor's document in place, keeping uid and version."""
    admin = await asyncpg.connect(pg_url)
    try:
        await admin.execute(
            "UPDATE actors SET doc = jsonb_set(doc, '{status,state}', to_jsonb($1::text))",
            state.name,
        )
    finally:
        await admin.close()


async def test_a_row_rewritten_behind_the_store_is_read_again(pg_url: str) -> None:
    """Same uid and version, another row version: the store does not trust its memory."""
    async with await PostgresStore.connect(pg_url) as store:
        await store.create_atespace(atespace())
        a = await store.create_actor(actor())
        assert await store.get_actor(a.ref) == a
        await rewrite_state_behind_the_store(pg_url, ActorState.PAUSED)
        updated = await store.update_actor(
            a.ref, expected_version=1, expected_uid=a.metadata.uid, mutate=lambda x: x
        )
        assert updated.state is ActorState.PAUSED, "mutate got the row as it is now"
        await rewrite_state_behind_the_store(pg_url, ActorState.RUNNING)
        seen = await store.get_actor(a.ref)
        assert seen.state is ActorState.RUNNING


async def test_an_update_of_a_deleted_actor_is_not_found(pg_url: str) -> None:
    async with (
        await PostgresStore.connect(pg_url) as one,
        await PostgresStore.connect(pg_url) as other,
    ):
        await one.create_atespace(atespace())
        a = await one.create_actor(actor(state=ActorState.DELETING))
        await other.delete_actor(a.ref)
        with pytest.raises(NotFound):
            await one.update_actor(
                a.ref, expected_version=1, expected_uid=a.metadata.uid, mutate=lambda x: x
            )


async def test_binds_and_releases_racing_on_one_worker_stay_consistent(pg_url: str) -> None:
    async with (
        await PostgresStore.connect(pg_url, max_size=8) as one,
        await PostgresStore.connect(pg_url, max_size=8) as other,
    ):
        await one.create_atespace(atespace())
        w = await one.create_worker(worker(slots=64, cpu_milli=64000, memory_bytes=1 << 40))
        actors = [await one.create_actor(actor(name=f"a{i}")) for i in range(16)]
        small = Resources(cpu_milli=10, memory_bytes=1 << 20)

        async def churn(a: Actor, store: PostgresStore) -> None:
            current = a
            for _ in range(5):
                fresh = await store.get_worker(w.ref)
                bound = await bind(store, current, fresh, small)
                current = bound.actor
                released = await store.release_actor(current.metadata.uid)
                assert released == bound.binding
                assert await store.release_actor(current.metadata.uid) is None

        async with anyio.create_task_group() as tg:
            for i, a in enumerate(actors):
                tg.start_soon(churn, a, one if i % 2 else other)
        final = await one.get_worker(w.ref)
        assert final.allocated == Capacity()
        assert final.metadata.version == 1 + 16 * 5 * 2, "each bind and release wrote once"
        assert await one.list_bindings() == []
        await assert_allocations_consistent(one)


async def test_a_cancelled_call_does_not_hand_on_a_busy_connection(pg_url: str) -> None:
    async with await PostgresStore.connect(pg_url, min_size=1, max_size=1) as store:
        await store.create_atespace(atespace())
        with anyio.move_on_after(0.2):
            async with store._session() as session:
                await session.conn.execute("SELECT pg_sleep(5)")
        # The only connection was interrupted mid-statement: it is replaced, not reused.
        with anyio.fail_after(3):
            assert (await store.get_atespace("as1")).name == "as1"


async def test_a_failed_statement_keeps_the_connection(pg_url: str) -> None:
    async with await PostgresStore.connect(pg_url, min_size=1, max_size=1) as store:
        async with store._session() as session:
            first = session.conn
        with pytest.raises(InvalidArgument):
            await store.create_atespace(Atespace(name="nul\x00byte"))  # refused by the server
        await store.create_atespace(atespace())
        async with store._session() as session:
            assert session.conn is first, "the connection was not thrown away"
