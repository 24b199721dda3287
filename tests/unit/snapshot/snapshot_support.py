"""Factories and hypothesis strategies shared by the snapshot tests."""

from __future__ import annotations

from collections.abc import Iterable

import attrs
from hypothesis import strategies as st

from substrate.core.ids import ActorRef, NodeRef, TagRef, TemplateRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorState,
    ActorStatus,
    ActorTemplate,
    Container,
    Durability,
    Fidelity,
    Metadata,
    SandboxClass,
    Snapshot,
    SnapshotOwner,
    SnapshotStorage,
    StorageStatus,
    Worker,
    WorkerState,
)

HERE = NodeRef("node-a")
OTHER = NodeRef("node-b")
DEAD = NodeRef("node-c")
NODES = (HERE, OTHER, DEAD)
LIVE = frozenset({HERE, OTHER})
TEMPLATE_UID = "tmpl-uid-1"
ACTOR_UID = "actor-uid-1"
LOCATION = "s3://bucket/ate"
RUNTIME = "runsc-2022"


def template(uid: str = TEMPLATE_UID) -> ActorTemplate:
    return ActorTemplate(
        ref=TemplateRef("ns", "tmpl"),
        metadata=Metadata(uid=uid),
        containers=(Container(name="app", image="example/app:1"),),
    )


def worker(
    node: NodeRef = HERE,
    *,
    runtimes: Iterable[str] = (RUNTIME,),
    sandbox_class: SandboxClass = SandboxClass.GVISOR,
) -> Worker:
    return Worker(
        ref=WorkerRef(f"w-{node.name}"),
        node=node,
        runtime_versions=frozenset(runtimes),
        sandbox_class=sandbox_class,
        state=WorkerState.ACTIVE,
    )


def local(
    node: NodeRef | None = HERE,
    status: StorageStatus = StorageStatus.COMPLETED,
    fidelity: Fidelity = Fidelity.MEMORY,
) -> SnapshotStorage:
    return SnapshotStorage(
        durability=Durability.LOCAL,
        status=status,
        fidelity=fidelity,
        local_name="snap",
        node=node,
    )


def durable(
    status: StorageStatus = StorageStatus.COMPLETED,
    fidelity: Fidelity = Fidelity.MEMORY,
    uri: str = "",
) -> SnapshotStorage:
    return SnapshotStorage(
        durability=Durability.DURABLE,
        status=status,
        fidelity=fidelity,
        uri=uri,
    )


def snap(
    generation: int,
    *storages: SnapshotStorage,
    owner: SnapshotOwner = SnapshotOwner.ACTOR,
    template_uid: str = TEMPLATE_UID,
    runtime_version: str = RUNTIME,
    sandbox_class: SandboxClass = SandboxClass.GVISOR,
    snapshot_id: str | None = None,
) -> Snapshot:
    """A generation; a DURABLE copy without uri gets the actor prefix of its snapshot id."""
    snapshot_id = snapshot_id or f"snap-{generation}"
    uri = f"{LOCATION}/atespaces/ns/actors/{ACTOR_UID}/snapshots/{snapshot_id}/"
    storages = tuple(
        attrs.evolve(s, uri=uri) if s.durability is Durability.DURABLE and not s.uri else s
        for s in storages
    )
    return Snapshot(
        generation=generation,
        snapshot_id=snapshot_id,
        owner=owner,
        template_uid=template_uid,
        runtime_version=runtime_version,
        sandbox_class=sandbox_class,
        source_tag=TagRef("ns", "golden") if owner is SnapshotOwner.TAG else None,
        storages=storages,
    )


def actor(
    *snapshots: Snapshot,
    state: ActorState = ActorState.SUSPENDED,
    assigned_node: NodeRef | None = None,
    last_assigned_generation: int | None = None,
    uid: str = ACTOR_UID,
) -> Actor:
    last = (
        last_assigned_generation
        if last_assigned_generation is not None
        else max((s.generation for s in snapshots), default=0)
    )
    return Actor(
        ref=ActorRef("ns", "a1"),
        metadata=Metadata(uid=uid),
        template=TemplateRef("ns", "tmpl"),
        status=ActorStatus(
            state=state,
            snapshots=sorted(snapshots, key=lambda s: s.generation),
            assigned_node=assigned_node,
            last_assigned_generation=last,
        ),
    )


# --- strategies -------------------------------------------------------------------------

statuses = st.sampled_from(StorageStatus)
fidelities = st.sampled_from(Fidelity)
nodes = st.sampled_from(NODES)
runtimes = st.sampled_from(("", RUNTIME, "runsc-2024"))
template_uids = st.sampled_from(("", TEMPLATE_UID, "tmpl-uid-2"))


_locals = st.none() | st.tuples(st.none() | nodes, statuses, fidelities)
_durables = st.none() | st.tuples(statuses, fidelities)
_classes = st.sampled_from((SandboxClass.GVISOR, SandboxClass.MICROVM))
_rows = st.tuples(
    st.integers(1, 30),
    _locals,
    _durables,
    st.sampled_from(SnapshotOwner),
    template_uids,
    runtimes,
    _classes,
)
Row = tuple[
    int,
    tuple[NodeRef | None, StorageStatus, Fidelity] | None,
    tuple[StorageStatus, Fidelity] | None,
    SnapshotOwner,
    str,
    str,
    SandboxClass,
]


def _build_actor(rows: list[Row], assigned_node: NodeRef | None, state: ActorState) -> Actor:
    snapshots: dict[int, Snapshot] = {}
    for generation, loc, dur, owner, template_uid, runtime_version, sandbox_class in rows:
        storages: list[SnapshotStorage] = []
        if loc is not None:
            storages.append(local(*loc))
        if dur is not None:
            storages.append(durable(*dur))
        snapshots.setdefault(
            generation,
            snap(
                generation,
                *storages,
                owner=owner,
                template_uid=template_uid,
                runtime_version=runtime_version,
                sandbox_class=sandbox_class,
            ),
        )
    return actor(*snapshots.values(), assigned_node=assigned_node, state=state)


actors_st = st.builds(
    _build_actor,
    st.lists(_rows, max_size=6),
    st.none() | nodes,
    st.sampled_from(ActorState),
)
"""Actors with up to six generations of arbitrary copies (any status, node, fidelity)."""

workers_st = st.builds(
    worker,
    nodes,
    runtimes=st.frozensets(st.sampled_from((RUNTIME, "runsc-2024"))),
    sandbox_class=_classes,
)


live_nodes_st = st.frozensets(nodes)
