"""The router's pure decisions: headers, the assignment cache, deadline admission."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from substrate.core.ids import ActorRef, NodeRef, TemplateRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorState,
    ActorStatus,
    RestoreSource,
    ResumeResult,
    WorkerAssignment,
)
from substrate.errors import InvalidArgument, Unavailable, http_response
from substrate.net.parking import FlightState, FlightView
from substrate.net.routing import (
    AssignmentCache,
    DeadlineRejected,
    RecentRequests,
    RequestRecord,
    ResumeCost,
    Route,
    RouteOutcome,
    WorkerDirectory,
    admit_deadline,
    downstream_headers,
    is_stale_answer,
    outcome_for_status,
    parse_connect_port,
    parse_request_timeout,
    parse_target_actor,
    provenance_headers,
    redact_target,
    retry_after,
    upstream_headers,
)

A = ActorRef("team-a", "alpha")
B = ActorRef("team-a", "beta")


def route(actor: ActorRef = A, worker: str = "w-0", address: str = "10.0.0.1:8443") -> Route:
    return Route(actor=actor, worker=WorkerRef(worker), address=address)


# --- headers ------------------------------------------------------------------------------


def test_parse_target_actor() -> None:
    assert parse_target_actor([(b"ATE-Target-Actor", b" team-a/alpha ")]) == A
    for headers, fragment in [
        ([], "missing ate-target-actor"),
        ([(b"ate-target-actor", b"team-a")], "<atespace>/<name>"),
        ([(b"ate-target-actor", b"team-a/alpha/x")], "<atespace>/<name>"),
        ([(b"ate-target-actor", b"Team/alpha")], "bad ate-target-actor"),
        ([(b"ate-target-actor", b"team-a/")], "bad ate-target-actor"),
        ([(b"ate-target-actor", b"a/b"), (b"ate-target-actor", b"a/b")], "exactly once"),
        ([(b"ate-target-actor", "a/ü".encode())], "ASCII"),
    ]:
        with pytest.raises(InvalidArgument, match=fragment):
            parse_target_actor(headers)


def test_parse_connect_port() -> None:
    assert parse_connect_port(b"example.com:8080") == 8080
    assert parse_connect_port(b"[::1]:443") == 443
    assert parse_connect_port(b"x:1") == 1
    for bad in (
        b"example.com",
        b":80",
        b"x:0",
        b"x:65536",
        b"x:+80",
        b"a:b:80",
        b"[::1]",
        b"/x:80",
    ):
        with pytest.raises(InvalidArgument, match="host:port"):
            parse_connect_port(bad)


def test_parse_request_timeout() -> None:
    assert parse_request_timeout([]) is None
    assert parse_request_timeout([(b"Ate-Request-Timeout-Ms", b"250")]) == 0.25
    assert parse_request_timeout([(b"ate-request-timeout-ms", b"0")]) == 0.0
    for bad in ([(b"ate-request-timeout-ms", b"-1")], [(b"ate-request-timeout-ms", b"1.5")]):
        with pytest.raises(InvalidArgument, match="milliseconds"):
            parse_request_timeout(bad)
    with pytest.raises(InvalidArgument, match="at most once"):
        parse_request_timeout([(b"ate-request-timeout-ms", b"1")] * 2)


def test_upstream_headers_keep_host_and_overwrite_the_routing_headers() -> None:
    headers = [
        (b"Host", b"Example.COM:81"),
        (b"ate-target-actor", b"evil/actor"),
        (b"ATE-Target-Port", b"22"),
        (b"Connection", b"keep-alive, X-Hop"),
        (b"X-Hop", b"1"),
        (b"X-Keep", b"yes"),
    ]
    assert upstream_headers(headers, A, 8080) == [
        (b"Host", b"Example.COM:81"),
        (b"X-Keep", b"yes"),
        (b"ate-target-actor", b"team-a/alpha"),
        (b"ate-target-port", b"8080"),
    ]
    # an HTTP/1.0 request without Host gets the actor's name
    assert upstream_headers([], A, 80)[0] == (b"Host", b"alpha.team-a.actors")


def test_downstream_headers() -> None:
    raw = [(b"Content-Length", b"2"), (b"Keep-Alive", b"timeout=5"), (b"X-App", b"1")]
    extra = [(b"X-Ate-Restored-From", b"local")]
    assert downstream_headers(raw, extra=extra, close=True) == [
        (b"Content-Length", b"2"),
        (b"X-App", b"1"),
        (b"X-Ate-Restored-From", b"local"),
        (b"Connection", b"close"),
    ]
    switching = [(b"Upgrade", b"websocket"), (b"Connection", b"upgrade")]
    assert downstream_headers(switching, switching=True, close=True) == switching


def test_only_atunnels_421_is_stale() -> None:
    assert is_stale_answer(421, [(b"X-Ate-Assignment-Stale", b"true")])
    assert is_stale_answer(421, [(b"x-ate-assignment-stale", b" TRUE ")])
    assert not is_stale_answer(421, [])
    assert not is_stale_answer(421, [(b"X-Ate-Assignment-Stale", b"false")])
    assert not is_stale_answer(200, [(b"X-Ate-Assignment-Stale", b"true")])


def result(resumed: bool, source: RestoreSource | None) -> ResumeResult:
    actor = Actor(
        ref=A,
        template=TemplateRef("team-a", "t"),
        status=ActorStatus(
            state=ActorState.RUNNING,
            assignment=WorkerAssignment(worker=WorkerRef("w"), node=NodeRef("n")),
        ),
    )
    return ResumeResult(
        actor=actor,
        resumed=resumed,
        source=source,
        generation=4,
        snapshot_age_seconds=61.0004,
        resume_duration_seconds=0.1234,
    )


def test_provenance_headers() -> None:
    assert provenance_headers(result(False, None)) == ()
    assert dict(provenance_headers(result(True, RestoreSource.TAG))) == {
        b"X-Ate-Restored-From": b"tag",
        b"X-Ate-Snapshot-Generation": b"4",
        b"X-Ate-Snapshot-Age-Seconds": b"61.000",
        b"X-Ate-Resume-Duration-Seconds": b"0.123",
    }
    assert dict(provenance_headers(result(True, None))) == {
        b"X-Ate-Restored-From": b"cold-boot",
        b"X-Ate-Resume-Duration-Seconds": b"0.123",
    }


def test_redact_target_and_retry_after() -> None:
    assert redact_target("/a/b?token=s3cret&x=1") == "/a/b?<redacted>"
    assert redact_target("/a/b") == "/a/b"
    assert redact_target("host:443") == "host:443"
    assert [retry_after(x) for x in (0.0, 0.2, 1.0, 1.01, float("inf"))] == [1, 1, 1, 2, 1]


def test_outcomes() -> None:
    assert outcome_for_status(404) is RouteOutcome.NOT_FOUND
    assert outcome_for_status(400) is RouteOutcome.BAD_REQUEST
    assert outcome_for_status(503) is RouteOutcome.UNAVAILABLE
    assert outcome_for_status(504) is RouteOutcome.TIMEOUT
    assert outcome_for_status(500) is RouteOutcome.ERROR


def test_a_deadline_rejection_is_a_503_through_the_one_mapping() -> None:
    error = DeadlineRejected("the request allows 5 ms", retry_after=3)
    assert isinstance(error, Unavailable)
    assert http_response(error, "team-a/alpha") == (
        503,
        "actor team-a/alpha unavailable: the request allows 5 ms",
    )


# --- the assignment cache -------------------------------------------------------------------


def test_cache_fresh_then_last_known() -> None:
    cache = AssignmentCache(ttl=5.0)
    assert cache.fresh(A, 0.0) is None
    cache.put(route(), 10.0)
    assert cache.fresh(A, 14.999) == route()
    assert cache.fresh(A, 15.0) is None
    assert cache.last_known(A) == route()
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.entries) == (1, 2, 1)


def test_cache_evicts_only_the_route_that_failed() -> None:
    cache = AssignmentCache(ttl=5.0)
    old, new = route(worker="w-0"), route(worker="w-1")
    cache.put(new, 0.0)
    assert not cache.evict(A, old)  # a request that failed on the old route
    assert cache.last_known(A) == new
    assert cache.evict(A, new)
    assert cache.last_known(A) is None
    assert not cache.evict(A)


def test_cache_replace_keeps_freshness() -> None:
    cache = AssignmentCache(ttl=5.0)
    old, moved = route(address="h:1"), route(address="h:2")
    cache.put(old, 0.0)
    assert cache.replace(old, moved)
    assert cache.fresh(A, 4.0) == moved
    assert cache.fresh(A, 5.0) is None
    assert not cache.replace(old, moved)
    assert not cache.replace(moved, route(B))


def test_cache_is_bounded() -> None:
    cache = AssignmentCache(ttl=5.0, max_entries=2)
    actors = [ActorRef("s", f"a{i}") for i in range(3)]
    for actor in actors:
        cache.put(route(actor), 0.0)
    assert len(cache) == 2
    assert cache.last_known(actors[0]) is None
    with pytest.raises(InvalidArgument):
        AssignmentCache(ttl=-1.0)
    with pytest.raises(InvalidArgument):
        AssignmentCache(max_entries=0)


ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "evict", "fresh"]),
        st.sampled_from([A, B]),
        st.sampled_from(["w-0", "w-1"]),
        st.floats(min_value=0, max_value=3),
    ),
    max_size=40,
)


@given(ops)
def test_cache_matches_a_simple_model(steps: list[tuple[str, ActorRef, str, float]]) -> None:
    """Against a dict of (route, stored_at): fresh iff younger than the TTL; evict-if-same."""
    cache = AssignmentCache(ttl=1.0)
    model: dict[ActorRef, tuple[Route, float]] = {}
    now = 0.0
    for op, actor, worker, dt in steps:
        now += dt
        r = route(actor, worker)
        if op == "put":
            cache.put(r, now)
            model[actor] = (r, now)
        elif op == "evict":
            removed = cache.evict(actor, r)
            assert removed == (actor in model and model[actor][0] == r)
            if removed:
                del model[actor]
        else:
            expected = model.get(actor)
            fresh = expected[0] if expected and now < expected[1] + 1.0 else None
            assert cache.fresh(actor, now) == fresh
        for a in (A, B):
            assert cache.last_known(a) == (model[a][0] if a in model else None)


def test_worker_directory() -> None:
    directory = WorkerDirectory()
    directory.put(WorkerRef("w-0"), "h:1")
    directory.put(WorkerRef("w-1"), "")
    assert directory.get(WorkerRef("w-0")) == "h:1"
    assert directory.get(WorkerRef("w-1")) is None
    directory.replace_all([(WorkerRef("w-2"), "h:2"), (WorkerRef("w-3"), "")])
    assert dict(directory.items()) == {WorkerRef("w-2"): "h:2"}
    directory.forget(WorkerRef("w-2"))
    assert len(directory) == 0


# --- deadline admission ---------------------------------------------------------------------


def flight(
    state: FlightState, *, retry_at: float | None = None, deadline: float = 5.0
) -> FlightView:
    return FlightView(
        actor=A,
        state=state,
        started_at=0.0,
        deadline=deadline,
        waiting=1,
        attempts=1,
        retry_at=retry_at,
        last_failure=None,
    )


def test_admit_deadline() -> None:
    def admit(deadline: float, f: FlightView | None, expected: float | None) -> object:
        return admit_deadline(now=1.0, deadline=deadline, flight=f, expected=expected)

    # nothing known: admit; an attempt in progress: admit
    assert admit(1.01, None, None) is None
    assert admit(1.01, flight(FlightState.ATTEMPTING), 10.0) is None
    # a passed deadline: reject
    passed = admit(1.0, None, None)
    assert passed is not None and "passed" in passed.reason  # type: ignore[attr-defined]
    # no flight: the predicted cost decides
    assert admit(1.5, None, 0.4) is None
    slow = admit(1.5, None, 0.6)
    assert slow is not None
    assert slow.retry_after == 1  # type: ignore[attr-defined]
    assert "allows 500 ms but a resume is expected to take 600 ms" in slow.reason  # type: ignore[attr-defined]
    # backing off: the next retry decides
    assert admit(3.0, flight(FlightState.BACKING_OFF, retry_at=2.5), None) is None
    late = admit(2.0, flight(FlightState.BACKING_OFF, retry_at=3.2), None)
    assert late is not None
    assert late.retry_after == 3  # type: ignore[attr-defined]
    # no attempt left in the flight's budget: doomed whatever the deadline
    doomed = admit(100.0, flight(FlightState.AWAITING_BUDGET, deadline=4.5), None)
    assert doomed is not None
    assert doomed.retry_after == 4  # type: ignore[attr-defined]


@given(
    now=st.floats(min_value=0, max_value=100),
    slack=st.floats(min_value=-5, max_value=5),
    expected=st.none() | st.floats(min_value=0, max_value=10),
)
def test_admission_never_admits_a_passed_deadline(
    now: float, slack: float, expected: float | None
) -> None:
    deadline = now + slack
    verdict = admit_deadline(now=now, deadline=deadline, flight=None, expected=expected)
    if deadline <= now:
        assert verdict is not None
    elif expected is not None and now + expected >= deadline:
        assert verdict is not None
        assert verdict.retry_after >= 1
    else:
        assert verdict is None


def test_resume_cost() -> None:
    cost = ResumeCost(window=3)
    assert cost.expected(warm=True) is None
    for seconds in (0.5, 0.1, 0.3, 0.9):
        cost.record(seconds, resumed=True)
    cost.record(0.002, resumed=False)
    cost.record(float("nan"), resumed=False)
    assert cost.expected(warm=False) == 0.3  # median of the last three: 0.1, 0.3, 0.9
    assert cost.expected(warm=True) == 0.002


def test_recent_requests_keep_the_last_ones() -> None:
    recent = RecentRequests(size=2)
    for i in range(3):
        recent.add(
            RequestRecord(
                at=float(i),
                method="GET",
                target="/",
                actor="a/b",
                port=80,
                status=200,
                outcome=RouteOutcome.OK,
                seconds=0.001,
            )
        )
    assert [r.at for r in recent.snapshot()] == [1.0, 2.0]
    assert len(recent) == 2
