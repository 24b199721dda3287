"""The domain model: frozen, slotted, keyword-only records.

Records never hold wire (protobuf) types; ``substrate.api`` converts at the edge. Times are
float seconds since the epoch, always passed in by the caller.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Final

import attrs

from substrate.core.ids import (
    ActorRef,
    Labels,
    NodeRef,
    TagRef,
    TemplateRef,
    WorkerRef,
    validate_dns_label,
    validate_selector,
)
from substrate.errors import InvalidArgument

# --- enums ------------------------------------------------------------------------------


class ActorState(enum.Enum):
    """Actor lifecycle states; numbers match the wire enum."""

    RESUMING = 1
    RUNNING = 2
    SUSPENDING = 3
    SUSPENDED = 4
    PAUSING = 5
    PAUSED = 6
    CRASHED = 7
    DELETING = 8
    REVERTING = 9

    @property
    def wire_name(self) -> str:
        return f"ACTOR_STATE_{self.name}"

    @property
    def transient(self) -> bool:
        """Every ``-ING`` state is a persisted intent some workflow must finish."""
        return self in TRANSIENT_STATES


TRANSIENT_STATES: Final = frozenset(
    {
        ActorState.RESUMING,
        ActorState.SUSPENDING,
        ActorState.PAUSING,
        ActorState.REVERTING,
        ActorState.DELETING,
    }
)


class WorkerState(enum.Enum):
    ACTIVE = 1
    DRAINING = 2
    UNAVAILABLE = 3

    @property
    def wire_name(self) -> str:
        return f"WORKER_STATE_{self.name}"


class SandboxClass(enum.Enum):
    """The kind of sandbox a worker runs; a snapshot restores only into its writer's class."""

    GVISOR = 1
    MICROVM = 2
    FAKE = 3


class Durability(enum.Enum):
    LOCAL = 1
    DURABLE = 2


class StorageStatus(enum.Enum):
    PENDING = 1
    IN_PROGRESS = 2
    COMPLETED = 3


class Fidelity(enum.IntEnum):
    """What a snapshot restores, ordered from least to most."""

    VOLUMES = 1
    ROOTFS = 2
    MEMORY = 3


class SnapshotOwner(enum.Enum):
    """Who owns the objects of a snapshot; only the owner ever deletes them."""

    ACTOR = 1
    TAG = 2


class RestoreSource(enum.Enum):
    """Where a resume's restored bytes came from; the value is the provenance label."""

    LOCAL = "local"
    """The node-local copy on the worker's node, restored in place."""
    DURABLE = "durable"
    """The actor's own durable copy in object storage."""
    TAG = "tag"
    """A durable copy owned by a tag, borrowed by the actor (its first generation)."""


COLD_BOOT_PROVENANCE: Final = "cold-boot"


class SuspendMode(enum.Enum):
    ASYNC = 1
    SYNC = 2


def _str_tuple(v: Iterable[str]) -> tuple[str, ...]:
    return tuple(v)


def _int_tuple(v: Iterable[int]) -> tuple[int, ...]:
    return tuple(v)


def _env_tuple(v: Iterable[EnvVar]) -> tuple[EnvVar, ...]:
    return tuple(v)


def _container_tuple(v: Iterable[Container]) -> tuple[Container, ...]:
    return tuple(v)


def _storage_tuple(v: Iterable[SnapshotStorage]) -> tuple[SnapshotStorage, ...]:
    return tuple(v)


def _snapshot_tuple(v: Iterable[Snapshot]) -> tuple[Snapshot, ...]:
    return tuple(v)


def _str_frozenset(v: Iterable[str]) -> frozenset[str]:
    return frozenset(v)


# --- small values -----------------------------------------------------------------------


def _non_negative(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise InvalidArgument(f"{attribute.name} must not be negative (got {value})")


@attrs.frozen(slots=True, kw_only=True)
class Resources:
    """CPU and memory limits of one actor (what it books on a worker)."""

    cpu_milli: int = attrs.field(default=0, validator=_non_negative)
    memory_bytes: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen(slots=True, kw_only=True)
class Capacity:
    """A worker's capacity or allocation: cpu, memory and actor slots."""

    cpu_milli: int = attrs.field(default=0, validator=_non_negative)
    memory_bytes: int = attrs.field(default=0, validator=_non_negative)
    actors: int = attrs.field(default=0, validator=_non_negative)

    def plus(self, r: Resources, actors: int = 1) -> Capacity:
        return Capacity(
            cpu_milli=self.cpu_milli + r.cpu_milli,
            memory_bytes=self.memory_bytes + r.memory_bytes,
            actors=self.actors + actors,
        )

    def minus(self, r: Resources, actors: int = 1) -> Capacity:
        """Subtract, clamping at zero (a release never drives an allocation negative)."""
        return Capacity(
            cpu_milli=max(0, self.cpu_milli - r.cpu_milli),
            memory_bytes=max(0, self.memory_bytes - r.memory_bytes),
            actors=max(0, self.actors - actors),
        )

    def covers(self, other: Capacity) -> bool:
        return (
            self.cpu_milli >= other.cpu_milli
            and self.memory_bytes >= other.memory_bytes
            and self.actors >= other.actors
        )


@attrs.frozen(slots=True, kw_only=True)
class Metadata:
    """Server-assigned identity and optimistic-concurrency fields of a stored record."""

    uid: str = ""
    version: int = 0
    create_time: float = 0.0
    update_time: float = 0.0


# --- templates --------------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class Probe:
    """An HTTP GET that must answer 200 before the actor is considered awake."""

    path: str = "/"
    port: int = 80
    timeout_seconds: int = 30

    def validate(self, *, what: str) -> Probe:
        if not self.path.startswith("/"):
            raise InvalidArgument(f"{what} path {self.path!r} must start with '/'")
        if not 1 <= self.port <= 65535:
            raise InvalidArgument(f"{what} port {self.port} must be in 1..65535")
        if not 1 <= self.timeout_seconds <= 3600:
            raise InvalidArgument(
                f"{what} timeout_seconds {self.timeout_seconds} must be in 1..3600"
            )
        return self


@attrs.frozen(slots=True, kw_only=True)
class EnvVar:
    name: str
    value: str = ""


@attrs.frozen(slots=True, kw_only=True)
class Container:
    name: str
    image: str
    command: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    env: tuple[EnvVar, ...] = attrs.field(default=(), converter=_env_tuple)
    ports: tuple[int, ...] = attrs.field(default=(80,), converter=_int_tuple)
    wakeup_probe: Probe | None = None

    def validate(self) -> Container:
        validate_dns_label(self.name, what="container name")
        if self.name == "pause":
            raise InvalidArgument("container name 'pause' is reserved")
        if not self.image:
            raise InvalidArgument(f"container {self.name!r} image is required")
        for p in self.ports:
            if not 1 <= p <= 65535:
                raise InvalidArgument(f"container {self.name!r} port {p} must be in 1..65535")
        names = [e.name for e in self.env]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"container {self.name!r} env has duplicate names")
        for e in self.env:
            if not e.name or "=" in e.name:
                raise InvalidArgument(f"container {self.name!r} env name {e.name!r} is invalid")
        if self.wakeup_probe is not None:
            self.wakeup_probe.validate(what=f"container {self.name!r} wakeup probe")
        return self


@attrs.frozen(slots=True, kw_only=True)
class SnapshotConfig:
    preferred_fidelity: Fidelity = Fidelity.MEMORY
    storage_location: str = ""
    """Object-store URL prefix, e.g. ``file:///var/lib/ate/objects`` or ``s3://bucket/x``."""


@attrs.frozen(slots=True, kw_only=True)
class ActorTemplate:
    ref: TemplateRef
    metadata: Metadata = Metadata()
    containers: tuple[Container, ...] = attrs.field(converter=_container_tuple)
    resources: Resources = Resources()
    worker_selector: Labels = Labels()
    sandbox_class: SandboxClass = SandboxClass.GVISOR
    snapshot_config: SnapshotConfig = SnapshotConfig()
    golden_snapshot: bool = False
    """If set, ateapi cold-boots a golden actor, suspends it and tags it as ``golden_tag``."""
    golden_tag: TagRef | None = None
    golden_error: str = ""

    def validate(self) -> ActorTemplate:
        self.ref.validate()
        if not self.containers:
            raise InvalidArgument("template must have at least one container")
        names = [c.name for c in self.containers]
        if len(set(names)) != len(names):
            raise InvalidArgument("template has duplicate container names")
        for c in self.containers:
            c.validate()
        validate_selector(self.worker_selector, what="template worker selector")
        return self


# --- snapshots --------------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class SnapshotStorage:
    """One copy of a snapshot: node-local or durable (object storage)."""

    durability: Durability
    status: StorageStatus
    fidelity: Fidelity
    uri: str = ""
    """Object-store prefix of a DURABLE copy (``.../snapshots/<id>``)."""
    local_name: str = ""
    """Directory name of a LOCAL copy inside the node's snapshot directory."""
    node: NodeRef | None = None
    """The node holding a LOCAL copy."""

    @property
    def completed(self) -> bool:
        return self.status is StorageStatus.COMPLETED


@attrs.frozen(slots=True, kw_only=True)
class Snapshot:
    """One generation of an actor's state, with its copies."""

    generation: int
    snapshot_id: str
    owner: SnapshotOwner = SnapshotOwner.ACTOR
    template_uid: str = ""
    """UID of the template the snapshot was captured under (another template → VOLUMES)."""
    sandbox_class: SandboxClass = SandboxClass.GVISOR
    runtime_version: str = ""
    """Runtime that wrote a MEMORY snapshot; only a worker that can restore it may."""
    captured_at: float = 0.0
    source_tag: TagRef | None = None
    storages: tuple[SnapshotStorage, ...] = attrs.field(default=(), converter=_storage_tuple)

    def durable(self) -> SnapshotStorage | None:
        for s in self.storages:
            if s.durability is Durability.DURABLE:
                return s
        return None

    def local(self) -> SnapshotStorage | None:
        for s in self.storages:
            if s.durability is Durability.LOCAL:
                return s
        return None

    def with_storage(self, storage: SnapshotStorage) -> Snapshot:
        """Replace the copy of the same durability (or add it)."""
        kept = tuple(s for s in self.storages if s.durability is not storage.durability)
        order = {Durability.LOCAL: 0, Durability.DURABLE: 1}
        merged = sorted((*kept, storage), key=lambda s: order[s.durability])
        return attrs.evolve(self, storages=tuple(merged))

    def without(self, durability: Durability) -> Snapshot:
        return attrs.evolve(
            self, storages=tuple(s for s in self.storages if s.durability is not durability)
        )


# --- actors -----------------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class WorkerAssignment:
    """Where an actor runs (a denormalized copy; the router reads ``pod_ips``)."""

    worker: WorkerRef
    node: NodeRef
    worker_epoch: int = 0
    pod_ips: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    resources: Resources = Resources()
    """What the actor booked on the worker (the template's limits at bind time)."""


@attrs.frozen(slots=True, kw_only=True)
class Crash:
    message: str
    time: float


@attrs.frozen(slots=True, kw_only=True)
class ActorStatus:
    state: ActorState = ActorState.SUSPENDED
    assignment: WorkerAssignment | None = None
    snapshots: tuple[Snapshot, ...] = attrs.field(default=(), converter=_snapshot_tuple)
    """Generations, oldest first."""
    crash: Crash | None = None
    assigned_node: NodeRef | None = None
    """Set while the actor is pinned to a node (paused, or holding a node-only copy)."""
    last_assigned_generation: int = 0
    in_progress_generation: int = 0
    """The generation a SUSPENDING/PAUSING workflow is writing (0 = none)."""


@attrs.frozen(slots=True, kw_only=True)
class Actor:
    ref: ActorRef
    metadata: Metadata = Metadata()
    template: TemplateRef
    worker_selector: Labels = Labels()
    source_tag: TagRef | None = None
    status: ActorStatus = ActorStatus()

    @property
    def state(self) -> ActorState:
        return self.status.state

    def snapshot(self, generation: int) -> Snapshot | None:
        for s in self.status.snapshots:
            if s.generation == generation:
                return s
        return None

    def validate(self) -> Actor:
        self.ref.validate()
        self.template.validate()
        validate_selector(self.worker_selector, what="actor worker selector")
        return self


# --- workers ----------------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class Worker:
    ref: WorkerRef
    metadata: Metadata = Metadata()
    pool: str = "default"
    node: NodeRef
    ips: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    sandbox_class: SandboxClass = SandboxClass.GVISOR
    runtime_versions: frozenset[str] = attrs.field(default=frozenset(), converter=_str_frozenset)
    labels: Labels = Labels()
    epoch: int = 0
    state: WorkerState = WorkerState.UNAVAILABLE
    capacity: Capacity | None = None
    """None = not reported yet, which means no room."""
    allocated: Capacity = Capacity()
    last_heartbeat: float = 0.0
    spiffe_id: str = ""
    tunnel_address: str = ""
    """``host:port`` of the worker's atunnel listener."""
    atelet_address: str = ""
    """``host:port`` of the gRPC listener of the node's atelet (how ateapi reaches the node)."""

    def can_restore(self, runtime_version: str) -> bool:
        return not runtime_version or runtime_version in self.runtime_versions


@attrs.frozen(slots=True, kw_only=True)
class ActorBinding:
    """A per-worker booking: the actor holds ``resources`` and one slot on the worker."""

    actor: ActorRef
    actor_uid: str
    worker: WorkerRef
    worker_epoch: int
    resources: Resources


# --- atespaces and tags -----------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class Atespace:
    name: str
    metadata: Metadata = Metadata()

    def validate(self) -> Atespace:
        validate_dns_label(self.name, what="atespace")
        return self


@attrs.frozen(slots=True, kw_only=True)
class Tag:
    """A named snapshot owning a copy of an actor's snapshot; actors created from it borrow it."""

    ref: TagRef
    metadata: Metadata = Metadata()
    source_actor: ActorRef | None = None
    template: TemplateRef | None = None
    snapshot: Snapshot | None = None

    def validate(self) -> Tag:
        self.ref.validate()
        return self


@attrs.frozen(slots=True, kw_only=True)
class ResumeResult:
    """What ResumeActor answers: the actor, whether it was resumed, and the restore provenance.

    ``source`` is where the restore read from; None with ``resumed`` means a cold boot. When
    ``resumed`` is false (the actor was already RUNNING) ``source`` is None and the numbers
    are 0.
    """

    actor: Actor
    resumed: bool
    source: RestoreSource | None = None
    generation: int = 0
    snapshot_age_seconds: float = 0.0
    resume_duration_seconds: float = 0.0

    @property
    def cold_boot(self) -> bool:
        return self.resumed and self.source is None

    @property
    def provenance(self) -> str:
        """The restore-provenance label ("local", "durable", "tag", "cold-boot"; "" if none)."""
        if self.source is not None:
            return self.source.value
        return COLD_BOOT_PROVENANCE if self.resumed else ""


def newest_first(snapshots: Iterable[Snapshot]) -> list[Snapshot]:
    return sorted(snapshots, key=lambda s: s.generation, reverse=True)


__all__ = [
    "COLD_BOOT_PROVENANCE",
    "TRANSIENT_STATES",
    "Actor",
    "ActorBinding",
    "ActorState",
    "ActorStatus",
    "ActorTemplate",
    "Atespace",
    "Capacity",
    "Container",
    "Crash",
    "Durability",
    "EnvVar",
    "Fidelity",
    "Metadata",
    "Probe",
    "Resources",
    "RestoreSource",
    "ResumeResult",
    "SandboxClass",
    "Snapshot",
    "SnapshotConfig",
    "SnapshotOwner",
    "SnapshotStorage",
    "StorageStatus",
    "SuspendMode",
    "Tag",
    "Worker",
    "WorkerAssignment",
    "WorkerState",
    "newest_first",
]
