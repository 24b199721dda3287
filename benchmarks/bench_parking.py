"""Benchmark: admission and resolution throughput of the pure parking lot.

Two scenarios, each 100,000 requests over 1,000 actors, on ``substrate.net.parking``
alone (no event loop, virtual time):

* ``burst``: every request is admitted (100 per actor, so 1,000 flights), then every
  flight's first attempt succeeds. This is the bare cost of admit + singleflight + serve.
* ``mixed``: a discrete-event run over 25 s of virtual time at 4,000 requests/s, actors
  drawn with a skew (a few hot ones), the default lot of 1,024 slots, and a control plane
  where most actors resume in 20 ms, some are saturated (ResourceExhausted, retried with
  the real backoff), some never get room (budget exhausted), some are missing (NotFound)
  and some hang for 6 s (cut at the budget). One request in ten carries a 0.5 s deadline
  and one in twenty leaves after 0.2 s. Every outcome of seed 001 shows up, plus shedding.
  The time includes the small event-queue harness that plays the control plane.

Prints, per scenario, the median over the runs of requests per second and microseconds
per request (plus the range), and the mixed run's outcome counts. Every run is checked:
each admitted request is resolved exactly once and the lot ends empty. Exits non-zero
only on errors, never on a missed performance goal.

Run: ``.venv/bin/python benchmarks/bench_parking.py``
"""

from __future__ import annotations

import collections
import gc
import heapq
import random
import statistics
import sys
import time

from substrate.core.ids import ActorRef
from substrate.errors import GrpcCode
from substrate.net.parking import (
    Admitted,
    Failure,
    Outcome,
    ParkingConfig,
    ParkingLot,
    RequestId,
)

REQUESTS = 100_000
ACTORS = 1_000
RUNS = 7
RATE = 4_000.0  # mixed: arrivals per second of virtual time
ATTEMPT_LATENCY = 0.02
HANG_LATENCY = 6.0
NO_ROOM = Failure(GrpcCode.RESOURCE_EXHAUSTED, "no worker has room for the actor")
MISSING = Failure(GrpcCode.NOT_FOUND, "actor not found")

# Actor behaviours in the mixed scenario, by share of the actors.
HEALTHY, SATURATED, STUCK, MISSING_ACTOR, HANGING = range(5)
BEHAVIOURS = [HEALTHY] * 70 + [SATURATED] * 15 + [STUCK] * 5 + [MISSING_ACTOR] * 5 + [HANGING] * 5

ARRIVE, ANSWER, LEAVE = 0, 1, 2


class CheckFailed(Exception):
    pass


def actors() -> list[ActorRef]:
    return [ActorRef(f"team-{n % 10}", f"actor-{n}") for n in range(ACTORS)]


def check(lot: ParkingLot[str], admitted: int, resolved: list[RequestId]) -> None:
    if len(resolved) != admitted or len(set(resolved)) != admitted:
        raise CheckFailed(f"{admitted} admitted but {len(resolved)} resolutions")
    stats = lot.stats()
    if stats.waiting or stats.flights:
        raise CheckFailed(f"lot not empty at the end: {stats}")


# --- burst ---------------------------------------------------------------------------------


def run_burst(refs: list[ActorRef]) -> float:
    lot: ParkingLot[str] = ParkingLot(ParkingConfig(max_parked=REQUESTS))
    admit = lot.admit
    succeed = lot.attempt_succeeded
    resolved: list[RequestId] = []
    starts: list[ActorRef] = []
    n_actors = len(refs)
    gc.disable()
    start = time.perf_counter()
    now = 0.0
    for n in range(REQUESTS):
        admission = admit(refs[n % n_actors], now=now)
        if isinstance(admission, Admitted) and admission.start_attempt:
            starts.append(refs[n % n_actors])
        now += 1e-6
    for actor in starts:
        succeed(actor, "10.0.0.7", now=now)
    resolved.extend(r.request for r in lot.take_resolutions())
    elapsed = time.perf_counter() - start
    gc.enable()
    check(lot, REQUESTS, resolved)
    return elapsed


# --- mixed ---------------------------------------------------------------------------------


def mixed_workload(refs: list[ActorRef], seed: int) -> list[tuple[float, int, float | None, float]]:
    """Arrivals as (time, actor index, relative deadline or None, leave-after or inf)."""
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) ** 0.8 for rank in range(len(refs))]
    chosen = rng.choices(range(len(refs)), weights=weights, k=REQUESTS)
    arrivals = []
    now = 0.0
    for index in chosen:
        now += rng.expovariate(RATE)
        roll = rng.random()
        deadline = 0.5 if roll < 0.10 else None
        leave = 0.2 if 0.10 <= roll < 0.15 else float("inf")
        arrivals.append((now, index, deadline, leave))
    return arrivals


def run_mixed(
    refs: list[ActorRef],
    behaviour: list[int],
    arrivals: list[tuple[float, int, float | None, float]],
    seed: int,
) -> tuple[float, collections.Counter[str]]:
    lot: ParkingLot[str] = ParkingLot()
    rng = random.Random(seed)
    index_of = {ref: n for n, ref in enumerate(refs)}
    events: list[tuple[float, int, int, object]] = []
    seq = 0
    for at, index, deadline, leave in arrivals:
        events.append((at, seq, ARRIVE, (index, deadline, leave)))
        seq += 1
    heapq.heapify(events)
    resolved: list[RequestId] = []
    outcomes: collections.Counter[str] = collections.Counter()
    admitted = 0

    def start_attempt(actor: ActorRef, now: float) -> None:
        nonlocal seq
        kind = behaviour[index_of[actor]]
        latency = HANG_LATENCY if kind == HANGING else ATTEMPT_LATENCY
        heapq.heappush(events, (now + latency, seq, ANSWER, actor))
        seq += 1

    gc.disable()
    start = time.perf_counter()
    while True:
        due_at = lot.next_deadline()
        if events and (due_at is None or events[0][0] < due_at):
            now, _, kind, payload = heapq.heappop(events)
            if kind == ARRIVE:
                index, deadline, leave = payload  # type: ignore[misc]
                admission = lot.admit(
                    refs[index], now=now, deadline=None if deadline is None else now + deadline
                )
                if isinstance(admission, Admitted):
                    admitted += 1
                    if admission.start_attempt:
                        start_attempt(refs[index], now)
                    if leave != float("inf"):
                        heapq.heappush(events, (now + leave, seq, LEAVE, admission.request))
                        seq += 1
                else:
                    outcomes["shed"] += 1
            elif kind == ANSWER:
                actor: ActorRef = payload  # type: ignore[assignment]
                behave = behaviour[index_of[actor]]
                if behave == HEALTHY or (behave == SATURATED and rng.random() < 0.3):
                    lot.attempt_succeeded(actor, "10.0.0.7", now=now)
                elif behave == MISSING_ACTOR:
                    lot.attempt_failed(actor, MISSING, now=now, rng=rng)
                elif behave == HANGING:
                    lot.attempt_succeeded(actor, "10.0.0.7", now=now)
                else:
                    lot.attempt_failed(actor, NO_ROOM, now=now, rng=rng)
            else:
                lot.cancel(payload, now=now)  # type: ignore[arg-type]
        elif due_at is not None:
            for actor in lot.poll(now=due_at):
                start_attempt(actor, due_at)
        else:
            break
        for resolution in lot.take_resolutions():
            resolved.append(resolution.request)
            outcomes[resolution.outcome.value] += 1
    elapsed = time.perf_counter() - start
    gc.enable()
    check(lot, admitted, resolved)
    if set(outcomes) != {o.value for o in Outcome} | {"shed"}:
        raise CheckFailed(f"the mixed run should produce every outcome: {dict(outcomes)}")
    return elapsed, outcomes


# --- report --------------------------------------------------------------------------------


def summarise(name: str, times: list[float]) -> str:
    rates = sorted(REQUESTS / t for t in times)
    per_request = sorted(t / REQUESTS * 1e6 for t in times)
    return (
        f"{name:<7} {statistics.median(rates):>12,.0f} req/s"
        f"  {statistics.median(per_request):6.2f} us/request"
        f"  (range {per_request[0]:.2f}..{per_request[-1]:.2f} us, {len(times)} runs)"
    )


def main() -> int:
    refs = actors()
    behaviour_rng = random.Random(7)
    behaviour = [behaviour_rng.choice(BEHAVIOURS) for _ in refs]
    arrivals = mixed_workload(refs, seed=11)
    burst_times: list[float] = []
    mixed_times: list[float] = []
    outcomes: collections.Counter[str] = collections.Counter()
    try:
        run_burst(refs)  # warm-up
        for _ in range(RUNS):
            burst_times.append(run_burst(refs))
            elapsed, outcomes = run_mixed(refs, behaviour, arrivals, seed=13)
            mixed_times.append(elapsed)
    except CheckFailed as error:
        print(f"bench_parking: check failed: {error}", file=sys.stderr)
        return 1
    print(
        f"bench_parking: pure ParkingLot, {REQUESTS:,} requests over {ACTORS:,} actors, "
        f"median of {RUNS} runs"
    )
    print(summarise("burst", burst_times))
    print(summarise("mixed", mixed_times))
    total = sum(outcomes.values())
    shares = ", ".join(
        f"{label}={count:,} ({count / total:.1%})" for label, count in sorted(outcomes.items())
    )
    print(f"mixed outcomes: {shares}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
