"""The worker port: what a node's atelet asks of one of its ateworkers (pure records + Protocol).

An ateworker hosts many actor sandboxes. atelet prepares everything that lives on the
node's disk — the bundle's root filesystem, the restore directory, the actor's
system-info files — and the worker does the rest: the actor's network namespace and
egress redirect, the bundle's ``config.json`` (it names that namespace), the sandbox, the
wakeup probes, and its ingress route in atunnel.

Adapters: :class:`substrate.services.workloads.WorkloadManager` in process, and the
``Ateworker`` gRPC service over the worker's Unix socket
(:mod:`substrate.api.worker`). Both pass the same behaviour tests.

Errors (from :mod:`substrate.errors`): ``FailedPrecondition`` for a wrong worker epoch or a
call the actor's state does not allow (a checkpoint of an actor that is not running);
``NotFound`` for an actor the worker does not know (stats); ``InvalidArgument`` for a
request it cannot run; ``Internal`` for a failed sandbox (a failed checkpoint kills it);
``Unavailable`` when the worker is not serving.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Protocol

import attrs

from substrate.core.ids import ActorRef, NodeRef
from substrate.core.model import Capacity, Container, Resources, SandboxClass
from substrate.errors import InvalidArgument
from substrate.sandbox.spec import SandboxStats


def _absolute_or_empty(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value and (not value.startswith("/") or "\x00" in value):
        raise InvalidArgument(f"{attribute.name} {value!r} must be an absolute path")


def _absolute(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not value:
        raise InvalidArgument(f"{attribute.name} is required")
    _absolute_or_empty(_inst, attribute, value)


def _containers(value: Iterable[Container]) -> tuple[Container, ...]:
    return tuple(value)


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise InvalidArgument("expected a sequence of strings, not one string")
    return tuple(value)


def _frozen_labels(value: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(value))


def _frozen_timings(value: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType(dict(value))


@attrs.frozen(slots=True, kw_only=True)
class WorkloadRequest:
    """Run (cold boot) or restore one actor's sandbox on a worker."""

    actor: ActorRef
    actor_uid: str
    worker_epoch: int = 0
    """The epoch the caller expects; 0 = do not check."""
    bundle_dir: str = attrs.field(validator=_absolute)
    """The OCI bundle directory atelet prepared: ``<bundle_dir>/rootfs`` is the root
    filesystem; the worker writes ``config.json`` beside it for its own namespace."""
    containers: tuple[Container, ...] = attrs.field(converter=_containers)
    resources: Resources = Resources()
    image_args: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    """The image's entrypoint + cmd, used when the first container has no command."""
    image_env: tuple[tuple[str, str], ...] = ()
    """The image's environment (the container's env overrides it by name)."""
    sysinfo_dir: str = attrs.field(default="", validator=_absolute_or_empty)
    """Host directory with the actor's system-info files (``name``, ``atespace``,
    ``uid``), mounted read-only at ``/run/ate`` in the sandbox ("" = none)."""
    restore_dir: str = attrs.field(default="", validator=_absolute_or_empty)
    """For a restore: the directory holding the image files."""
    preserve_restore_dir: bool = True
    """Keep ``restore_dir`` after the restore (a node-local snapshot restored in place)."""

    def __attrs_post_init__(self) -> None:
        if not self.containers:
            raise InvalidArgument("a workload needs at least one container")


@attrs.frozen(slots=True, kw_only=True)
class WorkloadStarted:
    worker_epoch: int
    pod_ips: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    timings: Mapping[str, float] = attrs.field(factory=dict, converter=_frozen_timings, eq=False)
    """Seconds per phase, e.g. ``network``, ``bundle``, ``restore``, ``probe``."""


@attrs.frozen(slots=True, kw_only=True)
class WorkloadCheckpointed:
    worker_epoch: int
    files: tuple[str, ...] = attrs.field(converter=_str_tuple)
    """The image files written (flat names in the checkpoint directory)."""
    runtime_version: str
    size_bytes: int = 0
    timings: Mapping[str, float] = attrs.field(factory=dict, converter=_frozen_timings, eq=False)


@attrs.frozen(slots=True, kw_only=True)
class WorkerInfo:
    """What a worker reports about itself (atelet registers it with ateapi)."""

    name: str
    """The worker's fleet-unique name (a DNS-1123 subdomain)."""
    node: NodeRef
    epoch: int
    """Rises on every start of the worker process."""
    sandbox_class: SandboxClass
    runtime_versions: tuple[str, ...] = attrs.field(converter=_str_tuple)
    capacity: Capacity
    tunnel_address: str = ""
    """``host:port`` of the worker's atunnel listener ("" = none)."""
    pool: str = "default"
    labels: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_labels, eq=False)


class WorkerApi(Protocol):
    """One ateworker, as its node's atelet sees it."""

    async def info(self) -> WorkerInfo:
        """Who the worker is, its epoch and capacity."""
        ...

    async def run(self, request: WorkloadRequest) -> WorkloadStarted:
        """Cold-boot the actor and wait until every wakeup probe answers 200.

        Idempotent: an actor already running on this worker returns at once. A wrong
        epoch returns the worker's epoch without starting anything (the caller compares).
        A probe that never answers 200 fails with ``FailedPrecondition`` and leaves
        nothing behind.
        """
        ...

    async def restore(self, request: WorkloadRequest) -> WorkloadStarted:
        """Restore the actor from ``request.restore_dir``; otherwise as :meth:`run`."""
        ...

    async def checkpoint(
        self, actor_uid: str, checkpoint_dir: str, *, worker_epoch: int = 0
    ) -> WorkloadCheckpointed:
        """Abort the actor's connections, checkpoint it into ``checkpoint_dir``, stop it.

        ``FailedPrecondition`` if the actor is not running here (or the epoch differs);
        ``Internal`` if the checkpoint failed — the sandbox is gone then, and its network
        torn down.
        """
        ...

    async def terminate(self, actor_uid: str, *, worker_epoch: int = 0) -> None:
        """Stop the actor's sandbox and remove its network; idempotent."""
        ...

    async def stats(self, actor_uid: str) -> SandboxStats:
        """``NotFound`` if unknown; ``FailedPrecondition`` if not running."""
        ...


__all__ = [
    "WorkerApi",
    "WorkerInfo",
    "WorkloadCheckpointed",
    "WorkloadRequest",
    "WorkloadStarted",
]
