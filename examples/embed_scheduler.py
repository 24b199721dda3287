"""Embed substrate's scheduler and control plane in your own program (docs/embedding.md).

    python examples/embed_scheduler.py

Four parts, each runnable on its own, none touching the network or the disk:

1. the pure scheduler: a FleetIndex, power of two choices, randomness as an argument;
2. the control plane in process: ActorService on the memory store with a manual clock,
   driving the in-memory fake nodes of substrate.testing;
3. a property checked with substrate.testing's hypothesis strategies;
4. the deterministic simulator.

Parts 3 and 4 need the ``test`` extra (hypothesis).
"""

from __future__ import annotations

import logging
import random
from collections import Counter

import anyio
import structlog

from substrate.adapters.memory import ManualClock, MemoryStore
from substrate.core.ids import ActorRef, NodeRef, TemplateRef, WorkerRef
from substrate.core.model import (
    ActorTemplate,
    Capacity,
    Container,
    Probe,
    Resources,
    SandboxClass,
    SnapshotConfig,
    Worker,
    WorkerState,
)
from substrate.errors import ResourceExhausted
from substrate.sched import Constraints, FleetIndex, choose, fits
from substrate.services.actors import ActorService, ServiceConfig
from substrate.services.worker_cache import WorkerCache
from substrate.testing.fake_node import FakeNodes

SMALL = Resources(cpu_milli=500, memory_bytes=512 << 20)


def fleet(n: int) -> list[Worker]:
    """``n`` ACTIVE gVisor workers on ``n // 2`` nodes, each with room for 4 actors."""
    return [
        Worker(
            ref=WorkerRef(f"w{i}"),
            node=NodeRef(f"node-{i // 2}"),
            state=WorkerState.ACTIVE,
            sandbox_class=SandboxClass.GVISOR,
            capacity=Capacity(cpu_milli=4000, memory_bytes=8 << 30, actors=4),
        )
        for i in range(n)
    ]


# --- 1. the pure scheduler --------------------------------------------------------------


def place(seed: int, actors: int = 30) -> list[str]:
    """Book ``actors`` placements on a 10-worker fleet; the seed alone decides where."""
    index = FleetIndex(fleet(10))
    rng = random.Random(seed)
    need = Constraints(sandbox_class=SandboxClass.GVISOR, resources=SMALL)
    return [index.schedule_and_book(need, rng=rng).ref.name for _ in range(actors)]


def scheduler_demo() -> None:
    first, again = place(seed=7), place(seed=7)
    assert first == again, "same seed, same placements"
    print("1. scheduler: 30 actors on 10 workers ->", dict(sorted(Counter(first).items())))
    # The fleet holds 40 actors; the 41st is refused, never over-booked.
    index = FleetIndex(fleet(10))
    need = Constraints(sandbox_class=SandboxClass.GVISOR, resources=SMALL)
    rng = random.Random(1)
    for _ in range(40):
        index.schedule_and_book(need, rng=rng)
    try:
        index.schedule(need, rng=rng)
    except ResourceExhausted as exc:
        print("   41st actor:", exc.description)
    # p2c over any candidate list, e.g. the workers of one node.
    pinned = Constraints(sandbox_class=SandboxClass.GVISOR, required_node=NodeRef("node-0"))
    candidates = [w for w in fleet(10) if fits(w, pinned)]
    print("   p2c among node-0's workers:", choose(candidates, rng=random.Random(3)).ref.name)


# --- 2. the control plane in process ---------------------------------------------------------


async def control_plane_demo() -> None:
    clock = ManualClock()
    snapshot_ids = iter(range(1, 1_000_000))
    nodes = FakeNodes()  # in-memory atelets, workers and bucket (substrate.testing)
    async with MemoryStore(clock=clock) as store:
        cache = WorkerCache(store, relist_every=3600)
        service = ActorService(
            store=store,
            agents=nodes,
            workers=cache,
            objects=nodes.bucket,
            config=ServiceConfig(default_storage_location="memory://bucket", golden_enabled=False),
            clock=clock,  # time is an argument ...
            rng=random.Random(7),  # ... and so is randomness
            new_id=lambda: f"snap-{next(snapshot_ids)}",
        )
        async with cache, service:
            await service.create_atespace("demo")
            template = await service.create_template(
                ActorTemplate(
                    ref=TemplateRef(atespace="demo", name="counter"),
                    containers=(
                        Container(name="app", image="counter:1", wakeup_probe=Probe(path="/")),
                    ),
                    resources=Resources(cpu_milli=100, memory_bytes=64 << 20),
                    sandbox_class=SandboxClass.FAKE,
                    snapshot_config=SnapshotConfig(storage_location="memory://bucket"),
                )
            )
            for node in ("node-a", "node-b"):
                worker = WorkerRef(f"{node}-w0")
                nodes.add_node(NodeRef(node), [worker])
                await service.register_worker(
                    Worker(
                        ref=worker,
                        node=NodeRef(node),
                        sandbox_class=SandboxClass.FAKE,
                        epoch=1,
                        capacity=Capacity(cpu_milli=1000, memory_bytes=1 << 30, actors=8),
                    )
                )
            await cache.wait_ready()

            ref = ActorRef(atespace="demo", name="alpha")
            await service.create_actor(ref, template=template.ref)
            first = await service.resume(ref)
            assignment = first.actor.status.assignment
            assert assignment is not None
            print(f"2. control plane: {ref} runs on {assignment.worker}, cold boot")
            for _ in range(3):  # three requests to the actor's counter
                count = nodes.for_node(assignment.node).request(
                    assignment.worker, first.actor.metadata.uid
                )
            await service.suspend(ref)
            clock.advance(60)  # a minute passes, on the manual clock
            again = await service.resume(ref)
            assert again.source is not None
            moved = again.actor.status.assignment
            assert moved is not None
            after = nodes.for_node(moved.node).request(moved.worker, again.actor.metadata.uid)
            print(
                f"   suspended and resumed from {again.source.name} generation "
                f"{again.generation} ({again.snapshot_age_seconds:.0f} s old): counter "
                f"{count} -> {after}"
            )
            assert after == count + 1, "the counter survived the snapshot"


# --- 3. a property with substrate.testing's strategies ------------------------------------------


def property_demo() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from substrate.testing import strategies as s

    @settings(max_examples=50, database=None, deadline=None)
    @given(workers=st.lists(s.workers(), max_size=8, unique_by=lambda w: w.ref), seed=st.integers())
    def never_over_books(workers: list[Worker], seed: int) -> None:
        index = FleetIndex(workers)
        need = Constraints(sandbox_class=SandboxClass.GVISOR, resources=SMALL)
        try:
            chosen = index.schedule_and_book(need, rng=random.Random(seed))
        except ResourceExhausted:
            assert not any(fits(w, need) for w in workers)
            return
        original = next(w for w in workers if w.ref == chosen.ref)
        assert fits(original, need)
        assert chosen.capacity is not None
        assert chosen.allocated.actors <= chosen.capacity.actors
        assert chosen.allocated.cpu_milli <= chosen.capacity.cpu_milli

    never_over_books()
    print("3. property: 50 random fleets, a placement never over-books a worker")


# --- 4. the simulator ----------------------------------------------------------------------------


def simulator_demo() -> None:
    from substrate.testing.sim import SimConfig, simulate

    report = simulate(SimConfig(seed=3, actors=300, workers=12, nodes=4, duration=20.0))
    assert not report.violations
    print("4. simulator:", report.lines()[0])


def main() -> None:
    # The services log every workflow through structlog; an embedding program decides
    # what to see. Here: warnings and errors only.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    scheduler_demo()
    anyio.run(control_plane_demo)
    property_demo()
    simulator_demo()


if __name__ == "__main__":
    main()
