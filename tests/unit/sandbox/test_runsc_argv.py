"""runsc argv builders: golden argv per command (docs/gvisor-notes.md §1c, gv.sh)."""

from __future__ import annotations

import pytest

from substrate.errors import InvalidArgument
from substrate.sandbox.runsc_argv import (
    HIDE_PROC_SYS_NET,
    RunscOptions,
    checkpoint_argv,
    delete_argv,
    global_argv,
    list_argv,
    ps_argv,
    restore_argv,
    run_argv,
    state_argv,
)

OPTS = RunscOptions(root="/var/lib/ate/runsc")
G = (
    "runsc",
    "--root",
    "/var/lib/ate/runsc",
    "--ignore-cgroups",
    "--platform=ptrace",
    "--network=sandbox",
)
WRAP = (
    "unshare",
    "-m",
    "--propagation",
    "private",
    "sh",
    "-c",
    'mount -t tmpfs gv-hide /proc/sys/net && exec "$@"',
    "sh",
)


def test_global_flags() -> None:
    assert global_argv(OPTS) == G


def test_run_is_wrapped() -> None:
    assert run_argv(OPTS, "ate-a1", "/b/a1") == (
        *WRAP,
        *G,
        "run",
        "-detach",
        "--bundle",
        "/b/a1",
        "ate-a1",
    )


def test_restore_is_wrapped() -> None:
    assert restore_argv(OPTS, "ate-a1", "/b/a1-copy", "/img/7") == (
        *WRAP,
        *G,
        "restore",
        "-detach",
        "--bundle",
        "/b/a1-copy",
        "--image-path",
        "/img/7",
        "ate-a1",
    )


def test_the_other_commands_are_not_wrapped() -> None:
    assert checkpoint_argv(OPTS, "ate-a1", "/img/7") == (
        *G,
        "checkpoint",
        "--image-path",
        "/img/7",
        "ate-a1",
    )
    assert delete_argv(OPTS, "ate-a1") == (*G, "delete", "-force", "ate-a1")
    assert state_argv(OPTS, "ate-a1") == (*G, "state", "ate-a1")
    assert ps_argv(OPTS, "ate-a1") == (*G, "ps", "-format", "json", "ate-a1")
    assert list_argv(OPTS) == (*G, "list", "-format", "json")


def test_the_wrapper_runs_the_command_as_its_positional_arguments() -> None:
    argv = run_argv(OPTS, "ate-a1", "/b/a1")
    script_at = argv.index("-c") + 1
    assert argv[script_at] == HIDE_PROC_SYS_NET
    assert argv[script_at + 1] == "sh"  # $0; "$@" is the runsc command
    assert argv[script_at + 2 :] == (*G, "run", "-detach", "--bundle", "/b/a1", "ate-a1")


def test_options() -> None:
    opts = RunscOptions(
        root="/r",
        binary="/usr/sbin/runsc",
        ignore_cgroups=False,
        debug_log_dir="/var/log/runsc/",
        unshare="/usr/bin/unshare",
        shell="/bin/sh",
    )
    assert global_argv(opts) == (
        "/usr/sbin/runsc",
        "--root",
        "/r",
        "--platform=ptrace",
        "--network=sandbox",
        "--debug",
        "--debug-log=/var/log/runsc/",
    )
    wrapped = run_argv(opts, "x", "/b")
    assert wrapped[:6] == ("/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c")


@pytest.mark.parametrize(
    "build",
    [
        lambda: run_argv(OPTS, "bad id", "/b"),
        lambda: run_argv(OPTS, "ate-a1", "relative/bundle"),
        lambda: restore_argv(OPTS, "ate-a1", "/b", "img"),
        lambda: checkpoint_argv(OPTS, "ate-a1", ""),
        lambda: checkpoint_argv(OPTS, "-flag", "/img"),
        lambda: delete_argv(OPTS, ""),
        lambda: state_argv(OPTS, "a/b"),
        lambda: ps_argv(OPTS, "x" * 65),
        lambda: RunscOptions(root="relative"),
        lambda: RunscOptions(root="/r", platform="kvm x"),
        lambda: RunscOptions(root="/r", debug_log_dir="logs"),
    ],
)
def test_invalid_input_is_refused(build: object) -> None:
    assert callable(build)
    with pytest.raises(InvalidArgument):
        build()
