"""PostgreSQL away and back: resumes fail fast, then work again within 2 s; nothing is stuck.

The original's worker cache backed off to 30 s during a database outage, so resumes kept
failing for 23-29 s after PostgreSQL was ready (seed 003). Ours caps the resync at 1 s.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import anyio
import pytest

from substrate.adapters.memory.clock import ManualClock
from substrate.adapters.postgres import PostgresStore
from substrate.core.model import ActorState
from substrate.core.ports import Store
from substrate.errors import SubstrateError
from tests.adapters.postgres.tcp_proxy import TcpProxy
from tests.adapters.postgres.test_pg_connection_loss import via
from tests.pg import PgHandle

from .harness import cluster

pytestmark = [pytest.mark.anyio, pytest.mark.postgres, pytest.mark.slow]


async def test_resumes_recover_within_two_seconds_and_nothing_is_stuck(
    pg_server: PgHandle,
) -> None:
    database = await pg_server.take_database()
    url = pg_server.url(database)
    target = urlsplit(url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    try:
        async with anyio.create_task_group() as tg:
            port = await tg.start(proxy.run)

            @asynccontextmanager
            async def proxied(clock: ManualClock) -> AsyncIterator[Store]:
                store = await PostgresStore.connect(
                    via(url, port), connect_timeout=1, command_timeout=2, clock=clock
                )
                async with store:
                    yield store

            async with cluster(proxied, nodes=1, workers_per_node=2, slots=4) as c:
                running = (await c.svc.resume((await c.new_actor("e-run")).ref)).actor
                waiting = [await c.new_actor(f"e-s-{i}") for i in range(3)]

                proxy.cut()
                for actor in waiting[:2]:
                    started = time.monotonic()
                    with pytest.raises(SubstrateError) as info:
                        await c.svc.resume(actor.ref)
                    assert info.value.code.name in {"UNAVAILABLE", "DEADLINE_EXCEEDED"}
                    assert time.monotonic() - started < 5.0, "a resume hung during the outage"
                await anyio.sleep(1.0)

                proxy.restore()
                ready = time.monotonic()
                recovered = None
                with anyio.fail_after(10):
                    while recovered is None:
                        try:
                            recovered = await c.svc.resume(waiting[2].ref)
                        except SubstrateError:
                            await anyio.sleep(0.05)
                took = time.monotonic() - ready
                assert recovered.actor.state is ActorState.RUNNING
                assert took <= 2.0, f"resumes recovered {took:.2f} s after the store was back"

                await c.svc.reconcile_once()
                for name in ["e-run", *(a.ref.name for a in waiting)]:
                    actor = await c.actor(name)
                    assert not actor.state.transient, (name, actor.state)
                assert (await c.actor("e-run")).status.assignment == running.status.assignment
                await c.allocated_matches_bindings()
            tg.cancel_scope.cancel()
    finally:
        await pg_server.discard_database(database)
