"""Seed 000 §4: which generation to restore, from which copy, at which fidelity."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from substrate.core.ids import NodeRef
from substrate.core.model import (
    Actor,
    ActorState,
    ActorStatus,
    ActorTemplate,
    Durability,
    Fidelity,
    SandboxClass,
    Snapshot,
    SnapshotOwner,
    StorageStatus,
    Worker,
)
from substrate.snapshot import (
    COLD_BOOT_PROVENANCE,
    ColdBoot,
    Restore,
    RestorePlan,
    RestoreSource,
    has_usable_copy,
    newest_usable,
    pin_node,
    preferred_node,
    select_restore,
)

from .snapshot_support import (
    DEAD,
    HERE,
    LIVE,
    OTHER,
    actor,
    actors_st,
    durable,
    live_nodes_st,
    local,
    snap,
    template,
    workers_st,
)
from .snapshot_support import worker as make_worker

C = StorageStatus.COMPLETED
P = StorageStatus.PENDING
IP = StorageStatus.IN_PROGRESS
MEM, ROOTFS, VOLS = Fidelity.MEMORY, Fidelity.ROOTFS, Fidelity.VOLUMES
L, D, T = RestoreSource.LOCAL, RestoreSource.DURABLE, RestoreSource.TAG


def describe(plan: RestorePlan) -> tuple[object, ...]:
    """A plan as (kind, generation, source, fidelity, drop_node) for table comparison."""
    match plan:
        case ColdBoot():
            return ("cold", None, None, None, plan.drop_node)
        case Restore():
            return ("restore", plan.generation, plan.source, plan.fidelity, plan.drop_node)


def cold(drop: NodeRef | None = None) -> tuple[object, ...]:
    return ("cold", None, None, None, drop)


def restore(
    gen: int, source: RestoreSource, fidelity: Fidelity, drop: NodeRef | None = None
) -> tuple[object, ...]:
    return ("restore", gen, source, fidelity, drop)


# (id, actor, worker, expected); template uid TEMPLATE_UID, live nodes {HERE, OTHER}.
TRUTH_TABLE: list[tuple[str, Actor, Worker, tuple[object, ...]]] = [
    ("no snapshot: cold boot", actor(), make_worker(), cold()),
    (
        "newest local copy on this node: restored in place",
        actor(snap(1, local(HERE), durable())),
        make_worker(),
        restore(1, L, MEM),
    ),
    (
        "local-only copy on this node (paused): restored in place",
        actor(snap(1, local(HERE)), state=ActorState.PAUSED, assigned_node=HERE),
        make_worker(),
        restore(1, L, MEM),
    ),
    (
        "local on another live node + durable: durable, binding dropped",
        actor(snap(1, local(OTHER), durable())),
        make_worker(),
        restore(1, D, MEM, OTHER),
    ),
    (
        "local on a dead node + durable: durable, binding dropped",
        actor(snap(1, local(DEAD), durable())),
        make_worker(),
        restore(1, D, MEM, DEAD),
    ),
    (
        "local on this node while it is not live: durable",
        actor(snap(1, local(HERE), durable())),
        make_worker(DEAD),
        restore(1, D, MEM, HERE),
    ),
    (
        "local on this node not COMPLETED: durable",
        actor(snap(1, local(HERE, IP), durable())),
        make_worker(),
        restore(1, D, MEM),
    ),
    (
        "durable only, COMPLETED: durable",
        actor(snap(1, durable())),
        make_worker(),
        restore(1, D, MEM),
    ),
    (
        "durable PENDING only: cold boot",
        actor(snap(1, durable(P))),
        make_worker(),
        cold(),
    ),
    (
        "durable IN_PROGRESS only: cold boot",
        actor(snap(1, durable(IP))),
        make_worker(),
        cold(),
    ),
    (
        "durable PENDING newest: falls back to the older generation",
        actor(snap(1, durable()), snap(2, durable(P))),
        make_worker(),
        restore(1, D, MEM),
    ),
    (
        "durable IN_PROGRESS newest with local IN_PROGRESS: older generation",
        actor(snap(1, durable()), snap(2, local(HERE, IP), durable(IP))),
        make_worker(),
        restore(1, D, MEM),
    ),
    (
        "local-only on another live node: not usable here, older generation",
        actor(snap(1, durable()), snap(2, local(OTHER), durable(P))),
        make_worker(),
        restore(1, D, MEM),
    ),
    (
        "local-only on another live node, nothing older: cold boot",
        actor(snap(1, local(OTHER))),
        make_worker(),
        cold(),
    ),
    (
        "local-only on a dead node: cold boot",
        actor(snap(1, local(DEAD))),
        make_worker(),
        cold(),
    ),
    (
        "newest unusable, older local on this node usable: older in place",
        actor(snap(3, local(HERE), durable()), snap(4, local(DEAD), durable(P))),
        make_worker(),
        restore(3, L, MEM),
    ),
    (
        "several usable generations: the newest wins",
        actor(snap(1, durable()), snap(2, durable()), snap(5, durable(fidelity=ROOTFS))),
        make_worker(),
        restore(5, D, ROOTFS),
    ),
    (
        "newest local on this node beats an older durable",
        actor(snap(1, durable()), snap(2, local(HERE))),
        make_worker(),
        restore(2, L, MEM),
    ),
    (
        "captured under another template: VOLUMES",
        actor(snap(1, durable(), template_uid="tmpl-uid-old")),
        make_worker(),
        restore(1, D, VOLS),
    ),
    (
        "another template, from the local copy: VOLUMES",
        actor(snap(1, local(HERE), template_uid="tmpl-uid-old")),
        make_worker(),
        restore(1, L, VOLS),
    ),
    (
        "another template beats a missing runtime: VOLUMES",
        actor(snap(1, durable(), template_uid="tmpl-uid-old", runtime_version="gone")),
        make_worker(),
        restore(1, D, VOLS),
    ),
    (
        "snapshot without template uid: own fidelity",
        actor(snap(1, durable(), template_uid="")),
        make_worker(),
        restore(1, D, MEM),
    ),
    (
        "memory runtime not on the worker: ROOTFS",
        actor(snap(1, durable(), runtime_version="runsc-2024")),
        make_worker(),
        restore(1, D, ROOTFS),
    ),
    (
        "memory runtime not on the worker, local copy: ROOTFS",
        actor(snap(1, local(HERE), runtime_version="runsc-2024")),
        make_worker(runtimes=()),
        restore(1, L, ROOTFS),
    ),
    (
        "ROOTFS copy with a missing runtime: ROOTFS",
        actor(snap(1, durable(fidelity=ROOTFS), runtime_version="runsc-2024")),
        make_worker(),
        restore(1, D, ROOTFS),
    ),
    (
        "VOLUMES copy with a missing runtime: VOLUMES",
        actor(snap(1, durable(fidelity=VOLS), runtime_version="runsc-2024")),
        make_worker(),
        restore(1, D, VOLS),
    ),
    (
        "memory snapshot without runtime version: MEMORY",
        actor(snap(1, durable(), runtime_version="")),
        make_worker(runtimes=()),
        restore(1, D, MEM),
    ),
    (
        "otherwise the copy's own fidelity (ROOTFS)",
        actor(snap(1, durable(fidelity=ROOTFS))),
        make_worker(),
        restore(1, D, ROOTFS),
    ),
    (
        "the fidelity of the chosen copy, not of the other copy",
        actor(snap(1, local(HERE, fidelity=ROOTFS), durable(fidelity=MEM))),
        make_worker(),
        restore(1, L, ROOTFS),
    ),
    (
        "written by another sandbox class: VOLUMES",
        actor(snap(1, durable(), sandbox_class=SandboxClass.MICROVM)),
        make_worker(),
        restore(1, D, VOLS),
    ),
    (
        "tag-borrowed first generation: TAG provenance",
        actor(snap(1, durable(), owner=SnapshotOwner.TAG)),
        make_worker(),
        restore(1, T, MEM),
    ),
    (
        "tag-borrowed under another template: TAG at VOLUMES",
        actor(snap(1, durable(), owner=SnapshotOwner.TAG, template_uid="tmpl-uid-old")),
        make_worker(),
        restore(1, T, VOLS),
    ),
    (
        "tag-borrowed with durable PENDING: cold boot",
        actor(snap(1, durable(P), owner=SnapshotOwner.TAG)),
        make_worker(),
        cold(),
    ),
    (
        "own generation after a borrowed one: DURABLE",
        actor(snap(1, durable(), owner=SnapshotOwner.TAG), snap(2, durable())),
        make_worker(),
        restore(2, D, MEM),
    ),
    (
        "assigned to another node, cold boot here: binding dropped",
        actor(assigned_node=OTHER),
        make_worker(),
        cold(OTHER),
    ),
    (
        "assigned to this node, durable only: nothing dropped",
        actor(snap(1, durable()), assigned_node=HERE),
        make_worker(),
        restore(1, D, MEM),
    ),
    (
        "assigned to another node, durable only: binding dropped",
        actor(snap(1, durable()), assigned_node=OTHER),
        make_worker(),
        restore(1, D, MEM, OTHER),
    ),
]


@pytest.mark.parametrize(
    ("the_actor", "the_worker", "expected"),
    [pytest.param(a, w, e, id=i) for i, a, w, e in TRUTH_TABLE],
)
def test_truth_table(the_actor: Actor, the_worker: Worker, expected: tuple[object, ...]) -> None:
    plan = select_restore(the_actor, template(), the_worker, live_nodes=LIVE)
    assert describe(plan) == expected
    if isinstance(plan, Restore):
        assert plan.snapshot in the_actor.status.snapshots
        assert plan.storage in plan.snapshot.storages
        expected_durability = Durability.LOCAL if plan.source is L else Durability.DURABLE
        assert plan.storage.durability is expected_durability


def test_template_without_uid_keeps_own_fidelity() -> None:
    a = actor(snap(1, durable(), template_uid="tmpl-uid-old"))
    plan = select_restore(a, template(uid=""), make_worker(), live_nodes=LIVE)
    assert describe(plan) == restore(1, D, MEM)


def test_local_restore_names_the_local_copy() -> None:
    s = snap(7, local(HERE), durable())
    plan = select_restore(actor(s), template(), make_worker(), live_nodes=LIVE)
    assert isinstance(plan, Restore)
    assert plan.storage == s.local()
    assert plan.snapshot == s


def test_durable_restore_names_the_durable_copy() -> None:
    s = snap(7, local(OTHER), durable())
    plan = select_restore(actor(s), template(), make_worker(), live_nodes=LIVE)
    assert isinstance(plan, Restore)
    assert plan.storage == s.durable()
    assert plan.storage.uri.endswith("/snapshots/snap-7/")


def test_provenance_labels() -> None:
    w = make_worker()
    assert select_restore(actor(), template(), w, live_nodes=LIVE).provenance == "cold-boot"
    assert COLD_BOOT_PROVENANCE == "cold-boot"
    local_plan = select_restore(actor(snap(1, local(HERE))), template(), w, live_nodes=LIVE)
    assert local_plan.provenance == "local"
    durable_plan = select_restore(actor(snap(1, durable())), template(), w, live_nodes=LIVE)
    assert durable_plan.provenance == "durable"
    tag = actor(snap(1, durable(), owner=SnapshotOwner.TAG))
    assert select_restore(tag, template(), w, live_nodes=LIVE).provenance == "tag"


def test_selection_ignores_snapshot_order() -> None:
    newest = snap(9, durable())
    older = snap(2, local(HERE))
    a = actor(newest, older)
    reversed_actor = Actor(
        ref=a.ref,
        metadata=a.metadata,
        template=a.template,
        status=ActorStatus(snapshots=(newest, older)),
    )
    for candidate in (a, reversed_actor):
        plan = select_restore(candidate, template(), make_worker(), live_nodes=LIVE)
        assert describe(plan) == restore(9, D, MEM)


# --- scheduler helpers ------------------------------------------------------------------


def test_preferred_node_is_the_newest_usable_local_copy() -> None:
    a = actor(snap(1, local(HERE), durable()), snap(2, local(OTHER), durable()))
    assert preferred_node(a, LIVE) == OTHER


def test_preferred_node_skips_dead_nodes() -> None:
    a = actor(snap(1, local(DEAD), durable()))
    assert preferred_node(a, LIVE) is None


def test_preferred_node_none_when_newest_usable_is_durable_only() -> None:
    # An older local copy would not be restored, so it is no reason to prefer its node.
    a = actor(snap(1, local(HERE), durable()), snap(2, durable()))
    assert preferred_node(a, LIVE) is None


def test_preferred_node_skips_unusable_newer_generations() -> None:
    a = actor(snap(1, local(OTHER)), snap(2, local(HERE, IP), durable(P)))
    assert preferred_node(a, LIVE) == OTHER


def test_preferred_node_without_snapshots() -> None:
    assert preferred_node(actor(), LIVE) is None


def test_pin_node_is_the_assigned_node() -> None:
    a = actor(snap(1, local(OTHER)), state=ActorState.PAUSED, assigned_node=OTHER)
    assert pin_node(a) == OTHER


def test_pin_node_for_a_local_only_newest_snapshot() -> None:
    paused = actor(snap(1, durable()), snap(2, local(OTHER)), state=ActorState.PAUSED)
    assert pin_node(paused) == OTHER
    # An async suspend whose upload has not finished is node-only as well.
    uploading = actor(snap(1, durable()), snap(2, local(DEAD), durable(P)))
    assert pin_node(uploading) == DEAD


def test_pin_node_skips_generations_with_nothing_completed() -> None:
    a = actor(snap(1, local(OTHER)), snap(2, local(HERE, IP), durable(IP)))
    assert pin_node(a) == OTHER


def test_no_pin_once_durable() -> None:
    assert pin_node(actor(snap(1, local(OTHER), durable()))) is None
    assert pin_node(actor(snap(1, local(OTHER)), snap(2, durable()))) is None
    assert pin_node(actor()) is None


def test_has_usable_copy_and_newest_usable() -> None:
    assert has_usable_copy(snap(1, local(HERE)), LIVE)
    assert not has_usable_copy(snap(1, local(DEAD)), LIVE)
    assert not has_usable_copy(snap(1, local(None)), LIVE)
    assert has_usable_copy(snap(1, durable()), frozenset())
    assert not has_usable_copy(snap(1, durable(P), local(HERE, IP)), LIVE)
    a = actor(snap(1, durable()), snap(2, local(DEAD)), snap(3, durable(IP)))
    newest = newest_usable(a, LIVE)
    assert newest is not None
    assert newest.generation == 1
    assert newest_usable(actor(), LIVE) is None


# --- properties -------------------------------------------------------------------------


def usable_for(s: Snapshot, w: Worker, live: frozenset[NodeRef]) -> bool:
    """The oracle: seed 000 §4's usability of a generation for one worker."""
    loc, dur = s.local(), s.durable()
    here = (
        loc is not None
        and loc.status is StorageStatus.COMPLETED
        and loc.node == w.node
        and loc.node in live
    )
    return here or (dur is not None and dur.status is StorageStatus.COMPLETED)


def expected_fidelity(s: Snapshot, own: Fidelity, t: ActorTemplate, w: Worker) -> Fidelity:
    if s.template_uid and t.metadata.uid and s.template_uid != t.metadata.uid:
        return VOLS
    if s.sandbox_class is not w.sandbox_class:
        return VOLS
    if own is MEM and s.runtime_version and s.runtime_version not in w.runtime_versions:
        return ROOTFS
    return own


templates_st = st.sampled_from((template(), template(uid=""), template(uid="tmpl-uid-2")))


@given(a=actors_st, w=workers_st, live=live_nodes_st, t=templates_st)
def test_property_selection_matches_the_oracle(
    a: Actor, w: Worker, live: frozenset[NodeRef], t: ActorTemplate
) -> None:
    plan = select_restore(a, t, w, live_nodes=live)
    # A binding is only ever dropped for a node other than the one the actor now runs on.
    assert plan.drop_node != w.node
    usable = [s.generation for s in a.status.snapshots if usable_for(s, w, live)]
    if not usable:
        assert isinstance(plan, ColdBoot)
        return
    assert isinstance(plan, Restore)
    # The chosen generation is the newest one usable on this worker.
    assert plan.generation == max(usable)
    storage = plan.storage
    # Never a copy that is not COMPLETED.
    assert storage.status is StorageStatus.COMPLETED
    assert storage in plan.snapshot.storages
    if storage.durability is Durability.LOCAL:
        # Never a local copy on another (or a dead) node.
        assert storage.node == w.node
        assert storage.node in live
        assert plan.source is RestoreSource.LOCAL
        assert plan.drop_node in {None, a.status.assigned_node}
    else:
        assert plan.source is not RestoreSource.LOCAL
        assert (plan.source is RestoreSource.TAG) == (plan.snapshot.owner is SnapshotOwner.TAG)
        loc = plan.snapshot.local()
        if loc is not None and loc.node is not None and loc.node != w.node:
            assert plan.drop_node == loc.node
    # The fidelity never exceeds the copy's, and follows the decision tree.
    assert plan.fidelity <= storage.fidelity
    assert plan.fidelity == expected_fidelity(plan.snapshot, storage.fidelity, t, w)


@given(a=actors_st, live=live_nodes_st)
def test_property_scheduler_helpers(a: Actor, live: frozenset[NodeRef]) -> None:
    node = preferred_node(a, live)
    if node is not None:
        # Scheduling on the preferred node restores the newest usable generation in place.
        assert node in live
        plan = select_restore(a, template(), make_worker(node), live_nodes=live)
        assert isinstance(plan, Restore)
        assert plan.source is RestoreSource.LOCAL
        newest = newest_usable(a, live)
        assert newest is not None
        assert plan.generation == newest.generation
    pinned = pin_node(a)
    if pinned is not None and pinned != a.status.assigned_node:
        # A pin without an assignment is the node of a local-only COMPLETED copy, and no
        # newer generation has a COMPLETED durable copy.
        holders = [
            s
            for s in a.status.snapshots
            if (loc := s.local()) is not None and loc.completed and loc.node == pinned
        ]
        assert holders
        newest_holder = max(s.generation for s in holders)
        assert not any(
            (dur := s.durable()) is not None and dur.completed and s.generation >= newest_holder
            for s in a.status.snapshots
        )
