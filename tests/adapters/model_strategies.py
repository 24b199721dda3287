"""Hypothesis strategies for every stored model record (values JSON and jsonb can hold)."""

from __future__ import annotations

from hypothesis import strategies as st

from substrate.core.ids import ActorRef, Labels, NodeRef, TagRef, TemplateRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorBinding,
    ActorState,
    ActorStatus,
    ActorTemplate,
    Atespace,
    Capacity,
    Container,
    Crash,
    Durability,
    EnvVar,
    Fidelity,
    Metadata,
    Probe,
    Resources,
    SandboxClass,
    Snapshot,
    SnapshotConfig,
    SnapshotOwner,
    SnapshotStorage,
    StorageStatus,
    Tag,
    Worker,
    WorkerAssignment,
    WorkerState,
)

# jsonb cannot hold NUL or lone surrogates; everything else must survive.
text = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12
)
floats = st.floats(allow_nan=False, allow_infinity=False)
ints = st.integers(min_value=-(2**62), max_value=2**62)
naturals = st.integers(min_value=0, max_value=2**62)

labels = st.lists(st.tuples(text, text), max_size=4).map(lambda pairs: Labels(tuple(pairs)))
node_refs = st.builds(NodeRef, text)
worker_refs = st.builds(WorkerRef, text)
actor_refs = st.builds(ActorRef, text, text)
template_refs = st.builds(TemplateRef, text, text)
tag_refs = st.builds(TagRef, text, text)
metadata = st.builds(Metadata, uid=text, version=ints, create_time=floats, update_time=floats)
resources = st.builds(Resources, cpu_milli=naturals, memory_bytes=naturals)
capacities = st.builds(Capacity, cpu_milli=naturals, memory_bytes=naturals, actors=naturals)

storages = st.builds(
    SnapshotStorage,
    durability=st.sampled_from(Durability),
    status=st.sampled_from(StorageStatus),
    fidelity=st.sampled_from(Fidelity),
    uri=text,
    local_name=text,
    node=st.none() | node_refs,
)
snapshots = st.builds(
    Snapshot,
    generation=ints,
    snapshot_id=text,
    owner=st.sampled_from(SnapshotOwner),
    template_uid=text,
    sandbox_class=st.sampled_from(SandboxClass),
    runtime_version=text,
    captured_at=floats,
    source_tag=st.none() | tag_refs,
    storages=st.lists(storages, max_size=3),
)
assignments = st.builds(
    WorkerAssignment,
    worker=worker_refs,
    node=node_refs,
    worker_epoch=ints,
    pod_ips=st.lists(text, max_size=3),
    resources=resources,
)
statuses = st.builds(
    ActorStatus,
    state=st.sampled_from(ActorState),
    assignment=st.none() | assignments,
    snapshots=st.lists(snapshots, max_size=3),
    crash=st.none() | st.builds(Crash, message=text, time=floats),
    assigned_node=st.none() | node_refs,
    last_assigned_generation=ints,
    in_progress_generation=ints,
)
actors = st.builds(
    Actor,
    ref=actor_refs,
    metadata=metadata,
    template=template_refs,
    worker_selector=labels,
    source_tag=st.none() | tag_refs,
    status=statuses,
)
workers = st.builds(
    Worker,
    ref=worker_refs,
    metadata=metadata,
    pool=text,
    node=node_refs,
    ips=st.lists(text, max_size=3),
    sandbox_class=st.sampled_from(SandboxClass),
    runtime_versions=st.frozensets(text, max_size=3),
    labels=labels,
    epoch=ints,
    state=st.sampled_from(WorkerState),
    capacity=st.none() | capacities,
    allocated=capacities,
    last_heartbeat=floats,
    spiffe_id=text,
    tunnel_address=text,
)
containers = st.builds(
    Container,
    name=text,
    image=text,
    command=st.lists(text, max_size=3),
    env=st.lists(st.builds(EnvVar, name=text, value=text), max_size=3),
    ports=st.lists(ints, max_size=3),
    wakeup_probe=st.none() | st.builds(Probe, path=text, port=ints, timeout_seconds=ints),
)
templates = st.builds(
    ActorTemplate,
    ref=template_refs,
    metadata=metadata,
    containers=st.lists(containers, max_size=3),
    resources=resources,
    worker_selector=labels,
    sandbox_class=st.sampled_from(SandboxClass),
    snapshot_config=st.builds(
        SnapshotConfig, preferred_fidelity=st.sampled_from(Fidelity), storage_location=text
    ),
    golden_snapshot=st.booleans(),
    golden_tag=st.none() | tag_refs,
    golden_error=text,
)
tags = st.builds(
    Tag,
    ref=tag_refs,
    metadata=metadata,
    source_actor=st.none() | actor_refs,
    template=st.none() | template_refs,
    snapshot=st.none() | snapshots,
)
atespaces = st.builds(Atespace, name=text, metadata=metadata)
bindings = st.builds(
    ActorBinding,
    actor=actor_refs,
    actor_uid=text,
    worker=worker_refs,
    worker_epoch=ints,
    resources=resources,
)

records = st.one_of(actors, workers, templates, tags, atespaces, bindings)
"""Any stored record."""
