"""Load order and power of two choices, checked against an independent Fraction oracle."""

from __future__ import annotations

import random

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from substrate.core.model import Capacity, Worker
from substrate.errors import ResourceExhausted
from substrate.sched import (
    NO_ROOM,
    FleetIndex,
    candidates,
    choose,
    compare_load,
    fits,
    less_loaded,
    sample_two,
    schedule,
)

from .sched_support import (
    GIB,
    any_constraints,
    constraints,
    fleets,
    loaded_workers,
    oracle_key,
    worker,
)


@settings(max_examples=150)
@given(loaded_workers("w-a"), loaded_workers("w-b"))
def test_compare_load_matches_fraction_oracle(a: Worker, b: Worker) -> None:
    ka, kb = oracle_key(a), oracle_key(b)
    want = (ka > kb) - (ka < kb)
    assert compare_load(a, b) == want
    assert compare_load(b, a) == -want


@settings(max_examples=150)
@given(loaded_workers("w-a"), loaded_workers("w-b"), st.integers(0, 2**32))
def test_two_candidates_take_the_less_loaded(a: Worker, b: Worker, seed: int) -> None:
    want = min((a, b), key=oracle_key)
    assert choose([a, b], rng=random.Random(seed)) is want
    assert choose([b, a], rng=random.Random(seed)) is want
    assert less_loaded(a, b) is want


@given(loaded_workers("w-a"), st.integers(0, 2**32))
def test_one_candidate_is_taken_without_drawing(a: Worker, seed: int) -> None:
    rng = random.Random(seed)
    before = rng.getstate()
    assert choose([a], rng=rng) is a
    assert rng.getstate() == before


def test_no_candidate_is_resource_exhausted() -> None:
    with pytest.raises(ResourceExhausted) as e:
        choose([], rng=random.Random(0))
    assert e.value.description == NO_ROOM == "no worker has room for the actor"


@settings(max_examples=60)
@given(st.lists(loaded_workers("w"), min_size=2, max_size=10), st.integers(0, 2**32))
def test_seeded_choice_is_reproducible(ws: list[Worker], seed: int) -> None:
    ws = [worker(f"w-{i}", capacity=w.capacity, allocated=w.allocated) for i, w in enumerate(ws)]
    first = choose(ws, rng=random.Random(seed))
    assert all(choose(ws, rng=random.Random(seed)) is first for _ in range(3))


@settings(max_examples=60)
@given(st.lists(loaded_workers("w"), min_size=2, max_size=10), st.integers(0, 2**32))
def test_the_strictly_most_loaded_is_never_chosen(ws: list[Worker], seed: int) -> None:
    ws = [worker(f"w-{i}", capacity=w.capacity, allocated=w.allocated) for i, w in enumerate(ws)]
    worst = max(ws, key=oracle_key)
    rng = random.Random(seed)
    for _ in range(20):
        assert choose(ws, rng=rng) is not worst


def test_sample_two_is_distinct_and_covers_all_pairs() -> None:
    rng = random.Random(7)
    seen = set()
    for _ in range(2000):
        i, j = sample_two(4, rng)
        assert i != j
        assert 0 <= i < 4
        assert 0 <= j < 4
        seen.add((i, j))
    assert len(seen) == 12  # every ordered pair of distinct indices
    with pytest.raises(ValueError, match="at least two"):
        sample_two(1, rng)


def test_p2c_spreads_load_over_candidates() -> None:
    """With three equally loaded workers every one is chosen sometimes (ties go by name)."""
    ws = [worker(f"w-{i}") for i in range(3)]
    rng = random.Random(1)
    chosen = {choose(ws, rng=rng).ref.name for _ in range(200)}
    # "w-2" loses every tie by name, so it is never chosen; the other two are.
    assert chosen == {"w-0", "w-1"}


@settings(max_examples=150)
@given(fleets(), any_constraints(), st.integers(0, 2**32))
def test_schedule_never_picks_an_ineligible_worker(ws: list[Worker], c: object, seed: int) -> None:
    from substrate.sched import Constraints

    assert isinstance(c, Constraints)
    eligible = candidates(ws, c)
    event("eligible workers", str(min(len(eligible), 3)))
    # The last index samples even tiny buckets and gives up sampling quickly.
    for fleet in (ws, FleetIndex(ws), FleetIndex(ws, scan_at_most=0, sample_attempts=3)):
        rng = random.Random(seed)
        if not eligible:
            with pytest.raises(ResourceExhausted):
                schedule(fleet, c, rng=rng)
            continue
        got = schedule(fleet, c, rng=rng)
        assert fits(got, c)
        assert got in eligible
        on_preferred = [w for w in eligible if w.node == c.preferred_node]
        if on_preferred:
            assert got.node == c.preferred_node


def test_preferred_node_wins_even_when_more_loaded() -> None:
    busy_local = worker("w-local", node="node-b", allocated=Capacity(actors=7))
    idle = [worker(f"w-{i}", node="node-a") for i in range(20)]
    c = constraints(preferred_node="node-b")
    for fleet in ([*idle, busy_local], FleetIndex([*idle, busy_local])):
        for seed in range(20):
            assert schedule(fleet, c, rng=random.Random(seed)) is busy_local


def test_preferred_node_without_room_falls_back_to_the_fleet() -> None:
    full_local = worker("w-local", node="node-b", allocated=Capacity(memory_bytes=16 * GIB))
    idle = worker("w-idle", node="node-a")
    c = constraints(preferred_node="node-b")
    for fleet in ([full_local, idle], FleetIndex([full_local, idle])):
        assert schedule(fleet, c, rng=random.Random(0)) is idle
