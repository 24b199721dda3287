"""The router's HTTP side over real sockets: naming, Host, CONNECT, streaming, 421, identity."""

from __future__ import annotations

from pathlib import Path

import anyio
import attrs
import h11
import pytest

from substrate.core.ids import ActorRef, WorkerRef
from substrate.core.model import ActorState, RestoreSource
from substrate.errors import Unavailable
from substrate.services.router_upstream import TunnelUnreachable
from tests.services.test_router_stack import (
    HOST,
    TIMEOUT,
    Http,
    backend,
    closed_port,
    get,
    metric,
    router_config,
    running,
    scripted,
    stack,
)

pytestmark = pytest.mark.anyio

A = ActorRef("team-a", "alpha")
B = ActorRef("team-a", "beta")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("headers", "fragment"),
    [
        ([], "missing ate-target-actor"),
        ([("ate-target-actor", "team-a")], "<atespace>/<name>"),
        ([("ate-target-actor", "Team-A/alpha")], "bad ate-target-actor"),
        ([("ate-target-actor", "team-a/alpha/x")], "<atespace>/<name>"),
        ([("ate-target-actor", "/alpha")], "bad ate-target-actor"),
        ([("ate-target-actor", "team-a/alpha"), ("ate-target-actor", "team-a/beta")], "once"),
    ],
)
async def test_a_missing_or_malformed_target_is_404(
    tmp_path: Path, headers: list[tuple[str, str]], fragment: str
) -> None:
    async with stack(tmp_path) as s, Http(s.port) as http:
        s.ateapi.on_resume = s.resume_onto()
        answer = await http.request("GET", "/", headers)
        assert answer.status == 404
        assert fragment in answer.text
        # The connection stays usable, and nothing reached ateapi.
        ok = await http.get(A)
        assert ok.status == 200
        assert ok.text.startswith("count=1")
        assert [ref for ref, _ in s.ateapi.resume_calls] == [A]
        assert metric(s, "atenet_router_route_duration_seconds_count", outcome="not_found") == 1


async def test_a_404_answer_to_a_request_with_a_body_keeps_the_connection(tmp_path: Path) -> None:
    async with stack(tmp_path) as s, Http(s.port) as http:
        s.ateapi.on_resume = s.resume_onto()
        answer = await http.request("POST", "/x", [], body=b"x" * 10_000)
        assert answer.status == 404
        assert (await http.get(A)).status == 200


async def test_host_passes_through_and_routing_headers_are_overwritten(tmp_path: Path) -> None:
    async with stack(tmp_path) as s, backend() as (address, seen):
        s.activate(A, address)
        s.ateapi.on_resume = scripted(then=running(A, resumed=False))
        async with Http(s.port) as http:
            answer = await http.request(
                "GET",
                "/inspect?q=secret",
                [
                    ("Host", "Example.COM:1234"),
                    ("ate-target-actor", "team-a/alpha"),
                    ("ate-target-port", "9999"),
                    ("Connection", "keep-alive, X-Hop"),
                    ("X-Hop", "1"),
                    ("X-Keep", "yes"),
                ],
            )
        assert answer.status == 200
        assert answer.text == "port=80 target=/inspect?q=secret body=0"
        ((port, _, headers),) = seen.requests
        assert port == 80
        names = [k.lower() for k, _ in headers]
        assert (b"Host", b"Example.COM:1234") in headers
        assert (b"X-Keep", b"yes") in headers
        assert b"x-hop" not in names
        assert b"connection" not in names
        # atunnel strips the routing headers before the workload; it saw the router's.
        assert b"ate-target-actor" not in names
        assert b"ate-target-port" not in names
        # A request that was not a resume carries no provenance headers.
        assert "x-ate-restored-from" not in answer.headers
        # /statusz lists the request with its query string redacted.
        (record,) = s.r.recent.snapshot()
        assert record.target == "/inspect?<redacted>"
        assert record.resolution == "resume"


async def test_connect_tunnels_route_each_request_independently(tmp_path: Path) -> None:
    async with stack(tmp_path) as s, backend() as (a_addr, a_seen), backend() as (b_addr, _):
        s.activate(A, a_addr, "w-0")
        s.activate(B, b_addr, "w-1")
        s.ateapi.on_resume = scripted(running(A, "w-0"), running(B, "w-1", resumed=False))
        stream = await anyio.connect_tcp(HOST, s.port)
        async with stream:
            conn = h11.Connection(h11.CLIENT)
            with anyio.fail_after(TIMEOUT):
                await stream.send(
                    conn.send(
                        h11.Request(
                            method="CONNECT",
                            target="whatever.example:8080",
                            headers=[("Host", "whatever.example:8080")],
                        )
                    )
                    or b""
                )
                data = b""
                while b"\r\n\r\n" not in data:
                    data += await stream.receive()
            assert data.startswith(b"HTTP/1.1 200 Connection established\r\n")
            inner = Http(s.port)
            inner.stream = stream
            first = await inner.get(A, "/one")
            second = await inner.get(B, "/two")
            third = await inner.get(A, "/three")
        assert first.text == "port=8080 target=/one body=0"
        assert second.text == "port=8080 target=/two body=0"
        assert third.text == "port=8080 target=/three body=0"
        # Each inner request was resolved on its own: A resumed (provenance), B looked up.
        assert first.headers["x-ate-restored-from"] == "local"
        assert "x-ate-restored-from" not in second.headers
        assert [ref for ref, _ in s.ateapi.resume_calls] == [A, B]
        assert [p for p, _, _ in a_seen.requests] == [8080, 8080]


async def test_a_bad_connect_target_is_400(tmp_path: Path) -> None:
    async with stack(tmp_path) as s, Http(s.port) as http:
        answer = await http.request("CONNECT", "no-port-here", [("Host", "x")])
        assert answer.status == 400
        assert "host:port" in answer.text


async def test_bodies_stream_both_ways(tmp_path: Path) -> None:
    """The echo of the first chunk comes back before the second chunk is sent."""
    async with stack(tmp_path) as s, backend() as (address, _):
        s.activate(A, address)
        s.ateapi.on_resume = scripted(then=running(A, resumed=False))
        async with Http(s.port) as http:
            chunk = b"x" * 100_000
            with anyio.fail_after(TIMEOUT):
                await http.send(
                    h11.Request(
                        method="POST",
                        target="/echo",
                        headers=[
                            ("Host", "h"),
                            ("ate-target-actor", str(A)),
                            ("Transfer-Encoding", "chunked"),
                        ],
                    )
                )
                await http.send(h11.Data(data=chunk))
                head = await http.event()
                assert isinstance(head, h11.Response)
                assert head.status_code == 200
                echoed = b""
                while len(echoed) < len(chunk):
                    event = await http.event()
                    assert isinstance(event, h11.Data)
                    echoed += event.data
                assert echoed == chunk
                for _ in range(20):  # 2 MB more, each piece echoed before the next is sent
                    await http.send(h11.Data(data=chunk))
                    got = b""
                    while len(got) < len(chunk):
                        event = await http.event()
                        assert isinstance(event, h11.Data)
                        got += event.data
                await http.send(h11.EndOfMessage())
                assert isinstance(await http.event(), h11.EndOfMessage)
            http.conn.start_next_cycle()
            # and the connection carries another request afterwards
            assert (await http.get(A, "/after")).text == "port=80 target=/after body=0"


async def test_upgrades_pass_through(tmp_path: Path) -> None:
    async with stack(tmp_path) as s, backend() as (address, _):
        s.activate(A, address)
        s.ateapi.on_resume = scripted(then=running(A, resumed=False))
        stream = await anyio.connect_tcp(HOST, s.port)
        async with stream:
            request = (
                b"GET /upgrade HTTP/1.1\r\nHost: h\r\nate-target-actor: team-a/alpha\r\n"
                b"Upgrade: upper\r\nConnection: Upgrade\r\n\r\nhello"
            )
            with anyio.fail_after(TIMEOUT):
                await stream.send(request)
                data = b""
                while b"HELLO" not in data:
                    data += await stream.receive()
                assert data.startswith(b"HTTP/1.1 101 ")
                assert b"upgrade: upper" in data.lower()
                await stream.send(b" world")
                got = b""
                while b"WORLD" not in got:
                    got += await stream.receive()


async def test_a_stale_assignment_is_evicted_resolved_and_retried(tmp_path: Path) -> None:
    async with stack(tmp_path) as s, backend() as (address, _), backend() as (moved, moved_seen):
        s.activate(A, address, "w-0")
        s.ateapi.on_resume = scripted(running(A, "w-0"), then=running(A, "w-1", resumed=False))
        async with Http(s.port) as http:
            assert (await http.get(A, "/one")).status == 200
            # The actor moves to w-1 behind the router's back: its cached route is stale.
            await s.deactivate(A, "w-0")
            s.activate(A, moved, "w-1")
            answer = await http.request(
                "POST", "/two", [("ate-target-actor", str(A))], body=b"payload" * 100
            )
        assert answer.status == 200
        assert answer.text == "port=80 target=/two body=700"
        assert [t for _, t, _ in moved_seen.requests] == ["/two"]
        assert s.ateapi.calls_for(A) == 2
        assert metric(s, "atenet_router_stale_assignments_total") == 1
        assert s.r.cache.last_known(A) is not None
        assert str(s.r.cache.last_known(A).worker) == "w-1"  # type: ignore[union-attr]


async def test_a_second_stale_answer_is_503(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        s.ateapi.on_resume = scripted(then=running(A, "w-0", resumed=False))
        answer = await get(s.port, A)
        assert answer.status == 503
        assert "assignment of actor team-a/alpha changed" in answer.text
        assert answer.headers["retry-after"] == "1"
        assert s.ateapi.calls_for(A) == 2


async def test_the_applications_own_421_is_returned(tmp_path: Path) -> None:
    async with stack(tmp_path) as s, backend() as (address, _):
        s.activate(A, address)
        s.ateapi.on_resume = scripted(then=running(A, resumed=False))
        answer = await get(s.port, A, "/app421")
        assert answer.status == 421
        assert answer.text == "the app says no"
        assert s.ateapi.calls_for(A) == 1
        assert metric(s, "atenet_router_stale_assignments_total") == 0


async def test_provenance_headers_only_on_the_request_that_resumed(tmp_path: Path) -> None:
    async with stack(tmp_path) as s, Http(s.port) as http:
        s.ateapi.on_resume = s.resume_onto(
            source=RestoreSource.DURABLE, generation=7, age=42.25, duration=0.5
        )
        first = await http.get(A)
        second = await http.get(A)
        assert first.headers["x-ate-restored-from"] == "durable"
        assert first.headers["x-ate-snapshot-generation"] == "7"
        assert first.headers["x-ate-snapshot-age-seconds"] == "42.250"
        assert first.headers["x-ate-resume-duration-seconds"] == "0.500"
        assert second.status == 200
        assert second.text.startswith("count=2")
        assert not any(h.startswith("x-ate-") for h in second.headers)
        assert s.ateapi.calls_for(A) == 1  # the second was a cache hit
        s.ateapi.on_resume = s.resume_onto(source=None)
        cold = await http.get(B)
        assert cold.headers["x-ate-restored-from"] == "cold-boot"
        assert "x-ate-snapshot-generation" not in cold.headers


async def test_keep_alive_alternates_actors(tmp_path: Path) -> None:
    async with stack(tmp_path) as s, Http(s.port) as http:
        s.ateapi.on_resume = s.resume_onto()
        texts = [(await http.get(actor)).text for actor in (A, B, A, B, A)]
        assert [t.split()[0] for t in texts] == [
            "count=1",
            "count=1",
            "count=2",
            "count=2",
            "count=3",
        ]
        assert s.r.pool.stats()["opened"] == 1  # one pooled connection to w-0 carried all


async def test_a_worker_with_the_wrong_identity_is_refused(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        await s.run_actor(A, "w-0")
        # ateapi says w-1's atunnel is where w-0's is: the peer there is not w-1.
        s.register("w-1", f"{HOST}:{s.tunnels['w-0'].port}")
        await s.r.check_ateapi()
        s.ateapi.on_resume = scripted(then=running(A, "w-1", resumed=False))
        answer = await get(s.port, A)
        assert answer.status == 503
        assert "spiffe://ate/worker/w-0, expected spiffe://ate/worker/w-1" in answer.text
        assert s.tunnels["w-0"].stats().requests == 0


async def test_a_worker_that_moved_is_found_again(tmp_path: Path) -> None:
    """A connection failure refreshes the worker's address (GetWorker) and tries again."""
    async with stack(tmp_path) as s:
        s.ateapi.on_resume = s.resume_onto("w-1")
        real = f"{HOST}:{s.tunnels['w-1'].port}"
        s.r.workers.put(WorkerRef("w-1"), f"{HOST}:{await closed_port()}")
        answer = await get(s.port, A)
        assert answer.status == 200
        assert s.ateapi.get_worker_calls == ["w-1"]
        route = s.r.cache.last_known(A)
        assert route is not None
        assert route.address == real


async def test_an_unreachable_worker_is_503_and_evicted(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        s.register("w-1", f"{HOST}:{await closed_port()}")
        await s.r.check_ateapi()
        s.ateapi.on_resume = scripted(then=running(A, "w-1", resumed=False))
        answer = await get(s.port, A)
        assert answer.status == 503
        assert "cannot reach worker w-1" in answer.text
        assert s.r.cache.last_known(A) is None


async def test_a_resume_answer_without_an_assignment_is_parked(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        resuming = running(A, state=ActorState.RESUMING)
        s.ateapi.on_resume = scripted(resuming, then=s.resume_onto())
        answer = await get(s.port, A)
        assert answer.status == 200
        assert s.ateapi.calls_for(A) == 2


def test_unavailable_is_the_error_for_unreachable_workers() -> None:
    assert issubclass(TunnelUnreachable, Unavailable)


async def test_a_body_beyond_the_replay_limit_is_not_retried(tmp_path: Path) -> None:
    config = router_config()
    config = attrs.evolve(config, replay_limit=1000)
    async with stack(tmp_path, config) as s:
        s.ateapi.on_resume = scripted(then=running(A, "w-0", resumed=False))
        async with Http(s.port) as http:
            small = await http.request("POST", "/", [("ate-target-actor", str(A))], b"x" * 10)
            large = await http.request("POST", "/", [("ate-target-actor", str(A))], b"x" * 5000)
        # Both found the actor gone from w-0. The small one was resolved and sent again (and
        # found it gone again); the large one was not sent again: its body was not kept.
        assert small.status == large.status == 503
        assert "changed; retry" in large.text
        assert metric(s, "atenet_router_stale_assignments_total") == 3
        assert s.ateapi.calls_for(A) == 3  # small: 2 resolutions; large: 1


async def test_a_cached_route_to_a_dead_worker_is_resolved_again(tmp_path: Path) -> None:
    """The worker of a cached route is gone: the request resolves again (parking, if ateapi
    needs time) instead of failing at once, and lands where the actor runs now."""
    async with stack(tmp_path) as s:
        s.ateapi.on_resume = s.resume_onto("w-0")
        assert (await get(s.port, A)).status == 200
        dead = f"{HOST}:{await closed_port()}"
        s.register("w-0", dead)  # w-0 is gone: nothing answers where it was
        cached = s.r.cache.last_known(A)
        assert cached is not None
        s.r.cache.replace(cached, attrs.evolve(cached, address=dead))
        s.r.workers.put(WorkerRef("w-0"), dead)
        s.ateapi.on_resume = s.resume_onto("w-1")
        answer = await get(s.port, A)
        assert answer.status == 200, answer.text
        route = s.r.cache.last_known(A)
        assert route is not None and route.worker == WorkerRef("w-1")
