"""Static stability: running actors keep answering while ateapi is away or hanging."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from substrate.core.ids import ActorRef
from substrate.errors import DeadlineExceeded, NotFound
from substrate.net.parking import ParkingConfig
from substrate.services.router import RouterConfig
from tests.services.test_router_stack import (
    TRUST_DOMAIN,
    Hang,
    Http,
    get,
    metric,
    scripted,
    stack,
)

pytestmark = pytest.mark.anyio

A = ActorRef("team-a", "alpha")
B = ActorRef("team-a", "beta")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def short_ttl() -> RouterConfig:
    return RouterConfig(
        parking=ParkingConfig(budget=0.6, retry_interval=0.05),
        cache_ttl=0.1,
        health_interval=60.0,
        stale_route_after=0.3,
        linger=0.2,
        trust_domain=TRUST_DOMAIN,
    )


async def test_running_actors_keep_answering_with_ateapi_stopped(tmp_path: Path) -> None:
    async with stack(tmp_path, short_ttl()) as s, Http(s.port) as http:
        s.ateapi.on_resume = s.resume_onto()
        assert (await http.get(A)).text.startswith("count=1")
        await s.stop_ateapi()
        await anyio.sleep(0.15)  # the cached assignment is no longer fresh
        for n in (2, 3):
            answer = await http.get(A)
            assert answer.status == 200
            assert answer.text.startswith(f"count={n}")
            await anyio.sleep(0.15)
        records = s.r.recent.snapshot()
        assert [r.resolution for r in records] == ["resume", "last-known", "last-known"]
        assert metric(s, "atenet_router_last_known_routes_total") == 2
        assert metric(s, "atenet_router_resume_calls_total", code="UNAVAILABLE") == 2
        # An actor the router never routed cannot be found without ateapi: parked, then 503.
        cold = await http.get(B)
        assert cold.status == 503
        assert cold.text.startswith("actor team-a/beta unavailable: ")
        # If the running actor moves meanwhile, atunnel's 421 makes the old route safe:
        # it is evicted, and with ateapi still away the request ends 503, not misrouted.
        await s.deactivate(A)
        moved = await http.get(A)
        assert moved.status == 503
        assert s.r.cache.last_known(A) is None
        await s.r.check_ateapi()
        assert s.r.health.healthy is False


async def test_a_hanging_ateapi_does_not_hold_running_actors(tmp_path: Path) -> None:
    async with stack(tmp_path, short_ttl()) as s:
        s.ateapi.on_resume = s.resume_onto()
        assert (await get(s.port, A)).status == 200
        s.ateapi.on_resume = scripted(then=Hang())
        await anyio.sleep(0.15)
        started = anyio.current_time()
        answer = await get(s.port, A)
        waited = anyio.current_time() - started
        assert answer.status == 200
        assert 0.25 <= waited < 1.5  # stale_route_after, not the call's 5 s timeout
        assert s.r.recent.snapshot()[-1].resolution == "last-known"
        # the call was not cancelled: it is still running in the background
        assert s.ateapi.resumes_finished == 1
        assert len(s.ateapi.resume_calls) == 2


async def test_deadline_exceeded_from_ateapi_uses_the_last_known_route(tmp_path: Path) -> None:
    async with stack(tmp_path, short_ttl()) as s:
        s.ateapi.on_resume = s.resume_onto()
        assert (await get(s.port, A)).status == 200
        s.ateapi.on_resume = scripted(then=DeadlineExceeded("database timeout"))
        await anyio.sleep(0.15)
        answer = await get(s.port, A)
        assert answer.status == 200
        assert s.r.recent.snapshot()[-1].resolution == "last-known"
        # without a last-known route, DeadlineExceeded fails fast with 504
        assert (await get(s.port, B)).status == 504


async def test_not_found_forgets_the_last_known_route(tmp_path: Path) -> None:
    async with stack(tmp_path, short_ttl()) as s:
        s.ateapi.on_resume = s.resume_onto()
        assert (await get(s.port, A)).status == 200
        s.ateapi.on_resume = scripted(then=NotFound("actor team-a/alpha was deleted"))
        await anyio.sleep(0.15)
        assert (await get(s.port, A)).status == 404
        assert s.r.cache.last_known(A) is None
