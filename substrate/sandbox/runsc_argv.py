"""argv of every ``runsc`` command the gVisor adapter runs (pure; ``docs/gvisor-notes.md`` §1c).

Every command carries the same global flags: the adapter's state directory
(``--root``), ``--ignore-cgroups`` (no cgroups here), ``--platform=ptrace`` (the only
platform that works on these machines) and ``--network=sandbox`` (netstack).

runsc itself always runs in the worker's own network namespace, so its control socket
(an abstract unix socket, which belongs to one network namespace) stays reachable by
every later command; the actor's namespace is named in the bundle's ``config.json``.
Only ``run`` and ``restore`` are wrapped in a private mount namespace with a tmpfs over
``/proc/sys/net``: old runsc refuses to set up netstack when, after joining the actor's
namespace, it can see ``/proc/sys/net/core/rmem_default`` — which this kernel shows in
every namespace.

Run ``run`` and ``restore`` with stdin from ``/dev/null`` and stdout/stderr to an
``O_APPEND`` file: the sandbox inherits them, so a captured pipe never closes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs

from substrate.errors import InvalidArgument
from substrate.sandbox.spec import validate_sandbox_id

HIDE_PROC_SYS_NET: Final = 'mount -t tmpfs gv-hide /proc/sys/net && exec "$@"'
"""The shell line of the wrapper: hide ``/proc/sys/net``, then exec the runsc command."""


def _absolute(value: str, *, what: str) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise InvalidArgument(f"{what} {value!r} must be an absolute path")
    if "\x00" in value:
        raise InvalidArgument(f"{what} {value!r} must not contain NUL")
    return value


def _validate_root(_inst: object, _attribute: object, value: str) -> None:
    _absolute(value, what="runsc root")


def _validate_debug_dir(_inst: object, _attribute: object, value: str) -> None:
    if value:
        _absolute(value, what="runsc debug log directory")


def _validate_word(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise InvalidArgument(f"runsc {attribute.name} {value!r} is invalid")


@attrs.frozen(slots=True, kw_only=True)
class RunscOptions:
    """How the adapter invokes runsc: binary, state directory and global flags."""

    root: str = attrs.field(validator=_validate_root)
    """The state directory (``--root``); one per worker, so workers never share ids."""
    binary: str = attrs.field(default="runsc", validator=_validate_word)
    platform: str = attrs.field(default="ptrace", validator=_validate_word)
    """ptrace: this runsc has no systrap and kvm hangs on these machines."""
    network: str = attrs.field(default="sandbox", validator=_validate_word)
    ignore_cgroups: bool = True
    debug_log_dir: str = attrs.field(default="", validator=_validate_debug_dir)
    """If set, ``--debug --debug-log=<dir>/`` (one log file per runsc command)."""
    unshare: str = attrs.field(default="unshare", validator=_validate_word)
    shell: str = attrs.field(default="sh", validator=_validate_word)


def global_argv(opts: RunscOptions) -> tuple[str, ...]:
    """``runsc`` and its global flags, as every command starts."""
    argv = [opts.binary, "--root", opts.root]
    if opts.ignore_cgroups:
        argv.append("--ignore-cgroups")
    argv += [f"--platform={opts.platform}", f"--network={opts.network}"]
    if opts.debug_log_dir:
        argv += ["--debug", f"--debug-log={opts.debug_log_dir.rstrip('/')}/"]
    return tuple(argv)


def hide_proc_sys_net(opts: RunscOptions, argv: Sequence[str]) -> tuple[str, ...]:
    """``argv`` run in a private mount namespace with a tmpfs over ``/proc/sys/net``."""
    return (
        opts.unshare,
        "-m",
        "--propagation",
        "private",
        opts.shell,
        "-c",
        HIDE_PROC_SYS_NET,
        "sh",
        *argv,
    )


def run_argv(opts: RunscOptions, sandbox_id: str, bundle_dir: str) -> tuple[str, ...]:
    """Create and start ``sandbox_id`` from ``bundle_dir``, detached (wrapped)."""
    validate_sandbox_id(sandbox_id)
    bundle = _absolute(bundle_dir, what="bundle directory")
    return hide_proc_sys_net(
        opts, (*global_argv(opts), "run", "-detach", "--bundle", bundle, sandbox_id)
    )


def checkpoint_argv(opts: RunscOptions, sandbox_id: str, image_dir: str) -> tuple[str, ...]:
    """Checkpoint ``sandbox_id`` into ``image_dir``; the sandbox exits afterwards.

    Not wrapped. The sandbox exits whether the checkpoint succeeds or fails; only exit
    code 0 means a usable image. Never ``--leave-running`` (it blocks as the parent of a
    new sandbox, and killing it kills that sandbox's gofer).
    """
    validate_sandbox_id(sandbox_id)
    image = _absolute(image_dir, what="image directory")
    return (*global_argv(opts), "checkpoint", "--image-path", image, sandbox_id)


def restore_argv(
    opts: RunscOptions, sandbox_id: str, bundle_dir: str, image_dir: str
) -> tuple[str, ...]:
    """Restore ``sandbox_id`` from ``image_dir`` with ``bundle_dir``, detached (wrapped).

    Use the id the image was checkpointed under, after deleting what is left of it in
    this ``--root`` (else: "container already exists").
    """
    validate_sandbox_id(sandbox_id)
    bundle = _absolute(bundle_dir, what="bundle directory")
    image = _absolute(image_dir, what="image directory")
    return hide_proc_sys_net(
        opts,
        (
            *global_argv(opts),
            "restore",
            "-detach",
            "--bundle",
            bundle,
            "--image-path",
            image,
            sandbox_id,
        ),
    )


def delete_argv(opts: RunscOptions, sandbox_id: str) -> tuple[str, ...]:
    """Force-delete ``sandbox_id``: kill the sandbox and its gofer, remove its state.

    Right after a checkpoint this waits about a second for the sandbox to exit.
    """
    validate_sandbox_id(sandbox_id)
    return (*global_argv(opts), "delete", "-force", sandbox_id)


def state_argv(opts: RunscOptions, sandbox_id: str) -> tuple[str, ...]:
    """Print ``sandbox_id``'s OCI state as JSON (``status``, ``pid``, ...)."""
    validate_sandbox_id(sandbox_id)
    return (*global_argv(opts), "state", sandbox_id)


def ps_argv(opts: RunscOptions, sandbox_id: str) -> tuple[str, ...]:
    """List the processes of ``sandbox_id`` as JSON."""
    validate_sandbox_id(sandbox_id)
    return (*global_argv(opts), "ps", "-format", "json", sandbox_id)


def list_argv(opts: RunscOptions) -> tuple[str, ...]:
    """List every container of this ``--root`` as JSON."""
    return (*global_argv(opts), "list", "-format", "json")


__all__ = [
    "HIDE_PROC_SYS_NET",
    "RunscOptions",
    "checkpoint_argv",
    "delete_argv",
    "global_argv",
    "hide_proc_sys_net",
    "list_argv",
    "ps_argv",
    "restore_argv",
    "run_argv",
    "state_argv",
]
