"""model ⇄ proto conversion: round trips (properties), enum alignment, request parsing."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import betterproto
import pytest
from hypothesis import given
from hypothesis import strategies as st

from substrate.api import convert as c
from substrate.api import pb
from substrate.core import model as m
from substrate.core.ids import ActorRef, Labels, NodeRef, TagRef, TemplateRef, WorkerRef
from substrate.errors import InvalidArgument
from substrate.snapshot import RestoreSource

# --- strategies ---------------------------------------------------------------------------

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
UINT63 = st.integers(0, 2**63 - 1)
FLOATS = st.floats(allow_nan=False)
# Proto strings are UTF-8: no lone surrogates.
TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
NAMES = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?", fullmatch=True)
SUBDOMAINS = st.from_regex(
    r"[a-z0-9]([-a-z0-9]{0,6}[a-z0-9])?(\.[a-z0-9]{1,5}){0,2}", fullmatch=True
)

# Label keys are never empty (betterproto 2.0.0b7 drops a map entry whose key and value are
# both empty, and an empty label key is invalid anyway).
labels_st = st.dictionaries(TEXT.filter(bool), TEXT, max_size=4).map(Labels)
actor_refs = st.builds(ActorRef, NAMES, NAMES)
template_refs = st.builds(TemplateRef, NAMES, NAMES)
tag_refs = st.builds(TagRef, NAMES, NAMES)
node_refs = st.builds(NodeRef, SUBDOMAINS)
worker_refs = st.builds(WorkerRef, SUBDOMAINS)

metadata_st = st.builds(m.Metadata, uid=TEXT, version=INT64, create_time=FLOATS, update_time=FLOATS)
resources_st = st.builds(m.Resources, cpu_milli=UINT63, memory_bytes=UINT63)
capacity_st = st.builds(m.Capacity, cpu_milli=UINT63, memory_bytes=UINT63, actors=UINT63)
probe_st = st.builds(m.Probe, path=TEXT, port=INT32, timeout_seconds=INT32)
env_st = st.builds(m.EnvVar, name=TEXT, value=TEXT)
container_st = st.builds(
    m.Container,
    name=TEXT,
    image=TEXT,
    command=st.lists(TEXT, max_size=3),
    env=st.lists(env_st, max_size=3),
    ports=st.lists(INT32, max_size=3),
    wakeup_probe=st.none() | probe_st,
)
snapshot_config_st = st.builds(
    m.SnapshotConfig, preferred_fidelity=st.sampled_from(m.Fidelity), storage_location=TEXT
)
template_st = st.builds(
    m.ActorTemplate,
    ref=template_refs,
    metadata=metadata_st,
    containers=st.lists(container_st, max_size=2),
    resources=resources_st,
    worker_selector=labels_st,
    sandbox_class=st.sampled_from(m.SandboxClass),
    snapshot_config=snapshot_config_st,
    golden_snapshot=st.booleans(),
    golden_tag=st.none() | tag_refs,
    golden_error=TEXT,
)
storage_st = st.builds(
    m.SnapshotStorage,
    durability=st.sampled_from(m.Durability),
    status=st.sampled_from(m.StorageStatus),
    fidelity=st.sampled_from(m.Fidelity),
    uri=TEXT,
    local_name=TEXT,
    node=st.none() | node_refs,
)
snapshot_st = st.builds(
    m.Snapshot,
    generation=INT64,
    snapshot_id=TEXT,
    owner=st.sampled_from(m.SnapshotOwner),
    template_uid=TEXT,
    sandbox_class=st.sampled_from(m.SandboxClass),
    runtime_version=TEXT,
    captured_at=FLOATS,
    source_tag=st.none() | tag_refs,
    storages=st.lists(storage_st, max_size=2),
)
assignment_st = st.builds(
    m.WorkerAssignment,
    worker=worker_refs,
    node=node_refs,
    worker_epoch=INT64,
    pod_ips=st.lists(TEXT, max_size=2),
    resources=resources_st,
)
crash_st = st.builds(m.Crash, message=TEXT, time=FLOATS)
status_st = st.builds(
    m.ActorStatus,
    state=st.sampled_from(m.ActorState),
    assignment=st.none() | assignment_st,
    snapshots=st.lists(snapshot_st, max_size=2),
    crash=st.none() | crash_st,
    assigned_node=st.none() | node_refs,
    last_assigned_generation=INT64,
    in_progress_generation=INT64,
)
actor_st = st.builds(
    m.Actor,
    ref=actor_refs,
    metadata=metadata_st,
    template=template_refs,
    worker_selector=labels_st,
    source_tag=st.none() | tag_refs,
    status=status_st,
)
worker_st = st.builds(
    m.Worker,
    ref=worker_refs,
    metadata=metadata_st,
    pool=TEXT,
    node=node_refs,
    ips=st.lists(TEXT, max_size=2),
    sandbox_class=st.sampled_from(m.SandboxClass),
    runtime_versions=st.frozensets(TEXT, max_size=3),
    labels=labels_st,
    epoch=INT64,
    state=st.sampled_from(m.WorkerState),
    capacity=st.none() | capacity_st,
    allocated=capacity_st,
    last_heartbeat=FLOATS,
    spiffe_id=TEXT,
    tunnel_address=TEXT,
)
tag_st = st.builds(
    m.Tag,
    ref=tag_refs,
    metadata=metadata_st,
    source_actor=st.none() | actor_refs,
    template=st.none() | template_refs,
    snapshot=st.none() | snapshot_st,
)
atespace_st = st.builds(m.Atespace, name=NAMES, metadata=metadata_st)
resume_st = st.builds(
    c.ResumeResult,
    actor=actor_st,
    resumed=st.booleans(),
    source=st.none() | st.sampled_from(RestoreSource),
    generation=INT64,
    snapshot_age_seconds=FLOATS,
    resume_duration_seconds=FLOATS,
)

# (strategy, to_proto, from_proto, message class)
CASES: dict[
    str, tuple[st.SearchStrategy[Any], Callable[[Any], Any], Callable[[Any], Any], type]
] = {
    "metadata": (metadata_st, c.metadata_to_proto, c.metadata_from_proto, pb.ResourceMetadata),
    "resources": (resources_st, c.resources_to_proto, c.resources_from_proto, pb.Resources),
    "capacity": (capacity_st, c.capacity_to_proto, c.capacity_from_proto, pb.Capacity),
    "probe": (probe_st, c.probe_to_proto, c.probe_from_proto, pb.Probe),
    "env": (env_st, c.env_var_to_proto, c.env_var_from_proto, pb.EnvVar),
    "container": (container_st, c.container_to_proto, c.container_from_proto, pb.Container),
    "snapshot_config": (
        snapshot_config_st,
        c.snapshot_config_to_proto,
        c.snapshot_config_from_proto,
        pb.SnapshotConfig,
    ),
    "template": (
        template_st,
        c.actor_template_to_proto,
        c.actor_template_from_proto,
        pb.ActorTemplate,
    ),
    "storage": (
        storage_st,
        c.snapshot_storage_to_proto,
        c.snapshot_storage_from_proto,
        pb.SnapshotStorage,
    ),
    "snapshot": (snapshot_st, c.snapshot_to_proto, c.snapshot_from_proto, pb.Snapshot),
    "assignment": (
        assignment_st,
        c.worker_assignment_to_proto,
        c.worker_assignment_from_proto,
        pb.WorkerAssignment,
    ),
    "crash": (crash_st, c.crash_to_proto, c.crash_from_proto, pb.Crash),
    "status": (status_st, c.actor_status_to_proto, c.actor_status_from_proto, pb.ActorStatus),
    "actor": (actor_st, c.actor_to_proto, c.actor_from_proto, pb.Actor),
    "worker": (worker_st, c.worker_to_proto, c.worker_from_proto, pb.Worker),
    "tag": (tag_st, c.tag_to_proto, c.tag_from_proto, pb.Tag),
    "atespace": (atespace_st, c.atespace_to_proto, c.atespace_from_proto, pb.Atespace),
    "resume": (
        resume_st,
        c.resume_result_to_proto,
        c.resume_result_from_proto,
        pb.ResumeActorResponse,
    ),
}


# --- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
@given(data=st.data())
def test_round_trip(case: str, data: st.DataObject) -> None:
    strategy, to_proto, from_proto, message_cls = CASES[case]
    record = data.draw(strategy)
    message: betterproto.Message = to_proto(record)
    assert isinstance(message, message_cls)
    assert from_proto(message) == record
    wire = bytes(message)
    parsed = message_cls().parse(wire)
    assert from_proto(parsed) == record
    assert bytes(parsed) == wire


@given(labels=labels_st)
def test_labels_round_trip(labels: Labels) -> None:
    assert c.labels_from_proto(c.labels_to_proto(labels)) == labels


@given(ref=actor_refs | template_refs | tag_refs)
def test_object_ref_round_trip(ref: ActorRef | TemplateRef | TagRef) -> None:
    message = c.object_ref_to_proto(ref)
    back = {
        ActorRef: c.actor_ref_from_proto,
        TemplateRef: c.template_ref_from_proto,
        TagRef: c.tag_ref_from_proto,
    }[type(ref)](message)
    assert back == ref


def test_absent_optionals_stay_absent_on_the_wire() -> None:
    actor = m.Actor(ref=ActorRef("a", "b"), template=TemplateRef("a", "t"))
    parsed = pb.Actor().parse(bytes(c.actor_to_proto(actor)))
    assert parsed.source_tag is None
    assert parsed.status.assignment is None
    assert parsed.status.crash is None
    assert parsed.status.assigned_node is None
    assert c.actor_from_proto(parsed) == actor


# --- enums --------------------------------------------------------------------------------

ENUM_PAIRS: list[tuple[type[enum.Enum], type[betterproto.Enum]]] = [
    (m.ActorState, pb.ActorState),
    (m.WorkerState, pb.WorkerState),
    (m.SandboxClass, pb.SandboxClass),
    (m.Fidelity, pb.Fidelity),
    (m.Durability, pb.Durability),
    (m.StorageStatus, pb.StorageStatus),
    (m.SnapshotOwner, pb.SnapshotOwner),
    (m.SuspendMode, pb.SuspendMode),
]


@pytest.mark.parametrize(("model_enum", "wire_enum"), ENUM_PAIRS, ids=lambda e: e.__name__)
def test_enum_names_and_numbers_match(
    model_enum: type[enum.Enum], wire_enum: type[betterproto.Enum]
) -> None:
    wire = {member.name: int(member) for member in wire_enum}
    assert wire.pop("UNSPECIFIED") == 0
    assert {member.name: member.value for member in model_enum} == wire


def test_actor_state_wire_names() -> None:
    for state in m.ActorState:
        assert state.wire_name == f"ACTOR_STATE_{pb.ActorState(state.value).name}"


def test_restore_source_covers_every_wire_value() -> None:
    assert {c.restore_source_to_proto(s, resumed=True).name for s in RestoreSource} == {
        "LOCAL",
        "DURABLE",
        "TAG",
    }
    assert c.restore_source_to_proto(None, resumed=True) == pb.RestoreSource.COLD_BOOT
    assert c.restore_source_to_proto(None, resumed=False) == pb.RestoreSource.UNSPECIFIED
    assert {int(v) for v in pb.RestoreSource} == {0, 1, 2, 3, 4}


def test_resume_result_provenance() -> None:
    actor = m.Actor(ref=ActorRef("a", "b"), template=TemplateRef("a", "t"))
    assert c.ResumeResult(actor=actor, resumed=True).provenance == "cold-boot"
    assert c.ResumeResult(actor=actor, resumed=True).cold_boot
    assert c.ResumeResult(actor=actor, resumed=False).provenance == ""
    tagged = c.ResumeResult(actor=actor, resumed=True, source=RestoreSource.TAG)
    assert tagged.provenance == "tag"
    assert not tagged.cold_boot


def test_unspecified_required_enum_is_invalid() -> None:
    status = c.actor_status_to_proto(m.ActorStatus())
    status.state = pb.ActorState(0)
    with pytest.raises(InvalidArgument, match="actor status state is required"):
        c.actor_status_from_proto(status)


def test_unknown_enum_number_is_invalid() -> None:
    # A newer peer's value arrives as a pseudo-member betterproto makes up.
    wire = bytes(
        c.snapshot_storage_to_proto(
            m.SnapshotStorage(
                durability=m.Durability.LOCAL,
                status=m.StorageStatus.COMPLETED,
                fidelity=m.Fidelity.MEMORY,
            )
        )
    )
    message = pb.SnapshotStorage().parse(wire + bytes([8, 77]))  # durability = 77
    with pytest.raises(
        InvalidArgument, match="snapshot storage durability has an unknown value 77"
    ):
        c.snapshot_storage_from_proto(message)


def test_defaults_for_unspecified_optional_enums() -> None:
    assert c.snapshot_config_from_proto(pb.SnapshotConfig()).preferred_fidelity is m.Fidelity.MEMORY
    assert c.suspend_mode_from_proto(pb.SuspendMode.UNSPECIFIED) is m.SuspendMode.ASYNC
    assert c.suspend_mode_from_proto(pb.SuspendMode.SYNC) is m.SuspendMode.SYNC


def test_negative_quantities_are_invalid() -> None:
    with pytest.raises(InvalidArgument, match="cpu_milli must not be negative"):
        c.resources_from_proto(pb.Resources(cpu_milli=-1))
    with pytest.raises(InvalidArgument, match="actors must not be negative"):
        c.capacity_from_proto(pb.Capacity(actors=-3))


# --- request parsing ----------------------------------------------------------------------


def ref(atespace: str = "team", name: str = "a") -> pb.ObjectRef:
    return pb.ObjectRef(atespace=atespace, name=name)


def template_request(**overrides: Any) -> pb.ActorTemplate:
    fields: dict[str, Any] = {
        "ref": ref(name="tpl"),
        "containers": [pb.Container(name="main", image="img@sha256:00")],
    }
    fields.update(overrides)
    return pb.ActorTemplate(**fields)


def test_parse_create_template_applies_defaults_and_drops_outputs() -> None:
    request = pb.CreateActorTemplateRequest(
        template=template_request(
            metadata=pb.ResourceMetadata(uid="client-made", version=7),
            containers=[
                pb.Container(name="main", image="img", wakeup_probe=pb.Probe(path="/ready"))
            ],
            golden_tag=ref(name="g"),
            golden_error="old",
            worker_selector={"zone": "a"},
        )
    )
    t = c.parse_create_actor_template(request)
    assert t.ref == TemplateRef("team", "tpl")
    assert t.metadata == m.Metadata()
    assert t.sandbox_class is m.SandboxClass.GVISOR
    assert t.snapshot_config.preferred_fidelity is m.Fidelity.MEMORY
    assert t.containers[0].ports == (80,)
    assert t.containers[0].wakeup_probe == m.Probe(path="/ready", port=80, timeout_seconds=30)
    assert t.golden_tag is None
    assert t.golden_error == ""
    assert t.worker_selector == Labels.of(zone="a")


def test_parse_update_template_keeps_preconditions() -> None:
    request = pb.UpdateActorTemplateRequest(
        template=template_request(
            metadata=pb.ResourceMetadata(uid="u1", version=3, create_time=5.0)
        )
    )
    t = c.parse_update_actor_template(request)
    assert t.metadata == m.Metadata(uid="u1", version=3)


BAD_REQUESTS: list[tuple[Callable[[Any], Any], Any, str]] = [
    (c.parse_get_actor, pb.GetActorRequest(), "actor reference is required"),
    (c.parse_get_actor, pb.GetActorRequest(ref=ref("Team")), "actor atespace 'Team' is invalid"),
    (c.parse_get_actor, pb.GetActorRequest(ref=ref(name="")), "actor name is required"),
    (c.parse_get_actor, pb.GetActorRequest(ref=ref(atespace="")), "actor atespace is required"),
    (c.parse_pause_actor, pb.PauseActorRequest(ref=ref(name="a_b")), "actor name 'a_b'"),
    (c.parse_resume_actor, pb.ResumeActorRequest(), "actor reference is required"),
    (c.parse_revert_actor, pb.RevertActorRequest(), "actor reference is required"),
    (c.parse_delete_actor, pb.DeleteActorRequest(), "actor reference is required"),
    (c.parse_create_atespace, pb.CreateAtespaceRequest(), "atespace is required"),
    (c.parse_create_atespace, pb.CreateAtespaceRequest(name="-x"), "atespace '-x' is invalid"),
    (c.parse_get_atespace, pb.GetAtespaceRequest(name="x" * 64), "no more than 63"),
    (c.parse_delete_atespace, pb.DeleteAtespaceRequest(), "atespace is required"),
    (
        c.parse_create_actor,
        pb.CreateActorRequest(ref=ref()),
        "a template or a source tag is required",
    ),
    (
        c.parse_create_actor,
        pb.CreateActorRequest(ref=ref(), template=ref(name="T")),
        "template name 'T' is invalid",
    ),
    (
        c.parse_create_actor,
        pb.CreateActorRequest(ref=ref(), source_tag=pb.ObjectRef(atespace="x")),
        "source tag name is required",
    ),
    (
        c.parse_create_actor,
        pb.CreateActorRequest(
            ref=ref(), template=ref(name="t"), worker_selector={f"k{i}": "v" for i in range(11)}
        ),
        "actor worker selector has 11 labels, more than the limit of 10",
    ),
    (
        c.parse_update_actor,
        pb.UpdateActorRequest(ref=ref(), worker_selector={"bad key!": "v"}),
        "actor worker selector: label key 'bad key!' is invalid",
    ),
    (
        c.parse_suspend_actor,
        pb.SuspendActorRequest(ref=ref(), mode=pb.SuspendMode.try_value(9)),
        "suspend mode has an unknown value 9",
    ),
    (c.parse_list_actors, pb.ListActorsRequest(page_size=-1), "page_size -1 must be in 0..1000"),
    (c.parse_list_actors, pb.ListActorsRequest(page_size=1001), "page_size 1001"),
    (c.parse_list_actors, pb.ListActorsRequest(atespace="A"), "atespace 'A' is invalid"),
    (
        c.parse_create_actor_template,
        pb.CreateActorTemplateRequest(),
        "template reference is required",
    ),
    (
        c.parse_create_actor_template,
        pb.CreateActorTemplateRequest(template=template_request(containers=[])),
        "template must have at least one container",
    ),
    (
        c.parse_create_actor_template,
        pb.CreateActorTemplateRequest(
            template=template_request(containers=[pb.Container(name="main")])
        ),
        "container 'main' image is required",
    ),
    (
        c.parse_create_actor_template,
        pb.CreateActorTemplateRequest(
            template=template_request(containers=[pb.Container(name="pause", image="i")])
        ),
        "container name 'pause' is reserved",
    ),
    (
        c.parse_create_actor_template,
        pb.CreateActorTemplateRequest(
            template=template_request(
                containers=[pb.Container(name="m", image="i", wakeup_probe=pb.Probe(path="x"))]
            )
        ),
        "wakeup probe path 'x' must start with '/'",
    ),
    (
        c.parse_create_actor_template,
        pb.CreateActorTemplateRequest(
            template=template_request(resources=pb.Resources(memory_bytes=-5))
        ),
        "template resources: memory_bytes must not be negative (got -5)",
    ),
    (
        c.parse_create_actor_template,
        pb.CreateActorTemplateRequest(
            template=template_request(sandbox_class=pb.SandboxClass.try_value(42))
        ),
        "template sandbox class has an unknown value 42",
    ),
    (
        c.parse_update_actor_template,
        pb.UpdateActorTemplateRequest(
            template=template_request(metadata=pb.ResourceMetadata(version=-1))
        ),
        "template metadata version must not be negative",
    ),
    (c.parse_get_actor_template, pb.GetActorTemplateRequest(), "template reference is required"),
    (c.parse_delete_actor_template, pb.DeleteActorTemplateRequest(), "template reference"),
    (c.parse_list_actor_templates, pb.ListActorTemplatesRequest(), "atespace is required"),
    (c.parse_create_tag, pb.CreateTagRequest(ref=ref()), "actor reference is required"),
    (c.parse_create_tag, pb.CreateTagRequest(actor=ref()), "tag reference is required"),
    (c.parse_get_tag, pb.GetTagRequest(ref=ref(name="UP")), "tag name 'UP' is invalid"),
    (c.parse_delete_tag, pb.DeleteTagRequest(), "tag reference is required"),
    (c.parse_list_tags, pb.ListTagsRequest(), "atespace is required"),
    (c.parse_get_worker, pb.GetWorkerRequest(), "worker name is required"),
    (c.parse_drain_worker, pb.DrainWorkerRequest(name="Bad_Name"), "worker name 'Bad_Name'"),
]


@pytest.mark.parametrize(
    ("parse", "request_", "message"),
    BAD_REQUESTS,
    ids=[f"{p.__name__}-{i}" for i, (p, _, _) in enumerate(BAD_REQUESTS)],
)
def test_bad_requests_are_invalid_arguments(
    parse: Callable[[Any], Any], request_: Any, message: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse(request_)
    assert message in info.value.description


def test_parse_create_actor_defaults_atespaces_to_the_actors() -> None:
    args = c.parse_create_actor(
        pb.CreateActorRequest(
            ref=ref("team", "a"),
            template=pb.ObjectRef(name="t"),
            source_tag=pb.ObjectRef(atespace="lib", name="golden"),
            worker_selector={"zone": "b"},
        )
    )
    assert args == c.CreateActorArgs(
        ref=ActorRef("team", "a"),
        template=TemplateRef("team", "t"),
        source_tag=TagRef("lib", "golden"),
        worker_selector=Labels.of(zone="b"),
    )
    from_tag = c.parse_create_actor(
        pb.CreateActorRequest(ref=ref("team", "a"), source_tag=pb.ObjectRef(name="g"))
    )
    assert from_tag.template is None
    assert from_tag.source_tag == TagRef("team", "g")


def test_parse_simple_requests() -> None:
    assert c.parse_list_actors(pb.ListActorsRequest()) == c.ListActorsArgs(
        atespace=None, page_size=c.DEFAULT_PAGE_SIZE, page_token=""
    )
    assert c.parse_list_actors(
        pb.ListActorsRequest(page_size=5, page_token="t", atespace="team")
    ) == c.ListActorsArgs(atespace="team", page_size=5, page_token="t")
    assert c.parse_suspend_actor(
        pb.SuspendActorRequest(ref=ref(), mode=c.suspend_mode_to_proto(m.SuspendMode.SYNC))
    ) == c.SuspendActorArgs(ref=ActorRef("team", "a"), mode=m.SuspendMode.SYNC)
    assert c.parse_suspend_actor(pb.SuspendActorRequest(ref=ref())).mode is m.SuspendMode.ASYNC
    assert c.parse_delete_actor(pb.DeleteActorRequest(ref=ref(), force=True)).force
    assert c.parse_update_actor(pb.UpdateActorRequest(ref=ref())).worker_selector == Labels()
    assert c.parse_create_tag(
        pb.CreateTagRequest(ref=ref(name="t1"), actor=pb.ObjectRef(name="a"))
    ) == c.CreateTagArgs(ref=TagRef("team", "t1"), actor=ActorRef("team", "a"))
    assert c.parse_create_atespace(pb.CreateAtespaceRequest(name="team")) == m.Atespace(name="team")
    assert c.parse_list_workers(pb.ListWorkersRequest()) is None
    assert c.parse_list_workers(pb.ListWorkersRequest(pool="gpu")) == "gpu"
    assert c.parse_get_worker(pb.GetWorkerRequest(name="w-1.node")) == WorkerRef("w-1.node")


def register_request(**overrides: Any) -> pb.RegisterWorkerRequest:
    fields: dict[str, Any] = {
        "name": "w1",
        "node": "node-a",
        "ips": ["10.0.0.2"],
        "sandbox_class": pb.SandboxClass.GVISOR,
        "runtime_versions": ["runsc-2022", "runsc-2023"],
        "labels": {"zone": "a"},
        "epoch": 4,
        "capacity": pb.Capacity(cpu_milli=4000, memory_bytes=2**33, actors=50),
        "tunnel_address": "10.0.0.2:7000",
    }
    fields.update(overrides)
    return pb.RegisterWorkerRequest(**fields)


def test_parse_register_worker() -> None:
    w = c.parse_register_worker(register_request())
    assert w.ref == WorkerRef("w1")
    assert w.node == NodeRef("node-a")
    assert w.pool == "default"
    assert w.runtime_versions == frozenset({"runsc-2022", "runsc-2023"})
    assert w.capacity == m.Capacity(cpu_milli=4000, memory_bytes=2**33, actors=50)
    assert w.epoch == 4
    assert w.labels == Labels.of(zone="a")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": ""}, "worker name is required"),
        ({"node": "Node"}, "worker node 'Node' is invalid"),
        ({"sandbox_class": pb.SandboxClass.UNSPECIFIED}, "worker sandbox class is required"),
        ({"epoch": 0}, "worker epoch must be positive"),
        ({"capacity": None}, "worker capacity is required"),
        ({"capacity": pb.Capacity(actors=-1)}, "worker capacity: actors must not be negative"),
        ({"labels": {"k": "bad value!"}}, "worker labels: label 'k' value 'bad value!'"),
    ],
)
def test_parse_register_worker_rejects(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        c.parse_register_worker(register_request(**overrides))
    assert message in info.value.description


def test_parse_heartbeat_and_suspend_request() -> None:
    hb = c.parse_heartbeat(pb.HeartbeatRequest(name="w1", epoch=2))
    assert hb == c.HeartbeatArgs(worker=WorkerRef("w1"), epoch=2, capacity=None)
    hb = c.parse_heartbeat(pb.HeartbeatRequest(name="w1", epoch=2, capacity=pb.Capacity()))
    assert hb.capacity == m.Capacity()
    with pytest.raises(InvalidArgument, match="worker epoch must be positive"):
        c.parse_heartbeat(pb.HeartbeatRequest(name="w1"))

    request = pb.RequestActorSuspendRequest(
        worker="w1", worker_epoch=2, actor=ref(), actor_uid="uid-1"
    )
    assert c.parse_request_actor_suspend(request) == c.ActorSuspendRequestArgs(
        worker=WorkerRef("w1"), worker_epoch=2, actor=ActorRef("team", "a"), actor_uid="uid-1"
    )
    with pytest.raises(InvalidArgument, match="actor uid is required"):
        c.parse_request_actor_suspend(pb.RequestActorSuspendRequest(worker="w1", worker_epoch=2))


valid_labels_st = st.dictionaries(NAMES, st.just("") | NAMES, max_size=10).map(Labels)
valid_container_st = st.builds(
    m.Container,
    name=NAMES.filter(lambda n: n != "pause"),
    image=TEXT.filter(bool),
    command=st.lists(TEXT, max_size=3),
    env=st.lists(
        st.builds(m.EnvVar, name=NAMES, value=TEXT), max_size=3, unique_by=lambda e: e.name
    ),
    ports=st.lists(st.integers(1, 65535), min_size=1, max_size=3),
    wakeup_probe=st.none()
    | st.builds(
        m.Probe,
        path=st.just("/") | NAMES.map(lambda n: "/" + n),
        port=st.integers(1, 65535),
        timeout_seconds=st.integers(1, 3600),
    ),
)
valid_template_st = st.builds(
    m.ActorTemplate,
    ref=template_refs,
    containers=st.lists(valid_container_st, min_size=1, max_size=3, unique_by=lambda x: x.name),
    resources=resources_st,
    worker_selector=valid_labels_st,
    sandbox_class=st.sampled_from(m.SandboxClass),
    snapshot_config=snapshot_config_st,
    golden_snapshot=st.booleans(),
)


@given(template=valid_template_st)
def test_parse_accepts_every_valid_template_unchanged(template: m.ActorTemplate) -> None:
    wire = c.actor_template_to_proto(template)
    request = pb.CreateActorTemplateRequest().parse(
        bytes(pb.CreateActorTemplateRequest(template=wire))
    )
    assert c.parse_create_actor_template(request) == template


@given(template=template_st)
def test_parse_rejects_only_with_invalid_argument(template: m.ActorTemplate) -> None:
    """Arbitrary (mostly invalid) templates: parse either accepts or raises InvalidArgument."""
    request = pb.CreateActorTemplateRequest(template=c.actor_template_to_proto(template))
    try:
        parsed = c.parse_create_actor_template(request)
    except InvalidArgument:
        return
    assert parsed.validate() == parsed
