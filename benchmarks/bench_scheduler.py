"""Benchmark: cost of one scheduling decision on a FleetIndex of 100, 10k and 100k workers.

Each fleet has several nodes (16 workers a node), a few labels (zone, tier, gpu), two
sandbox classes, some draining/unavailable/unreported workers and mixed load (most workers
have room). The decision mix covers plain requests, label selectors, a preferred node, a
pinned node, a rare label and the other sandbox class with a MEMORY runtime gate. Every
placement is booked and the oldest booking released once a fixed number are outstanding,
so the fleet's load stays stable.

Prints p50/p99 of the decision (``FleetIndex.schedule``) per fleet size in microseconds and
the ratio of the largest to the smallest p50. The sizes are measured in interleaved rounds
so that noise from other processes on the machine spreads evenly over them; the collector
is paused while a batch is timed. Every decision is checked (the chosen worker
passes every gate; sampled refusals are confirmed by a full scan). Exits non-zero only on
errors, never on a missed performance goal.

Run: ``.venv/bin/python benchmarks/bench_scheduler.py``
"""

from __future__ import annotations

import contextlib
import gc
import random
import statistics
import sys
import time
from collections import deque

from substrate.core.ids import Labels, NodeRef, WorkerRef
from substrate.core.model import (
    Capacity,
    Metadata,
    Resources,
    SandboxClass,
    Worker,
    WorkerState,
)
from substrate.errors import ResourceExhausted
from substrate.sched import Constraints, FleetIndex, fits, schedule

SIZES = (100, 10_000, 100_000)
WORKERS_PER_NODE = 16
ROUNDS = 10
BATCH = 2_000
WARMUP = 2_000
LIST_SCAN_DECISIONS = 200
CHECK_REFUSALS = 20
GOAL_P50_US = 50.0
GOAL_RATIO = 2.0
MIB = 1 << 20
GIB = 1 << 30
ZONES = ("z0", "z1", "z2", "z3")


def build_fleet(n: int, rng: random.Random) -> tuple[list[Worker], list[NodeRef]]:
    nodes = [NodeRef(f"node-{i}") for i in range(max(1, n // WORKERS_PER_NODE))]
    fleet = []
    for i in range(n):
        node = nodes[i % len(nodes)]
        labels = {"zone": ZONES[(i // WORKERS_PER_NODE) % len(ZONES)]}
        labels["tier"] = "gold" if rng.random() < 0.2 else "std"
        if rng.random() < 0.05:
            labels["gpu"] = "true"
        roll = rng.random()
        state = (
            WorkerState.ACTIVE
            if roll < 0.95
            else WorkerState.DRAINING
            if roll < 0.98
            else WorkerState.UNAVAILABLE
        )
        slots = rng.choice((16, 32, 64))
        capacity: Capacity | None = Capacity(
            cpu_milli=slots * 1000, memory_bytes=slots * 4 * GIB, actors=slots
        )
        load = rng.random()
        if load < 0.7:
            share = rng.uniform(0.0, 0.6)
        elif load < 0.9:
            share = rng.uniform(0.6, 0.95)
        else:
            share = 1.0  # full
        used = int(slots * share)
        allocated = Capacity(cpu_milli=used * 500, memory_bytes=used * 2 * GIB, actors=used)
        if rng.random() < 0.01:
            capacity, allocated = None, Capacity()  # not reported yet
        fleet.append(
            Worker(
                ref=WorkerRef(f"worker-{i:06d}"),
                metadata=Metadata(uid=f"uid-{i}", version=1),
                node=node,
                sandbox_class=SandboxClass.MICROVM if i % 10 == 9 else SandboxClass.GVISOR,
                runtime_versions=frozenset({"rt1", "rt2"} if i % 3 else {"rt1"}),
                labels=Labels(labels),
                state=state,
                capacity=capacity,
                allocated=allocated,
            )
        )
    return fleet, nodes


def make_request(rng: random.Random, nodes: list[NodeRef]) -> Constraints:
    resources = Resources(
        cpu_milli=rng.choice((250, 500, 1000)), memory_bytes=rng.choice((512, 1024, 2048)) * MIB
    )
    roll = rng.random()
    base = Constraints(sandbox_class=SandboxClass.GVISOR, resources=resources)
    if roll < 0.50:
        return base
    if roll < 0.70:
        return Constraints(
            sandbox_class=SandboxClass.GVISOR,
            template_selector=Labels({"zone": rng.choice(ZONES)}),
            resources=resources,
        )
    if roll < 0.80:
        return Constraints(
            sandbox_class=SandboxClass.GVISOR,
            template_selector=Labels({"zone": rng.choice(ZONES)}),
            actor_selector=Labels({"tier": "gold"}),
            resources=resources,
        )
    if roll < 0.90:
        return Constraints(
            sandbox_class=SandboxClass.GVISOR,
            preferred_node=rng.choice(nodes),
            resources=resources,
        )
    if roll < 0.95:
        return Constraints(
            sandbox_class=SandboxClass.GVISOR,
            required_node=rng.choice(nodes),
            resources=resources,
        )
    if roll < 0.98:
        return Constraints(
            sandbox_class=SandboxClass.GVISOR,
            actor_selector=Labels({"gpu": "true"}),
            resources=resources,
        )
    return Constraints(
        sandbox_class=SandboxClass.MICROVM,
        runtime_version="rt2",
        resources=resources,
    )


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class Run:
    """One fleet size: its index, its request stream and what was measured on it."""

    def __init__(self, n: int) -> None:
        self.n = n
        t0 = time.perf_counter()
        fleet, self.nodes = build_fleet(n, random.Random(1000 + n))
        self.index = FleetIndex(fleet)
        self.build_s = time.perf_counter() - t0
        self.rng = random.Random(n)
        self.outstanding: deque[tuple[WorkerRef, Resources]] = deque()
        self.keep = min(2_000, n * 2)
        self.samples: list[float] = []
        self.errors = 0
        self.refused = 0
        self.refusals_checked = 0

    def batch(self, decisions: int, *, record: bool) -> None:
        """Run ``decisions`` decisions, booking each placement and releasing the oldest."""
        index, rng, nodes = self.index, self.rng, self.nodes
        perf = time.perf_counter_ns
        for _ in range(decisions):
            c = make_request(rng, nodes)
            start = perf()
            try:
                chosen = index.schedule(c, rng=rng)
            except ResourceExhausted:
                elapsed = perf() - start
                self.refused += 1
                if self.refusals_checked < CHECK_REFUSALS:
                    self.refusals_checked += 1
                    if any(fits(w, c) for w in index):
                        self.errors += 1
                        print(f"  ERROR: refused although a worker had room: {c}", file=sys.stderr)
            else:
                elapsed = perf() - start
                if not fits(chosen, c):
                    self.errors += 1
                    print(f"  ERROR: chose ineligible {chosen.ref.name} for {c}", file=sys.stderr)
                    continue
                index.book(chosen.ref, c.resources)
                self.outstanding.append((chosen.ref, c.resources))
                if len(self.outstanding) > self.keep:
                    ref, resources = self.outstanding.popleft()
                    index.release(ref, resources)
            if record:
                self.samples.append(elapsed / 1000.0)

    def list_scan_p50(self, decisions: int) -> float:
        """For context only: the same kind of decision by an exact O(n) scan of a list."""
        workers = list(self.index)
        rng = random.Random(7)
        times = []
        for _ in range(decisions):
            c = make_request(rng, self.nodes)
            start = time.perf_counter_ns()
            with contextlib.suppress(ResourceExhausted):
                schedule(workers, c, rng=rng)
            times.append((time.perf_counter_ns() - start) / 1000.0)
        return statistics.median(times)


def main() -> int:
    print(
        f"scheduler benchmark: {ROUNDS} rounds x {BATCH} timed decisions per fleet size, "
        "sizes interleaved"
    )
    runs = [Run(n) for n in SIZES]
    gc.collect()
    gc.freeze()  # the fleets are long-lived; keep them out of the collector's way
    for run in runs:
        run.batch(WARMUP, record=False)
    for _ in range(ROUNDS):
        for run in runs:
            gc.disable()  # as timeit does: measure the decision, not collector pauses
            try:
                run.batch(BATCH, record=True)
            finally:
                gc.enable()
            gc.collect()
    print(
        f"{'workers':>8} {'build s':>8} {'p50 us':>8} {'p99 us':>8} {'mean us':>8} "
        f"{'refused':>8} {'list-scan p50 us':>17}"
    )
    for run in runs:
        run.samples.sort()
        scan = "-"
        if run.n <= 10_000:
            scan = f"{run.list_scan_p50(LIST_SCAN_DECISIONS if run.n <= 1_000 else 50):.1f}"
        print(
            f"{run.n:>8} {run.build_s:>8.2f} {percentile(run.samples, 0.5):>8.1f} "
            f"{percentile(run.samples, 0.99):>8.1f} {statistics.fmean(run.samples):>8.1f} "
            f"{run.refused:>8} {scan:>17}"
        )
    p50s = [percentile(run.samples, 0.5) for run in runs]
    ratio = p50s[-1] / p50s[0]
    print(f"p50 ratio largest/smallest fleet: {ratio:.2f}")
    met = max(p50s) < GOAL_P50_US and ratio <= GOAL_RATIO
    print(
        f"goal (p50 < {GOAL_P50_US:.0f} us, ratio <= {GOAL_RATIO:.1f}): "
        f"{'met' if met else 'NOT met'}"
    )
    errors = sum(run.errors for run in runs)
    if errors:
        print(f"{errors} error(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
