"""A child-subreaper helper process for the gVisor runtime (stdlib only; run as a script).

``runsc run -detach`` and ``runsc restore -detach`` exit once the sandbox runs, leaving
the sandbox and gofer processes orphaned. Orphans go to the nearest ancestor that is a
child subreaper (``PR_SET_CHILD_SUBREAPER``), else to pid 1 — which on some machines (the
Firecracker guests of ``docs/gvisor-notes.md``) reaps exited processes only about a second
later. ``runsc delete`` waits until the sandbox process has been reaped, so every delete
after a checkpoint and every terminate took 1-2 s. This helper is a subreaper: the runtime
starts each run/restore through it, and it reaps every orphan the moment it exits.

Protocol: one JSON object per line. Requests on stdin::

    {"id": 1, "argv": ["unshare", ...], "log": "/path/to/sandbox.log"}
    {"kill": 1}

The command runs with stdin from ``/dev/null`` and stdout/stderr appended to ``log``
(``O_APPEND``). Answers on stdout: ``{"ready": true, "pid": <pid>}`` once, then
``{"id": 1, "rc": 0}`` when a command exits (``rc`` < 0: killed by that signal), or
``{"id": 1, "error": "..."}`` if it could not start. At end of stdin the helper exits once
its commands have exited; orphans it still has then go to pid 1.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import selectors
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def _reply(message: dict[str, object]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _spawn(argv: list[str], log: str) -> int:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
    try:
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, fd, 1),
            (os.POSIX_SPAWN_DUP2, fd, 2),
        ]
        return os.posix_spawnp(argv[0], argv, os.environ, file_actions=actions, setsigdef=(
            signal.SIGCHLD, signal.SIGPIPE, signal.SIGINT, signal.SIGTERM,
        ))  # fmt: skip
    finally:
        os.close(fd)


def main() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        _reply({"ready": False, "error": os.strerror(ctypes.get_errno())})
        return 1
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker's Ctrl-C is not ours
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ, "in")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    pending: dict[int, int] = {}  # pid -> request id
    buffer = b""
    stdin_open = True
    _reply({"ready": True, "pid": os.getpid()})
    while stdin_open or pending:
        for key, _ in sel.select(timeout=1.0):
            if key.data == "wake":
                while True:
                    try:
                        if not os.read(wake_r, 512):
                            break
                    except BlockingIOError:
                        break
            elif key.data == "in":
                chunk = os.read(0, 65536)
                if not chunk:
                    stdin_open = False
                    sel.unregister(0)
                    continue
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    _handle(line, pending)
        _reap(pending)
    return 0


def _handle(line: bytes, pending: dict[int, int]) -> None:
    try:
        request = json.loads(line)
    except ValueError:
        return
    if not isinstance(request, dict):
        return
    if "kill" in request:
        for pid, running in pending.items():
            if running == request["kill"]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return
    rid = request.get("id")
    if not isinstance(rid, int):
        return  # not ours to answer
    try:
        pid = _spawn([str(a) for a in request["argv"]], str(request["log"]))
    except (OSError, KeyError, TypeError, IndexError) as exc:
        _reply({"id": rid, "error": str(exc)})
        return
    pending[pid] = rid


def _reap(pending: dict[int, int]) -> None:
    """Reap every exited child: answer for our commands, just forget adopted orphans."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            return
        if pid == 0:
            return
        rid = pending.pop(pid, None)
        if rid is not None:
            _reply({"id": rid, "rc": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    sys.exit(main())
