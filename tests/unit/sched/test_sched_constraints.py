"""The eligibility gates: applies / has_room / fits, and building constraints from records."""

from __future__ import annotations

import pytest

from substrate.core.ids import ActorRef, Labels, NodeRef, TemplateRef
from substrate.core.model import (
    Actor,
    ActorStatus,
    ActorTemplate,
    Capacity,
    Container,
    Durability,
    Fidelity,
    Resources,
    SandboxClass,
    Snapshot,
    SnapshotStorage,
    StorageStatus,
    Worker,
    WorkerState,
)
from substrate.sched import Constraints, applies, constraints_for, fits, has_free_slot, has_room

from .sched_support import GIB, constraints, worker

LABELED = {"zone": "x", "tier": "gold"}

# (id, worker, constraints, applies?, has_room?)
TABLE: list[tuple[str, Worker, Constraints, bool, bool]] = [
    ("nil selectors match everything", worker(labels=LABELED), constraints(), True, True),
    ("nil selectors match an unlabeled worker", worker(), constraints(), True, True),
    (
        "template selector matches",
        worker(labels=LABELED),
        constraints(template_selector={"zone": "x"}),
        True,
        True,
    ),
    (
        "actor selector matches",
        worker(labels=LABELED),
        constraints(actor_selector={"tier": "gold"}),
        True,
        True,
    ),
    (
        "both selectors match (AND)",
        worker(labels=LABELED),
        constraints(template_selector={"zone": "x"}, actor_selector={"tier": "gold"}),
        True,
        True,
    ),
    (
        "template matches, actor does not",
        worker(labels=LABELED),
        constraints(template_selector={"zone": "x"}, actor_selector={"tier": "silver"}),
        False,
        True,
    ),
    (
        "actor matches, template does not",
        worker(labels=LABELED),
        constraints(template_selector={"zone": "y"}, actor_selector={"tier": "gold"}),
        False,
        True,
    ),
    (
        "disjoint keys both required",
        worker(labels={"zone": "x"}),
        constraints(template_selector={"zone": "x"}, actor_selector={"tier": "gold"}),
        False,
        True,
    ),
    (
        "same key, conflicting values never match",
        worker(labels=LABELED),
        constraints(template_selector={"zone": "x"}, actor_selector={"zone": "y"}),
        False,
        True,
    ),
    (
        "selector key missing on worker",
        worker(),
        constraints(template_selector={"zone": "x"}),
        False,
        True,
    ),
    (
        "sandbox class differs",
        worker(sandbox_class=SandboxClass.MICROVM),
        constraints(sandbox_class=SandboxClass.GVISOR),
        False,
        True,
    ),
    (
        "sandbox class equal (microvm)",
        worker(sandbox_class=SandboxClass.MICROVM),
        constraints(sandbox_class=SandboxClass.MICROVM),
        True,
        True,
    ),
    ("draining worker", worker(state=WorkerState.DRAINING), constraints(), False, True),
    ("unavailable worker", worker(state=WorkerState.UNAVAILABLE), constraints(), False, True),
    (
        "runtime missing for a memory restore",
        worker(runtimes={"rt1"}),
        constraints(runtime_version="rt2"),
        False,
        True,
    ),
    (
        "runtime present for a memory restore",
        worker(runtimes={"rt1", "rt2"}),
        constraints(runtime_version="rt2"),
        True,
        True,
    ),
    ("no runtime gate without one", worker(runtimes=()), constraints(), True, True),
    (
        "pinned to another node",
        worker(node="node-a"),
        constraints(required_node="node-b"),
        False,
        True,
    ),
    (
        "pinned to this node",
        worker(node="node-b"),
        constraints(required_node="node-b"),
        True,
        True,
    ),
    (
        "preferred node is not a gate",
        worker(node="node-a"),
        constraints(preferred_node="node-b"),
        True,
        True,
    ),
    ("unreported capacity = no room", worker(capacity=None), constraints(), True, False),
    (
        "zero actor slots = no room",
        worker(capacity=Capacity(cpu_milli=8000, memory_bytes=16 * GIB, actors=0)),
        constraints(cpu_milli=0, memory_bytes=0),
        True,
        False,
    ),
    (
        "all slots allocated = no room",
        worker(allocated=Capacity(actors=8)),
        constraints(cpu_milli=0, memory_bytes=0),
        True,
        False,
    ),
    (
        "cpu exactly fits",
        worker(allocated=Capacity(cpu_milli=7500, actors=1)),
        constraints(cpu_milli=500, memory_bytes=0),
        True,
        True,
    ),
    (
        "cpu one milli short",
        worker(allocated=Capacity(cpu_milli=7501, actors=1)),
        constraints(cpu_milli=500, memory_bytes=0),
        True,
        False,
    ),
    (
        "memory exactly fits",
        worker(allocated=Capacity(memory_bytes=15 * GIB, actors=1)),
        constraints(cpu_milli=0, memory_bytes=GIB),
        True,
        True,
    ),
    (
        "memory one byte short",
        worker(allocated=Capacity(memory_bytes=15 * GIB + 1, actors=1)),
        constraints(cpu_milli=0, memory_bytes=GIB),
        True,
        False,
    ),
    (
        "over-allocated worker (capacity shrank) has no room",
        worker(
            capacity=Capacity(cpu_milli=1000, memory_bytes=GIB, actors=4),
            allocated=Capacity(cpu_milli=2000, actors=1),
        ),
        constraints(cpu_milli=0, memory_bytes=0),
        True,
        False,
    ),
    (
        "zero-resource actor still needs a slot",
        worker(capacity=Capacity(actors=1)),
        constraints(cpu_milli=0, memory_bytes=0),
        True,
        True,
    ),
]


@pytest.mark.parametrize(
    ("w", "c", "want_applies", "want_room"),
    [pytest.param(w, c, a, r, id=name) for name, w, c, a, r in TABLE],
)
def test_eligibility_table(w: Worker, c: Constraints, want_applies: bool, want_room: bool) -> None:
    assert applies(w, c) is want_applies
    assert has_room(w, c.resources) is want_room
    assert fits(w, c) is (want_applies and want_room)


def test_has_free_slot() -> None:
    assert has_free_slot(worker())
    assert not has_free_slot(worker(capacity=None))
    assert not has_free_slot(worker(capacity=Capacity(actors=0)))
    assert not has_free_slot(worker(allocated=Capacity(actors=8)))
    assert has_free_slot(worker(allocated=Capacity(actors=7)))


def test_selector_items_merges_and_keeps_conflicts() -> None:
    assert constraints().selector_items() == ()
    assert constraints(template_selector={"a": "1"}).selector_items() == (("a", "1"),)
    assert constraints(actor_selector={"a": "1"}).selector_items() == (("a", "1"),)
    both = constraints(template_selector={"a": "1", "b": "2"}, actor_selector={"a": "1"})
    assert both.selector_items() == (("a", "1"), ("b", "2"))
    conflict = constraints(template_selector={"a": "1"}, actor_selector={"a": "2"})
    assert conflict.selector_items() == (("a", "1"), ("a", "2"))


def test_unpinned_drops_only_the_pin() -> None:
    c = constraints(required_node="node-a", preferred_node="node-a", runtime_version="rt1")
    u = c.unpinned()
    assert u.required_node is None
    assert u.preferred_node == NodeRef("node-a")
    assert u.runtime_version == "rt1"


def _template() -> ActorTemplate:
    return ActorTemplate(
        ref=TemplateRef("as", "tmpl"),
        containers=[Container(name="main", image="img")],
        resources=Resources(cpu_milli=250, memory_bytes=512),
        worker_selector=Labels({"zone": "x"}),
        sandbox_class=SandboxClass.MICROVM,
    )


def _actor(assigned: str | None = None) -> Actor:
    return Actor(
        ref=ActorRef("as", "a"),
        template=TemplateRef("as", "tmpl"),
        worker_selector=Labels({"tier": "gold"}),
        status=ActorStatus(assigned_node=NodeRef(assigned) if assigned else None),
    )


def test_constraints_for_cold_boot_uses_the_template() -> None:
    c = constraints_for(template=_template(), actor=_actor())
    assert c == Constraints(
        sandbox_class=SandboxClass.MICROVM,
        template_selector=Labels({"zone": "x"}),
        actor_selector=Labels({"tier": "gold"}),
        resources=Resources(cpu_milli=250, memory_bytes=512),
    )


def test_constraints_for_memory_snapshot_gates_runtime_and_prefers_local_node() -> None:
    snap = Snapshot(
        generation=3,
        snapshot_id="s3",
        sandbox_class=SandboxClass.GVISOR,
        runtime_version="rt9",
        storages=[
            SnapshotStorage(
                durability=Durability.LOCAL,
                status=StorageStatus.COMPLETED,
                fidelity=Fidelity.MEMORY,
                node=NodeRef("node-b"),
            )
        ],
    )
    c = constraints_for(template=_template(), actor=_actor("node-b"), snapshot=snap)
    assert c.sandbox_class is SandboxClass.GVISOR  # the writer's class, not the template's
    assert c.runtime_version == "rt9"
    assert c.preferred_node == NodeRef("node-b")
    assert c.required_node == NodeRef("node-b")
    # Restoring the same snapshot at ROOTFS does not need the runtime.
    rootfs = constraints_for(
        template=_template(), actor=_actor(), snapshot=snap, restore_fidelity=Fidelity.ROOTFS
    )
    assert rootfs.runtime_version == ""
    assert rootfs.required_node is None


def test_constraints_for_pending_local_copy_is_not_preferred() -> None:
    snap = Snapshot(
        generation=1,
        snapshot_id="s1",
        runtime_version="rt1",
        storages=[
            SnapshotStorage(
                durability=Durability.LOCAL,
                status=StorageStatus.IN_PROGRESS,
                fidelity=Fidelity.ROOTFS,
                node=NodeRef("node-c"),
            )
        ],
    )
    c = constraints_for(template=_template(), actor=_actor(), snapshot=snap)
    assert c.preferred_node is None
    assert c.runtime_version == ""  # a ROOTFS snapshot has no runtime gate
