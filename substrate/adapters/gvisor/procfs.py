"""Reading ``/proc`` for the gVisor runtime: liveness, usage and stray processes of a sandbox.

A runsc sandbox on the ptrace platform is one host process (the sentry,
``runsc-sandbox``) with stub processes below it, where the workload's threads run, and a
gofer process beside it (``runsc-gofer``). The workload's memory lives in a memfd of the
sentry (``/memfd:runsc-memory``): the pages it holds are that file's allocated blocks, and
they show in nobody's resident set (the stubs map them lazily). So a sandbox's memory is
the sentry's anonymous resident memory plus the memfd's allocated bytes, and its CPU time
is the sentry's plus its descendants' user and system time.

The parsers are pure functions of the file text (tested without root); the readers
return None when the process is gone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

import attrs

PROC: Final = "/proc"
CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
"""``/proc/<pid>/stat`` times are in these ticks per second."""
MEMORY_FILE: Final = "/memfd:runsc-memory"
"""The link target of the sentry's descriptor of the sandbox's memory file."""


@attrs.frozen(slots=True, kw_only=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the runtime needs."""

    pid: int
    comm: str
    state: str
    """One letter: R, S, D, Z (zombie), X (dead), ..."""
    ppid: int
    cpu_ticks: int
    """utime + stime."""
    start_ticks: int
    """Start time after boot: with the pid, it names one process (pids are reused)."""

    @property
    def gone(self) -> bool:
        """Exited (a zombie waiting for its parent, or dead)."""
        return self.state in ("Z", "X", "x")


def parse_stat(text: str) -> ProcStat:
    """Parse ``/proc/<pid>/stat``; ``comm`` may hold spaces and parentheses."""
    head, sep, tail = text.rpartition(")")
    pid_text, _, comm = head.partition(" (")
    fields = tail.split()
    if not sep or len(fields) < 20:
        raise ValueError(f"malformed /proc stat line: {text[:80]!r}")
    # fields[0] is field 3 (state); utime/stime are fields 14/15, starttime is field 22
    return ProcStat(
        pid=int(pid_text),
        comm=comm,
        state=fields[0],
        ppid=int(fields[1]),
        cpu_ticks=int(fields[11]) + int(fields[12]),
        start_ticks=int(fields[19]),
    )


def parse_status_kib(text: str, field: str) -> int | None:
    """The value of a ``kB`` line of ``/proc/<pid>/status`` (e.g. ``VmRSS``), in KiB."""
    prefix = field + ":"
    for line in text.splitlines():
        if line.startswith(prefix):
            parts = line[len(prefix) :].split()
            if parts and parts[0].isdigit():
                return int(parts[0])
    return None


def parse_children(text: str) -> list[int]:
    """The pids of ``/proc/<pid>/task/<tid>/children``."""
    return [int(p) for p in text.split() if p.isdigit()]


def argv_mentions_root(argv: Sequence[str], root: str) -> bool:
    """Whether ``argv`` is a runsc command line (or a wrapper of one) on state dir ``root``.

    Matches ``--root=<root>`` and ``--root <root>`` exactly, but for a trailing slash
    (``/a/b`` is not ``/a/bc``),
    and requires a ``runsc*`` word (``runsc``, ``runsc-gofer``, ``runsc-sandbox``, or the
    runsc of an ``unshare ... sh -c ... runsc`` wrapper).
    """
    root = _normal(root)
    has_root = False
    for index, arg in enumerate(argv):
        if arg.startswith(("--root=", "-root=")):
            has_root = _normal(arg.split("=", 1)[1]) == root
        elif arg in ("--root", "-root") and index + 1 < len(argv):
            has_root = _normal(argv[index + 1]) == root
        if has_root:
            break
    return has_root and any(
        os.path.basename(arg).startswith("runsc")
        for arg in argv
        if not arg.startswith("-") and _normal(arg) != root
    )


def _normal(path: str) -> str:
    return path.rstrip("/") or "/"


# --- readers (None when the process is gone) -------------------------------------------


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    except PermissionError:
        return None


def read_stat(pid: int, *, proc: str = PROC) -> ProcStat | None:
    text = _read_text(f"{proc}/{pid}/stat")
    if text is None:
        return None
    try:
        return parse_stat(text)
    except ValueError:
        return None


def alive(pid: int, start_ticks: int, *, proc: str = PROC) -> bool:
    """Whether process ``pid``, started at ``start_ticks``, still runs (not a zombie)."""
    if pid <= 0:
        return False
    st = read_stat(pid, proc=proc)
    return st is not None and not st.gone and st.start_ticks == start_ticks


def read_cmdline(pid: int, *, proc: str = PROC) -> tuple[str, ...]:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return ()
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def pids(*, proc: str = PROC) -> list[int]:
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit()]


def children(pid: int, *, proc: str = PROC) -> list[int]:
    found: list[int] = []
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        text = _read_text(f"{proc}/{pid}/task/{tid}/children")
        if text:
            found += parse_children(text)
    return found


def descendants(pid: int, *, proc: str = PROC, limit: int = 4096) -> list[int]:
    """Every process below ``pid`` (children first), at most ``limit``."""
    found: list[int] = []
    queue = [pid]
    seen = {pid}
    while queue and len(found) < limit:
        for child in children(queue.pop(0), proc=proc):
            if child not in seen:
                seen.add(child)
                found.append(child)
                queue.append(child)
    return found


def find_fd(pid: int, target: str, *, hint: int | None = None, proc: str = PROC) -> int | None:
    """The descriptor of ``pid`` whose link starts with ``target`` (``hint`` is tried first)."""
    if hint is not None:
        with contextlib.suppress(OSError):
            if os.readlink(f"{proc}/{pid}/fd/{hint}").startswith(target):
                return hint
    try:
        fds = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"{proc}/{pid}/fd/{fd}").startswith(target):
                return int(fd)
    return None


@attrs.frozen(slots=True, kw_only=True)
class Usage:
    memory_bytes: int
    cpu_ticks: int
    memory_fd: int | None
    """The sentry's descriptor of the memory file (a hint for the next call)."""


def sandbox_usage(
    pid: int, start_ticks: int, *, memory_fd: int | None = None, proc: str = PROC
) -> Usage | None:
    """Memory and CPU of the sandbox whose sentry is ``pid``; None if it is gone."""
    st = read_stat(pid, proc=proc)
    if st is None or st.gone or st.start_ticks != start_ticks:
        return None
    status = _read_text(f"{proc}/{pid}/status") or ""
    rss_kib = parse_status_kib(status, "RssAnon")
    if rss_kib is None:
        rss_kib = parse_status_kib(status, "VmRSS") or 0
    memory = rss_kib * 1024
    fd = find_fd(pid, MEMORY_FILE, hint=memory_fd, proc=proc)
    if fd is not None:
        with contextlib.suppress(OSError):
            memory += os.stat(f"{proc}/{pid}/fd/{fd}").st_blocks * 512
    ticks = st.cpu_ticks
    for child in descendants(pid, proc=proc):
        child_stat = read_stat(child, proc=proc)
        if child_stat is not None:
            ticks += child_stat.cpu_ticks
    return Usage(memory_bytes=memory, cpu_ticks=ticks, memory_fd=fd)


def processes_of_root(
    root: str, *, proc: str = PROC, exclude: Iterable[int] = ()
) -> Iterator[tuple[int, tuple[str, ...]]]:
    """``(pid, argv)`` of every live runsc process (or wrapper) working on state dir ``root``."""
    skip = {os.getpid(), *exclude}
    for pid in pids(proc=proc):
        if pid in skip:
            continue
        argv = read_cmdline(pid, proc=proc)
        if argv and argv_mentions_root(argv, root):
            st = read_stat(pid, proc=proc)
            if st is not None and not st.gone:
                yield pid, argv


__all__ = [
    "CLOCK_TICKS",
    "MEMORY_FILE",
    "ProcStat",
    "Usage",
    "alive",
    "argv_mentions_root",
    "children",
    "descendants",
    "find_fd",
    "parse_children",
    "parse_stat",
    "parse_status_kib",
    "pids",
    "processes_of_root",
    "read_cmdline",
    "read_stat",
    "sandbox_usage",
]
