"""Drill 6: a burst — parking under saturation.

``burst_workers`` workers of ``burst_slots`` actor slots each, ``burst_actors`` SUSPENDED
actors (more than the slots), the router's lot at ``burst_lot`` (1,024 by default, the
product's default). The drill sends ``burst_requests`` (2,800) requests at once, spread
evenly over the actors, each on its own connection, with a client limit far above the
park budget. Meanwhile an *idle suspender* plays the part of an idle-actor policy: every
half second it suspends (async) each RUNNING actor that has no request in flight and
answered its last one at least half a second ago, so slots come free and parked
requests get workers. ``/statusz`` is sampled every 0.2 s.

Expectations: every request gets an answer (200, or 503 when the budget ran out or the
lot was full) within the budget — none hangs; the lot never holds more than its size;
afterwards no actor is left in a transient state, none is CRASHED, and every actor
answers a request.

"Within the budget" is the park budget of seed 001: it bounds how long a request waits
for its actor to get a worker. Each request's *verdict* — a route in hand, or a refusal
written — is checked against it from the request's arrival, as the router logged it
(``queued_ms``/``route_ms``/``ms`` of ``router.request``), and every refusal at the
client too. A served request's answer then also takes the exchange with its actor, which
no budget bounds: under a burst the requests released for one actor share its worker's
tunnel and the actor itself, so that time is reported (a figure), and only the looser
"none hangs" bound (budget + ``burst_slack``) applies to it.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import datetime
from typing import Final

import anyio
import attrs

from benchmarks.drills import burstload
from benchmarks.drills.cluster import Cluster
from benchmarks.drills.common import (
    DrillConfig,
    DrillResult,
    Progress,
    crashed,
    create_actors,
    drill_stack,
    list_actors,
    ref,
    setup_template,
    wait_settled,
    write_timeline,
)
from benchmarks.drills.streams import request
from benchmarks.drills.timeline import Sample, Timeline, failed, pct, status_counts
from substrate.cli.stack import admin_get
from substrate.client import AteClient
from substrate.core.model import ActorState, SuspendMode
from substrate.errors import SubstrateError

BURST_CLIENT_TIMEOUT: Final = 60.0
IDLE_AFTER: Final = 0.5

ORIGINAL: Final = {
    "unanswered": "4 of 2,800 got no answer before the client limit of 90 s",
    "stuck": "2 actors left in RESUMING (after a 500), for minutes",
    "after": "each of those actors answered 200 in a later burst",
}


class IdleSuspender:
    """Suspends RUNNING actors with nothing in flight (the drill's idle policy)."""

    def __init__(self, c: AteClient) -> None:
        self.c = c
        self.in_flight: Counter[str] = Counter()
        self.last_answer: dict[str, float] = {}
        self.suspended = 0
        self.errors = 0
        self.stop = anyio.Event()

    def begin(self, actor: str) -> None:
        self.in_flight[actor] += 1

    def end(self, actor: str) -> None:
        self.in_flight[actor] -= 1
        self.last_answer[actor] = time.monotonic()

    async def run(self) -> None:
        while not self.stop.is_set():
            try:
                actors = await list_actors(self.c)
            except SubstrateError:
                actors = []
            now = time.monotonic()
            idle = [
                str(a.ref)
                for a in actors
                if a.state is ActorState.RUNNING
                and self.in_flight[str(a.ref)] == 0
                and now - self.last_answer.get(str(a.ref), 0.0) >= IDLE_AFTER
            ]
            async with anyio.create_task_group() as tg:
                for actor in idle:
                    tg.start_soon(self._suspend, actor)
            with anyio.move_on_after(0.5):
                await self.stop.wait()

    async def _suspend(self, actor: str) -> None:
        try:
            await self.c.suspend_actor(actor, SuspendMode.ASYNC)
            self.suspended += 1
        except SubstrateError:
            self.errors += 1


@attrs.frozen
class Verdict:
    """One request as the router logged it (``router.request``), times from its arrival."""

    at: float
    """Wall-clock time the router finished it."""
    status: int
    seconds: float
    """Arrival to the end of the answer."""
    route_seconds: float | None
    """Arrival to a route in hand (after any park); None if refused."""

    @property
    def verdict_seconds(self) -> float:
        """Arrival to the router's verdict: a route in hand, or the refusal written."""
        return self.seconds if self.route_seconds is None else self.route_seconds

    @property
    def exchange_seconds(self) -> float:
        """Route in hand to the end of the answer: the worker's tunnel and the actor."""
        return 0.0 if self.route_seconds is None else self.seconds - self.route_seconds


def router_verdicts(cluster: Cluster, since: float, until: float) -> list[Verdict]:
    """The requests the router finished between the wall-clock times ``since`` and
    ``until``, from the ``router.request`` lines of its log."""
    out = []
    with open(cluster.logs / "router.log", errors="replace") as log:
        for line in log:
            if '"router.request"' not in line:
                continue
            try:
                doc = json.loads(line)
                at = datetime.fromisoformat(doc["timestamp"]).timestamp()
                route_ms = doc.get("route_ms")
                verdict = Verdict(
                    at=at,
                    status=int(doc["status"]),
                    seconds=float(doc["ms"]) / 1000,
                    route_seconds=None if route_ms is None else float(route_ms) / 1000,
                )
            except (ValueError, KeyError, TypeError):
                continue
            if since <= at <= until:
                out.append(verdict)
    return out


async def router_totals(cluster: Cluster) -> dict[str, float]:
    """From the router's ``/metrics``: ``route_sum``/``route_count`` (arrival to the end of
    the answer, all outcomes), ``queued_sum`` (of that, waiting in the kernel before the
    router read the request) and ``resume_calls`` (ResumeActor calls, all codes)."""
    status, text = await admin_get(cluster.router_admin, "/metrics", timeout=5.0)
    out = {"route_sum": 0.0, "route_count": 0.0, "queued_sum": 0.0, "resume_calls": 0.0}
    if status != 200:
        return out
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("atenet_router_route_duration_seconds_sum"):
            out["route_sum"] += float(value)
        elif name.startswith("atenet_router_route_duration_seconds_count"):
            out["route_count"] += float(value)
        elif name.startswith("atenet_router_request_queued_duration_seconds_sum"):
            out["queued_sum"] += float(value)
        elif name.startswith("atenet_router_resume_calls_total"):
            out["resume_calls"] += float(value)
    return out


async def drill_burst(cfg: DrillConfig, progress: Progress) -> DrillResult:
    slots = cfg.burst_workers * cfg.burst_slots
    result = DrillResult(
        6,
        "burst",
        f"a burst: {cfg.burst_requests:,} requests, {cfg.burst_actors} actors, {slots} slots",
    )
    options = cfg.cluster_options(
        nodes=cfg.burst_workers, max_actors=cfg.burst_slots, parked_max=cfg.burst_lot
    )
    async with drill_stack(cfg, result, "6-burst", options, progress) as cluster:
        await _run(cfg, result, cluster, progress)
    return result


async def _run(cfg: DrillConfig, result: DrillResult, cluster: Cluster, progress: Progress) -> None:
    c = await cluster.client()
    await setup_template(c, cluster)
    names = [f"b-{i:03d}" for i in range(cfg.burst_actors)]
    for i in range(0, len(names), 50):
        await create_actors(c, names[i : i + 50])
    actors = [ref(n) for n in names]
    tl = Timeline("6-burst")
    limit = cfg.budget + cfg.burst_slack
    suspender = IdleSuspender(c)
    peak: dict[str, float] = {
        "parked": 0,
        "max_parked_seen": 0,
        "rejected": 0,
        "max_parked": 0,
        "longest_wait_seconds": 0.0,
    }
    sampling = anyio.Event()

    async def sample() -> None:
        while not sampling.is_set():
            status = await cluster.router_status()
            parking = status.get("parking")
            if isinstance(parking, dict):
                for key in peak:
                    value = parking.get(key)
                    if isinstance(value, int | float):
                        peak[key] = max(peak[key], float(value))
            with anyio.move_on_after(0.2):
                await sampling.wait()

    client = burstload.build(cfg.out)
    targets = [actors[i % len(actors)] for i in range(cfg.burst_requests)]

    def answered(answer: burstload.Answer) -> None:
        suspender.end(answer.actor)
        tl.add(
            Sample(
                stream="burst",
                actor=answer.actor,
                sent=t0 + answer.started,
                status=answer.status,
                latency=answer.seconds,
                body=answer.body,
            )
        )

    async with anyio.create_task_group() as outer:
        outer.start_soon(sample)
        outer.start_soon(suspender.run)
        progress(f"sending {cfg.burst_requests:,} requests at once")
        for actor in targets:
            suspender.begin(actor)
        t0 = tl.mark("burst")
        wall0 = time.time()
        await burstload.burst(
            client, cluster.router_url, targets, limit=BURST_CLIENT_TIMEOUT, on_answer=answered
        )
        burst_s = tl.now() - t0
        totals = await router_totals(cluster)
        verdicts = router_verdicts(cluster, wall0, time.time())
        with anyio.move_on_after(3.0):  # the router logs a request just after answering it
            while len(verdicts) < cfg.burst_requests:
                await anyio.sleep(0.1)
                verdicts = router_verdicts(cluster, wall0, time.time())
        tl.mark("burst answered")
        progress(f"burst answered in {burst_s:.1f} s; asking every actor once")
        after = []
        for actor in actors:
            suspender.begin(actor)
            try:
                s = await request(tl, "after", cluster.router_url, actor, timeout=30)
                if not s.ok:  # no room at that moment: once more, as a client would
                    await anyio.sleep(1.0)
                    s = await request(tl, "after", cluster.router_url, actor, timeout=30)
                after.append(s)
            finally:
                suspender.end(actor)
        sampling.set()
        suspender.stop.set()
    result.files += write_timeline(cfg, tl)

    burst = tl.stream("burst")
    latencies = [s.latency for s in burst]
    unanswered = [s for s in burst if s.status == 0]
    late = [s for s in burst if s.latency > limit]
    codes = status_counts(burst)
    result.expect(
        "every request gets an answer",
        not unanswered and len(burst) == cfg.burst_requests,
        f"{len(burst)} sent: {codes}"
        + (f"; e.g. {unanswered[0].body[:100]}" if unanswered else ""),
    )
    longest = peak["longest_wait_seconds"]
    result.expect(
        f"no request is parked longer than the budget ({cfg.budget:g} s, the router's view)",
        0 < longest <= cfg.budget + 0.25,
        f"longest park {longest:.3f} s (/statusz)",
    )
    late_verdicts = [v for v in verdicts if v.verdict_seconds > cfg.budget + cfg.slack]
    longest_verdict = max((v.verdict_seconds for v in verdicts), default=0.0)
    result.expect(
        f"every request gets its verdict within the budget of its arrival ({cfg.budget:g} s + "
        f"{cfg.slack:g} s, the router's view: a route in hand, or the refusal written)",
        len(verdicts) == cfg.burst_requests and not late_verdicts,
        f"{len(verdicts)} logged; longest {longest_verdict:.3f} s; {len(late_verdicts)} later",
    )
    refusals = [s for s in burst if s.status != 200]
    refusal_latencies = [s.latency for s in refusals]
    late_refusals = [s for s in refusals if s.latency > cfg.budget + cfg.slack]
    result.expect(
        f"every refusal reaches the client within the budget ({cfg.budget:g} s + {cfg.slack:g} s)",
        not late_refusals,
        f"{len(refusals)} refusals: p50 {pct(refusal_latencies, 0.5):.2f} s, max "
        f"{max(refusal_latencies, default=0):.2f} s; {len(late_refusals)} later",
    )
    spread = (
        f"p50 {pct(latencies, 0.5):.2f} s, p99 {pct(latencies, 0.99):.2f} s, max "
        f"{max(latencies, default=0):.2f} s"
    )
    served = [s.latency for s in burst if s.status == 200]
    exchanges = [v.exchange_seconds for v in verdicts if v.status == 200]
    result.expect(
        f"none hangs: every answer reaches the client within {limit:g} s "
        f"(budget + {cfg.burst_slack:g} s)",
        not late,
        f"{spread}; {len(late)} later",
    )
    seen = int(max(peak["max_parked_seen"], peak["parked"]))
    result.expect(
        f"the lot never holds more than its size ({cfg.burst_lot})",
        0 < seen <= cfg.burst_lot and int(peak["max_parked"]) in (0, cfg.burst_lot),
        f"peak {seen} parked; {int(peak['rejected'])} shed at the lot",
    )
    client_mean = sum(latencies) / len(latencies) if latencies else 0.0
    count = totals["route_count"]
    router_mean = totals["route_sum"] / count if count else 0.0
    queued_mean = totals["queued_sum"] / count if count else 0.0
    result.notes.append(
        f"mean time per request: {client_mean:.2f} s at the client; {router_mean:.2f} s by "
        "the router's clock, from the request's arrival (TCP_INFO) to the end of its answer "
        f"({count:.0f} requests), of which {queued_mean:.2f} s waiting in the kernel before "
        f"the router read it; the router made {totals['resume_calls']:.0f} ResumeActor "
        f"calls in {burst_s:.1f} s for the parked flights and their retries"
    )
    ok = len(burst) - len(failed(burst))
    left, _ = await wait_settled(c, timeout=20)
    result.expect("no actor is left in a transient state", not left, ", ".join(left)[:400])
    final = await list_actors(c)
    broken = crashed(final)
    result.expect("no actor CRASHED", not broken, "; ".join(broken)[:400])
    dead = {str(a.ref) for a in final if a.state is ActorState.CRASHED}
    bad_after = [f"{s.actor} {s.status}" for s in after if not s.ok and s.actor not in dead]
    result.expect(
        "afterwards every actor that is not CRASHED answers",
        not bad_after,
        f"{len(after) - len(bad_after) - len(dead)} of {len(after) - len(dead)}; "
        + ", ".join(bad_after[:5]),
    )
    bodies = Counter(s.body.split(":")[-1].strip()[:50] for s in failed(burst))
    result.notes.append(
        f"burst answered in {burst_s:.1f} s; idle suspender suspended {suspender.suspended} "
        f"({suspender.errors} refused); failure bodies: "
        + "; ".join(f"{n}x {b!r}" for b, n in bodies.most_common(4))
    )
    result.figure(
        f"{cfg.burst_requests:,} requests at once",
        f"{len(unanswered)} unanswered; {codes}; client p99 {pct(latencies, 0.99):.2f} s, "
        f"max {max(latencies, default=0):.2f} s; longest park {longest:.2f} s, longest "
        f"verdict {longest_verdict:.2f} s from arrival",
        ORIGINAL["unanswered"],
    )
    result.figure(
        "served (200) answers at the client",
        f"max {max(served, default=0):.2f} s, of which the exchange with the actor after its "
        f"route was in hand up to {max(exchanges, default=0):.2f} s (p50 "
        f"{pct(exchanges, 0.5):.2f} s): the released requests of an actor share its worker's "
        "tunnel and the actor",
        "not reported",
    )
    result.figure(
        "actors stuck afterwards",
        f"{len(left)} transient, {len(broken)} CRASHED",
        ORIGINAL["stuck"],
    )
    result.figure(
        "every actor afterwards",
        f"{len(after) - len(bad_after)} of {len(after)} answered 200",
        ORIGINAL["after"],
    )
    result.figure("peak parked requests", f"{seen} (lot {cfg.burst_lot})", "not reported")
    result.figure("served in the burst", f"{ok} of {len(burst)} answered 200", "not reported")


__all__ = ["drill_burst"]
