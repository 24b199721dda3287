"""A simulated fleet: routers park requests, ateapi places actors with the real scheduler.

What is real: every placement is a :class:`substrate.sched.FleetIndex` decision with real
constraints and capacity booking, and every parked request goes through the real
:class:`substrate.net.ParkingLot` (budget, backoff with jitter, shedding, singleflight).
What is modelled: restore and request latencies (drawn from the seeded RNG, shaped like the
gVisor figures in docs), and actors that go idle suspend after ``idle_suspend`` seconds.
"""

from __future__ import annotations

import math
from collections import Counter

import attrs

from substrate.core.ids import ActorRef, NodeRef, WorkerRef
from substrate.core.model import (
    Capacity,
    Metadata,
    Resources,
    SandboxClass,
    Worker,
    WorkerState,
)
from substrate.errors import GrpcCode, ResourceExhausted
from substrate.net import (
    Admitted,
    AwaitBudget,
    Failure,
    FlightEnded,
    NoFlight,
    ParkingConfig,
    ParkingLot,
    RetryAt,
    Shed,
)
from substrate.sched import Constraints, FleetIndex
from substrate.testing.sim.world import SimWorld


@attrs.frozen(slots=True, kw_only=True)
class SimConfig:
    seed: int = 1
    actors: int = 2000
    workers: int = 50
    nodes: int = 10
    slots_per_worker: int = 16
    duration: float = 120.0
    base_rate: float = 150.0
    """Requests per second outside bursts."""
    burst_every: float = 20.0
    burst_length: float = 3.0
    burst_rate: float = 1500.0
    zipf_s: float = 1.1
    """Popularity skew over actors (1.0 ≈ classic Zipf)."""
    restore_latency: float = 0.25
    restore_jitter: float = 0.15
    idle_suspend: float = 8.0
    suspend_latency: float = 0.2
    parking: ParkingConfig = ParkingConfig()


@attrs.frozen(slots=True, kw_only=True)
class SimReport:
    seed: int
    requests: int
    served_warm: int
    outcomes: dict[str, int]
    shed: int
    resumes: int
    suspends: int
    placements_per_worker_max: int
    placements_per_worker_min: int
    max_parked_seen: int
    parked_p50: float
    parked_p99: float
    max_wait: float
    steps: int
    violations: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        o = self.outcomes
        return [
            f"seed {self.seed}: {self.requests} requests, {self.served_warm} served warm",
            f"  resumes {self.resumes}, suspends {self.suspends}, placements per worker "
            f"min {self.placements_per_worker_min} max {self.placements_per_worker_max}",
            "  parked outcomes: "
            + ", ".join(f"{k}={v}" for k, v in sorted(o.items()))
            + f"; shed {self.shed}",
            f"  parked time p50 {self.parked_p50 * 1000:.1f} ms, p99 {self.parked_p99 * 1000:.1f}"
            f" ms, max {self.max_wait * 1000:.1f} ms; lot peak {self.max_parked_seen}",
            f"  invariant violations: {len(self.violations)}",
        ]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[k]


class _Sim:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.world = SimWorld(cfg.seed)
        self.lot: ParkingLot[WorkerRef] = ParkingLot(cfg.parking)
        self.fleet = FleetIndex(
            Worker(
                ref=WorkerRef(name=f"w{i}"),
                node=NodeRef(name=f"n{i % cfg.nodes}"),
                sandbox_class=SandboxClass.FAKE,
                state=WorkerState.ACTIVE,
                epoch=1,
                capacity=Capacity(
                    cpu_milli=cfg.slots_per_worker * 250,
                    memory_bytes=cfg.slots_per_worker * (256 << 20),
                    actors=cfg.slots_per_worker,
                ),
                metadata=Metadata(uid=f"w{i}", version=1),
            )
            for i in range(cfg.workers)
        )
        self.actors = [ActorRef(atespace="sim", name=f"a{i}") for i in range(cfg.actors)]
        weights = [1.0 / (i + 1) ** cfg.zipf_s for i in range(cfg.actors)]
        total = sum(weights)
        acc = 0.0
        self.cdf = []
        for w in weights:
            acc += w / total
            self.cdf.append(acc)
        self.running: dict[ActorRef, WorkerRef] = {}
        self.last_used: dict[ActorRef, float] = {}
        self.resuming: set[ActorRef] = set()
        self.resources = Resources(cpu_milli=250, memory_bytes=256 << 20)
        self.constraints = Constraints(sandbox_class=SandboxClass.FAKE, resources=self.resources)
        self.requests = 0
        self.served_warm = 0
        self.shed = 0
        self.resumes = 0
        self.suspends = 0
        self.placements: Counter[WorkerRef] = Counter()
        self.waits: list[float] = []
        self.outcomes: Counter[str] = Counter()
        self.violations: list[str] = []
        self.admitted: set[int] = set()
        self.resolved: set[int] = set()
        self.poll_scheduled_for: float | None = None

    # --- traffic ----------------------------------------------------------------------

    def pick_actor(self) -> ActorRef:
        x = self.world.rng.random()
        lo, hi = 0, len(self.cdf) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.cdf[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        return self.actors[lo]

    def rate(self, t: float) -> float:
        in_burst = (t % self.cfg.burst_every) < self.cfg.burst_length
        return self.cfg.burst_rate if in_burst else self.cfg.base_rate

    def next_arrival(self) -> None:
        w = self.world
        if w.now >= self.cfg.duration:
            return
        self.request(self.pick_actor())
        w.after(w.rng.expovariate(self.rate(w.now)), self.next_arrival)

    def request(self, actor: ActorRef) -> None:
        self.requests += 1
        now = self.world.now
        if actor in self.running:
            self.served_warm += 1
            self.last_used[actor] = now
            return
        admission = self.lot.admit(actor, now=now)
        if isinstance(admission, Shed):
            self.shed += 1
            return
        assert isinstance(admission, Admitted)
        self.admitted.add(int(admission.request))
        if admission.start_attempt:
            self.attempt(actor)
        self.arm_poll()

    # --- the control plane ------------------------------------------------------------

    def attempt(self, actor: ActorRef) -> None:
        """One ResumeActor: a real scheduling decision, then a modelled restore."""
        w = self.world
        if actor in self.running:
            self.finish_attempt_ok(actor, self.running[actor])
            return
        try:
            worker = self.fleet.schedule_and_book(self.constraints, rng=w.rng)
        except ResourceExhausted as exc:
            decision = self.lot.attempt_failed(
                actor,
                Failure(code=GrpcCode.RESOURCE_EXHAUSTED, description=exc.description),
                now=w.now,
                rng=w.rng,
            )
            self.after_decision(decision)
            return
        self.resumes += 1
        self.placements[worker.ref] += 1
        self.resuming.add(actor)
        latency = max(0.05, w.rng.gauss(self.cfg.restore_latency, self.cfg.restore_jitter))

        def restored() -> None:
            self.resuming.discard(actor)
            self.running[actor] = worker.ref
            self.last_used[actor] = w.now
            w.after(self.cfg.idle_suspend, lambda: self.maybe_suspend(actor))
            self.finish_attempt_ok(actor, worker.ref)

        w.after(latency, restored)

    def finish_attempt_ok(self, actor: ActorRef, worker: WorkerRef) -> None:
        self.after_decision(self.lot.attempt_succeeded(actor, worker, now=self.world.now))

    def after_decision(self, decision: object) -> None:
        if isinstance(decision, RetryAt | AwaitBudget):
            self.arm_poll()
        elif isinstance(decision, FlightEnded | NoFlight):
            pass
        self.collect()

    def maybe_suspend(self, actor: ActorRef) -> None:
        w = self.world
        if actor not in self.running:
            return
        due = self.last_used.get(actor, 0.0) + self.cfg.idle_suspend
        if w.now + 1e-6 < due:
            w.at(due, lambda: self.maybe_suspend(actor))
            return
        worker = self.running.pop(actor)
        self.suspends += 1

        def suspended() -> None:
            self.fleet.release(worker, self.resources)

        w.after(self.cfg.suspend_latency, suspended)

    # --- parking lot timers -----------------------------------------------------------

    def arm_poll(self) -> None:
        nxt = self.lot.next_deadline()
        if nxt is None:
            return
        if self.poll_scheduled_for is not None and self.poll_scheduled_for <= nxt:
            return
        self.poll_scheduled_for = nxt
        self.world.at(nxt, self.on_poll)

    def on_poll(self) -> None:
        self.poll_scheduled_for = None
        for actor in self.lot.poll(now=self.world.now):
            self.attempt(actor)
        self.collect()
        self.arm_poll()

    def collect(self) -> None:
        for r in self.lot.take_resolutions():
            rid = int(r.request)
            if rid in self.resolved:
                self.violations.append(f"request {rid} resolved twice")
            self.resolved.add(rid)
            self.outcomes[r.outcome.value] += 1
            self.waits.append(r.waited)
            if r.waited > self.cfg.parking.effective_budget + 1e-9:
                self.violations.append(f"request {rid} waited {r.waited:.3f}s past the budget")
        stats = self.lot.stats()
        if self.cfg.parking.enabled and stats.parked > self.cfg.parking.max_parked:
            self.violations.append(f"lot held {stats.parked} > {self.cfg.parking.max_parked}")

    def check_fleet(self) -> None:
        for worker in self.fleet:
            cap = worker.capacity
            if cap is not None and not cap.covers(worker.allocated):
                self.violations.append(f"worker {worker.ref} over-booked: {worker.allocated}")

    def run(self) -> SimReport:
        w = self.world
        w.at(0.0, self.next_arrival)

        def audit() -> None:
            self.check_fleet()
            if w.now < self.cfg.duration:
                w.after(1.0, audit)

        w.at(0.0, audit)
        w.run_until(self.cfg.duration + self.cfg.parking.effective_budget + 30.0)
        self.collect()
        self.check_fleet()
        missing = self.admitted - self.resolved
        if missing:
            self.violations.append(f"{len(missing)} admitted requests never resolved")
        counts = [self.placements.get(wk.ref, 0) for wk in self.fleet]
        return SimReport(
            seed=self.cfg.seed,
            requests=self.requests,
            served_warm=self.served_warm,
            outcomes=dict(self.outcomes),
            shed=self.shed,
            resumes=self.resumes,
            suspends=self.suspends,
            placements_per_worker_max=max(counts),
            placements_per_worker_min=min(counts),
            max_parked_seen=self.lot.stats().max_parked_seen,
            parked_p50=_percentile(self.waits, 0.5),
            parked_p99=_percentile(self.waits, 0.99),
            max_wait=max(self.waits, default=0.0),
            steps=w.steps,
            violations=tuple(self.violations),
        )


def simulate(config: SimConfig) -> SimReport:
    """Run one seeded simulation; the same config always gives the same report."""
    return _Sim(config).run()


__all__ = ["SimConfig", "SimReport", "simulate"]
