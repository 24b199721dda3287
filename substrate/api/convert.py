"""Conversion between the domain model (:mod:`substrate.core.model`) and the wire (:mod:`.pb`).

Two kinds of functions live here:

* ``<record>_to_proto`` / ``<record>_from_proto``: structural, total conversions. Every model
  record maps to a message and back to an equal record (``from(to(x)) == x``). Decoding
  checks only what the model itself needs: an enum that is UNSPECIFIED (or a number this
  version does not know) where the record requires a value, and negative quantities, raise
  :class:`~substrate.errors.InvalidArgument`. Names are not validated, so a stored record
  always reads back.
* ``parse_<rpc>``: request parsing for servers. They apply the defaults the ``.proto``
  comments document (e.g. an UNSPECIFIED suspend mode is ASYNC), validate names, labels and
  specs, and raise :class:`~substrate.errors.InvalidArgument` with a message naming the
  offending field.

The node agent's records (:mod:`substrate.core.agent_ports`) travel the same way over the
Atelet service: ``*_to_proto`` builds ateapi's requests (and atelet's replies), ``parse_*``
and ``*_from_proto`` read them back, losing no field of the records.

Model numbers of every enum equal the wire numbers (``tests/api/test_convert.py`` checks it).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final, TypeVar

import attrs

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
from substrate.core.ids import (
    LABELS_MAX,
    SELECTOR_MAX_LABELS,
    ActorRef,
    Labels,
    NodeRef,
    TagRef,
    TemplateRef,
    WorkerRef,
    validate_dns_label,
    validate_dns_subdomain,
)
from substrate.core.model import (
    Actor,
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
    RestoreSource,
    ResumeResult,
    SandboxClass,
    Snapshot,
    SnapshotConfig,
    SnapshotOwner,
    SnapshotStorage,
    StorageStatus,
    SuspendMode,
    Tag,
    Worker,
    WorkerAssignment,
    WorkerState,
)
from substrate.errors import InvalidArgument

_E = TypeVar("_E", bound=enum.Enum)

DEFAULT_PAGE_SIZE: Final = 100
"""Page size of ListActors when the request leaves it 0."""
MAX_PAGE_SIZE: Final = 1000
"""Largest page size ListActors accepts."""
DEFAULT_POOL: Final = "default"
"""Pool of a worker that registers without one."""


# --- resume outcome -----------------------------------------------------------------------


# --- parsed requests ----------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class CreateActorArgs:
    """A validated CreateActor request: from a template, a tag, or both."""

    ref: ActorRef
    template: TemplateRef | None
    """None when the actor takes its template from ``source_tag``."""
    source_tag: TagRef | None
    worker_selector: Labels


@attrs.frozen(slots=True, kw_only=True)
class ListActorsArgs:
    """A validated ListActors request."""

    atespace: str | None
    """None lists every atespace."""
    page_size: int
    page_token: str


@attrs.frozen(slots=True, kw_only=True)
class UpdateActorArgs:
    """A validated UpdateActor request."""

    ref: ActorRef
    worker_selector: Labels


@attrs.frozen(slots=True, kw_only=True)
class SuspendActorArgs:
    """A validated SuspendActor request."""

    ref: ActorRef
    mode: SuspendMode


@attrs.frozen(slots=True, kw_only=True)
class DeleteActorArgs:
    """A validated DeleteActor request."""

    ref: ActorRef
    force: bool


@attrs.frozen(slots=True, kw_only=True)
class CreateTagArgs:
    """A validated CreateTag request."""

    ref: TagRef
    actor: ActorRef


@attrs.frozen(slots=True, kw_only=True)
class HeartbeatArgs:
    """A validated Heartbeat request."""

    worker: WorkerRef
    epoch: int
    capacity: Capacity | None
    """None keeps the registered capacity."""


@attrs.frozen(slots=True, kw_only=True)
class ActorSuspendRequestArgs:
    """A validated RequestActorSuspend request."""

    worker: WorkerRef
    worker_epoch: int
    actor: ActorRef
    actor_uid: str


# --- enums --------------------------------------------------------------------------------


def _enum_from_proto(value: int, model: type[_E], *, what: str, default: _E | None = None) -> _E:
    number = int(value)
    if number == 0:
        if default is None:
            raise InvalidArgument(f"{what} is required (got UNSPECIFIED)")
        return default
    try:
        return model(number)
    except ValueError:
        raise InvalidArgument(f"{what} has an unknown value {number}") from None


def actor_state_to_proto(value: ActorState) -> pb.ActorState:
    return pb.ActorState(value.value)


def actor_state_from_proto(value: int, *, what: str = "actor state") -> ActorState:
    return _enum_from_proto(value, ActorState, what=what)


def worker_state_to_proto(value: WorkerState) -> pb.WorkerState:
    return pb.WorkerState(value.value)


def worker_state_from_proto(value: int, *, what: str = "worker state") -> WorkerState:
    return _enum_from_proto(value, WorkerState, what=what)


def sandbox_class_to_proto(value: SandboxClass) -> pb.SandboxClass:
    return pb.SandboxClass(value.value)


def sandbox_class_from_proto(
    value: int, *, what: str = "sandbox class", default: SandboxClass | None = None
) -> SandboxClass:
    return _enum_from_proto(value, SandboxClass, what=what, default=default)


def fidelity_to_proto(value: Fidelity) -> pb.Fidelity:
    return pb.Fidelity(value.value)


def fidelity_from_proto(
    value: int, *, what: str = "fidelity", default: Fidelity | None = None
) -> Fidelity:
    return _enum_from_proto(value, Fidelity, what=what, default=default)


def durability_to_proto(value: Durability) -> pb.Durability:
    return pb.Durability(value.value)


def durability_from_proto(value: int, *, what: str = "durability") -> Durability:
    return _enum_from_proto(value, Durability, what=what)


def storage_status_to_proto(value: StorageStatus) -> pb.StorageStatus:
    return pb.StorageStatus(value.value)


def storage_status_from_proto(value: int, *, what: str = "storage status") -> StorageStatus:
    return _enum_from_proto(value, StorageStatus, what=what)


def snapshot_owner_to_proto(value: SnapshotOwner) -> pb.SnapshotOwner:
    return pb.SnapshotOwner(value.value)


def snapshot_owner_from_proto(value: int, *, what: str = "snapshot owner") -> SnapshotOwner:
    return _enum_from_proto(value, SnapshotOwner, what=what)


def suspend_mode_to_proto(value: SuspendMode) -> pb.SuspendMode:
    return pb.SuspendMode(value.value)


def suspend_mode_from_proto(value: int, *, what: str = "suspend mode") -> SuspendMode:
    """UNSPECIFIED means ASYNC, as the proto documents."""
    return _enum_from_proto(value, SuspendMode, what=what, default=SuspendMode.ASYNC)


# betterproto enum members type-check as plain ints, hence the pb.RestoreSource(...) calls.
_RESTORE_SOURCES: Final[Mapping[RestoreSource, int]] = {
    RestoreSource.LOCAL: pb.RestoreSource.LOCAL,
    RestoreSource.DURABLE: pb.RestoreSource.DURABLE,
    RestoreSource.TAG: pb.RestoreSource.TAG,
}
_RESTORE_SOURCES_BACK: Final[Mapping[int, RestoreSource]] = {
    v: k for k, v in _RESTORE_SOURCES.items()
}


def restore_source_to_proto(value: RestoreSource | None, *, resumed: bool) -> pb.RestoreSource:
    """None is COLD_BOOT for a resume that ran, UNSPECIFIED for one that did nothing."""
    if value is not None:
        return pb.RestoreSource(_RESTORE_SOURCES[value])
    return pb.RestoreSource(pb.RestoreSource.COLD_BOOT if resumed else pb.RestoreSource.UNSPECIFIED)


def restore_source_from_proto(value: int, *, what: str = "restore source") -> RestoreSource | None:
    """COLD_BOOT and UNSPECIFIED are None (``resumed`` tells them apart)."""
    number = int(value)
    if number in (pb.RestoreSource.UNSPECIFIED, pb.RestoreSource.COLD_BOOT):
        return None
    try:
        return _RESTORE_SOURCES_BACK[number]
    except KeyError:
        raise InvalidArgument(f"{what} has an unknown value {number}") from None


# --- names and small values ---------------------------------------------------------------


def labels_to_proto(labels: Labels) -> dict[str, str]:
    """Labels as a wire map. Keys are never empty in valid labels; betterproto 2.0.0b7 would
    drop an entry whose key and value are both empty."""
    return labels.as_dict()


def labels_from_proto(labels: Mapping[str, str]) -> Labels:
    return Labels(labels)


def object_ref_to_proto(ref: ActorRef | TemplateRef | TagRef) -> pb.ObjectRef:
    return pb.ObjectRef(atespace=ref.atespace, name=ref.name)


def actor_ref_from_proto(ref: pb.ObjectRef) -> ActorRef:
    return ActorRef(atespace=ref.atespace, name=ref.name)


def template_ref_from_proto(ref: pb.ObjectRef) -> TemplateRef:
    return TemplateRef(atespace=ref.atespace, name=ref.name)


def tag_ref_from_proto(ref: pb.ObjectRef) -> TagRef:
    return TagRef(atespace=ref.atespace, name=ref.name)


def _opt_tag_ref_from_proto(ref: pb.ObjectRef | None) -> TagRef | None:
    return None if ref is None else tag_ref_from_proto(ref)


def _opt_tag_ref_to_proto(ref: TagRef | None) -> pb.ObjectRef | None:
    return None if ref is None else object_ref_to_proto(ref)


def metadata_to_proto(metadata: Metadata) -> pb.ResourceMetadata:
    return pb.ResourceMetadata(
        uid=metadata.uid,
        version=metadata.version,
        create_time=metadata.create_time,
        update_time=metadata.update_time,
    )


def metadata_from_proto(metadata: pb.ResourceMetadata) -> Metadata:
    return Metadata(
        uid=metadata.uid,
        version=metadata.version,
        create_time=metadata.create_time,
        update_time=metadata.update_time,
    )


def resources_to_proto(resources: Resources) -> pb.Resources:
    return pb.Resources(cpu_milli=resources.cpu_milli, memory_bytes=resources.memory_bytes)


def resources_from_proto(resources: pb.Resources) -> Resources:
    return Resources(cpu_milli=resources.cpu_milli, memory_bytes=resources.memory_bytes)


def capacity_to_proto(capacity: Capacity) -> pb.Capacity:
    return pb.Capacity(
        cpu_milli=capacity.cpu_milli, memory_bytes=capacity.memory_bytes, actors=capacity.actors
    )


def capacity_from_proto(capacity: pb.Capacity) -> Capacity:
    return Capacity(
        cpu_milli=capacity.cpu_milli, memory_bytes=capacity.memory_bytes, actors=capacity.actors
    )


# --- templates ----------------------------------------------------------------------------


def probe_to_proto(probe: Probe) -> pb.Probe:
    return pb.Probe(path=probe.path, port=probe.port, timeout_seconds=probe.timeout_seconds)


def probe_from_proto(probe: pb.Probe) -> Probe:
    return Probe(path=probe.path, port=probe.port, timeout_seconds=probe.timeout_seconds)


def env_var_to_proto(env: EnvVar) -> pb.EnvVar:
    return pb.EnvVar(name=env.name, value=env.value)


def env_var_from_proto(env: pb.EnvVar) -> EnvVar:
    return EnvVar(name=env.name, value=env.value)


def container_to_proto(container: Container) -> pb.Container:
    return pb.Container(
        name=container.name,
        image=container.image,
        command=list(container.command),
        env=[env_var_to_proto(e) for e in container.env],
        ports=list(container.ports),
        wakeup_probe=(
            None if container.wakeup_probe is None else probe_to_proto(container.wakeup_probe)
        ),
    )


def container_from_proto(container: pb.Container) -> Container:
    return Container(
        name=container.name,
        image=container.image,
        command=tuple(container.command),
        env=tuple(env_var_from_proto(e) for e in container.env),
        ports=tuple(container.ports),
        wakeup_probe=(
            None if container.wakeup_probe is None else probe_from_proto(container.wakeup_probe)
        ),
    )


def snapshot_config_to_proto(config: SnapshotConfig) -> pb.SnapshotConfig:
    return pb.SnapshotConfig(
        preferred_fidelity=fidelity_to_proto(config.preferred_fidelity),
        storage_location=config.storage_location,
    )


def snapshot_config_from_proto(config: pb.SnapshotConfig) -> SnapshotConfig:
    """An UNSPECIFIED preferred fidelity is MEMORY, as the proto documents."""
    return SnapshotConfig(
        preferred_fidelity=fidelity_from_proto(
            config.preferred_fidelity,
            what="snapshot config preferred fidelity",
            default=Fidelity.MEMORY,
        ),
        storage_location=config.storage_location,
    )


def actor_template_to_proto(template: ActorTemplate) -> pb.ActorTemplate:
    return pb.ActorTemplate(
        ref=object_ref_to_proto(template.ref),
        metadata=metadata_to_proto(template.metadata),
        containers=[container_to_proto(c) for c in template.containers],
        resources=resources_to_proto(template.resources),
        worker_selector=labels_to_proto(template.worker_selector),
        sandbox_class=sandbox_class_to_proto(template.sandbox_class),
        snapshot_config=snapshot_config_to_proto(template.snapshot_config),
        golden_snapshot=template.golden_snapshot,
        golden_tag=_opt_tag_ref_to_proto(template.golden_tag),
        golden_error=template.golden_error,
    )


def actor_template_from_proto(template: pb.ActorTemplate) -> ActorTemplate:
    return ActorTemplate(
        ref=template_ref_from_proto(template.ref),
        metadata=metadata_from_proto(template.metadata),
        containers=tuple(container_from_proto(c) for c in template.containers),
        resources=resources_from_proto(template.resources),
        worker_selector=labels_from_proto(template.worker_selector),
        sandbox_class=sandbox_class_from_proto(
            template.sandbox_class, what="template sandbox class"
        ),
        snapshot_config=snapshot_config_from_proto(template.snapshot_config),
        golden_snapshot=template.golden_snapshot,
        golden_tag=_opt_tag_ref_from_proto(template.golden_tag),
        golden_error=template.golden_error,
    )


# --- snapshots ----------------------------------------------------------------------------


def snapshot_storage_to_proto(storage: SnapshotStorage) -> pb.SnapshotStorage:
    return pb.SnapshotStorage(
        durability=durability_to_proto(storage.durability),
        status=storage_status_to_proto(storage.status),
        fidelity=fidelity_to_proto(storage.fidelity),
        uri=storage.uri,
        local_name=storage.local_name,
        node=None if storage.node is None else storage.node.name,
    )


def snapshot_storage_from_proto(storage: pb.SnapshotStorage) -> SnapshotStorage:
    return SnapshotStorage(
        durability=durability_from_proto(storage.durability, what="snapshot storage durability"),
        status=storage_status_from_proto(storage.status, what="snapshot storage status"),
        fidelity=fidelity_from_proto(storage.fidelity, what="snapshot storage fidelity"),
        uri=storage.uri,
        local_name=storage.local_name,
        node=None if storage.node is None else NodeRef(storage.node),
    )


def snapshot_to_proto(snapshot: Snapshot) -> pb.Snapshot:
    return pb.Snapshot(
        generation=snapshot.generation,
        snapshot_id=snapshot.snapshot_id,
        owner=snapshot_owner_to_proto(snapshot.owner),
        template_uid=snapshot.template_uid,
        sandbox_class=sandbox_class_to_proto(snapshot.sandbox_class),
        runtime_version=snapshot.runtime_version,
        captured_at=snapshot.captured_at,
        source_tag=_opt_tag_ref_to_proto(snapshot.source_tag),
        storages=[snapshot_storage_to_proto(s) for s in snapshot.storages],
    )


def snapshot_from_proto(snapshot: pb.Snapshot) -> Snapshot:
    return Snapshot(
        generation=snapshot.generation,
        snapshot_id=snapshot.snapshot_id,
        owner=snapshot_owner_from_proto(snapshot.owner),
        template_uid=snapshot.template_uid,
        sandbox_class=sandbox_class_from_proto(
            snapshot.sandbox_class, what="snapshot sandbox class"
        ),
        runtime_version=snapshot.runtime_version,
        captured_at=snapshot.captured_at,
        source_tag=_opt_tag_ref_from_proto(snapshot.source_tag),
        storages=tuple(snapshot_storage_from_proto(s) for s in snapshot.storages),
    )


# --- actors -------------------------------------------------------------------------------


def worker_assignment_to_proto(assignment: WorkerAssignment) -> pb.WorkerAssignment:
    return pb.WorkerAssignment(
        worker=assignment.worker.name,
        node=assignment.node.name,
        worker_epoch=assignment.worker_epoch,
        pod_ips=list(assignment.pod_ips),
        resources=resources_to_proto(assignment.resources),
    )


def worker_assignment_from_proto(assignment: pb.WorkerAssignment) -> WorkerAssignment:
    return WorkerAssignment(
        worker=WorkerRef(assignment.worker),
        node=NodeRef(assignment.node),
        worker_epoch=assignment.worker_epoch,
        pod_ips=tuple(assignment.pod_ips),
        resources=resources_from_proto(assignment.resources),
    )


def crash_to_proto(crash: Crash) -> pb.Crash:
    return pb.Crash(message=crash.message, time=crash.time)


def crash_from_proto(crash: pb.Crash) -> Crash:
    return Crash(message=crash.message, time=crash.time)


def actor_status_to_proto(status: ActorStatus) -> pb.ActorStatus:
    return pb.ActorStatus(
        state=actor_state_to_proto(status.state),
        assignment=(
            None if status.assignment is None else worker_assignment_to_proto(status.assignment)
        ),
        snapshots=[snapshot_to_proto(s) for s in status.snapshots],
        crash=None if status.crash is None else crash_to_proto(status.crash),
        assigned_node=None if status.assigned_node is None else status.assigned_node.name,
        last_assigned_generation=status.last_assigned_generation,
        in_progress_generation=status.in_progress_generation,
    )


def actor_status_from_proto(status: pb.ActorStatus) -> ActorStatus:
    return ActorStatus(
        state=actor_state_from_proto(status.state, what="actor status state"),
        assignment=(
            None if status.assignment is None else worker_assignment_from_proto(status.assignment)
        ),
        snapshots=tuple(snapshot_from_proto(s) for s in status.snapshots),
        crash=None if status.crash is None else crash_from_proto(status.crash),
        assigned_node=None if status.assigned_node is None else NodeRef(status.assigned_node),
        last_assigned_generation=status.last_assigned_generation,
        in_progress_generation=status.in_progress_generation,
    )


def actor_to_proto(actor: Actor) -> pb.Actor:
    return pb.Actor(
        ref=object_ref_to_proto(actor.ref),
        metadata=metadata_to_proto(actor.metadata),
        template=object_ref_to_proto(actor.template),
        worker_selector=labels_to_proto(actor.worker_selector),
        source_tag=_opt_tag_ref_to_proto(actor.source_tag),
        status=actor_status_to_proto(actor.status),
    )


def actor_from_proto(actor: pb.Actor) -> Actor:
    return Actor(
        ref=actor_ref_from_proto(actor.ref),
        metadata=metadata_from_proto(actor.metadata),
        template=template_ref_from_proto(actor.template),
        worker_selector=labels_from_proto(actor.worker_selector),
        source_tag=_opt_tag_ref_from_proto(actor.source_tag),
        status=actor_status_from_proto(actor.status),
    )


def resume_result_to_proto(result: ResumeResult) -> pb.ResumeActorResponse:
    return pb.ResumeActorResponse(
        actor=actor_to_proto(result.actor),
        resumed=result.resumed,
        source=restore_source_to_proto(result.source, resumed=result.resumed),
        generation=result.generation,
        snapshot_age_seconds=result.snapshot_age_seconds,
        resume_duration_seconds=result.resume_duration_seconds,
    )


def resume_result_from_proto(response: pb.ResumeActorResponse) -> ResumeResult:
    return ResumeResult(
        actor=actor_from_proto(response.actor),
        resumed=response.resumed,
        source=restore_source_from_proto(response.source),
        generation=response.generation,
        snapshot_age_seconds=response.snapshot_age_seconds,
        resume_duration_seconds=response.resume_duration_seconds,
    )


# --- workers, tags, atespaces -------------------------------------------------------------


def worker_to_proto(worker: Worker) -> pb.Worker:
    return pb.Worker(
        name=worker.ref.name,
        metadata=metadata_to_proto(worker.metadata),
        pool=worker.pool,
        node=worker.node.name,
        ips=list(worker.ips),
        sandbox_class=sandbox_class_to_proto(worker.sandbox_class),
        runtime_versions=sorted(worker.runtime_versions),
        labels=labels_to_proto(worker.labels),
        epoch=worker.epoch,
        state=worker_state_to_proto(worker.state),
        capacity=None if worker.capacity is None else capacity_to_proto(worker.capacity),
        allocated=capacity_to_proto(worker.allocated),
        last_heartbeat=worker.last_heartbeat,
        spiffe_id=worker.spiffe_id,
        tunnel_address=worker.tunnel_address,
        atelet_address=worker.atelet_address,
    )


def worker_from_proto(worker: pb.Worker) -> Worker:
    return Worker(
        ref=WorkerRef(worker.name),
        metadata=metadata_from_proto(worker.metadata),
        pool=worker.pool,
        node=NodeRef(worker.node),
        ips=tuple(worker.ips),
        sandbox_class=sandbox_class_from_proto(worker.sandbox_class, what="worker sandbox class"),
        runtime_versions=frozenset(worker.runtime_versions),
        labels=labels_from_proto(worker.labels),
        epoch=worker.epoch,
        state=worker_state_from_proto(worker.state),
        capacity=None if worker.capacity is None else capacity_from_proto(worker.capacity),
        allocated=capacity_from_proto(worker.allocated),
        last_heartbeat=worker.last_heartbeat,
        spiffe_id=worker.spiffe_id,
        tunnel_address=worker.tunnel_address,
        atelet_address=worker.atelet_address,
    )


def tag_to_proto(tag: Tag) -> pb.Tag:
    return pb.Tag(
        ref=object_ref_to_proto(tag.ref),
        metadata=metadata_to_proto(tag.metadata),
        source_actor=None if tag.source_actor is None else object_ref_to_proto(tag.source_actor),
        template=None if tag.template is None else object_ref_to_proto(tag.template),
        snapshot=None if tag.snapshot is None else snapshot_to_proto(tag.snapshot),
    )


def tag_from_proto(tag: pb.Tag) -> Tag:
    return Tag(
        ref=tag_ref_from_proto(tag.ref),
        metadata=metadata_from_proto(tag.metadata),
        source_actor=None if tag.source_actor is None else actor_ref_from_proto(tag.source_actor),
        template=None if tag.template is None else template_ref_from_proto(tag.template),
        snapshot=None if tag.snapshot is None else snapshot_from_proto(tag.snapshot),
    )


def atespace_to_proto(atespace: Atespace) -> pb.Atespace:
    return pb.Atespace(name=atespace.name, metadata=metadata_to_proto(atespace.metadata))


def atespace_from_proto(atespace: pb.Atespace) -> Atespace:
    return Atespace(name=atespace.name, metadata=metadata_from_proto(atespace.metadata))


# --- request parsing: names ---------------------------------------------------------------


def _is_empty(ref: pb.ObjectRef | None) -> bool:
    return ref is None or (not ref.atespace and not ref.name)


def parse_atespace(name: str, *, what: str = "atespace") -> str:
    """A required atespace name."""
    return validate_dns_label(name, what=what)


def _parse_scoped(ref: pb.ObjectRef | None, *, what: str, default_atespace: str) -> tuple[str, str]:
    if ref is None or _is_empty(ref):
        raise InvalidArgument(f"{what} reference is required")
    atespace = ref.atespace or default_atespace
    validate_dns_label(atespace, what=f"{what} atespace")
    validate_dns_label(ref.name, what=f"{what} name")
    return atespace, ref.name


def parse_actor_ref(
    ref: pb.ObjectRef | None, *, what: str = "actor", default_atespace: str = ""
) -> ActorRef:
    """A required actor reference; an empty atespace means ``default_atespace``."""
    atespace, name = _parse_scoped(ref, what=what, default_atespace=default_atespace)
    return ActorRef(atespace=atespace, name=name)


def parse_template_ref(
    ref: pb.ObjectRef | None, *, what: str = "template", default_atespace: str = ""
) -> TemplateRef:
    """A required template reference; an empty atespace means ``default_atespace``."""
    atespace, name = _parse_scoped(ref, what=what, default_atespace=default_atespace)
    return TemplateRef(atespace=atespace, name=name)


def parse_tag_ref(
    ref: pb.ObjectRef | None, *, what: str = "tag", default_atespace: str = ""
) -> TagRef:
    """A required tag reference; an empty atespace means ``default_atespace``."""
    atespace, name = _parse_scoped(ref, what=what, default_atespace=default_atespace)
    return TagRef(atespace=atespace, name=name)


def parse_worker_name(name: str, *, what: str = "worker name") -> WorkerRef:
    return WorkerRef(validate_dns_subdomain(name, what=what))


def parse_labels(
    labels: Mapping[str, str], *, what: str = "labels", limit: int = LABELS_MAX
) -> Labels:
    """Labels from a wire map, every key and value validated; at most ``limit`` of them."""
    try:
        return Labels(labels).validate(what=what, limit=limit)
    except InvalidArgument as exc:
        if exc.description.startswith(what):
            raise
        raise InvalidArgument(f"{what}: {exc.description}") from None


def parse_selector(labels: Mapping[str, str], *, what: str = "worker selector") -> Labels:
    """A worker selector: at most ten labels, each valid."""
    return parse_labels(labels, what=what, limit=SELECTOR_MAX_LABELS)


def parse_host_port(address: str, *, what: str = "address") -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port); the port must be in 1..65535."""
    if address.startswith("["):
        host, sep, rest = address[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        ok = bool(sep and host)
    else:
        host, _, port_text = address.rpartition(":")
        ok = bool(host) and ":" not in host
    digits = port_text.isascii() and port_text.isdigit()
    if not ok or not digits or not 0 < int(port_text) < 65536:
        raise InvalidArgument(f"{what} {address!r} must be host:port")
    return host, int(port_text)


def _checked_address(address: str, *, what: str) -> str:
    parse_host_port(address, what=what)
    return address


# --- request parsing: Control -------------------------------------------------------------


def parse_create_atespace(request: pb.CreateAtespaceRequest) -> Atespace:
    return Atespace(name=parse_atespace(request.name)).validate()


def parse_get_atespace(request: pb.GetAtespaceRequest) -> str:
    return parse_atespace(request.name)


def parse_delete_atespace(request: pb.DeleteAtespaceRequest) -> str:
    return parse_atespace(request.name)


_DEFAULT_PROBE: Final = Probe()
_DEFAULT_PORTS: Final = Container(name="", image="").ports


def _request_probe(probe: pb.Probe) -> Probe:
    """A probe from a request: zero values take the model's defaults ("/", 80, 30 s)."""
    return Probe(
        path=probe.path or _DEFAULT_PROBE.path,
        port=probe.port or _DEFAULT_PROBE.port,
        timeout_seconds=probe.timeout_seconds or _DEFAULT_PROBE.timeout_seconds,
    )


def _request_container(container: pb.Container) -> Container:
    """A container from a request: no ports means the model's default (80)."""
    return Container(
        name=container.name,
        image=container.image,
        command=tuple(container.command),
        env=tuple(env_var_from_proto(e) for e in container.env),
        ports=tuple(container.ports) or _DEFAULT_PORTS,
        wakeup_probe=(
            None if container.wakeup_probe is None else _request_probe(container.wakeup_probe)
        ),
    )


def _template_spec(template: pb.ActorTemplate, *, metadata: Metadata) -> ActorTemplate:
    """A template from a request: defaults applied, output fields dropped, validated."""
    return ActorTemplate(
        ref=parse_template_ref(template.ref),
        metadata=metadata,
        containers=tuple(_request_container(c) for c in template.containers),
        resources=_parse_resources(template.resources, what="template resources"),
        worker_selector=parse_selector(template.worker_selector, what="template worker selector"),
        sandbox_class=sandbox_class_from_proto(
            template.sandbox_class, what="template sandbox class", default=SandboxClass.GVISOR
        ),
        snapshot_config=snapshot_config_from_proto(template.snapshot_config),
        golden_snapshot=template.golden_snapshot,
    ).validate()


def _parse_resources(resources: pb.Resources, *, what: str) -> Resources:
    try:
        return resources_from_proto(resources)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{what}: {exc.description}") from None


def _parse_capacity(capacity: pb.Capacity, *, what: str) -> Capacity:
    try:
        return capacity_from_proto(capacity)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{what}: {exc.description}") from None


def parse_create_actor_template(request: pb.CreateActorTemplateRequest) -> ActorTemplate:
    """The template to create; its metadata and output fields are ignored."""
    return _template_spec(request.template, metadata=Metadata())


def parse_update_actor_template(request: pb.UpdateActorTemplateRequest) -> ActorTemplate:
    """The new spec; ``metadata`` keeps only the uid and version preconditions (0/"" = none)."""
    version = request.template.metadata.version
    if version < 0:
        raise InvalidArgument(f"template metadata version must not be negative (got {version})")
    metadata = Metadata(uid=request.template.metadata.uid, version=version)
    return _template_spec(request.template, metadata=metadata)


def parse_get_actor_template(request: pb.GetActorTemplateRequest) -> TemplateRef:
    return parse_template_ref(request.ref)


def parse_list_actor_templates(request: pb.ListActorTemplatesRequest) -> str:
    return parse_atespace(request.atespace)


def parse_delete_actor_template(request: pb.DeleteActorTemplateRequest) -> TemplateRef:
    return parse_template_ref(request.ref)


def parse_create_actor(request: pb.CreateActorRequest) -> CreateActorArgs:
    """An actor needs a template, a source tag, or both; empty atespaces mean the actor's."""
    ref = parse_actor_ref(request.ref)
    template = (
        None
        if _is_empty(request.template)
        else parse_template_ref(request.template, default_atespace=ref.atespace)
    )
    source_tag = (
        None
        if _is_empty(request.source_tag)
        else parse_tag_ref(request.source_tag, what="source tag", default_atespace=ref.atespace)
    )
    if template is None and source_tag is None:
        raise InvalidArgument("a template or a source tag is required")
    return CreateActorArgs(
        ref=ref,
        template=template,
        source_tag=source_tag,
        worker_selector=parse_selector(request.worker_selector, what="actor worker selector"),
    )


def parse_get_actor(request: pb.GetActorRequest) -> ActorRef:
    return parse_actor_ref(request.ref)


def parse_list_actors(request: pb.ListActorsRequest) -> ListActorsArgs:
    if not 0 <= request.page_size <= MAX_PAGE_SIZE:
        raise InvalidArgument(f"page_size {request.page_size} must be in 0..{MAX_PAGE_SIZE}")
    return ListActorsArgs(
        atespace=parse_atespace(request.atespace) if request.atespace else None,
        page_size=request.page_size or DEFAULT_PAGE_SIZE,
        page_token=request.page_token,
    )


def parse_update_actor(request: pb.UpdateActorRequest) -> UpdateActorArgs:
    return UpdateActorArgs(
        ref=parse_actor_ref(request.ref),
        worker_selector=parse_selector(request.worker_selector, what="actor worker selector"),
    )


def parse_suspend_actor(request: pb.SuspendActorRequest) -> SuspendActorArgs:
    return SuspendActorArgs(
        ref=parse_actor_ref(request.ref), mode=suspend_mode_from_proto(request.mode)
    )


def parse_pause_actor(request: pb.PauseActorRequest) -> ActorRef:
    return parse_actor_ref(request.ref)


def parse_resume_actor(request: pb.ResumeActorRequest) -> ActorRef:
    return parse_actor_ref(request.ref)


def parse_revert_actor(request: pb.RevertActorRequest) -> ActorRef:
    return parse_actor_ref(request.ref)


def parse_delete_actor(request: pb.DeleteActorRequest) -> DeleteActorArgs:
    return DeleteActorArgs(ref=parse_actor_ref(request.ref), force=request.force)


def parse_create_tag(request: pb.CreateTagRequest) -> CreateTagArgs:
    ref = parse_tag_ref(request.ref)
    return CreateTagArgs(
        ref=ref, actor=parse_actor_ref(request.actor, default_atespace=ref.atespace)
    )


def parse_get_tag(request: pb.GetTagRequest) -> TagRef:
    return parse_tag_ref(request.ref)


def parse_list_tags(request: pb.ListTagsRequest) -> str:
    return parse_atespace(request.atespace)


def parse_delete_tag(request: pb.DeleteTagRequest) -> TagRef:
    return parse_tag_ref(request.ref)


def parse_list_workers(request: pb.ListWorkersRequest) -> str | None:
    """The pool to list, or None for every pool."""
    return request.pool or None


def parse_get_worker(request: pb.GetWorkerRequest) -> WorkerRef:
    return parse_worker_name(request.name)


def parse_drain_worker(request: pb.DrainWorkerRequest) -> WorkerRef:
    return parse_worker_name(request.name)


# --- request parsing: WorkerRegistry ------------------------------------------------------


def _parse_epoch(epoch: int, *, what: str) -> int:
    if epoch <= 0:
        raise InvalidArgument(f"{what} must be positive (got {epoch})")
    return epoch


def parse_register_worker(request: pb.RegisterWorkerRequest) -> Worker:
    """The worker as it reports itself; state, allocation and heartbeat are the server's."""
    if request.capacity is None:
        raise InvalidArgument("worker capacity is required")
    node = NodeRef(validate_dns_subdomain(request.node, what="worker node"))
    return Worker(
        ref=parse_worker_name(request.name),
        pool=request.pool or DEFAULT_POOL,
        node=node,
        ips=tuple(request.ips),
        sandbox_class=sandbox_class_from_proto(request.sandbox_class, what="worker sandbox class"),
        runtime_versions=frozenset(request.runtime_versions),
        labels=parse_labels(request.labels, what="worker labels"),
        epoch=_parse_epoch(request.epoch, what="worker epoch"),
        capacity=_parse_capacity(request.capacity, what="worker capacity"),
        tunnel_address=request.tunnel_address,
        atelet_address=(
            _checked_address(request.atelet_address, what="worker atelet address")
            if request.atelet_address
            else ""
        ),
    )


def parse_heartbeat(request: pb.HeartbeatRequest) -> HeartbeatArgs:
    return HeartbeatArgs(
        worker=parse_worker_name(request.name),
        epoch=_parse_epoch(request.epoch, what="worker epoch"),
        capacity=(
            None
            if request.capacity is None
            else _parse_capacity(request.capacity, what="worker capacity")
        ),
    )


def parse_request_actor_suspend(request: pb.RequestActorSuspendRequest) -> ActorSuspendRequestArgs:
    if not request.actor_uid:
        raise InvalidArgument("actor uid is required")
    return ActorSuspendRequestArgs(
        worker=parse_worker_name(request.worker),
        worker_epoch=_parse_epoch(request.worker_epoch, what="worker epoch"),
        actor=parse_actor_ref(request.actor),
        actor_uid=request.actor_uid,
    )


# --- node agent (Atelet) ------------------------------------------------------------------
#
# ateapi's NodeAgent port (:mod:`substrate.core.agent_ports`) over the Atelet service. The
# ``*_to_proto`` side is the client's (ateapi), the ``parse_*`` side the server's (atelet);
# replies go the other way. Requests carry the records whole (template, snapshot, storage),
# so ``parse_x(x_to_proto(r)) == r``; the flat fields are filled from the records and are
# not read back.


@attrs.frozen(slots=True, kw_only=True)
class DropSnapshotArgs:
    """A validated DropSnapshot request."""

    actor_uid: str
    local_name: str


def checkpoint_mode_to_proto(value: CheckpointMode) -> pb.CheckpointMode:
    return pb.CheckpointMode(value.value)


def checkpoint_mode_from_proto(value: int, *, what: str = "checkpoint mode") -> CheckpointMode:
    return _enum_from_proto(value, CheckpointMode, what=what)


def _actor_identity(
    actor: ActorRef | None, actor_uid: str, template: ActorTemplate | None = None
) -> pb.ActorIdentity:
    return pb.ActorIdentity(
        ref=pb.ObjectRef() if actor is None else object_ref_to_proto(actor),
        uid=actor_uid,
        template=pb.ObjectRef() if template is None else object_ref_to_proto(template.ref),
        template_uid="" if template is None else template.metadata.uid,
    )


def _workload_spec(template: ActorTemplate) -> pb.WorkloadSpec:
    return pb.WorkloadSpec(
        containers=[container_to_proto(c) for c in template.containers],
        sandbox_class=sandbox_class_to_proto(template.sandbox_class),
    )


def _copy_fidelity(snapshot: Snapshot) -> pb.Fidelity:
    """What the snapshot's local copy holds (else its durable copy; UNSPECIFIED if none)."""
    copy = snapshot.local() or snapshot.durable()
    return pb.Fidelity(0) if copy is None else fidelity_to_proto(copy.fidelity)


def _local_name(snapshot: Snapshot) -> str:
    local = snapshot.local()
    return "" if local is None else local.local_name


def _durable_uri(snapshot: Snapshot) -> str:
    durable = snapshot.durable()
    return "" if durable is None else durable.uri


def _parse_actor(identity: pb.ActorIdentity) -> tuple[ActorRef, str]:
    actor = parse_actor_ref(identity.ref)
    if not identity.uid:
        raise InvalidArgument("actor uid is required")
    return actor, identity.uid


def _parse_node(name: str) -> NodeRef:
    return NodeRef(validate_dns_subdomain(name, what="node"))


def _parse_target(
    identity: pb.ActorIdentity, worker: str, worker_epoch: int, node: str
) -> WorkloadTarget:
    actor, uid = _parse_actor(identity)
    if worker_epoch < 0:
        raise InvalidArgument(f"worker epoch must not be negative (got {worker_epoch})")
    return WorkloadTarget(
        actor=actor,
        actor_uid=uid,
        worker=parse_worker_name(worker),
        node=_parse_node(node),
        worker_epoch=worker_epoch,
    )


def _required_template(template: pb.ActorTemplate | None) -> ActorTemplate:
    if template is None:
        raise InvalidArgument("template is required")
    return actor_template_from_proto(template)


def _required_snapshot(snapshot: pb.Snapshot | None, *, what: str = "snapshot") -> Snapshot:
    if snapshot is None:
        raise InvalidArgument(f"{what} is required")
    return snapshot_from_proto(snapshot)


# start: Run (cold boot) or Restore


def start_request_to_proto(request: StartRequest) -> pb.RunRequest | pb.RestoreRequest:
    """A Run request for a cold boot, a Restore request when a snapshot is given."""
    t, template = request.target, request.template
    identity = _actor_identity(t.actor, t.actor_uid, template)
    if request.snapshot is None:
        if request.storage is not None:
            raise InvalidArgument("a cold boot reads no snapshot storage")
        return pb.RunRequest(
            actor=identity,
            worker=t.worker.name,
            worker_epoch=t.worker_epoch,
            spec=_workload_spec(template),
            resources=resources_to_proto(template.resources),
            node=t.node.name,
            template=actor_template_to_proto(template),
            fidelity=fidelity_to_proto(request.fidelity),
        )
    snap, storage = request.snapshot, request.storage
    if storage is None:
        raise InvalidArgument("a restore needs the snapshot storage to read")
    durable = storage.durability is Durability.DURABLE
    return pb.RestoreRequest(
        actor=identity,
        worker=t.worker.name,
        worker_epoch=t.worker_epoch,
        spec=_workload_spec(template),
        resources=resources_to_proto(template.resources),
        snapshot=pb.RestoreSnapshot(
            snapshot_id=snap.snapshot_id,
            generation=snap.generation,
            fidelity=fidelity_to_proto(request.fidelity),
            object_uri=storage.uri if durable else "",
            local_name="" if durable else storage.local_name,
            owner=snapshot_owner_to_proto(snap.owner),
            tag=pb.ObjectRef() if snap.source_tag is None else object_ref_to_proto(snap.source_tag),
            runtime_version=snap.runtime_version,
            record=snapshot_to_proto(snap),
            storage=snapshot_storage_to_proto(storage),
        ),
        node=t.node.name,
        template=actor_template_to_proto(template),
    )


def parse_run(request: pb.RunRequest) -> StartRequest:
    """A cold boot; an UNSPECIFIED fidelity is MEMORY."""
    return StartRequest(
        target=_parse_target(request.actor, request.worker, request.worker_epoch, request.node),
        template=_required_template(request.template),
        fidelity=fidelity_from_proto(request.fidelity, default=Fidelity.MEMORY),
    )


def parse_restore(request: pb.RestoreRequest) -> StartRequest:
    snap = request.snapshot
    if snap.storage is None:
        raise InvalidArgument("restore snapshot storage is required")
    return StartRequest(
        target=_parse_target(request.actor, request.worker, request.worker_epoch, request.node),
        template=_required_template(request.template),
        snapshot=_required_snapshot(snap.record, what="restore snapshot record"),
        storage=snapshot_storage_from_proto(snap.storage),
        fidelity=fidelity_from_proto(snap.fidelity, what="restore fidelity"),
    )


def run_response_to_proto(result: StartResult) -> pb.RunResponse:
    return pb.RunResponse(
        worker_epoch=result.worker_epoch,
        pod_ips=list(result.pod_ips),
        timings=pb.Timings(total_seconds=result.duration),
    )


def restore_response_to_proto(result: StartResult, *, fidelity: Fidelity) -> pb.RestoreResponse:
    """``fidelity`` is what the request asked to restore (the port reports no other)."""
    return pb.RestoreResponse(
        worker_epoch=result.worker_epoch,
        pod_ips=list(result.pod_ips),
        fidelity=fidelity_to_proto(fidelity),
        timings=pb.Timings(total_seconds=result.duration),
    )


def start_result_from_proto(response: pb.RunResponse | pb.RestoreResponse) -> StartResult:
    return StartResult(
        worker_epoch=response.worker_epoch,
        pod_ips=tuple(response.pod_ips),
        duration=response.timings.total_seconds,
    )


# checkpoint


def checkpoint_request_to_proto(request: CheckpointRequest) -> pb.CheckpointRequest:
    t, snap = request.target, request.snapshot
    return pb.CheckpointRequest(
        actor=_actor_identity(t.actor, t.actor_uid, request.template),
        worker=t.worker.name,
        worker_epoch=t.worker_epoch,
        mode=checkpoint_mode_to_proto(request.mode),
        snapshot_id=snap.snapshot_id,
        generation=snap.generation,
        fidelity=_copy_fidelity(snap),
        destination_uri=_durable_uri(snap),
        node=t.node.name,
        template=actor_template_to_proto(request.template),
        snapshot=snapshot_to_proto(snap),
        local_name=_local_name(snap),
    )


def parse_checkpoint(request: pb.CheckpointRequest) -> CheckpointRequest:
    return CheckpointRequest(
        target=_parse_target(request.actor, request.worker, request.worker_epoch, request.node),
        template=_required_template(request.template),
        mode=checkpoint_mode_from_proto(request.mode),
        snapshot=_required_snapshot(request.snapshot, what="checkpoint snapshot"),
    )


def checkpoint_result_to_proto(
    result: CheckpointResult, *, worker_epoch: int
) -> pb.CheckpointResponse:
    """``worker_epoch`` is the request's (the port reports no other)."""
    snap = result.snapshot
    return pb.CheckpointResponse(
        worker_epoch=worker_epoch,
        storages=[snapshot_storage_to_proto(s) for s in snap.storages],
        runtime_version=snap.runtime_version,
        snapshot=snapshot_to_proto(snap),
        upload_error=result.upload_error,
    )


def checkpoint_result_from_proto(response: pb.CheckpointResponse) -> CheckpointResult:
    return CheckpointResult(
        snapshot=_required_snapshot(response.snapshot, what="checkpoint reply snapshot"),
        upload_error=response.upload_error,
    )


# upload and detach (no worker: they act on the node's snapshot directory)


def upload_request_to_proto(request: UploadRequest) -> pb.UploadSnapshotRequest:
    snap = request.snapshot
    return pb.UploadSnapshotRequest(
        actor=_actor_identity(request.actor, request.actor_uid),
        snapshot_id=snap.snapshot_id,
        generation=snap.generation,
        local_name=_local_name(snap),
        destination_uri=_durable_uri(snap),
        fidelity=_copy_fidelity(snap),
        node=request.node.name,
        snapshot=snapshot_to_proto(snap),
    )


def _parse_upload(
    identity: pb.ActorIdentity, node: str, snapshot: pb.Snapshot | None
) -> UploadRequest:
    actor, uid = _parse_actor(identity)
    return UploadRequest(
        actor=actor,
        actor_uid=uid,
        node=_parse_node(node),
        snapshot=_required_snapshot(snapshot),
    )


def parse_upload_snapshot(request: pb.UploadSnapshotRequest) -> UploadRequest:
    return _parse_upload(request.actor, request.node, request.snapshot)


def upload_result_to_proto(snapshot: Snapshot) -> pb.UploadSnapshotResponse:
    durable = snapshot.durable()
    return pb.UploadSnapshotResponse(
        storage=pb.SnapshotStorage() if durable is None else snapshot_storage_to_proto(durable),
        snapshot=snapshot_to_proto(snapshot),
    )


def upload_result_from_proto(response: pb.UploadSnapshotResponse) -> Snapshot:
    return _required_snapshot(response.snapshot, what="upload reply snapshot")


def detach_request_to_proto(request: UploadRequest) -> pb.DetachRequest:
    snap = request.snapshot
    durable = snap.durable()
    name = _local_name(snap)
    upload = durable is not None and not durable.completed
    return pb.DetachRequest(
        actor=_actor_identity(request.actor, request.actor_uid),
        local_names=[name] if name else [],
        upload_local_name=name if upload else "",
        snapshot_id=snap.snapshot_id,
        generation=snap.generation,
        destination_uri=_durable_uri(snap),
        fidelity=_copy_fidelity(snap),
        node=request.node.name,
        snapshot=snapshot_to_proto(snap),
    )


def parse_detach(request: pb.DetachRequest) -> UploadRequest:
    return _parse_upload(request.actor, request.node, request.snapshot)


def detach_result_to_proto(snapshot: Snapshot) -> pb.DetachResponse:
    durable = snapshot.durable()
    return pb.DetachResponse(
        storage=None if durable is None else snapshot_storage_to_proto(durable),
        snapshot=snapshot_to_proto(snapshot),
    )


def detach_result_from_proto(response: pb.DetachResponse) -> Snapshot:
    return _required_snapshot(response.snapshot, what="detach reply snapshot")


# terminate and drop


def terminate_request_to_proto(target: WorkloadTarget) -> pb.TerminateRequest:
    return pb.TerminateRequest(
        actor=_actor_identity(target.actor, target.actor_uid),
        worker=target.worker.name,
        worker_epoch=target.worker_epoch,
        node=target.node.name,
    )


def parse_terminate(request: pb.TerminateRequest) -> WorkloadTarget:
    return _parse_target(request.actor, request.worker, request.worker_epoch, request.node)


def drop_snapshot_request_to_proto(actor_uid: str, local_name: str) -> pb.DropSnapshotRequest:
    return pb.DropSnapshotRequest(actor=_actor_identity(None, actor_uid), local_name=local_name)


def parse_drop_snapshot(request: pb.DropSnapshotRequest) -> DropSnapshotArgs:
    """The local name must be one directory name (never empty, ``.``, ``..`` or a path)."""
    if not request.actor.uid:
        raise InvalidArgument("actor uid is required")
    name = request.local_name
    if not name:
        raise InvalidArgument("local snapshot name is required")
    if name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        raise InvalidArgument(f"local snapshot name {name!r} must be a single directory name")
    return DropSnapshotArgs(actor_uid=request.actor.uid, local_name=name)


__all__ = [
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_POOL",
    "MAX_PAGE_SIZE",
    "ActorSuspendRequestArgs",
    "CreateActorArgs",
    "CreateTagArgs",
    "DeleteActorArgs",
    "DropSnapshotArgs",
    "HeartbeatArgs",
    "ListActorsArgs",
    "ResumeResult",
    "SuspendActorArgs",
    "UpdateActorArgs",
    "actor_from_proto",
    "actor_ref_from_proto",
    "actor_state_from_proto",
    "actor_state_to_proto",
    "actor_status_from_proto",
    "actor_status_to_proto",
    "actor_template_from_proto",
    "actor_template_to_proto",
    "actor_to_proto",
    "atespace_from_proto",
    "atespace_to_proto",
    "capacity_from_proto",
    "capacity_to_proto",
    "checkpoint_mode_from_proto",
    "checkpoint_mode_to_proto",
    "checkpoint_request_to_proto",
    "checkpoint_result_from_proto",
    "checkpoint_result_to_proto",
    "container_from_proto",
    "container_to_proto",
    "crash_from_proto",
    "crash_to_proto",
    "detach_request_to_proto",
    "detach_result_from_proto",
    "detach_result_to_proto",
    "drop_snapshot_request_to_proto",
    "durability_from_proto",
    "durability_to_proto",
    "env_var_from_proto",
    "env_var_to_proto",
    "fidelity_from_proto",
    "fidelity_to_proto",
    "labels_from_proto",
    "labels_to_proto",
    "metadata_from_proto",
    "metadata_to_proto",
    "object_ref_to_proto",
    "parse_actor_ref",
    "parse_atespace",
    "parse_checkpoint",
    "parse_create_actor",
    "parse_create_actor_template",
    "parse_create_atespace",
    "parse_create_tag",
    "parse_delete_actor",
    "parse_delete_actor_template",
    "parse_delete_atespace",
    "parse_delete_tag",
    "parse_detach",
    "parse_drain_worker",
    "parse_drop_snapshot",
    "parse_get_actor",
    "parse_get_actor_template",
    "parse_get_atespace",
    "parse_get_tag",
    "parse_get_worker",
    "parse_heartbeat",
    "parse_host_port",
    "parse_labels",
    "parse_list_actor_templates",
    "parse_list_actors",
    "parse_list_tags",
    "parse_list_workers",
    "parse_pause_actor",
    "parse_register_worker",
    "parse_request_actor_suspend",
    "parse_restore",
    "parse_resume_actor",
    "parse_revert_actor",
    "parse_run",
    "parse_selector",
    "parse_suspend_actor",
    "parse_tag_ref",
    "parse_template_ref",
    "parse_terminate",
    "parse_update_actor",
    "parse_update_actor_template",
    "parse_upload_snapshot",
    "parse_worker_name",
    "probe_from_proto",
    "probe_to_proto",
    "resources_from_proto",
    "resources_to_proto",
    "restore_response_to_proto",
    "restore_source_from_proto",
    "restore_source_to_proto",
    "resume_result_from_proto",
    "resume_result_to_proto",
    "run_response_to_proto",
    "sandbox_class_from_proto",
    "sandbox_class_to_proto",
    "snapshot_config_from_proto",
    "snapshot_config_to_proto",
    "snapshot_from_proto",
    "snapshot_owner_from_proto",
    "snapshot_owner_to_proto",
    "snapshot_storage_from_proto",
    "snapshot_storage_to_proto",
    "snapshot_to_proto",
    "start_request_to_proto",
    "start_result_from_proto",
    "storage_status_from_proto",
    "storage_status_to_proto",
    "suspend_mode_from_proto",
    "suspend_mode_to_proto",
    "tag_from_proto",
    "tag_ref_from_proto",
    "tag_to_proto",
    "template_ref_from_proto",
    "terminate_request_to_proto",
    "upload_request_to_proto",
    "upload_result_from_proto",
    "upload_result_to_proto",
    "worker_assignment_from_proto",
    "worker_assignment_to_proto",
    "worker_from_proto",
    "worker_state_from_proto",
    "worker_state_to_proto",
    "worker_to_proto",
]
