"""The OCI ``config.json`` of a sandbox bundle (pure).

The config is what ``runsc spec`` writes, with the edits that make a networked
checkpoint and restore work on these machines (``docs/gvisor-notes.md`` §1b):

* ``process.args`` is the sandbox's process and ``process.terminal`` is false;
* ``root`` is the rootfs, read-only;
* ``/tmp`` is a tmpfs (tmpfs lives in sentry memory, so it is part of the checkpoint);
* there is no ``linux.resources`` and no ``linux.cgroupsPath`` (runsc runs with
  ``--ignore-cgroups``; limits are the worker's accounting, not cgroups);
* ``linux.namespaces`` names the actor's network namespace by path. A restore into
  another namespace changes only that path.

A spec without a network namespace path is refused: runsc would then use the namespace
it runs in, which is the worker's own, and strip the worker's addresses into the sandbox.
"""

from __future__ import annotations

import json
from typing import Any, Final

from substrate.errors import InvalidArgument
from substrate.sandbox.spec import SYSINFO_MOUNT, SandboxSpec

OCI_VERSION: Final = "1.0.0"
HOSTNAME: Final = "runsc"
DEFAULT_ENV: Final = (
    ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
    ("TERM", "xterm"),
)
"""The environment ``runsc spec`` starts from; the container's env overrides it by name."""

CAPABILITIES: Final = ("CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE")
NOFILE_LIMIT: Final = 1024

TMP_OPTIONS: Final = ("nosuid", "nodev", "mode=1777")
"""Options of the ``/tmp`` tmpfs mount."""

SYSINFO_OPTIONS: Final = ("rbind", "ro", "nosuid", "nodev", "noexec")
"""Options of the read-only bind mount of the actor's system-info directory."""


def process_env(spec: SandboxSpec) -> list[str]:
    """``NAME=value`` strings: the defaults, overridden in place by name, then the rest."""
    own = {e.name: e.value for e in spec.env}
    env = [f"{name}={own.pop(name, value)}" for name, value in DEFAULT_ENV]
    env += [f"{e.name}={e.value}" for e in spec.env if e.name in own]
    return env


def _capabilities() -> dict[str, list[str]]:
    return {
        kind: list(CAPABILITIES)
        for kind in ("bounding", "effective", "inheritable", "permitted", "ambient")
    }


def _mounts(spec: SandboxSpec) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []},
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": list(TMP_OPTIONS),
        },
    ]
    if spec.sysinfo_dir:
        mounts.append(
            {
                "destination": SYSINFO_MOUNT,
                "type": "bind",
                "source": spec.sysinfo_dir,
                "options": list(SYSINFO_OPTIONS),
            }
        )
    return mounts


def build_config(spec: SandboxSpec) -> dict[str, Any]:
    """The ``config.json`` of ``spec``'s bundle, as a JSON-ready dict (a new one each call).

    With ``spec.sysinfo_dir`` set, that host directory is bind-mounted read-only at
    ``/run/ate`` (the rootfs needs a ``/run/ate`` directory: it is mounted read-only).
    """
    if not spec.netns_path:
        raise InvalidArgument(
            f"sandbox {spec.sandbox_id} has no network namespace path; refusing to build a "
            "config that would run in the worker's own namespace"
        )
    return {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": list(spec.args),
            "env": process_env(spec),
            "cwd": spec.cwd,
            "capabilities": _capabilities(),
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": NOFILE_LIMIT, "soft": NOFILE_LIMIT}],
        },
        "root": {"path": spec.rootfs, "readonly": True},
        "hostname": HOSTNAME,
        "mounts": _mounts(spec),
        "linux": {
            "namespaces": [
                {"type": "pid"},
                {"type": "network", "path": spec.netns_path},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
            ]
        },
    }


def render_config(spec: SandboxSpec) -> str:
    """:func:`build_config` as the text of ``config.json`` (stable, ends with a newline)."""
    return json.dumps(build_config(spec), indent=2) + "\n"


def network_namespace_path(config: dict[str, Any]) -> str:
    """The network namespace path a ``config.json`` dict names ("" if none).

    The runtime adapter checks this before every run or restore of a bundle it did not
    build itself (the same guard as ``gv.sh``'s ``need_netns``).
    """
    linux = config.get("linux")
    namespaces = linux.get("namespaces") if isinstance(linux, dict) else None
    if not isinstance(namespaces, list):
        return ""
    for ns in namespaces:
        if isinstance(ns, dict) and ns.get("type") == "network":
            path = ns.get("path", "")
            return path if isinstance(path, str) else ""
    return ""


__all__ = [
    "CAPABILITIES",
    "DEFAULT_ENV",
    "HOSTNAME",
    "OCI_VERSION",
    "SYSINFO_OPTIONS",
    "TMP_OPTIONS",
    "build_config",
    "network_namespace_path",
    "process_env",
    "render_config",
]
