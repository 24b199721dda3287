"""What a sandbox runtime is asked to run, and what it reports back (pure records).

A :class:`SandboxSpec` is everything a runtime needs to cold-boot or restore one actor's
sandbox: the sandbox id (derived from the actor uid, so a restore reuses the id the image
was checkpointed under), the OCI bundle, the process of the template's first container,
its ports and wakeup probe, the limits, and the network namespace it joins. How a worker
reaches the workload is reported by the runtime as a :class:`SandboxAddress`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from typing import Final

import attrs

from substrate.core.model import (
    ActorTemplate,
    Container,
    EnvVar,
    Fidelity,
    Probe,
    Resources,
)
from substrate.errors import InvalidArgument, NotFound

SANDBOX_ID_PREFIX: Final = "ate-"
"""Prefix of the sandbox (OCI container) id of an actor: ``ate-<actor-uid>``."""

SANDBOX_ID_MAX: Final = 64
"""Longest sandbox id. runsc names its control socket ``@runsc-sandbox.<id>`` and an
abstract unix socket name is at most 107 bytes; 64 leaves room."""

NETNS_DIR: Final = "/var/run/netns"
"""Where ``ip netns`` keeps its named network namespaces."""

DEFAULT_ROOTFS: Final = "rootfs"
"""The root filesystem directory inside the bundle (``root.path`` of ``config.json``)."""

SYSINFO_MOUNT: Final = "/run/ate"
"""Where the actor's system-info directory appears inside the sandbox (read-only)."""

_SANDBOX_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_DEVICE_RE: Final = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")


class SandboxState(enum.Enum):
    """Where a sandbox is in its life, as its runtime sees it."""

    CREATED = 1
    """Being started: the process does not run yet."""
    RUNNING = 2
    """The workload runs (whether it answers its probes is the worker's business)."""
    CHECKPOINTED = 3
    """Checkpointed successfully; the process is gone, the image is in the image dir."""
    STOPPED = 4
    """The process is gone without a usable image: it exited, crashed or a checkpoint failed."""


# --- validation -------------------------------------------------------------------------


def validate_sandbox_id(value: str) -> str:
    """Return ``value`` if it is a usable sandbox id, else raise :class:`InvalidArgument`.

    Allowed: ASCII letters, digits, ``_``, ``.`` and ``-``, starting with a letter or
    digit, at most :data:`SANDBOX_ID_MAX` characters (runsc accepts ``[\\w+.-]+``).
    """
    if not isinstance(value, str) or not value:
        raise InvalidArgument("sandbox id is required")
    if len(value) > SANDBOX_ID_MAX:
        raise InvalidArgument(
            f"sandbox id {value!r} must be no more than {SANDBOX_ID_MAX} characters"
        )
    if not _SANDBOX_ID_RE.match(value):
        raise InvalidArgument(
            f"sandbox id {value!r} is invalid: it must consist of ASCII letters, digits, "
            "'_', '.' or '-' and start with a letter or digit"
        )
    return value


def sandbox_id_for(actor_uid: str) -> str:
    """The sandbox id of the actor with uid ``actor_uid`` (``ate-<uid>``).

    The id depends on the uid alone, so every worker restores an actor's image under the
    id it was checkpointed with (runsc needs that for ``ps`` to list the restored tasks).
    """
    if not isinstance(actor_uid, str) or not actor_uid:
        raise InvalidArgument("actor uid is required for a sandbox id")
    return validate_sandbox_id(SANDBOX_ID_PREFIX + actor_uid)


def netns_path_for(name: str) -> str:
    """The path of the named network namespace ``name`` (``/var/run/netns/<name>``)."""
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise InvalidArgument(f"network namespace name {name!r} is invalid")
    return f"{NETNS_DIR}/{name}"


def _check_absolute(value: str, *, what: str) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise InvalidArgument(f"{what} {value!r} must be an absolute path")
    if "\x00" in value:
        raise InvalidArgument(f"{what} {value!r} must not contain NUL")
    return value


def _validate_spec_id(_inst: object, _attribute: object, value: str) -> None:
    validate_sandbox_id(value)


def _validate_bundle(_inst: object, _attribute: object, value: str) -> None:
    _check_absolute(value, what="bundle directory")


def _validate_netns(_inst: object, _attribute: object, value: str) -> None:
    _check_absolute(value, what="network namespace path")


def _validate_sysinfo(_inst: object, _attribute: object, value: str) -> None:
    if value:
        _check_absolute(value, what="system-info directory")


def _validate_rootfs(_inst: object, _attribute: object, value: str) -> None:
    if not isinstance(value, str) or not value or "\x00" in value:
        raise InvalidArgument(f"rootfs {value!r} is invalid")


def _validate_args(_inst: object, _attribute: object, value: tuple[str, ...]) -> None:
    if not value:
        raise InvalidArgument("sandbox args are required (the process to run)")
    for arg in value:
        if not isinstance(arg, str) or "\x00" in arg:
            raise InvalidArgument(f"sandbox arg {arg!r} is invalid")


def _validate_cwd(_inst: object, _attribute: object, value: str) -> None:
    _check_absolute(value, what="working directory")


def _validate_env(_inst: object, _attribute: object, value: tuple[EnvVar, ...]) -> None:
    names = [e.name for e in value]
    if len(set(names)) != len(names):
        raise InvalidArgument("sandbox env has duplicate names")
    for e in value:
        if not e.name or "=" in e.name or "\x00" in e.name or "\x00" in e.value:
            raise InvalidArgument(f"sandbox env name {e.name!r} is invalid")


def _validate_ports(_inst: object, _attribute: object, value: tuple[int, ...]) -> None:
    if len(set(value)) != len(value):
        raise InvalidArgument("sandbox ports must be distinct")
    for p in value:
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535:
            raise InvalidArgument(f"sandbox port {p!r} must be in 1..65535")


def _validate_device(_inst: object, _attribute: object, value: str) -> None:
    if value and not _DEVICE_RE.match(value):
        raise InvalidArgument(f"network device {value!r} is not a valid interface name")


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise InvalidArgument("expected a sequence of strings, not one string")
    return tuple(value)


def _int_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _env_tuple(value: Iterable[EnvVar]) -> tuple[EnvVar, ...]:
    return tuple(value)


# --- the spec ---------------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class SandboxSpec:
    """One actor's sandbox: what to run, with which limits, in which network namespace.

    Build it with :meth:`from_template`; move it to another namespace or worker for a
    restore with :meth:`relocated` (only the namespace, bundle and address change).
    """

    sandbox_id: str = attrs.field(validator=_validate_spec_id)
    """The OCI container id; :func:`sandbox_id_for` of the actor uid."""
    bundle_dir: str = attrs.field(validator=_validate_bundle)
    """Absolute path of the OCI bundle directory (``config.json`` and the rootfs)."""
    netns_path: str = attrs.field(validator=_validate_netns)
    """Absolute path of the network namespace the sandbox joins (never the worker's own)."""
    args: tuple[str, ...] = attrs.field(converter=_str_tuple, validator=_validate_args)
    """The process: the first container's command (or the image's entrypoint)."""
    env: tuple[EnvVar, ...] = attrs.field(default=(), converter=_env_tuple, validator=_validate_env)
    cwd: str = attrs.field(default="/", validator=_validate_cwd)
    rootfs: str = attrs.field(default=DEFAULT_ROOTFS, validator=_validate_rootfs)
    """The root filesystem, relative to the bundle (or absolute); mounted read-only."""
    ports: tuple[int, ...] = attrs.field(
        default=(80,), converter=_int_tuple, validator=_validate_ports
    )
    """The ports the workload listens on inside the sandbox."""
    wakeup_probe: Probe | None = None
    """The HTTP GET the worker waits for after a run or restore (None: none declared)."""
    resources: Resources = Resources()
    """The actor's cpu and memory limits (what it books on the worker)."""
    address: str = ""
    """Host-side IP address the workload is reached at (e.g. ``169.254.17.2``); "" = the
    runtime decides (see :meth:`SandboxRuntime.address`)."""
    device: str = attrs.field(default="", validator=_validate_device)
    """Host-side interface to bind to when connecting (``SO_BINDTODEVICE``), e.g. the
    actor's host veth: many actors share one address, each behind its own veth."""
    sysinfo_dir: str = attrs.field(default="", validator=_validate_sysinfo)
    """Absolute host directory with the actor's system-info files (``atespace``, ``name``,
    ``uid``), bind-mounted read-only at :data:`SYSINFO_MOUNT` ("" = none). The sandbox
    reads the host's current files, also after a restore."""

    @property
    def memory_limit_bytes(self) -> int:
        return self.resources.memory_bytes

    @property
    def cpu_limit_milli(self) -> int:
        return self.resources.cpu_milli

    @property
    def probe_port(self) -> int:
        """The port the wakeup probe targets (the first port if no probe is declared)."""
        if self.wakeup_probe is not None:
            return self.wakeup_probe.port
        return self.ports[0] if self.ports else 80

    @classmethod
    def from_template(
        cls,
        template: ActorTemplate,
        *,
        actor_uid: str,
        bundle_dir: str,
        netns_path: str,
        image_args: Sequence[str] = (),
        address: str = "",
        device: str = "",
        rootfs: str = DEFAULT_ROOTFS,
        sysinfo_dir: str = "",
    ) -> SandboxSpec:
        """The spec of the actor ``actor_uid`` of ``template``.

        The process, env, ports and wakeup probe come from the template's first
        container; ``image_args`` (the image's entrypoint and cmd) is used when the
        container has no command. Raises :class:`InvalidArgument` if neither gives a
        process to run or a value is malformed.
        """
        if not template.containers:
            raise InvalidArgument("template must have at least one container")
        first: Container = template.containers[0]
        args = tuple(first.command) or tuple(image_args)
        if not args:
            raise InvalidArgument(
                f"container {first.name!r} has no command and the image has no entrypoint"
            )
        return cls(
            sandbox_id=sandbox_id_for(actor_uid),
            bundle_dir=bundle_dir,
            netns_path=netns_path,
            args=args,
            env=first.env,
            ports=first.ports,
            wakeup_probe=first.wakeup_probe,
            resources=template.resources,
            address=address,
            device=device,
            rootfs=rootfs,
            sysinfo_dir=sysinfo_dir,
        )

    def relocated(
        self,
        *,
        netns_path: str,
        bundle_dir: str | None = None,
        address: str | None = None,
        device: str | None = None,
        sysinfo_dir: str | None = None,
    ) -> SandboxSpec:
        """The same sandbox in another network namespace (and bundle copy, address, veth).

        This is what a restore on another worker, or into a fresh namespace, uses: the
        sandbox id and the process stay, only where it lives changes.
        """
        return attrs.evolve(
            self,
            netns_path=netns_path,
            bundle_dir=self.bundle_dir if bundle_dir is None else bundle_dir,
            address=self.address if address is None else address,
            device=self.device if device is None else device,
            sysinfo_dir=self.sysinfo_dir if sysinfo_dir is None else sysinfo_dir,
        )


# --- what a runtime reports -------------------------------------------------------------


def _port_pairs(value: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    return tuple(sorted((int(a), int(b)) for a, b in value))


def _validate_port_pairs(
    _inst: object, _attribute: object, value: tuple[tuple[int, int], ...]
) -> None:
    inner = [a for a, _ in value]
    if len(set(inner)) != len(inner):
        raise InvalidArgument("a sandbox port is mapped twice")
    for a, b in value:
        if not (1 <= a <= 65535 and 1 <= b <= 65535):
            raise InvalidArgument(f"port mapping {a}->{b} is out of range")


@attrs.frozen(slots=True, kw_only=True)
class SandboxAddress:
    """Where the worker reaches a running sandbox's workload.

    ``ports`` maps each sandbox port to the host-side port to connect to (the identity
    for a sandbox with its own network namespace; ephemeral ports for the fake runtime).
    If ``device`` is set, connect with ``SO_BINDTODEVICE`` on it.
    """

    host: str
    ports: tuple[tuple[int, int], ...] = attrs.field(
        default=(), converter=_port_pairs, validator=_validate_port_pairs
    )
    device: str = attrs.field(default="", validator=_validate_device)

    def host_port(self, sandbox_port: int) -> int:
        """The host-side port of ``sandbox_port``; :class:`NotFound` if it is not exposed."""
        for inner, outer in self.ports:
            if inner == sandbox_port:
                return outer
        raise NotFound(f"sandbox port {sandbox_port} is not exposed at {self.host}")


@attrs.frozen(slots=True, kw_only=True)
class SandboxStats:
    """Resource use of a running sandbox.

    ``uptime_seconds`` and ``cpu_seconds`` count from the start of the current sandbox
    process: a restore starts them again (the restored memory is not the process).
    """

    memory_bytes: int
    """Memory the sandbox holds (resident set of its processes, or the fake's pages)."""
    cpu_seconds: float
    """CPU time the sandbox process has used."""
    uptime_seconds: float
    """Seconds since the sandbox process started (run or restore)."""


def _names_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(value))


def _validate_file_names(_inst: object, _attribute: object, value: tuple[str, ...]) -> None:
    for name in value:
        if not name or "/" in name or name in (".", ".."):
            raise InvalidArgument(f"checkpoint file name {name!r} is invalid")


@attrs.frozen(slots=True, kw_only=True)
class CheckpointInfo:
    """A successful checkpoint: the image files in ``directory`` and who wrote them.

    The files are flat (no subdirectories), so a snapshot manifest can list them as is.
    A MEMORY restore needs a runtime whose :meth:`runtime_version` equals
    ``runtime_version``.
    """

    sandbox_id: str
    directory: str
    files: tuple[str, ...] = attrs.field(converter=_names_tuple, validator=_validate_file_names)
    runtime_version: str
    size_bytes: int
    """The image files' total size."""
    fidelity: Fidelity = Fidelity.MEMORY


__all__ = [
    "DEFAULT_ROOTFS",
    "NETNS_DIR",
    "SANDBOX_ID_MAX",
    "SANDBOX_ID_PREFIX",
    "SYSINFO_MOUNT",
    "CheckpointInfo",
    "SandboxAddress",
    "SandboxSpec",
    "SandboxState",
    "SandboxStats",
    "netns_path_for",
    "sandbox_id_for",
    "validate_sandbox_id",
]
