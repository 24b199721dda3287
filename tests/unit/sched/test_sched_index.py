"""FleetIndex: versioned upserts, removal, bucket narrowing and the exact fallback."""

from __future__ import annotations

import random

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substrate.core.ids import Labels, WorkerRef
from substrate.core.model import Capacity, Resources, SandboxClass, Worker, WorkerState
from substrate.errors import InvalidArgument, NotFound, ResourceExhausted
from substrate.sched import Constraints, FleetIndex, applies, fits, schedule
from substrate.sched.index import INT64_MAX, SCAN_AT_MOST

from .sched_support import GIB, constraints, loaded_workers, oracle_key, worker


def test_upsert_keeps_the_higher_version() -> None:
    idx = FleetIndex()
    assert idx.upsert(worker("w-1", version=2, labels={"zone": "x"}))
    assert not idx.upsert(worker("w-1", version=1, labels={"zone": "y"}))  # older: ignored
    assert not idx.upsert(worker("w-1", version=2, labels={"zone": "y"}))  # replay: ignored
    got = idx.get(WorkerRef("w-1"))
    assert got is not None
    assert got.labels.get("zone") == "x"
    assert idx.upsert(worker("w-1", version=3, labels={"zone": "y"}))
    got = idx.get(WorkerRef("w-1"))
    assert got is not None
    assert got.labels.get("zone") == "y"
    assert len(idx) == 1
    idx.check_invariants()
    # The buckets followed the newer record.
    rng = random.Random(0)
    with pytest.raises(ResourceExhausted):
        idx.schedule(constraints(template_selector={"zone": "x"}), rng=rng)
    assert idx.schedule(constraints(template_selector={"zone": "y"}), rng=rng).ref.name == "w-1"


def test_upsert_moves_a_worker_between_buckets() -> None:
    idx = FleetIndex([worker("w-1", node="node-a", version=1)])
    idx.upsert(
        worker("w-1", node="node-b", sandbox_class=SandboxClass.MICROVM, version=2),
    )
    idx.check_invariants()
    rng = random.Random(0)
    with pytest.raises(ResourceExhausted):
        idx.schedule(constraints(), rng=rng)  # no GVISOR worker any more
    c = constraints(sandbox_class=SandboxClass.MICROVM, required_node="node-b")
    assert idx.schedule(c, rng=rng).ref.name == "w-1"
    idx.upsert(worker("w-1", state=WorkerState.DRAINING, version=3))
    idx.check_invariants()
    assert idx.pool_size(constraints()) == 0
    with pytest.raises(ResourceExhausted):
        idx.schedule(constraints(), rng=rng)


def test_remove() -> None:
    idx = FleetIndex([worker("w-1"), worker("w-2")])
    removed = idx.remove(WorkerRef("w-1"))
    assert removed is not None
    assert removed.ref.name == "w-1"
    assert idx.remove(WorkerRef("w-1")) is None
    assert WorkerRef("w-1") not in idx
    assert WorkerRef("w-2") in idx
    assert [w.ref.name for w in idx] == ["w-2"]
    idx.check_invariants()
    for seed in range(10):
        assert idx.schedule(constraints(), rng=random.Random(seed)).ref.name == "w-2"
    with pytest.raises(NotFound):
        idx.book(WorkerRef("w-1"), Resources())
    with pytest.raises(NotFound):
        idx.release(WorkerRef("w-1"), Resources())
    # A removed worker may come back with any version.
    assert idx.upsert(worker("w-1", version=0))


def test_book_and_release_move_workers_out_of_and_into_buckets() -> None:
    idx = FleetIndex([worker("w-1", capacity=Capacity(cpu_milli=1000, memory_bytes=GIB, actors=1))])
    c = constraints(cpu_milli=100, memory_bytes=0)
    booked = idx.schedule_and_book(c, rng=random.Random(0))
    assert booked.allocated == Capacity(cpu_milli=100, actors=1)
    assert idx.get(WorkerRef("w-1")) == booked
    assert idx.pool_size(c) == 0  # its only slot is taken
    idx.check_invariants()
    with pytest.raises(ResourceExhausted):
        idx.schedule(c, rng=random.Random(0))
    with pytest.raises(ResourceExhausted):
        idx.book(WorkerRef("w-1"), Resources())
    released = idx.release(WorkerRef("w-1"), c.resources)
    assert released.allocated == Capacity()
    assert idx.pool_size(c) == 1
    idx.check_invariants()


def _big_fleet() -> list[Worker]:
    ws = []
    for i in range(2000):
        labels = {"zone": "x" if i % 2 else "y"}
        if i % 500 == 7:
            labels["gpu"] = "true"
        ws.append(worker(f"w-{i:04d}", node=f"node-{i % 50}", labels=labels))
    return ws


def test_selectors_narrow_the_pool() -> None:
    idx = FleetIndex(_big_fleet())
    assert idx.pool_size(constraints()) == 2000
    assert idx.pool_size(constraints(template_selector={"zone": "x"})) == 1000
    gpu = constraints(template_selector={"zone": "x"}, actor_selector={"gpu": "true"})
    assert idx.pool_size(gpu) == 4
    assert idx.pool_size(constraints(required_node="node-3")) == 40
    assert idx.pool_size(constraints(template_selector={"gpu": "false"})) == 0
    conflict = constraints(template_selector={"zone": "x"}, actor_selector={"zone": "y"})
    assert idx.pool_size(conflict) == 0
    assert idx.pool_size(constraints(sandbox_class=SandboxClass.MICROVM)) == 0
    gpu_workers = {f"w-{i:04d}" for i in range(2000) if i % 500 == 7}
    for seed in range(50):
        got = idx.schedule(gpu, rng=random.Random(seed))
        assert got.ref.name in gpu_workers
        assert got.labels.get("zone") == "x"


def test_conflicting_selectors_never_match() -> None:
    idx = FleetIndex(_big_fleet())
    with pytest.raises(ResourceExhausted):
        idx.schedule(
            constraints(template_selector={"zone": "x"}, actor_selector={"zone": "y"}),
            rng=random.Random(0),
        )


def test_exact_fallback_finds_the_single_worker_with_room() -> None:
    """Sampling would almost never hit it; the exact fallback must."""
    full = Capacity(cpu_milli=8000, memory_bytes=16 * GIB, actors=4)
    ws = [worker(f"w-{i}", allocated=full) for i in range(3000)]  # slots free, memory gone
    ws[1234] = worker("w-1234")
    idx = FleetIndex(ws)
    assert idx.pool_size(constraints()) == 3000
    for seed in range(5):
        assert idx.schedule(constraints(), rng=random.Random(seed)).ref.name == "w-1234"


def test_fallback_with_a_few_candidates_still_uses_p2c() -> None:
    full = Capacity(cpu_milli=8000, memory_bytes=16 * GIB, actors=4)
    ws = [worker(f"w-{i}", allocated=full) for i in range(1000)]
    ws[10] = worker("w-10", allocated=Capacity(actors=3))
    ws[20] = worker("w-20", allocated=Capacity(actors=1))
    idx = FleetIndex(ws)
    for seed in range(10):
        assert idx.schedule(constraints(), rng=random.Random(seed)).ref.name == "w-20"


def test_small_buckets_are_scanned_exactly() -> None:
    ws = [worker(f"w-{i}", allocated=Capacity(actors=i)) for i in range(SCAN_AT_MOST)]
    idx = FleetIndex(ws)
    chosen = {idx.schedule(constraints(), rng=random.Random(s)).ref.name for s in range(100)}
    assert f"w-{SCAN_AT_MOST - 1}" not in chosen  # the most loaded never wins p2c
    assert "w-0" in chosen


def test_pinned_and_preferred_nodes() -> None:
    ws = [worker(f"w-{i}", node=f"node-{i % 4}") for i in range(40)]
    idx = FleetIndex(ws)
    for seed in range(20):
        rng = random.Random(seed)
        assert idx.schedule(constraints(required_node="node-2"), rng=rng).node.name == "node-2"
        assert idx.schedule(constraints(preferred_node="node-1"), rng=rng).node.name == "node-1"
        # A preferred node other than the pin cannot win: the pin is a gate.
        c = constraints(required_node="node-3", preferred_node="node-1")
        assert idx.schedule(c, rng=rng).node.name == "node-3"
    with pytest.raises(ResourceExhausted):
        idx.schedule(constraints(required_node="node-9"), rng=random.Random(0))


def test_seeded_decisions_are_reproducible() -> None:
    def run(seed: int) -> list[str]:
        idx = FleetIndex(_big_fleet())
        rng = random.Random(seed)
        out = []
        for i in range(200):
            c = constraints(template_selector={"zone": "x"} if i % 3 else {}, memory_bytes=GIB)
            out.append(idx.schedule_and_book(c, rng=rng).ref.name)
        return out

    assert run(42) == run(42)
    assert run(42) != run(43)


def test_index_and_list_agree_on_eligibility() -> None:
    rng = random.Random(5)
    ws = [
        worker(
            f"w-{i}",
            node=f"node-{rng.randrange(5)}",
            sandbox_class=rng.choice(list(SandboxClass)),
            state=rng.choice(list(WorkerState)),
            labels={"zone": rng.choice("xyz")},
            allocated=Capacity(
                cpu_milli=rng.randrange(0, 8001),
                memory_bytes=rng.randrange(0, 17) * GIB,
                actors=rng.randrange(0, 9),
            ),
            runtimes=rng.sample(["rt1", "rt2", "rt3"], rng.randrange(0, 3)),
        )
        for i in range(300)
    ]
    idx = FleetIndex(ws)
    for _ in range(300):
        c = constraints(
            sandbox_class=rng.choice(list(SandboxClass)),
            template_selector=rng.choice([{}, {"zone": "x"}, {"zone": "z"}]),
            required_node=rng.choice([None, None, "node-1"]),
            preferred_node=rng.choice([None, "node-2"]),
            runtime_version=rng.choice(["", "rt2"]),
            cpu_milli=rng.randrange(0, 4000),
            memory_bytes=rng.randrange(0, 8) * GIB,
        )
        seed = rng.randrange(1 << 30)
        eligible = [w for w in ws if fits(w, c)]
        if not eligible:
            with pytest.raises(ResourceExhausted):
                idx.schedule(c, rng=random.Random(seed))
            continue
        got = idx.schedule(c, rng=random.Random(seed))
        assert got in eligible
        assert schedule(ws, c, rng=random.Random(seed)) in eligible


def _with_free_slot(w: Worker) -> Worker:
    assert w.capacity is not None
    actors = min(w.allocated.actors, w.capacity.actors - 1)
    return attrs.evolve(
        w,
        allocated=attrs.evolve(w.allocated, actors=actors),
        runtime_versions=frozenset({"rt1"}),
    )


@settings(max_examples=100)
@given(loaded_workers("w-a"), loaded_workers("w-b"), st.integers(0, 2**32))
def test_sampled_pair_is_compared_like_less_loaded(a: Worker, b: Worker, seed: int) -> None:
    """Two candidates hidden among ineligible bucket members: the fast path (packed loads)
    and the fallback (records) must both take the less loaded by the documented order."""
    a, b = _with_free_slot(a), _with_free_slot(b)
    fillers = [worker(f"f-{i}") for i in range(2 * SCAN_AT_MOST)]  # cannot restore rt1
    idx = FleetIndex([*fillers, a, b])
    c = constraints(runtime_version="rt1", cpu_milli=0, memory_bytes=0)
    want = min((a, b), key=oracle_key)
    assert idx.schedule(c, rng=random.Random(seed)) == want


def test_values_beyond_int64_are_refused() -> None:
    idx = FleetIndex()
    huge = Capacity(cpu_milli=1, memory_bytes=INT64_MAX + 1, actors=1)
    with pytest.raises(InvalidArgument, match="exceeds"):
        idx.upsert(worker("w-1", capacity=huge))
    assert len(idx) == 0
    idx.upsert(worker("w-1", version=1))
    with pytest.raises(InvalidArgument):
        idx.upsert(worker("w-1", capacity=huge, version=2))
    got = idx.get(WorkerRef("w-1"))
    assert got is not None
    assert got.metadata.version == 1
    idx.check_invariants()


def test_slots_are_reused_after_removal() -> None:
    idx = FleetIndex([worker(f"w-{i}") for i in range(20)])
    for i in range(0, 20, 2):
        idx.remove(WorkerRef(f"w-{i}"))
    idx.check_invariants()
    for i in range(20, 30):
        idx.upsert(worker(f"w-{i}", node="node-b"))
    idx.check_invariants()
    assert len(idx) == 20
    assert idx.pool_size(constraints(required_node="node-b")) == 10
    for seed in range(20):
        got = idx.schedule(constraints(required_node="node-b"), rng=random.Random(seed))
        assert int(got.ref.name.split("-")[1]) >= 20


class CountingRandom(random.Random):
    """A seeded Random that counts the draws a decision makes."""

    draws = 0

    def randrange(self, *args: int) -> int:  # type: ignore[override]
        self.draws += 1
        return super().randrange(*args)


def test_exact_fits_are_taken_by_the_fast_path() -> None:
    """When every bucket member qualifies (even exactly), a decision makes ~2 draws."""
    cap = Capacity(cpu_milli=1000, memory_bytes=4 * GIB, actors=4)
    used = Capacity(cpu_milli=500, memory_bytes=3 * GIB, actors=3)
    idx = FleetIndex([worker(f"w-{i}", capacity=cap, allocated=used) for i in range(200)])
    c = constraints(cpu_milli=500, memory_bytes=GIB)
    for seed in range(30):
        rng = CountingRandom(seed)
        got = idx.schedule(c, rng=rng)
        assert fits(got, c)
        assert rng.draws <= 4  # two distinct draws, rarely a repeat; no fallback scan


def test_repeated_label_keys_are_read_like_labels_matches() -> None:
    """Unvalidated Labels may repeat a key; the index must agree with Labels.matches."""
    w = attrs.evolve(worker("w-1"), labels=Labels((("zone", "x"), ("zone", "y"))))
    idx = FleetIndex([w])
    idx.check_invariants()
    for sel in (
        Labels({"zone": "x"}),
        Labels({"zone": "y"}),
        Labels((("zone", "y"), ("zone", "y"))),
        Labels((("zone", "x"), ("zone", "y"))),
    ):
        c = Constraints(sandbox_class=SandboxClass.GVISOR, template_selector=sel)
        if applies(w, c):
            assert idx.schedule(c, rng=random.Random(0)) == w
            assert schedule([w], c, rng=random.Random(0)) == w
        else:
            with pytest.raises(ResourceExhausted):
                idx.schedule(c, rng=random.Random(0))
    assert applies(
        w, Constraints(sandbox_class=SandboxClass.GVISOR, template_selector=Labels({"zone": "y"}))
    )
