"""NodeAgent records ⇄ Atelet messages: lossless round trips (properties), parsing, workers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import betterproto
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substrate.api import convert as c
from substrate.api import pb
from substrate.core.agent_ports import (
    CheckpointMode,
    CheckpointRequest,
    CheckpointResult,
    StartRequest,
    StartResult,
    UploadRequest,
    WorkloadTarget,
)
from substrate.core.ids import ActorRef, NodeRef, TemplateRef, WorkerRef
from substrate.core.model import (
    ActorTemplate,
    Container,
    Durability,
    Fidelity,
    Snapshot,
    SnapshotStorage,
    StorageStatus,
    Worker,
)
from substrate.errors import InvalidArgument
from substrate.testing import strategies as s

_M = TypeVar("_M", bound=betterproto.Message)

uids = st.uuids().map(str)
texts = st.text(st.characters(codec="utf-8"), max_size=20)

targets = st.builds(
    WorkloadTarget,
    actor=s.actor_refs(),
    actor_uid=uids,
    worker=s.worker_refs(),
    node=s.node_refs(),
    worker_epoch=st.integers(0, 2**62),
)


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    """The model strategy's snapshots, sometimes borrowed from a tag."""
    snap = draw(s.snapshots())
    return attrs.evolve(snap, source_tag=draw(st.none() | s.tag_refs()))


@st.composite
def start_requests(draw: st.DrawFn) -> StartRequest:
    request = StartRequest(
        target=draw(targets),
        template=draw(s.templates()),
        fidelity=draw(st.sampled_from(Fidelity)),
    )
    if draw(st.booleans()):
        return request  # cold boot
    snap = draw(snapshots())
    return attrs.evolve(request, snapshot=snap, storage=draw(st.sampled_from(snap.storages)))


start_results = st.builds(
    StartResult,
    worker_epoch=st.integers(0, 2**62),
    pod_ips=st.lists(st.sampled_from(["127.0.0.1", "10.0.0.2", "::1"]), max_size=2).map(tuple),
    duration=st.floats(0, 1e6, allow_nan=False),
)
checkpoint_requests = st.builds(
    CheckpointRequest,
    target=targets,
    template=s.templates(),
    mode=st.sampled_from(CheckpointMode),
    snapshot=snapshots(),
)
checkpoint_results = st.builds(CheckpointResult, snapshot=snapshots(), upload_error=texts)
upload_requests = st.builds(
    UploadRequest, actor=s.actor_refs(), actor_uid=uids, node=s.node_refs(), snapshot=snapshots()
)


SNAPSHOT_HEAVY = settings(max_examples=40)
"""Drawing model snapshots is slow (~40 ms each); 40 examples per property suffice here."""


def wire(message: _M) -> _M:
    """``message`` through its bytes; re-encoding gives the same bytes."""
    data = bytes(message)
    parsed = type(message)().parse(data)
    assert bytes(parsed) == data
    return parsed


# --- requests: ateapi → atelet → the port's record -----------------------------------------


@SNAPSHOT_HEAVY
@given(request=start_requests())
def test_start_request_round_trip(request: StartRequest) -> None:
    message = c.start_request_to_proto(request)
    if request.snapshot is None:
        assert isinstance(message, pb.RunRequest)
        assert c.parse_run(wire(message)) == request
    else:
        assert isinstance(message, pb.RestoreRequest)
        assert c.parse_restore(wire(message)) == request


@SNAPSHOT_HEAVY
@given(request=checkpoint_requests)
def test_checkpoint_request_round_trip(request: CheckpointRequest) -> None:
    assert c.parse_checkpoint(wire(c.checkpoint_request_to_proto(request))) == request


@SNAPSHOT_HEAVY
@given(request=upload_requests)
def test_upload_and_detach_requests_round_trip(request: UploadRequest) -> None:
    assert c.parse_upload_snapshot(wire(c.upload_request_to_proto(request))) == request
    assert c.parse_detach(wire(c.detach_request_to_proto(request))) == request


@given(target=targets)
def test_terminate_request_round_trip(target: WorkloadTarget) -> None:
    assert c.parse_terminate(wire(c.terminate_request_to_proto(target))) == target


@given(uid=uids, name=s.dns_labels(40))
def test_drop_snapshot_request_round_trip(uid: str, name: str) -> None:
    args = c.parse_drop_snapshot(wire(c.drop_snapshot_request_to_proto(uid, name)))
    assert (args.actor_uid, args.local_name) == (uid, name)


# --- replies: the port's result → ateapi -------------------------------------------------


@given(result=start_results, fidelity=st.sampled_from(Fidelity))
def test_start_result_round_trip(result: StartResult, fidelity: Fidelity) -> None:
    assert c.start_result_from_proto(wire(c.run_response_to_proto(result))) == result
    restored = wire(c.restore_response_to_proto(result, fidelity=fidelity))
    assert c.start_result_from_proto(restored) == result
    assert c.fidelity_from_proto(restored.fidelity) is fidelity


@SNAPSHOT_HEAVY
@given(result=checkpoint_results, epoch=st.integers(0, 2**62))
def test_checkpoint_result_round_trip(result: CheckpointResult, epoch: int) -> None:
    message = wire(c.checkpoint_result_to_proto(result, worker_epoch=epoch))
    assert c.checkpoint_result_from_proto(message) == result
    assert message.worker_epoch == epoch
    assert [c.snapshot_storage_from_proto(x) for x in message.storages] == list(
        result.snapshot.storages
    )


@SNAPSHOT_HEAVY
@given(snap=snapshots())
def test_snapshot_replies_round_trip(snap: Snapshot) -> None:
    assert c.upload_result_from_proto(wire(c.upload_result_to_proto(snap))) == snap
    assert c.detach_result_from_proto(wire(c.detach_result_to_proto(snap))) == snap


# --- the flat fields say what the records say ---------------------------------------------

TARGET = WorkloadTarget(
    actor=ActorRef("lab", "a1"),
    actor_uid="uid-1",
    worker=WorkerRef("w-0-0"),
    node=NodeRef("node-0"),
    worker_epoch=4,
)
TEMPLATE = ActorTemplate(
    ref=TemplateRef("lab", "counter"),
    containers=(Container(name="app", image="local/counter"),),
)
LOCAL = SnapshotStorage(
    durability=Durability.LOCAL,
    status=StorageStatus.IN_PROGRESS,
    fidelity=Fidelity.ROOTFS,
    local_name="snap7",
    node=NodeRef("node-0"),
)
DURABLE = SnapshotStorage(
    durability=Durability.DURABLE,
    status=StorageStatus.PENDING,
    fidelity=Fidelity.ROOTFS,
    uri="memory://bucket/snap7",
)
SNAP = Snapshot(generation=7, snapshot_id="snap7", storages=(LOCAL, DURABLE))


def test_flat_fields_of_a_checkpoint() -> None:
    request = CheckpointRequest(
        target=TARGET, template=TEMPLATE, mode=CheckpointMode.SUSPEND_SYNC, snapshot=SNAP
    )
    m = c.checkpoint_request_to_proto(request)
    assert (m.worker, m.worker_epoch, m.node) == ("w-0-0", 4, "node-0")
    assert (m.actor.ref.name, m.actor.uid, m.actor.template.name) == ("a1", "uid-1", "counter")
    assert (m.snapshot_id, m.generation, m.local_name) == ("snap7", 7, "snap7")
    assert m.destination_uri == "memory://bucket/snap7"
    assert m.fidelity == pb.Fidelity.ROOTFS
    assert m.mode == pb.CheckpointMode.SUSPEND_SYNC


def test_flat_fields_of_a_restore_name_the_copy_to_read() -> None:
    done = attrs.evolve(LOCAL, status=StorageStatus.COMPLETED)
    local = c.start_request_to_proto(
        StartRequest(target=TARGET, template=TEMPLATE, snapshot=SNAP, storage=done)
    )
    assert isinstance(local, pb.RestoreRequest)
    assert (local.snapshot.local_name, local.snapshot.object_uri) == ("snap7", "")
    assert [x.name for x in local.spec.containers] == ["app"]
    durable = c.start_request_to_proto(
        StartRequest(target=TARGET, template=TEMPLATE, snapshot=SNAP, storage=DURABLE)
    )
    assert isinstance(durable, pb.RestoreRequest)
    assert durable.snapshot.object_uri == "memory://bucket/snap7"
    assert durable.snapshot.local_name == ""


def test_flat_fields_of_a_detach() -> None:
    m = c.detach_request_to_proto(
        UploadRequest(actor=TARGET.actor, actor_uid="uid-1", node=TARGET.node, snapshot=SNAP)
    )
    assert (m.local_names, m.upload_local_name) == (["snap7"], "snap7")
    done = SNAP.with_storage(attrs.evolve(DURABLE, status=StorageStatus.COMPLETED))
    m = c.detach_request_to_proto(
        UploadRequest(actor=TARGET.actor, actor_uid="uid-1", node=TARGET.node, snapshot=done)
    )
    assert (m.local_names, m.upload_local_name) == (["snap7"], "")


def test_checkpoint_modes_match_the_wire() -> None:
    wire_modes = {member.name: int(member) for member in pb.CheckpointMode}
    assert wire_modes.pop("UNSPECIFIED") == 0
    assert {m.name: m.value for m in CheckpointMode} == wire_modes


# --- refusals ------------------------------------------------------------------------------


def _without(message: _M, **changes: Any) -> _M:
    for name, value in changes.items():
        setattr(message, name, value)
    return wire(message)


def _run() -> pb.RunRequest:
    m = c.start_request_to_proto(StartRequest(target=TARGET, template=TEMPLATE))
    assert isinstance(m, pb.RunRequest)
    return m


def _restore() -> pb.RestoreRequest:
    m = c.start_request_to_proto(
        StartRequest(target=TARGET, template=TEMPLATE, snapshot=SNAP, storage=LOCAL)
    )
    assert isinstance(m, pb.RestoreRequest)
    return m


def _checkpoint() -> pb.CheckpointRequest:
    return c.checkpoint_request_to_proto(
        CheckpointRequest(
            target=TARGET, template=TEMPLATE, mode=CheckpointMode.PAUSE, snapshot=SNAP
        )
    )


BAD: list[tuple[Callable[[Any], Any], Callable[[], Any], str]] = [
    (c.parse_run, lambda: _without(_run(), template=None), "template is required"),
    (c.parse_run, lambda: _without(_run(), worker=""), "worker name is required"),
    (c.parse_run, lambda: _without(_run(), node="Node_0"), "node 'Node_0' is invalid"),
    (c.parse_run, lambda: _without(_run(), worker_epoch=-1), "worker epoch must not be negative"),
    (
        c.parse_run,
        lambda: _without(
            _run(), actor=pb.ActorIdentity(ref=pb.ObjectRef(atespace="lab", name="a1"))
        ),
        "actor uid is required",
    ),
    (
        c.parse_run,
        lambda: _without(_run(), actor=pb.ActorIdentity(uid="u")),
        "actor reference is required",
    ),
    (
        c.parse_restore,
        lambda: _without(
            _restore(), snapshot=dataclasses.replace(_restore().snapshot, storage=None)
        ),
        "restore snapshot storage is required",
    ),
    (
        c.parse_restore,
        lambda: _without(
            _restore(), snapshot=dataclasses.replace(_restore().snapshot, record=None)
        ),
        "restore snapshot record is required",
    ),
    (
        c.parse_restore,
        lambda: _without(
            _restore(), snapshot=dataclasses.replace(_restore().snapshot, fidelity=pb.Fidelity(0))
        ),
        "restore fidelity is required",
    ),
    (c.parse_checkpoint, lambda: _without(_checkpoint(), snapshot=None), "checkpoint snapshot"),
    (
        c.parse_checkpoint,
        lambda: _without(_checkpoint(), mode=pb.CheckpointMode(0)),
        "checkpoint mode is required",
    ),
    (
        c.parse_drop_snapshot,
        lambda: pb.DropSnapshotRequest(actor=pb.ActorIdentity(uid="u"), local_name="a/b"),
        "single directory name",
    ),
    (
        c.parse_drop_snapshot,
        lambda: pb.DropSnapshotRequest(actor=pb.ActorIdentity(uid="u"), local_name="."),
        "single directory name",
    ),
    (
        c.parse_drop_snapshot,
        lambda: pb.DropSnapshotRequest(local_name="snap7"),
        "actor uid is required",
    ),
    (
        c.checkpoint_result_from_proto,
        lambda: pb.CheckpointResponse(worker_epoch=1),
        "checkpoint reply snapshot is required",
    ),
    (
        c.upload_result_from_proto,
        lambda: pb.UploadSnapshotResponse(),
        "upload reply snapshot is required",
    ),
]


@pytest.mark.parametrize(("parse", "make", "message"), BAD)
def test_malformed_messages_are_invalid(
    parse: Callable[[Any], Any], make: Callable[[], Any], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse(make())


def test_a_start_request_must_be_consistent() -> None:
    with pytest.raises(InvalidArgument, match="cold boot reads no snapshot storage"):
        c.start_request_to_proto(StartRequest(target=TARGET, template=TEMPLATE, storage=LOCAL))
    with pytest.raises(InvalidArgument, match="needs the snapshot storage"):
        c.start_request_to_proto(StartRequest(target=TARGET, template=TEMPLATE, snapshot=SNAP))


def test_an_unspecified_run_fidelity_is_memory() -> None:
    assert c.parse_run(_without(_run(), fidelity=pb.Fidelity(0))).fidelity is Fidelity.MEMORY


# --- workers carry their node's atelet address --------------------------------------------


@given(worker=s.workers(), address=st.sampled_from(["", "10.0.0.2:7444", "[::1]:7444"]))
def test_worker_round_trip_keeps_the_atelet_address(worker: Worker, address: str) -> None:
    worker = attrs.evolve(worker, atelet_address=address)
    assert c.worker_from_proto(wire(c.worker_to_proto(worker))) == worker


def _registration(**overrides: Any) -> pb.RegisterWorkerRequest:
    fields: dict[str, Any] = {
        "name": "w1",
        "node": "node-a",
        "sandbox_class": pb.SandboxClass.GVISOR,
        "epoch": 1,
        "capacity": pb.Capacity(cpu_milli=1000, memory_bytes=1 << 30, actors=4),
        "atelet_address": "10.0.0.2:7444",
    }
    fields.update(overrides)
    return pb.RegisterWorkerRequest(**fields)


def test_parse_register_worker_takes_the_atelet_address() -> None:
    assert c.parse_register_worker(_registration()).atelet_address == "10.0.0.2:7444"
    assert c.parse_register_worker(_registration(atelet_address="")).atelet_address == ""
    v6 = _registration(atelet_address="[fd00::1]:7444")
    assert c.parse_register_worker(v6).atelet_address == "[fd00::1]:7444"


@pytest.mark.parametrize("address", ["10.0.0.2", "10.0.0.2:0", ":7444", "a:b:7444", "h:99999"])
def test_parse_register_worker_refuses_a_bad_atelet_address(address: str) -> None:
    with pytest.raises(InvalidArgument, match=r"worker atelet address .* must be host:port"):
        c.parse_register_worker(_registration(atelet_address=address))


def test_parse_host_port() -> None:
    assert c.parse_host_port("127.0.0.1:7444") == ("127.0.0.1", 7444)
    assert c.parse_host_port("[::1]:1") == ("::1", 1)
    assert c.parse_host_port("atelet.node-0:65535") == ("atelet.node-0", 65535)
    for bad in ("", "host", "host:", "[::1]", "[]:80", "host:²"):
        with pytest.raises(InvalidArgument, match="must be host:port"):
            c.parse_host_port(bad)
