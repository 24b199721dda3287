"""Generation bookkeeping: new_generation, prune_after_suspend, latest_durable."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from substrate.core.ids import NodeRef
from substrate.core.model import (
    Actor,
    Durability,
    Fidelity,
    SandboxClass,
    Snapshot,
    SnapshotOwner,
    StorageStatus,
)
from substrate.errors import InvalidArgument
from substrate.snapshot import (
    latest_durable,
    new_generation,
    next_generation,
    owned_by_actor,
    parse_prefix,
    prune_after_suspend,
)

from .snapshot_support import (
    ACTOR_UID,
    DEAD,
    HERE,
    OTHER,
    actor,
    durable,
    local,
    snap,
)

P = StorageStatus.PENDING
IP = StorageStatus.IN_PROGRESS


def make_generation(
    *,
    actor_: Actor | None = None,
    snapshot_id: str = "0b7c5d2e-1111-4a4a-9c9c-000000000001",
    fidelity: Fidelity = Fidelity.MEMORY,
    node: NodeRef = HERE,
    now: float = 1_700_000_000.5,
    location: str = "s3://bucket/ate/",
) -> Snapshot:
    return new_generation(
        actor_ if actor_ is not None else actor(snap(1, durable()), snap(2, durable())),
        snapshot_id=snapshot_id,
        fidelity=fidelity,
        node=node,
        template_uid="tmpl-uid-1",
        sandbox_class=SandboxClass.GVISOR,
        runtime_version="runsc-2022",
        now=now,
        location=location,
    )


# --- latest_durable ---------------------------------------------------------------------


def test_latest_durable_is_the_newest_completed_durable() -> None:
    a = actor(
        snap(1, durable()),
        snap(2, durable()),
        snap(3, durable(P)),
        snap(4, local(HERE)),
    )
    found = latest_durable(a)
    assert found is not None
    assert found.generation == 2


def test_latest_durable_includes_a_borrowed_snapshot() -> None:
    a = actor(snap(1, durable(), owner=SnapshotOwner.TAG), snap(2, local(HERE), durable(IP)))
    found = latest_durable(a)
    assert found is not None
    assert found.generation == 1
    assert found.owner is SnapshotOwner.TAG


def test_latest_durable_none() -> None:
    assert latest_durable(actor()) is None
    assert latest_durable(actor(snap(1, local(HERE)), snap(2, durable(IP)))) is None


# --- new_generation ---------------------------------------------------------------------


def test_new_generation_fields() -> None:
    s = make_generation()
    assert s.generation == 3
    assert s.snapshot_id == "0b7c5d2e-1111-4a4a-9c9c-000000000001"
    assert s.owner is SnapshotOwner.ACTOR
    assert s.template_uid == "tmpl-uid-1"
    assert s.sandbox_class is SandboxClass.GVISOR
    assert s.runtime_version == "runsc-2022"
    assert s.captured_at == 1_700_000_000.5
    assert s.source_tag is None
    loc, dur = s.local(), s.durable()
    assert loc is not None
    assert dur is not None
    assert (loc.status, loc.node, loc.local_name, loc.fidelity) == (
        StorageStatus.IN_PROGRESS,
        HERE,
        s.snapshot_id,
        Fidelity.MEMORY,
    )
    assert (dur.status, dur.fidelity, dur.node) == (StorageStatus.PENDING, Fidelity.MEMORY, None)
    assert dur.uri == (
        "s3://bucket/ate/atespaces/ns/actors/actor-uid-1/snapshots/"
        "0b7c5d2e-1111-4a4a-9c9c-000000000001/"
    )
    assert owned_by_actor(dur.uri, "ns", ACTOR_UID)
    assert [x.durability for x in s.storages] == [Durability.LOCAL, Durability.DURABLE]


def test_new_generation_uses_last_assigned_generation() -> None:
    # A generation number is never reused, even if that generation was discarded.
    a = actor(snap(1, durable()), last_assigned_generation=7)
    assert make_generation(actor_=a).generation == 8
    assert next_generation(a) == 8
    assert make_generation(actor_=actor()).generation == 1


def test_new_generation_never_collides_with_a_held_generation() -> None:
    a = actor(snap(5, durable()), last_assigned_generation=2)
    assert make_generation(actor_=a).generation == 6


def test_new_generation_keeps_the_requested_fidelity() -> None:
    s = make_generation(fidelity=Fidelity.ROOTFS)
    assert {x.fidelity for x in s.storages} == {Fidelity.ROOTFS}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"snapshot_id": "../escape"}, "snapshot id"),
        ({"snapshot_id": "a/b"}, "snapshot id"),
        ({"snapshot_id": ""}, "snapshot id"),
        ({"location": ""}, "location"),
        ({"actor_": actor(uid="")}, "no uid"),
    ],
)
def test_new_generation_rejects(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        make_generation(**overrides)


# --- prune_after_suspend ----------------------------------------------------------------


def test_prune_keeps_the_new_generation_and_releases_older_owned_ones() -> None:
    g1 = snap(1, durable())
    g2 = snap(2, local(OTHER), durable())
    g3 = snap(3, local(HERE), durable())
    kept, released = prune_after_suspend((g1, g2, g3), 3)
    assert kept == (g3,)
    assert released == (g1, g2)


def test_prune_never_releases_a_borrowed_snapshot() -> None:
    golden = snap(1, durable(), owner=SnapshotOwner.TAG)
    own = snap(2, durable())
    kept, released = prune_after_suspend((golden, own), 2)
    assert kept == (own,)
    assert released == ()


def test_prune_keeps_newer_generations() -> None:
    g1, g2, g3 = snap(1, durable()), snap(2, durable()), snap(3, local(DEAD), durable(IP))
    kept, released = prune_after_suspend((g1, g2, g3), 2)
    assert kept == (g2, g3)
    assert released == (g1,)


def test_prune_does_not_release_objects_still_in_use() -> None:
    uri = "s3://bucket/ate/atespaces/ns/actors/actor-uid-1/snapshots/shared/"
    old = snap(1, durable(uri=uri), snapshot_id="shared-old")
    new = snap(2, durable(uri=uri), snapshot_id="shared-new")
    same_id = snap(3, durable(), snapshot_id="shared-new")
    kept, released = prune_after_suspend((old, new), 2)
    assert kept == (new,)
    assert released == ()
    kept, released = prune_after_suspend((new, same_id), 3)
    assert kept == (same_id,)
    assert released == ()


def test_prune_requires_the_kept_generation() -> None:
    with pytest.raises(InvalidArgument, match="generation 4"):
        prune_after_suspend((snap(1, durable()),), 4)
    with pytest.raises(InvalidArgument):
        prune_after_suspend((), 1)


generation_lists = st.lists(
    st.tuples(st.integers(1, 20), st.sampled_from(SnapshotOwner)),
    min_size=1,
    max_size=8,
    unique_by=lambda t: t[0],
)


@given(rows=generation_lists, data=st.data())
def test_property_prune(rows: list[tuple[int, SnapshotOwner]], data: st.DataObject) -> None:
    snapshots = tuple(snap(g, durable(), owner=o) for g, o in rows)
    keep = data.draw(st.sampled_from([g for g, _ in rows]))
    kept, released = prune_after_suspend(snapshots, keep)
    # Never hands a TAG-owned (borrowed) snapshot to the deleter.
    assert all(s.owner is SnapshotOwner.ACTOR for s in released)
    # The new generation is kept; only older generations are released.
    assert any(s.generation == keep for s in kept)
    assert all(s.generation >= keep for s in kept)
    assert all(s.generation < keep for s in released)
    # Every older ACTOR-owned generation is released; kept + dropped = everything.
    older_owned = {
        s.generation for s in snapshots if s.generation < keep and s.owner is SnapshotOwner.ACTOR
    }
    assert {s.generation for s in released} == older_owned
    assert set(kept) | {s for s in snapshots if s.generation < keep} == set(snapshots)
    assert not set(kept) & set(released)


@given(
    last=st.integers(0, 50),
    snapshot_id=st.from_regex(r"[a-z0-9][a-z0-9-]{0,30}", fullmatch=True),
    node=st.sampled_from((HERE, OTHER, DEAD)),
    now=st.floats(0, 4e9, allow_nan=False),
)
def test_property_new_generation(last: int, snapshot_id: str, node: NodeRef, now: float) -> None:
    a = actor(last_assigned_generation=last)
    s = make_generation(actor_=a, snapshot_id=snapshot_id, node=node, now=now)
    assert s.generation == last + 1
    assert s.captured_at == now
    dur = s.durable()
    assert dur is not None
    parsed = parse_prefix(dur.uri)
    assert (parsed.atespace, parsed.owner_uid, parsed.snapshot_id) == (
        "ns",
        ACTOR_UID,
        snapshot_id,
    )
    loc = s.local()
    assert loc is not None
    assert loc.node == node
