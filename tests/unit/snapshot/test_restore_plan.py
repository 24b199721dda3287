"""Seed 000 §5 on the node: where a start restores from, what a checkpoint writes (pure)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from substrate.core.agent_ports import CheckpointMode
from substrate.core.ids import ActorRef, NodeRef
from substrate.core.model import (
    Durability,
    Fidelity,
    SandboxClass,
    Snapshot,
    SnapshotOwner,
    SnapshotStorage,
    StorageStatus,
)
from substrate.errors import FailedPrecondition, InvalidArgument
from substrate.sandbox.node_layout import NodeLayout
from substrate.snapshot.layout import actor_snapshot_prefix, tag_prefix
from substrate.snapshot.restore_plan import (
    NodeRestorePlan,
    RestoreKind,
    checkpointed,
    plan_checkpoint,
    plan_restore,
    plan_upload,
    sysinfo_files,
    tag_of,
    uploaded_snapshot,
)

LAYOUT = NodeLayout("/var/lib/ate")
HERE = NodeRef("node-a")
THERE = NodeRef("node-b")
UID = "actor-uid-1"
LOCATION = "s3://bucket/ate"
RUNTIME = "runsc-2025"


def local(
    name: str = "snap-1",
    *,
    node: NodeRef | None = HERE,
    status: StorageStatus = StorageStatus.COMPLETED,
    fidelity: Fidelity = Fidelity.MEMORY,
) -> SnapshotStorage:
    return SnapshotStorage(
        durability=Durability.LOCAL, status=status, fidelity=fidelity, local_name=name, node=node
    )


def durable(
    uri: str = actor_snapshot_prefix(LOCATION, "lab", UID, "snap-1"),
    *,
    status: StorageStatus = StorageStatus.COMPLETED,
    fidelity: Fidelity = Fidelity.MEMORY,
) -> SnapshotStorage:
    return SnapshotStorage(durability=Durability.DURABLE, status=status, fidelity=fidelity, uri=uri)


def snapshot(*storages: SnapshotStorage, runtime: str = RUNTIME, **kw: object) -> Snapshot:
    return Snapshot(
        generation=1,
        snapshot_id="snap-1",
        runtime_version=runtime,
        sandbox_class=SandboxClass.GVISOR,
        storages=storages,
        **kw,  # type: ignore[arg-type]
    )


def plan(
    snap: Snapshot | None,
    storage: SnapshotStorage | None,
    *,
    fidelity: Fidelity = Fidelity.MEMORY,
    runtimes: tuple[str, ...] = (RUNTIME,),
    sandbox_class: SandboxClass = SandboxClass.GVISOR,
) -> NodeRestorePlan:
    return plan_restore(
        layout=LAYOUT,
        node=HERE,
        actor_uid=UID,
        snapshot=snap,
        storage=storage,
        fidelity=fidelity,
        sandbox_class=sandbox_class,
        runtime_versions=runtimes,
    )


# --- restore ------------------------------------------------------------------------------


def test_no_snapshot_is_a_cold_boot() -> None:
    p = plan_restore(
        layout=LAYOUT,
        node=HERE,
        actor_uid=UID,
        snapshot=None,
        storage=None,
        fidelity=Fidelity.MEMORY,
        sandbox_class=SandboxClass.GVISOR,
        runtime_versions=(),
    )
    assert p.kind is RestoreKind.COLD
    assert not p.restores
    assert not p.downloads
    assert p.restore_dir == ""


def test_local_copy_on_this_node_restores_in_place() -> None:
    s = local()
    p = plan(snapshot(s), s)
    assert p == plan(snapshot(s), s)
    assert p.kind is RestoreKind.LOCAL
    assert p.restore_dir == "/var/lib/ate/actors/actor-uid-1/snapshots/snap-1"
    assert p.preserve is True
    assert p.local_name == "snap-1"
    assert not p.downloads


def test_local_copy_without_a_node_is_taken_as_this_nodes() -> None:
    s = local(node=None)
    assert plan(snapshot(s), s).kind is RestoreKind.LOCAL


def test_local_copy_of_another_node_is_refused() -> None:
    s = local(node=THERE)
    with pytest.raises(FailedPrecondition, match="node-b"):
        plan(snapshot(s), s)


def test_durable_copy_downloads_into_the_restore_dir() -> None:
    d = durable()
    p = plan(snapshot(local(), d), d)
    assert p.kind is RestoreKind.DOWNLOAD
    assert p.restore_dir == "/var/lib/ate/actors/actor-uid-1/restore"
    assert p.preserve is False
    assert p.uri == d.uri
    assert p.downloads


def test_tag_copy_goes_through_the_tag_cache() -> None:
    d = durable(tag_prefix(LOCATION, "lab", "tag-uid-7"))
    p = plan(snapshot(d, owner=SnapshotOwner.TAG), d)
    assert p.kind is RestoreKind.TAG_CACHE
    assert p.restore_dir == "/var/lib/ate/cache/tags/tag-uid-7/snap-1"
    assert p.preserve is True
    assert p.tag_uid == "tag-uid-7"


def test_tag_of() -> None:
    assert tag_of(tag_prefix(LOCATION, "lab", "t1")) == "t1"
    assert tag_of(actor_snapshot_prefix(LOCATION, "lab", UID, "s")) is None
    assert tag_of("s3://bucket/somewhere/else") is None


def test_durable_copy_not_completed_is_refused() -> None:
    d = durable(status=StorageStatus.PENDING)
    with pytest.raises(FailedPrecondition, match="PENDING"):
        plan(snapshot(d), d)


def test_malformed_requests_are_invalid() -> None:
    with pytest.raises(InvalidArgument, match="storage"):
        plan(snapshot(local()), None)
    nameless = local(name="")
    with pytest.raises(InvalidArgument):
        plan(snapshot(nameless), nameless)
    no_uri = durable(uri="")
    with pytest.raises(InvalidArgument):
        plan(snapshot(no_uri), no_uri)


def test_memory_snapshot_needs_the_runtime_that_wrote_it() -> None:
    s = local()
    with pytest.raises(FailedPrecondition, match=RUNTIME):
        plan(snapshot(s), s, runtimes=("runsc-2024",))
    # A snapshot that records no runtime restores anywhere.
    assert plan(snapshot(s, runtime=""), s, runtimes=()).kind is RestoreKind.LOCAL


def test_snapshot_of_another_sandbox_class_is_refused() -> None:
    s = local()
    with pytest.raises(FailedPrecondition, match="GVISOR"):
        plan(snapshot(s), s, sandbox_class=SandboxClass.MICROVM)


@pytest.mark.parametrize("fidelity", [Fidelity.VOLUMES, Fidelity.ROOTFS])
def test_fidelity_below_memory_is_refused(fidelity: Fidelity) -> None:
    s = local()
    with pytest.raises(FailedPrecondition, match=fidelity.name):
        plan(snapshot(s), s, fidelity=fidelity)
    low = local(fidelity=fidelity)
    with pytest.raises(FailedPrecondition, match=fidelity.name):
        plan(snapshot(low), low, fidelity=Fidelity.MEMORY)


@given(
    durability=st.sampled_from(Durability),
    node=st.sampled_from([HERE, THERE, None]),
    status=st.sampled_from(StorageStatus),
    tagged=st.booleans(),
)
def test_restore_plan_invariants(
    durability: Durability, node: NodeRef | None, status: StorageStatus, tagged: bool
) -> None:
    if durability is Durability.LOCAL:
        storage = local(node=node, status=status)
    else:
        uri = (
            tag_prefix(LOCATION, "lab", "tag-1")
            if tagged
            else actor_snapshot_prefix(LOCATION, "lab", UID, "snap-1")
        )
        storage = durable(uri, status=status)
    try:
        p = plan(snapshot(storage), storage)
    except FailedPrecondition:
        assert (durability is Durability.LOCAL and node == THERE) or (
            durability is Durability.DURABLE and status is not StorageStatus.COMPLETED
        )
        return
    restore_dir = p.restore_dir
    assert restore_dir.startswith(LAYOUT.root + "/")
    # Only the actor's own download is removed after the restore; shared copies are kept.
    assert p.preserve is (p.kind is not RestoreKind.DOWNLOAD)
    assert p.downloads is (durability is Durability.DURABLE)


def test_sysinfo_files_name_the_actor_itself() -> None:
    assert sysinfo_files(ActorRef("lab", "a1"), "uid-1") == {
        "name": "a1",
        "atespace": "lab",
        "uid": "uid-1",
    }


# --- checkpoint and upload --------------------------------------------------------------------


def generation() -> Snapshot:
    return snapshot(
        local(status=StorageStatus.IN_PROGRESS),
        durable(status=StorageStatus.PENDING),
        runtime="",
    )


@pytest.mark.parametrize(
    ("mode", "upload"),
    [
        (CheckpointMode.PAUSE, False),
        (CheckpointMode.SUSPEND_ASYNC, False),
        (CheckpointMode.SUSPEND_SYNC, True),
    ],
)
def test_checkpoint_plan_per_mode(mode: CheckpointMode, upload: bool) -> None:
    p = plan_checkpoint(layout=LAYOUT, node=HERE, actor_uid=UID, mode=mode, snapshot=generation())
    assert p.local_dir == "/var/lib/ate/actors/actor-uid-1/snapshots/snap-1"
    assert p.check_store_first is upload
    assert p.upload_now is upload


def test_sync_checkpoint_of_an_already_durable_copy_does_not_upload() -> None:
    snap = generation().with_storage(durable())
    p = plan_checkpoint(
        layout=LAYOUT, node=HERE, actor_uid=UID, mode=CheckpointMode.SUSPEND_SYNC, snapshot=snap
    )
    assert not p.upload_now
    assert not p.check_store_first


def test_sync_checkpoint_without_durable_copy_stays_local() -> None:
    snap = generation().without(Durability.DURABLE)
    p = plan_checkpoint(
        layout=LAYOUT, node=HERE, actor_uid=UID, mode=CheckpointMode.SUSPEND_SYNC, snapshot=snap
    )
    assert p.durable is None
    assert not p.upload_now


def test_checkpoint_needs_a_local_destination_on_this_node() -> None:
    with pytest.raises(InvalidArgument, match="LOCAL"):
        plan_checkpoint(
            layout=LAYOUT,
            node=HERE,
            actor_uid=UID,
            mode=CheckpointMode.PAUSE,
            snapshot=generation().without(Durability.LOCAL),
        )
    elsewhere = generation().with_storage(local(node=THERE, status=StorageStatus.IN_PROGRESS))
    with pytest.raises(InvalidArgument, match="node-b"):
        plan_checkpoint(
            layout=LAYOUT, node=HERE, actor_uid=UID, mode=CheckpointMode.PAUSE, snapshot=elsewhere
        )


def test_checkpointed_marks_local_and_records_the_runtime() -> None:
    out = checkpointed(generation(), runtime_version="runsc-x", uploaded=False)
    loc, dur = out.local(), out.durable()
    assert loc is not None and loc.status is StorageStatus.COMPLETED
    assert dur is not None and dur.status is StorageStatus.PENDING
    assert out.runtime_version == "runsc-x"
    both = checkpointed(generation(), runtime_version="", uploaded=True)
    dur = both.durable()
    assert dur is not None and dur.completed
    assert both.runtime_version == ""
    assert uploaded_snapshot(out) == attrs.evolve(
        out,
        storages=(out.storages[0], attrs.evolve(out.storages[1], status=StorageStatus.COMPLETED)),
    )


def test_upload_plan() -> None:
    p = plan_upload(layout=LAYOUT, node=HERE, actor_uid=UID, snapshot=generation())
    assert p is not None
    assert p.local_dir == "/var/lib/ate/actors/actor-uid-1/snapshots/snap-1"
    assert p.uri == durable().uri
    done = generation().with_storage(durable())
    assert plan_upload(layout=LAYOUT, node=HERE, actor_uid=UID, snapshot=done) is None
    with pytest.raises(FailedPrecondition, match="no local copy"):
        plan_upload(
            layout=LAYOUT,
            node=HERE,
            actor_uid=UID,
            snapshot=generation().without(Durability.LOCAL),
        )
    with pytest.raises(InvalidArgument, match="DURABLE"):
        plan_upload(
            layout=LAYOUT,
            node=HERE,
            actor_uid=UID,
            snapshot=generation().without(Durability.DURABLE),
        )
    elsewhere = generation().with_storage(local(node=THERE))
    with pytest.raises(FailedPrecondition, match="node-b"):
        plan_upload(layout=LAYOUT, node=HERE, actor_uid=UID, snapshot=elsewhere)
