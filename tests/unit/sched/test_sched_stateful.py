"""A state machine driving a FleetIndex through upserts, decisions, bookings and releases.

The model is the list of bookings the test made; after every step each worker's allocation
must equal the sum of its bookings, stay within its capacity, and the index's buckets must
agree with its records. Every ResourceExhausted is confirmed by a brute-force scan.
"""

from __future__ import annotations

import random

import attrs
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from substrate.core.ids import WorkerRef
from substrate.core.model import Capacity, Resources, Worker
from substrate.errors import ResourceExhausted
from substrate.sched import Constraints, FleetIndex, fits
from substrate.sched.index import SAMPLE_ATTEMPTS, SCAN_AT_MOST

from .sched_support import any_constraints, capacities, workers

NAMES = tuple(f"w-{i}" for i in range(8))


def _total(bookings: list[Resources]) -> Capacity:
    return Capacity(
        cpu_milli=sum(r.cpu_milli for r in bookings),
        memory_bytes=sum(r.memory_bytes for r in bookings),
        actors=len(bookings),
    )


class FleetMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index = FleetIndex()
        self.records: dict[str, Worker] = {}
        """The last accepted upsert of each worker (its allocation is not tracked here)."""
        self.bookings: list[tuple[str, Resources]] = []
        self.decisions = 0

    @initialize(
        fleet=st.lists(workers(), min_size=len(NAMES), max_size=len(NAMES)),
        scan_at_most=st.sampled_from((0, 2, SCAN_AT_MOST)),
        sample_attempts=st.sampled_from((SAMPLE_ATTEMPTS, 0, 3)),
    )
    def seed_fleet(self, fleet: list[Worker], scan_at_most: int, sample_attempts: int) -> None:
        # Small knobs force the sampling fast path (and its fallback) on this small fleet.
        self.index = FleetIndex(scan_at_most=scan_at_most, sample_attempts=sample_attempts)
        for name, template in zip(NAMES, fleet, strict=True):
            w = attrs.evolve(template, ref=WorkerRef(name), allocated=Capacity())
            assert self.index.upsert(w)
            self.records[name] = w

    def booked_on(self, name: str) -> Capacity:
        return _total([r for n, r in self.bookings if n == name])

    @rule(
        name=st.sampled_from(NAMES),
        template=workers(),
        capacity=capacities,
        bump=st.integers(1, 3),
    )
    def upsert_newer(
        self, name: str, template: Worker, capacity: Capacity | None, bump: int
    ) -> None:
        """A newer record from the store: anything may change, the allocation is the truth."""
        alloc = self.booked_on(name)
        if alloc.actors:
            # The store never reports a capacity below what is booked on the worker.
            base = capacity or Capacity()
            capacity = Capacity(
                cpu_milli=max(base.cpu_milli, alloc.cpu_milli),
                memory_bytes=max(base.memory_bytes, alloc.memory_bytes),
                actors=max(base.actors, alloc.actors),
            )
        old = self.records.get(name)
        version = (old.metadata.version if old else 0) + bump
        new = attrs.evolve(
            template,
            ref=WorkerRef(name),
            metadata=attrs.evolve(template.metadata, version=version),
            capacity=capacity,
            allocated=alloc,
        )
        assert self.index.upsert(new)
        self.records[name] = new

    @rule(data=st.data(), template=workers(), back=st.integers(0, 3))
    def upsert_stale(self, data: st.DataObject, template: Worker, back: int) -> None:
        """An older (or replayed) record must be ignored."""
        if not self.records:
            return
        name = data.draw(st.sampled_from(sorted(self.records)))
        current = self.records[name].metadata.version
        stale = attrs.evolve(
            template,
            ref=WorkerRef(name),
            metadata=attrs.evolve(template.metadata, version=max(0, current - back)),
        )
        before = self.index.get(WorkerRef(name))
        assert not self.index.upsert(stale)
        assert self.index.get(WorkerRef(name)) == before

    @rule(c=any_constraints(), seed=st.integers(0, 2**32))
    def schedule_and_book(self, c: Constraints, seed: int) -> None:
        self.decisions += 1
        refusal = ""
        try:
            chosen = self.index.schedule(c, rng=random.Random(seed))
        except ResourceExhausted as e:
            refusal = e.description
        event("exhausted" if refusal else "placed")
        if refusal:
            assert refusal == "no worker has room for the actor"
            assert not [w for w in self.index if fits(w, c)], "a worker had room"
            return
        assert chosen == self.index.get(chosen.ref)
        assert fits(chosen, c), "placed on an ineligible worker"
        if c.preferred_node is not None and c.required_node in (None, c.preferred_node):
            local = [w for w in self.index if fits(w, c) and w.node == c.preferred_node]
            if local:
                assert chosen.node == c.preferred_node
        booked = self.index.book(chosen.ref, c.resources)
        assert booked.allocated == chosen.allocated.plus(c.resources)
        self.bookings.append((chosen.ref.name, c.resources))

    # No preconditions: hypothesis gives up on a step after a few draws of disabled rules.
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        if not self.bookings:
            return
        i = data.draw(st.integers(0, len(self.bookings) - 1))
        name, resources = self.bookings.pop(i)
        self.index.release(WorkerRef(name), resources)
        event("released")

    @rule(name=st.sampled_from(NAMES))
    def remove(self, name: str) -> None:
        removed = self.index.remove(WorkerRef(name))
        assert (removed is None) == (name not in self.records)
        self.records.pop(name, None)
        self.bookings = [(n, r) for n, r in self.bookings if n != name]

    @invariant()
    def buckets_agree_with_records(self) -> None:
        self.index.check_invariants()

    @invariant()
    def allocations_are_the_bookings_and_within_capacity(self) -> None:
        assert {w.ref.name for w in self.index} == set(self.records)
        for w in self.index:
            expected = self.booked_on(w.ref.name)
            assert w.allocated == expected
            if w.capacity is None:
                assert w.allocated == Capacity()
            else:
                assert w.capacity.covers(w.allocated), f"{w.ref.name} is over-booked"
            assert w == attrs.evolve(self.records[w.ref.name], allocated=expected)


FleetMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
TestFleetIndexStateMachine = FleetMachine.TestCase
