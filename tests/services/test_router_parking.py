"""Request parking through the real router (seed 001): every ResumeActor result, the budget
shared by a flight, shedding, disabled mode, departing clients, deadlines, /statusz."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import anyio
import anyio.abc
import pytest
from prometheus_client import generate_latest

from substrate.core.ids import ActorRef
from substrate.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    SubstrateError,
    Unauthenticated,
    Unavailable,
)
from substrate.services.router_status import render_html, render_json, status_snapshot
from tests.services.test_router_stack import (
    HOST,
    Hang,
    Http,
    get,
    metric,
    router_config,
    scripted,
    stack,
    wait_for,
)

pytestmark = pytest.mark.anyio

A = ActorRef("team-a", "alpha")
B = ActorRef("team-a", "beta")
C = ActorRef("team-a", "gamma")
NO_ROOM = "no worker has room for the actor"
WAIT = "atenet_router_parking_wait_duration_seconds_count"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_burst_to_a_cold_actor_makes_one_resume(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        resume = s.resume_onto()

        async def slow(actor: ActorRef):  # type: ignore[no-untyped-def]
            await anyio.sleep(0.2)
            return await resume(actor)

        s.ateapi.on_resume = scripted(then=slow)
        answers = []

        async def one() -> None:
            answers.append(await get(s.port, A))

        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(one)
        assert [a.status for a in answers] == [200] * 50
        assert len(s.ateapi.resume_calls) == 1
        assert sorted(int(a.text.split()[0].split("=")[1]) for a in answers) == list(range(1, 51))
        # every request that waited on the resume says what it was restored from
        assert {a.headers["x-ate-restored-from"] for a in answers} == {"local"}
        assert metric(s, WAIT, outcome="served") == 50
        assert metric(s, "atenet_router_parking_active") == 0
        assert metric(s, "atenet_router_resume_calls_total", code="OK") == 1


# Seed 001's table: what each ResumeActor result does to a request.
RETRIED: list[tuple[str, SubstrateError]] = [
    ("aborted", Aborted("another operation holds the actor")),
    ("resource_exhausted", ResourceExhausted(NO_ROOM)),
    ("failed_precondition", FailedPrecondition("actor is SUSPENDING")),
    ("unavailable", Unavailable("ateapi is restarting")),
]
FAIL_FAST: list[tuple[str, SubstrateError, int, str]] = [
    ("not_found", NotFound("no such actor"), 404, "actor team-a/alpha not found"),
    ("deadline_exceeded", DeadlineExceeded("took too long"), 504, "deadline exceeded"),
    ("permission_denied", PermissionDenied("no"), 403, "permission denied"),
    ("unauthenticated", Unauthenticated("who"), 401, "unauthenticated"),
]


async def test_ok_routes_to_the_worker(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        s.ateapi.on_resume = s.resume_onto()
        answer = await get(s.port, A)
        assert answer.status == 200
        assert len(s.ateapi.resume_calls) == 1


@pytest.mark.parametrize(("name", "error"), RETRIED, ids=[r[0] for r in RETRIED])
async def test_retryable_results_are_parked_and_retried(
    tmp_path: Path, name: str, error: SubstrateError
) -> None:
    async with stack(tmp_path) as s:
        s.ateapi.on_resume = scripted(error, error, then=s.resume_onto())
        answer = await get(s.port, A)
        assert answer.status == 200, answer.text
        assert s.ateapi.calls_for(A) == 3
        assert metric(s, WAIT, outcome="served") == 1
        assert metric(s, "atenet_router_resume_calls_total", code=error.code.name) == 2


@pytest.mark.parametrize(
    ("name", "error", "status", "text"), FAIL_FAST, ids=[r[0] for r in FAIL_FAST]
)
async def test_final_results_fail_fast(
    tmp_path: Path, name: str, error: SubstrateError, status: int, text: str
) -> None:
    async with stack(tmp_path) as s:
        s.ateapi.on_resume = scripted(error, then=s.resume_onto())
        started = anyio.current_time()
        answer = await get(s.port, A)
        assert answer.status == status
        assert text in answer.text
        assert anyio.current_time() - started < 0.5
        assert s.ateapi.calls_for(A) == 1
        assert metric(s, WAIT, outcome="error") == 1


async def test_the_budget_runs_out_with_the_last_description(tmp_path: Path) -> None:
    async with stack(tmp_path, router_config(budget=0.5)) as s:
        s.ateapi.on_resume = scripted(then=ResourceExhausted(NO_ROOM))
        started = anyio.current_time()
        answer = await get(s.port, A)
        waited = anyio.current_time() - started
        assert answer.status == 503
        assert answer.text == f"actor team-a/alpha unavailable: {NO_ROOM}\n"
        assert answer.headers["retry-after"] == "1"
        assert 0.45 <= waited < 1.5
        assert s.ateapi.calls_for(A) > 3  # retried with backoff meanwhile
        assert metric(s, WAIT, outcome="budget_exhausted") == 1


async def test_the_budget_counts_from_when_the_request_reached_the_host(tmp_path: Path) -> None:
    """A request that waits in the kernel while the router is busy is not given a full
    budget on top: the router asks the kernel when the bytes came (TCP_INFO)."""
    async with stack(tmp_path, router_config(budget=1.0)) as s:
        s.ateapi.on_resume = scripted(then=ResourceExhausted(NO_ROOM))
        raw = socket.create_connection((HOST, s.port))
        raw.setblocking(False)
        started = time.monotonic()
        raw.sendall(
            b"GET / HTTP/1.1\r\nHost: r\r\nate-target-actor: team-a/alpha\r\n"
            b"Connection: close\r\n\r\n"
        )
        time.sleep(0.5)  # noqa: ASYNC251 (on purpose: the router shares this loop and must not read)
        stream = await anyio.abc.SocketStream.from_socket(raw)
        data = b""
        async with stream:
            with anyio.fail_after(5):
                while True:
                    try:
                        data += await stream.receive()
                    except anyio.EndOfStream:
                        break
        waited = time.monotonic() - started
        assert data.startswith(b"HTTP/1.1 503"), data
        assert NO_ROOM.encode() in data
        assert 0.9 <= waited < 1.35  # the budget from arrival, not 1.5 s (0.5 + 1.0)
        assert metric(s, WAIT, outcome="budget_exhausted") == 1
        (record,) = s.r.recent.snapshot()
        assert 0.45 <= record.queued_seconds <= 0.6  # reported apart in the request log
        assert 0.45 <= metric(s, "atenet_router_request_queued_duration_seconds_sum") <= 0.6
        assert record.route_seconds is None
        assert 0.9 <= record.seconds < 1.35


async def test_a_late_joiner_shares_the_flights_budget(tmp_path: Path) -> None:
    async with stack(tmp_path, router_config(budget=0.8)) as s:
        s.ateapi.on_resume = scripted(then=ResourceExhausted(NO_ROOM))
        ended: dict[str, float] = {}
        started = anyio.current_time()

        async def request(name: str, delay: float) -> None:
            await anyio.sleep(delay)
            answer = await get(s.port, A)
            assert answer.status == 503
            assert NO_ROOM in answer.text
            ended[name] = anyio.current_time() - started

        async with anyio.create_task_group() as tg:
            tg.start_soon(request, "first", 0.0)
            tg.start_soon(request, "late", 0.5)
        # Both end when the flight's budget does; the late one waited far less.
        assert abs(ended["first"] - ended["late"]) < 0.3
        late = [r for r in s.r.recent.snapshot() if r.seconds < 0.5]
        assert len(late) == 1
        assert late[0].outcome.value == "unavailable"
        assert metric(s, WAIT, outcome="budget_exhausted") == 2
        assert metric(s, "atenet_router_parking_wait_duration_seconds_sum") < 0.8 + 0.5


async def test_a_full_lot_sheds_at_once(tmp_path: Path) -> None:
    async with stack(tmp_path, router_config(budget=1.0, max_parked=2)) as s:
        s.ateapi.on_resume = scripted(then=Hang())
        async with anyio.create_task_group() as tg:
            parked: list[int] = []

            async def park(actor: ActorRef) -> None:
                parked.append((await get(s.port, actor)).status)

            tg.start_soon(park, A)
            tg.start_soon(park, B)
            await wait_for(lambda: s.r.parking_status().parked == 2, "two parked requests")
            started = anyio.current_time()
            shed = await get(s.port, C)
            assert anyio.current_time() - started < 0.5
            assert shed.status == 503
            assert shed.text == "actor team-a/gamma unavailable: router at capacity\n"
            assert shed.headers["retry-after"] == "1"
            assert metric(s, "atenet_router_parking_rejected_total") == 1
            assert metric(s, "atenet_router_parking_active") == 2
        # the two parked ones ran out of budget, having heard nothing from ateapi
        assert parked == [503, 503]
        assert metric(s, WAIT, outcome="budget_exhausted") == 2
        assert s.r.parking_status().max_parked_seen == 2


async def test_disabled_parking_fails_fast_but_retries_aborted(tmp_path: Path) -> None:
    async with stack(tmp_path, router_config(max_parked=0)) as s:
        s.ateapi.on_resume = scripted(ResourceExhausted(NO_ROOM), then=s.resume_onto())
        answer = await get(s.port, A)
        assert answer.status == 503
        assert answer.text == f"actor team-a/alpha unavailable: {NO_ROOM}\n"
        assert s.ateapi.calls_for(A) == 1
        s.ateapi.on_resume = scripted(Unavailable("restarting"), then=s.resume_onto())
        assert (await get(s.port, B)).status == 503
        s.ateapi.on_resume = scripted(Aborted("held"), Aborted("held"), then=s.resume_onto())
        assert (await get(s.port, C)).status == 200
        assert s.ateapi.calls_for(C) == 3
        # no parking metrics while disabled
        assert metric(s, WAIT, outcome="served") == 0
        assert metric(s, WAIT, outcome="error") == 0
        status = s.r.parking_status()
        assert not status.enabled
        assert status.max_wait == 15.0


async def test_a_client_that_leaves_does_not_cancel_the_flight(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        resume = s.resume_onto()

        async def slow(actor: ActorRef):  # type: ignore[no-untyped-def]
            await anyio.sleep(0.3)
            return await resume(actor)

        s.ateapi.on_resume = scripted(then=slow)
        stream = await anyio.connect_tcp(HOST, s.port)
        await stream.send(b"GET / HTTP/1.1\r\nHost: h\r\nate-target-actor: team-a/alpha\r\n\r\n")
        await wait_for(lambda: len(s.ateapi.resume_calls) == 1, "the resume to start")
        await stream.aclose()  # the client gives up while parked
        await wait_for(lambda: metric(s, WAIT, outcome="canceled") == 1, "a canceled park")
        await wait_for(lambda: s.ateapi.resumes_finished == 1, "the resume to finish anyway")
        answer = await get(s.port, A)
        assert answer.status == 200
        assert answer.text.startswith("count=1")
        assert len(s.ateapi.resume_calls) == 1  # served from the cache the flight filled
        outcomes = [r.outcome.value for r in s.r.recent.snapshot()]
        assert outcomes == ["cancelled", "ok"]


async def test_a_deadline_the_flight_cannot_meet_is_answered_at_once(tmp_path: Path) -> None:
    async with stack(tmp_path, router_config(budget=2.0, retry_interval=0.5)) as s:
        s.ateapi.on_resume = scripted(then=ResourceExhausted(NO_ROOM))
        async with anyio.create_task_group() as tg:
            tg.start_soon(get, s.port, A)  # parks; the flight backs off for 0.5 s
            await wait_for(lambda: s.ateapi.calls_for(A) == 1, "the first attempt")
            await anyio.sleep(0.05)
            started = anyio.current_time()
            answer = await get(s.port, A, ate_request_timeout_ms="100")
            assert anyio.current_time() - started < 0.4
            assert answer.status == 503
            # what is left of the 100 ms when the router decides: the clock starts when
            # the request reached the host, so a few ms may be gone already
            left = re.search(r"the request allows (\d+) ms but the next resume", answer.text)
            assert left is not None, answer.text
            assert 50 <= int(left.group(1)) <= 100
            assert answer.headers["retry-after"] == "1"
            assert metric(s, "atenet_router_deadline_rejections_total") == 1
            tg.cancel_scope.cancel()


async def test_an_admitted_request_times_out_with_its_own_deadline(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        s.ateapi.on_resume = scripted(then=Hang())
        started = anyio.current_time()
        answer = await get(s.port, A, ate_request_timeout_ms="150")
        assert 0.1 <= anyio.current_time() - started < 0.9
        assert answer.status == 504
        assert metric(s, WAIT, outcome="timeout") == 1


async def test_a_predicted_slow_resume_is_rejected_and_started(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        resume = s.resume_onto()

        async def slow(actor: ActorRef):  # type: ignore[no-untyped-def]
            await anyio.sleep(0.3)
            return await resume(actor)

        s.ateapi.on_resume = scripted(then=slow)
        assert (await get(s.port, A)).status == 200  # teaches the router: resumes take 0.3 s
        answer = await get(s.port, B, ate_request_timeout_ms="50")
        assert answer.status == 503
        assert "a resume is expected to take" in answer.text
        # ... and B's resume was started anyway, so that the client's retry finds it up.
        await wait_for(lambda: s.ateapi.resumes_finished == 2, "B's resume")
        retry = await get(s.port, B, ate_request_timeout_ms="50")
        assert retry.status == 200
        assert s.ateapi.calls_for(B) == 1


async def test_a_bad_deadline_header_is_400(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        answer = await get(s.port, A, ate_request_timeout_ms="soon")
        assert answer.status == 400
        assert "ate-request-timeout-ms" in answer.text


async def test_metrics_and_statusz(tmp_path: Path) -> None:
    async with stack(tmp_path, router_config(max_parked=7)) as s, Http(s.port) as http:
        s.ateapi.on_resume = scripted(ResourceExhausted(NO_ROOM), then=s.resume_onto())
        assert (await http.get(A, "/?token=secret")).status == 200
        assert (await http.get(A, "/readyz?x=1")).status == 200
        assert (await http.get(None)).status == 404
        text = generate_latest(s.metrics.registry).decode()  # type: ignore[union-attr]
        for needle in (
            "atenet_router_parking_active 0.0",
            'atenet_router_parking_wait_duration_seconds_count{outcome="served"} 1.0',
            "atenet_router_parking_rejected_total 0.0",
            'atenet_router_route_duration_seconds_count{outcome="ok"} 2.0',
            'atenet_router_route_duration_seconds_count{outcome="not_found"} 1.0',
            'atenet_router_resume_calls_total{code="RESOURCE_EXHAUSTED"} 1.0',
        ):
            assert needle in text, needle
        snapshot = status_snapshot(s.r)
        parking = snapshot["parking"]
        assert parking["enabled"] is True
        assert parking["parked"] == 0
        assert parking["max_parked"] == 7
        assert parking["max_wait_seconds"] == 1.0
        assert snapshot["ateapi"]["healthy"] is True
        assert snapshot["ateapi"]["workers"] == 2
        assert snapshot["flags"] == {"cache_ttl": 5.0}
        assert snapshot["build"]["version"]
        requests = snapshot["requests"]
        assert [r["target"] for r in requests] == ["/", "/readyz?<redacted>", "/?<redacted>"]
        assert [r["resolution"] for r in requests] == ["", "cache", "resume"]
        assert requests[2]["provenance"] == "local"
        assert requests[0]["route_ms"] is None  # not found: never had a route
        assert 0 < requests[1]["route_ms"] <= requests[1]["ms"]
        assert 0 < requests[2]["route_ms"] <= requests[2]["ms"]
        assert all(r["queued_ms"] >= 0 for r in requests)
        assert json.loads(render_json(snapshot))["parking"]["max_parked"] == 7
        page = render_html(snapshot)
        assert "Request Parking" in page
        assert "0 / 7" in page
        assert "secret" not in page and "secret" not in render_json(snapshot)
