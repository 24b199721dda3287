"""Hypothesis strategies for substrate's domain model (needs the ``test`` extra)."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st

from substrate.core.ids import ActorRef, Labels, NodeRef, TagRef, TemplateRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorState,
    ActorStatus,
    ActorTemplate,
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
    Worker,
    WorkerAssignment,
    WorkerState,
)

_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"


def dns_labels(max_size: int = 63) -> st.SearchStrategy[str]:
    """Valid DNS-1123 labels."""
    edge = st.sampled_from(_ALNUM)
    middle = st.text(alphabet=_ALNUM + "-", max_size=max(0, max_size - 2))
    single = edge
    multi = st.builds(lambda a, m, b: a + m + b, edge, middle, edge)
    return st.one_of(single, multi).filter(lambda s: len(s) <= max_size)


def invalid_dns_labels() -> st.SearchStrategy[str]:
    """Strings that are not DNS-1123 labels."""
    return st.one_of(
        st.just(""),
        st.text(min_size=64, max_size=80, alphabet=_ALNUM),
        dns_labels().map(lambda s: "-" + s),
        dns_labels().map(lambda s: s + "-"),
        dns_labels().map(lambda s: s.upper() + "A"),
        st.builds(
            lambda a, c, b: a + c + b, dns_labels(10), st.sampled_from("_./ :@"), dns_labels(10)
        ),
    )


def label_values() -> st.SearchStrategy[str]:
    edge = st.sampled_from(_ALNUM + "ABCXYZ")
    middle = st.text(alphabet=_ALNUM + "-_.", max_size=20)
    return st.one_of(st.just(""), edge, st.builds(lambda a, m, b: a + m + b, edge, middle, edge))


def labels(max_size: int = 4) -> st.SearchStrategy[Labels]:
    keys = st.one_of(
        dns_labels(20), st.builds(lambda p, n: f"{p}.io/{n}", dns_labels(10), dns_labels(10))
    )
    return st.dictionaries(keys, label_values(), max_size=max_size).map(Labels)


def actor_refs() -> st.SearchStrategy[ActorRef]:
    return st.builds(ActorRef, atespace=dns_labels(20), name=dns_labels(30))


def template_refs() -> st.SearchStrategy[TemplateRef]:
    return st.builds(TemplateRef, atespace=dns_labels(20), name=dns_labels(30))


def tag_refs() -> st.SearchStrategy[TagRef]:
    return st.builds(TagRef, atespace=dns_labels(20), name=dns_labels(30))


def worker_refs() -> st.SearchStrategy[WorkerRef]:
    return st.builds(WorkerRef, name=dns_labels(30))


def node_refs() -> st.SearchStrategy[NodeRef]:
    return st.builds(NodeRef, name=dns_labels(20))


def resources() -> st.SearchStrategy[Resources]:
    return st.builds(
        Resources,
        cpu_milli=st.integers(0, 8000),
        memory_bytes=st.integers(0, 16 << 30),
    )


def capacities() -> st.SearchStrategy[Capacity]:
    return st.builds(
        Capacity,
        cpu_milli=st.integers(0, 64000),
        memory_bytes=st.integers(0, 256 << 30),
        actors=st.integers(0, 200),
    )


def metadata() -> st.SearchStrategy[Metadata]:
    return st.builds(
        Metadata,
        uid=st.uuids().map(str),
        version=st.integers(1, 10_000),
        create_time=st.floats(0, 2e9, allow_nan=False),
        update_time=st.floats(0, 2e9, allow_nan=False),
    )


def storages() -> st.SearchStrategy[SnapshotStorage]:
    local = st.builds(
        SnapshotStorage,
        durability=st.just(Durability.LOCAL),
        status=st.sampled_from(StorageStatus),
        fidelity=st.sampled_from(Fidelity),
        local_name=dns_labels(20),
        node=node_refs(),
    )
    durable = st.builds(
        SnapshotStorage,
        durability=st.just(Durability.DURABLE),
        status=st.sampled_from(StorageStatus),
        fidelity=st.sampled_from(Fidelity),
        uri=dns_labels(20).map(lambda s: f"file:///objects/{s}/"),
    )
    return st.one_of(local, durable)


def _has_durability(d: Durability) -> Callable[[SnapshotStorage], bool]:
    return lambda s: s.durability is d


@st.composite
def snapshots(draw: st.DrawFn, generation: int | None = None) -> Snapshot:
    gen = draw(st.integers(1, 50)) if generation is None else generation
    kinds = draw(st.sets(st.sampled_from(Durability), min_size=1))
    items = [
        draw(storages().filter(_has_durability(d))) for d in sorted(kinds, key=lambda k: k.value)
    ]
    return Snapshot(
        generation=gen,
        snapshot_id=str(draw(st.uuids())),
        owner=draw(st.sampled_from(SnapshotOwner)),
        template_uid=draw(st.sampled_from(["", "tmpl-uid-1", "tmpl-uid-2"])),
        sandbox_class=draw(st.sampled_from(SandboxClass)),
        runtime_version=draw(st.sampled_from(["", "runsc-2022", "fake-1"])),
        captured_at=draw(st.floats(0, 2e9, allow_nan=False)),
        storages=tuple(items),
    )


def assignments() -> st.SearchStrategy[WorkerAssignment]:
    return st.builds(
        WorkerAssignment,
        worker=worker_refs(),
        node=node_refs(),
        worker_epoch=st.integers(0, 100),
        pod_ips=st.lists(st.sampled_from(["127.0.0.1", "10.0.0.2", "::1"]), max_size=2).map(tuple),
        resources=resources(),
    )


@st.composite
def actors(draw: st.DrawFn, state: ActorState | None = None) -> Actor:
    gens = draw(st.lists(st.integers(1, 30), unique=True, max_size=3))
    snaps = tuple(sorted((draw(snapshots(g)) for g in gens), key=lambda s: s.generation))
    st_state = state if state is not None else draw(st.sampled_from(ActorState))
    status = ActorStatus(
        state=st_state,
        assignment=draw(st.one_of(st.none(), assignments())),
        snapshots=snaps,
        crash=draw(
            st.one_of(
                st.none(),
                st.builds(Crash, message=st.text(max_size=40), time=st.floats(0, 2e9)),
            )
        ),
        assigned_node=draw(st.one_of(st.none(), node_refs())),
        last_assigned_generation=max(gens, default=0),
        in_progress_generation=0,
    )
    return Actor(
        ref=draw(actor_refs()),
        metadata=draw(metadata()),
        template=draw(template_refs()),
        worker_selector=draw(labels(3)),
        source_tag=draw(st.one_of(st.none(), tag_refs())),
        status=status,
    )


def containers() -> st.SearchStrategy[Container]:
    return st.builds(
        Container,
        name=dns_labels(20).filter(lambda n: n != "pause"),
        image=dns_labels(20).map(lambda s: f"local/{s}"),
        command=st.lists(st.text(max_size=10), max_size=3).map(tuple),
        env=st.lists(
            st.builds(EnvVar, name=dns_labels(10).map(str.upper), value=st.text(max_size=10)),
            max_size=3,
            unique_by=lambda e: e.name,
        ).map(tuple),
        ports=st.lists(st.integers(1, 65535), min_size=1, max_size=2).map(tuple),
        wakeup_probe=st.one_of(
            st.none(),
            st.builds(
                Probe,
                path=dns_labels(10).map(lambda s: "/" + s),
                port=st.integers(1, 65535),
                timeout_seconds=st.integers(1, 3600),
            ),
        ),
    )


def templates() -> st.SearchStrategy[ActorTemplate]:
    return st.builds(
        ActorTemplate,
        ref=template_refs(),
        metadata=metadata(),
        containers=st.lists(containers(), min_size=1, max_size=3, unique_by=lambda c: c.name).map(
            tuple
        ),
        resources=resources(),
        worker_selector=labels(3),
        sandbox_class=st.sampled_from(SandboxClass),
        snapshot_config=st.builds(
            SnapshotConfig,
            preferred_fidelity=st.sampled_from(Fidelity),
            storage_location=st.just("file:///objects"),
        ),
        golden_snapshot=st.booleans(),
        golden_tag=st.one_of(st.none(), tag_refs()),
    )


@st.composite
def workers(draw: st.DrawFn) -> Worker:
    cap = draw(st.one_of(st.none(), capacities()))
    if cap is None:
        allocated = Capacity()
    else:
        allocated = Capacity(
            cpu_milli=draw(st.integers(0, cap.cpu_milli)),
            memory_bytes=draw(st.integers(0, cap.memory_bytes)),
            actors=draw(st.integers(0, cap.actors)),
        )
    return Worker(
        ref=draw(worker_refs()),
        metadata=draw(metadata()),
        pool=draw(dns_labels(10)),
        node=draw(node_refs()),
        ips=("127.0.0.1",),
        sandbox_class=draw(st.sampled_from(SandboxClass)),
        runtime_versions=frozenset(draw(st.sets(st.sampled_from(["runsc-2022", "fake-1"])))),
        labels=draw(labels(3)),
        epoch=draw(st.integers(0, 50)),
        state=draw(st.sampled_from(WorkerState)),
        capacity=cap,
        allocated=allocated,
    )


__all__ = [
    "actor_refs",
    "actors",
    "assignments",
    "capacities",
    "containers",
    "dns_labels",
    "invalid_dns_labels",
    "labels",
    "metadata",
    "node_refs",
    "resources",
    "snapshots",
    "storages",
    "tag_refs",
    "template_refs",
    "templates",
    "worker_refs",
    "workers",
]
