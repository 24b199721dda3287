"""The gVisor :class:`~substrate.sandbox.ports.SandboxRuntime`: runsc, as gvisor-notes §1c.

* runsc always runs in the worker's own network namespace (its control socket is an
  abstract unix socket, which belongs to one namespace); the actor's namespace is named
  in the bundle's ``config.json``, which this runtime writes from the
  :class:`~substrate.sandbox.spec.SandboxSpec` before every run and restore (and refuses
  without a namespace path);
* ``run`` and ``restore`` are wrapped in a private mount namespace with a tmpfs over
  ``/proc/sys/net`` (:mod:`substrate.sandbox.runsc_argv`), and get stdin from
  ``/dev/null`` and stdout/stderr on an ``O_APPEND`` log file per sandbox (the sandbox
  inherits them; a pipe would never close);
* every command carries ``--platform=ptrace --ignore-cgroups --network=sandbox``.

Checkpoints: only exit code 0 is a usable image. The sandbox is gone afterwards either
way; a failed one leaves the sandbox STOPPED and raises :class:`Internal` starting with
:data:`CHECKPOINT_FAILED_MESSAGE` and runsc's reason. Beside runsc's ``checkpoint.img``
the image directory gets ``runtime.json`` (written last, so a failed checkpoint has none),
which records the runsc version; a restore refuses images of another version.

What is left of a sandbox in the ``--root`` after a checkpoint is deleted in the
background; a run or restore of the same id waits for that. ``runsc delete`` waits until
the old sandbox process has been reaped, and pid 1 of these machines reaps orphans only
about a second late; so run and restore go through a child-subreaper helper process
(:mod:`.reaper`), which adopts the sandboxes and reaps them at once (without it, every
terminate and every delete after a checkpoint takes 1-2 s).

Stats: the sentry's anonymous resident memory plus the pages of the sandbox's memory file,
and the CPU time of the sentry and its stub processes (:mod:`.procfs`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Final, Self

import anyio
import anyio.lowlevel
import anyio.to_thread
import attrs
from anyio.abc import TaskGroup

from substrate.adapters.gvisor import procfs
from substrate.adapters.gvisor.reaper import Subreaper
from substrate.errors import (
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    SubstrateError,
    Unavailable,
)
from substrate.sandbox.lifecycle import SandboxOp, check_op
from substrate.sandbox.oci import build_config, network_namespace_path
from substrate.sandbox.ports import CHECKPOINT_FAILED_MESSAGE, RUNTIME_CLOSED_MESSAGE
from substrate.sandbox.runsc_argv import (
    RunscOptions,
    checkpoint_argv,
    delete_argv,
    global_argv,
    list_argv,
    restore_argv,
    run_argv,
    state_argv,
)
from substrate.sandbox.spec import (
    CheckpointInfo,
    SandboxAddress,
    SandboxSpec,
    SandboxState,
    SandboxStats,
)

DEFAULT_ADDRESS: Final = "169.254.17.2"
"""The sandbox side of every actor's veth pair (``netns.sh``); reach it through the device."""
CONFIG_FILE: Final = "config.json"
IMAGE_FILE: Final = "checkpoint.img"
"""What runsc writes into the image directory (it refuses to overwrite it)."""
RUNTIME_FILE: Final = "runtime.json"
"""Who wrote the image: written after a successful checkpoint only."""
IMAGE_FORMAT: Final = "substrate-runsc-image/1"
STALE_IMAGE_FILES: Final = (RUNTIME_FILE, IMAGE_FILE)
"""Removed from an image directory before a checkpoint (runtime.json first)."""
LOG_SUFFIX: Final = ".log"
_ERROR_TAIL: Final = 65536
_SUMMARY_MAX: Final = 400

_STATUS: Final = {
    "creating": SandboxState.CREATED,
    "created": SandboxState.CREATED,
    "running": SandboxState.RUNNING,
    "paused": SandboxState.RUNNING,
    "stopped": SandboxState.STOPPED,
}
_VERSION_RE: Final = re.compile(r"runsc version (\S+)")
_REJECTED_RE: Final = re.compile(r"save rejected[^\n{]*")
_FRAME_RE: Final = re.compile(r"^[\w./*()\[\]-]+\(.*\)$")
"""A Go stack frame line, e.g. ``gvisor.dev/gvisor/pkg/urpc.(*Server).handleOne(0xc0, 0x1)``."""


CONTROL_SOCKET_BUSY: Final = "creating control server socket"
"""runsc's error when the abstract control socket of the sandbox id is still bound."""


@attrs.frozen(slots=True, kw_only=True)
class RunscTimeouts:
    """Seconds each kind of runsc command may take before it is killed."""

    command: float = 30.0
    """state, delete, list, --version."""
    run: float = 60.0
    checkpoint: float = 600.0
    restore: float = 600.0
    gone: float = 20.0
    """How long removing a sandbox may retry until its processes and state are gone."""


# --- parsing (pure helpers) ------------------------------------------------------------


def parse_version(text: str) -> str:
    """The runtime version of ``runsc --version`` output: ``runsc-<version>``."""
    match = _VERSION_RE.search(text)
    if match:
        return f"runsc-{match.group(1)}"
    first = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not first:
        raise Unavailable("runsc --version printed nothing")
    return first


def parse_state(text: str) -> tuple[SandboxState, int]:
    """``(state, pid)`` from ``runsc state`` JSON (``created``/``running``/``stopped``)."""
    try:
        data = json.loads(text)
        status = str(data["status"]).lower()
        pid = int(data.get("pid") or 0)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Internal(f"cannot parse runsc state output {text[:200]!r}: {exc}") from exc
    return _STATUS.get(status, SandboxState.STOPPED), pid


def parse_list(text: str) -> list[str]:
    """Container ids from ``runsc list -format json`` (``null`` when there are none)."""
    try:
        data = json.loads(text or "null")
    except ValueError as exc:
        raise Internal(f"cannot parse runsc list output {text[:200]!r}: {exc}") from exc
    if not isinstance(data, list):
        return []
    return [str(c["id"]) for c in data if isinstance(c, dict) and c.get("id")]


def summarize_error(text: str, *, last: bool = False) -> str:
    """A short, readable reason from runsc's error output.

    runsc can print Go panics and whole object dumps; keep the first (or, for a log file
    shared with the workload, the last) meaningful lines, cut before object dumps, plus a
    netstack "save rejected ..." reason if there is one.
    """
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip()
        and not line.startswith(("\t", " ", "goroutine ", "created by "))
        and not _FRAME_RE.match(line.strip())
    ]
    picked = lines[-3:] if last else lines[:1]
    parts = [line.split("{", 1)[0].rstrip(" :")[:_SUMMARY_MAX] for line in picked]
    rejected = _REJECTED_RE.search(text)
    if rejected:
        parts.append(rejected.group(0).rstrip(" :")[:_SUMMARY_MAX])
    summary = "; ".join(p for p in parts if p)
    return summary or "no error output"


def runtime_record(sandbox_id: str, version: str, opts: RunscOptions, image_bytes: int) -> str:
    """The text of ``runtime.json``."""
    record = {
        "format": IMAGE_FORMAT,
        "runtime_version": version,
        "sandbox_id": sandbox_id,
        "platform": opts.platform,
        "network": opts.network,
        "image_file": IMAGE_FILE,
        "image_bytes": image_bytes,
    }
    return json.dumps(record, indent=1, sort_keys=True) + "\n"


def check_image(directory: str, version: str) -> None:
    """Raise unless ``directory`` holds a complete image written by runsc ``version``.

    :class:`NotFound` without ``checkpoint.img``; :class:`Internal` for an image without
    a valid ``runtime.json`` (what a failed checkpoint leaves) or of the wrong size;
    :class:`FailedPrecondition` for an image of another runtime version.
    """
    image = os.path.join(directory, IMAGE_FILE)
    try:
        size = os.stat(image).st_size
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise NotFound(f"no sandbox image in {directory}") from exc
    try:
        with open(os.path.join(directory, RUNTIME_FILE), "rb") as f:
            record = json.loads(f.read())
        if not isinstance(record, dict) or record.get("format") != IMAGE_FORMAT:
            raise ValueError("not a runsc image record")
        written_by = str(record["runtime_version"])
        expected = int(record["image_bytes"])
    except FileNotFoundError as exc:
        raise Internal(
            f"the sandbox image in {directory} is incomplete: it has no {RUNTIME_FILE} "
            "(a failed checkpoint leaves such an image)"
        ) from exc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Internal(f"the sandbox image record in {directory} is corrupt: {exc}") from exc
    if written_by != version:
        raise FailedPrecondition(
            f"the sandbox image in {directory} was written by {written_by!r}; "
            f"this runtime is {version!r}"
        )
    if size != expected:
        raise Internal(
            f"the sandbox image in {directory} is {size} bytes, but {expected} were written"
        )


# --- blocking helpers (run in worker threads) -------------------------------------------


def _write_config(spec: SandboxSpec) -> None:
    """Check the spec against the host and write the bundle's ``config.json`` atomically."""
    config = build_config(spec)
    if not network_namespace_path(config):  # gv.sh's guard: never the worker's namespace
        raise InvalidArgument(f"sandbox {spec.sandbox_id}: config names no network namespace")
    if not os.path.exists(spec.netns_path):
        raise InvalidArgument(
            f"sandbox {spec.sandbox_id}: network namespace {spec.netns_path} does not exist"
        )
    rootfs = os.path.join(spec.bundle_dir, spec.rootfs)
    if not os.path.isdir(rootfs):
        raise InvalidArgument(f"sandbox {spec.sandbox_id}: root filesystem {rootfs} is missing")
    if spec.sysinfo_dir and not os.path.isdir(spec.sysinfo_dir):
        raise InvalidArgument(
            f"sandbox {spec.sandbox_id}: system-info directory {spec.sysinfo_dir} is missing"
        )
    path = os.path.join(spec.bundle_dir, CONFIG_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def _prepare_image_dir(directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    for name in STALE_IMAGE_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))


def _finish_image(
    directory: str, sandbox_id: str, version: str, opts: RunscOptions
) -> CheckpointInfo:
    image_bytes = os.stat(os.path.join(directory, IMAGE_FILE)).st_size
    record = os.path.join(directory, RUNTIME_FILE)
    tmp = os.path.join(directory, f".{RUNTIME_FILE}.tmp")
    with open(tmp, "w") as f:
        f.write(runtime_record(sandbox_id, version, opts, image_bytes))
    os.replace(tmp, record)
    files: list[str] = []
    size = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False) and not entry.name.startswith("."):
                files.append(entry.name)
                size += entry.stat(follow_symlinks=False).st_size
    return CheckpointInfo(
        sandbox_id=sandbox_id,
        directory=directory,
        files=files,
        runtime_version=version,
        size_bytes=size,
    )


def _read_tail(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(max(offset, end - _ERROR_TAIL))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _kill(pid: int, start_ticks: int) -> bool:
    """SIGKILL ``pid`` if it is still the process that started at ``start_ticks``."""
    if not procfs.alive(pid, start_ticks):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return True


# --- the runtime ---------------------------------------------------------------------------


@attrs.define(eq=False)
class _Box:
    spec: SandboxSpec
    state: SandboxState = SandboxState.CREATED
    pid: int = 0
    pid_start: int = 0
    gofer_pid: int = 0
    gofer_start: int = 0
    started_at: float = 0.0
    cpu_seconds: float = 0.0
    memory_fd: int | None = None
    in_runsc: bool = False
    """runsc's --root may still hold a container of this id."""

    def processes(self) -> list[tuple[int, int]]:
        return [
            (p, s)
            for p, s in ((self.pid, self.pid_start), (self.gofer_pid, self.gofer_start))
            if p > 0
        ]


class RunscRuntime:
    """One worker's runsc sandboxes; an async context manager.

    ``options`` are runsc's binary, ``--root`` (one per worker) and global flags.
    ``log_dir`` gets one ``<sandbox-id>.log`` per sandbox (runsc's and the workload's
    output; default: ``logs`` beside the root). ``default_address`` is the address
    :meth:`address` reports when the spec names none. ``subreaper``: start run and
    restore through the subreaper helper (:mod:`.reaper`; if it cannot start, they run
    directly). On exit every sandbox this runtime started is terminated.
    """

    def __init__(
        self,
        options: RunscOptions,
        *,
        log_dir: str | None = None,
        default_address: str = DEFAULT_ADDRESS,
        timeouts: RunscTimeouts = RunscTimeouts(),
        clock: Callable[[], float] = time.monotonic,
        subreaper: bool = True,
    ) -> None:
        self._opts = options
        self._use_subreaper = subreaper
        self._reaper: Subreaper | None = None
        self._log_dir = log_dir or os.path.join(os.path.dirname(options.root.rstrip("/")), "logs")
        self._default_address = default_address
        self._timeouts = timeouts
        self._clock = clock
        self._boxes: dict[str, _Box] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._version: str | None = None
        self._version_lock: anyio.Lock | None = None
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._closing = False

    @property
    def options(self) -> RunscOptions:
        return self._opts

    @property
    def log_dir(self) -> str:
        return self._log_dir

    @property
    def subreaper_pid(self) -> int:
        """The pid of the subreaper helper the sandboxes are adopted by (0: none)."""
        reaper = self._reaper
        return reaper.pid if reaper is not None and reaper.alive else 0

    def sandbox_pid(self, sandbox_id: str) -> int:
        """The host pid of the running sandbox's sentry process (``runsc-sandbox``).

        Raises :class:`NotFound` if the sandbox is unknown, :class:`FailedPrecondition` if
        it is not RUNNING.
        """
        box = self._boxes.get(sandbox_id)
        check_op(sandbox_id, self._observe(box), SandboxOp.STATS)
        assert box is not None
        return box.pid

    def log_path(self, sandbox_id: str) -> str:
        """The O_APPEND log file of ``sandbox_id`` (runsc's and the workload's output)."""
        return os.path.join(self._log_dir, sandbox_id + LOG_SUFFIX)

    # --- lifetime -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise RuntimeError("RunscRuntime is already open")
        if shutil.which(self._opts.binary) is None:
            raise Unavailable(f"{RUNTIME_CLOSED_MESSAGE}: {self._opts.binary!r} not found")
        await anyio.to_thread.run_sync(self._make_dirs)
        stack = AsyncExitStack()
        if self._use_subreaper:
            with contextlib.suppress(Unavailable):  # then run/restore run directly
                self._reaper = await stack.enter_async_context(Subreaper())
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        self._closing = False
        return self

    def _make_dirs(self) -> None:
        os.makedirs(self._opts.root, mode=0o711, exist_ok=True)
        os.makedirs(self._log_dir, mode=0o750, exist_ok=True)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        stack, tg = self._stack, self._tg
        assert stack is not None
        assert tg is not None
        self._closing = True
        try:
            with anyio.CancelScope(shield=True):
                await self._terminate_all()
        finally:
            self._stack = self._tg = None
            tg.cancel_scope.cancel()
            result = await stack.__aexit__(exc_type, exc, tb)
            self._reaper = None
            self._boxes.clear()
        return result

    async def _terminate_all(self) -> None:
        async def one(sandbox_id: str) -> None:
            with contextlib.suppress(SubstrateError, OSError):
                await self._terminate(sandbox_id)

        async with anyio.create_task_group() as tg:
            for sandbox_id in list(self._boxes):
                tg.start_soon(one, sandbox_id)

    async def _ready(self) -> TaskGroup:
        await anyio.lowlevel.checkpoint()
        if self._tg is None or self._closing:
            raise Unavailable(RUNTIME_CLOSED_MESSAGE)
        return self._tg

    def _lock(self, sandbox_id: str) -> anyio.Lock:
        lock = self._locks.get(sandbox_id)
        if lock is None:
            lock = self._locks[sandbox_id] = anyio.Lock()
        return lock

    def _observe(self, box: _Box | None) -> SandboxState | None:
        """The box's state, noticing (cheaply, from /proc) a sandbox that died on its own."""
        if box is None:
            return None
        if box.state is SandboxState.RUNNING and not procfs.alive(box.pid, box.pid_start):
            box.state = SandboxState.STOPPED
        return box.state

    # --- the port ---------------------------------------------------------------------------

    async def runtime_version(self) -> str:
        if self._version is None:
            if self._version_lock is None:
                self._version_lock = anyio.Lock()
            async with self._version_lock:
                if self._version is None:
                    done = await self._runsc((self._opts.binary, "--version"))
                    if done.returncode != 0:
                        raise Unavailable(
                            f"runsc --version failed: {summarize_error(_text(done.stderr))}"
                        )
                    self._version = parse_version(_text(done.stdout))
        return self._version

    async def run(self, spec: SandboxSpec) -> None:
        await self._ready()
        sid = spec.sandbox_id
        argv = run_argv(self._opts, sid, spec.bundle_dir)
        async with self._lock(sid):
            await self._ready()
            box = self._boxes.get(sid)
            check_op(sid, self._observe(box), SandboxOp.RUN)
            await anyio.to_thread.run_sync(_write_config, spec)
            await self._clear(sid, box)
            fresh = self._boxes[sid] = _Box(spec=spec)
            await self._start(fresh, argv, "start")

    async def restore(self, spec: SandboxSpec, image_dir: str) -> None:
        await self._ready()
        sid = spec.sandbox_id
        image = _image_path(image_dir)
        argv = restore_argv(self._opts, sid, spec.bundle_dir, image)
        async with self._lock(sid):
            await self._ready()
            box = self._boxes.get(sid)
            check_op(sid, self._observe(box), SandboxOp.RESTORE)
            version = await self.runtime_version()
            await anyio.to_thread.run_sync(check_image, image, version)
            await anyio.to_thread.run_sync(_write_config, spec)
            await self._clear(sid, box)
            fresh = self._boxes[sid] = _Box(spec=spec)
            await self._start(fresh, argv, "restore")

    async def checkpoint(self, sandbox_id: str, image_dir: str) -> CheckpointInfo:
        await self._ready()
        image = _image_path(image_dir)
        argv = checkpoint_argv(self._opts, sandbox_id, image)
        async with self._lock(sandbox_id):
            await self._ready()
            box = self._boxes.get(sandbox_id)
            check_op(sandbox_id, self._observe(box), SandboxOp.CHECKPOINT)
            assert box is not None
            version = await self.runtime_version()
            try:
                await anyio.to_thread.run_sync(_prepare_image_dir, image)
            except OSError as exc:  # nothing happened to the sandbox yet: it keeps running
                raise Internal(f"cannot prepare the image directory {image}: {exc}") from exc
            try:
                done = await self._runsc(argv, self._timeouts.checkpoint)
            except BaseException as exc:  # timed out or cancelled: the sandbox is in limbo
                self._lost(box)
                if isinstance(exc, SubstrateError):
                    raise Internal(f"{CHECKPOINT_FAILED_MESSAGE}: {sandbox_id}: {exc}") from exc
                raise
            if done.returncode != 0:
                self._lost(box)
                reason = summarize_error(_text(done.stderr) or _text(done.stdout))
                raise Internal(f"{CHECKPOINT_FAILED_MESSAGE}: {sandbox_id}: {reason}")
            box.state = SandboxState.CHECKPOINTED
            self._remove_soon(box)
            try:
                return await anyio.to_thread.run_sync(
                    _finish_image, image, sandbox_id, version, self._opts
                )
            except OSError as exc:
                box.state = SandboxState.STOPPED
                raise Internal(
                    f"{CHECKPOINT_FAILED_MESSAGE}: {sandbox_id}: recording the image: {exc}"
                ) from exc

    async def terminate(self, sandbox_id: str) -> None:
        await anyio.lowlevel.checkpoint()
        if self._tg is None:
            return  # closed: everything was terminated on exit
        await self._terminate(sandbox_id)

    async def state(self, sandbox_id: str) -> SandboxState:
        await self._ready()
        box = self._boxes.get(sandbox_id)
        state = self._observe(box)
        if box is None or state is None:
            raise NotFound(f"sandbox {sandbox_id} not found")
        if state is not SandboxState.RUNNING:
            return state
        done = await self._runsc(state_argv(self._opts, sandbox_id))
        seen = SandboxState.STOPPED
        if done.returncode == 0:
            seen, _pid = parse_state(_text(done.stdout))
        current = self._boxes.get(sandbox_id) is box and box.state is SandboxState.RUNNING
        if current and (seen is SandboxState.STOPPED or not procfs.alive(box.pid, box.pid_start)):
            box.state = SandboxState.STOPPED
        return box.state

    async def stats(self, sandbox_id: str) -> SandboxStats:
        await self._ready()
        box = self._boxes.get(sandbox_id)
        check_op(sandbox_id, self._observe(box), SandboxOp.STATS)
        assert box is not None
        usage = await anyio.to_thread.run_sync(
            lambda: procfs.sandbox_usage(box.pid, box.pid_start, memory_fd=box.memory_fd)
        )
        if usage is None:  # it died since _observe looked
            box.state = SandboxState.STOPPED
            raise FailedPrecondition(
                f"sandbox {sandbox_id} is STOPPED; only a running sandbox has stats"
            )
        box.memory_fd = usage.memory_fd
        box.cpu_seconds = max(box.cpu_seconds, usage.cpu_ticks / procfs.CLOCK_TICKS)
        return SandboxStats(
            memory_bytes=usage.memory_bytes,
            cpu_seconds=box.cpu_seconds,
            uptime_seconds=max(0.0, self._clock() - box.started_at),
        )

    async def address(self, sandbox_id: str) -> SandboxAddress:
        await self._ready()
        box = self._boxes.get(sandbox_id)
        check_op(sandbox_id, self._observe(box), SandboxOp.ADDRESS)
        assert box is not None
        spec = box.spec
        return SandboxAddress(
            host=spec.address or self._default_address,
            ports=[(port, port) for port in spec.ports],
            device=spec.device,
        )

    # --- internals ---------------------------------------------------------------------------

    async def _runsc(
        self, argv: Sequence[str], limit: float | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        """Run one runsc command to completion, output captured (never run/restore)."""
        if limit is None:
            limit = self._timeouts.command
        try:
            with anyio.fail_after(limit):
                return await anyio.run_process(argv, stdin=subprocess.DEVNULL, check=False)
        except FileNotFoundError as exc:
            raise Unavailable(f"{RUNTIME_CLOSED_MESSAGE}: {argv[0]!r} not found") from exc
        except TimeoutError as exc:
            raise Internal(f"{self._describe(argv)!r} took over {limit:g}s") from exc

    def _describe(self, argv: Sequence[str]) -> str:
        """``argv`` without runsc's global flags, for messages (``runsc checkpoint ...``)."""
        prefix = global_argv(self._opts)
        if tuple(argv[: len(prefix)]) == prefix:
            return " ".join(("runsc", *argv[len(prefix) :]))
        return " ".join(argv)

    async def _detached(
        self, sandbox_id: str, argv: Sequence[str], limit: float
    ) -> tuple[int, str]:
        """Run a wrapped run/restore: stdin /dev/null, output appended to the sandbox's log.

        Returns the exit code and what the command added to the log.
        """
        path = self.log_path(sandbox_id)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        try:
            offset = os.fstat(fd).st_size
            with anyio.fail_after(limit):
                reaper = self._reaper
                if reaper is not None and reaper.alive:
                    code = await reaper.run(argv, path)
                else:
                    done = await anyio.run_process(
                        argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, check=False
                    )
                    code = done.returncode
        except FileNotFoundError as exc:
            raise Unavailable(f"{RUNTIME_CLOSED_MESSAGE}: {argv[0]!r} not found") from exc
        except OSError as exc:
            raise Internal(f"cannot start {argv[0]!r} for sandbox {sandbox_id}: {exc}") from exc
        except TimeoutError as exc:
            raise Internal(f"runsc took over {limit:g}s to start sandbox {sandbox_id}") from exc
        finally:
            os.close(fd)
        if code == 0:
            return 0, ""
        return code, await anyio.to_thread.run_sync(_read_tail, path, offset)

    async def _start(self, box: _Box, argv: Sequence[str], what: str) -> None:
        """Run the wrapped ``argv`` for ``box`` and adopt the sandbox it starts."""
        sid = box.spec.sandbox_id
        limit = self._timeouts.run if what == "start" else self._timeouts.restore
        try:
            box.in_runsc = True
            code, text = await self._detached(sid, argv, limit)
            if code != 0 and "already exists" in text:  # a leftover this runtime did not know
                await self._remove(sid, ())
                box.in_runsc = True
                code, text = await self._detached(sid, argv, limit)
            pause = 0.05
            deadline = self._clock() + self._timeouts.gone
            while code != 0 and CONTROL_SOCKET_BUSY in text and self._clock() < deadline:
                # The control socket (@runsc-sandbox.<id>) of the sandbox this one replaces
                # is still bound: its last process is still going away. Wait and retry.
                await self._remove(sid, ())
                await anyio.sleep(pause)
                pause = min(pause * 2, 0.5)
                box.in_runsc = True
                code, text = await self._detached(sid, argv, limit)
            if code != 0:
                raise Internal(
                    f"sandbox {sid} failed to {what}: {summarize_error(text, last=True)}"
                )
            await self._adopt(box)
        except BaseException:
            box.state = SandboxState.STOPPED
            with anyio.CancelScope(shield=True), contextlib.suppress(SubstrateError, OSError):
                await self._remove(sid, box.processes())
                box.in_runsc = False
            raise

    async def _adopt(self, box: _Box) -> None:
        sid = box.spec.sandbox_id
        done = await self._runsc(state_argv(self._opts, sid))
        if done.returncode != 0:
            raise Internal(
                f"sandbox {sid} vanished after it started: {summarize_error(_text(done.stderr))}"
            )
        state, pid = parse_state(_text(done.stdout))
        st = procfs.read_stat(pid) if pid > 0 else None
        if state is not SandboxState.RUNNING or st is None or st.gone:
            raise Internal(f"sandbox {sid} is {state.name.lower()} right after it started")
        box.pid, box.pid_start = pid, st.start_ticks
        gofer = await anyio.to_thread.run_sync(self._find_gofer, box.spec.bundle_dir)
        if gofer is not None:
            box.gofer_pid, box.gofer_start = gofer
        box.started_at = self._clock()
        box.state = SandboxState.RUNNING

    def _find_gofer(self, bundle_dir: str) -> tuple[int, int] | None:
        for pid, argv in procfs.processes_of_root(self._opts.root):
            if (
                argv
                and os.path.basename(argv[0]) == "runsc-gofer"
                and _has_bundle(argv, bundle_dir)
            ):
                st = procfs.read_stat(pid)
                if st is not None:
                    return pid, st.start_ticks
        return None

    def _lost(self, box: _Box) -> None:
        """A checkpoint failed: the sandbox must be gone (kill it if not) and is STOPPED."""
        box.state = SandboxState.STOPPED
        for pid, start in box.processes():
            _kill(pid, start)
        self._remove_soon(box)

    def _remove_soon(self, box: _Box) -> None:
        """Delete the container of ``box`` from runsc's root in the background."""
        if self._tg is not None:
            self._tg.start_soon(self._remove_later, box)

    async def _remove_later(self, box: _Box) -> None:
        sid = box.spec.sandbox_id
        async with self._lock(sid):
            if self._boxes.get(sid) is not box or not box.in_runsc:
                return
            with contextlib.suppress(SubstrateError, OSError):
                await self._remove(sid, box.processes())
                box.in_runsc = False

    async def _clear(self, sid: str, box: _Box | None) -> None:
        """Remove what is left of ``sid`` (a CHECKPOINTED or STOPPED sandbox) before a start."""
        if box is not None:
            if box.in_runsc or any(procfs.alive(p, s) for p, s in box.processes()):
                await self._remove(sid, box.processes())
                box.in_runsc = False
        elif await anyio.to_thread.run_sync(self._in_root, sid):
            await self._remove(sid, ())

    def _in_root(self, sid: str) -> bool:
        return any(
            os.path.exists(os.path.join(self._opts.root, f"{sid}_sandbox:{sid}{suffix}"))
            for suffix in (".state", ".lock")
        )

    async def _remove(self, sid: str, processes: Iterable[tuple[int, int]]) -> None:
        """``delete -force`` until runsc forgets ``sid`` and its processes are gone."""
        processes = list(processes)
        deadline = self._clock() + self._timeouts.gone
        pause = 0.05
        while True:
            done = await self._runsc(delete_argv(self._opts, sid))
            killed = [p for p, s in processes if _kill(p, s)]
            present = await anyio.to_thread.run_sync(self._in_root, sid)
            if done.returncode == 0 and not present and not killed:
                return
            if self._clock() > deadline:
                raise Internal(
                    f"cannot remove sandbox {sid} from {self._opts.root}: "
                    f"{summarize_error(_text(done.stderr))}"
                )
            await anyio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def _terminate(self, sid: str) -> None:
        lock = self._lock(sid)
        try:
            await self._terminate_locked(sid, lock)
        finally:
            if sid not in self._boxes and not lock.locked() and not lock.statistics().tasks_waiting:
                self._locks.pop(sid, None)  # nobody holds or waits for it: forget it

    async def _terminate_locked(self, sid: str, lock: anyio.Lock) -> None:
        async with lock:
            box = self._boxes.get(sid)
            if box is None:
                return
            with anyio.CancelScope(shield=True):
                if box.in_runsc or any(procfs.alive(p, s) for p, s in box.processes()):
                    if box.state is SandboxState.RUNNING:
                        box.state = SandboxState.STOPPED
                    await self._remove(sid, box.processes())
                    box.in_runsc = False
                if self._boxes.get(sid) is box:
                    del self._boxes[sid]


def _image_path(image_dir: str) -> str:
    if not isinstance(image_dir, str) or not image_dir.startswith("/") or "\x00" in image_dir:
        raise InvalidArgument(f"image directory {image_dir!r} must be an absolute path")
    return image_dir.rstrip("/") or "/"


def _text(data: bytes | None) -> str:
    return (data or b"").decode(errors="replace")


def _has_bundle(argv: Sequence[str], bundle_dir: str) -> bool:
    bundle = bundle_dir.rstrip("/")
    return any(
        arg == f"--bundle={bundle}"
        or (arg == "--bundle" and i + 1 < len(argv) and argv[i + 1] == bundle)
        for i, arg in enumerate(argv)
    )


# --- a worker's start-up after an unclean exit ---------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class CleanupReport:
    """What :func:`cleanup_root` removed."""

    deleted: tuple[str, ...] = ()
    """Container ids runsc knew in the root."""
    killed: tuple[int, ...] = ()
    """Stray runsc processes of the root, killed by pid."""


async def cleanup_root(root: str, *, binary: str = "runsc", limit: float = 30.0) -> CleanupReport:
    """Remove every container of runsc state dir ``root`` and every runsc process on it.

    For a worker starting after an unclean exit: ``delete -force`` of each container
    ``runsc list`` shows (from this, the root, network namespace), then SIGKILL by pid of
    any ``runsc``/``runsc-gofer``/``runsc-sandbox`` process (or run/restore wrapper) whose
    argv names exactly this root (absolute, as given to runsc) — a hung run or a sandbox
    whose state file is gone — then the state files. The directory itself stays.
    Idempotent.
    """
    opts = RunscOptions(root=root.rstrip("/") or "/", binary=binary)
    deleted: list[str] = []
    with anyio.move_on_after(limit):
        if await anyio.to_thread.run_sync(os.path.isdir, opts.root):
            for sid in await _listed(opts):
                done = await anyio.run_process(
                    delete_argv(opts, sid), stdin=subprocess.DEVNULL, check=False
                )
                if done.returncode == 0:
                    deleted.append(sid)
    strays = await anyio.to_thread.run_sync(_strays, opts.root)
    killed: list[int] = []
    for pid, start in strays:
        if _kill(pid, start):
            killed.append(pid)
    for _ in range(100):  # up to 5 s for the killed processes to go
        if not any(procfs.alive(pid, start) for pid, start in strays):
            break
        await anyio.sleep(0.05)
    await anyio.to_thread.run_sync(_empty_dir, opts.root)
    return CleanupReport(deleted=tuple(deleted), killed=tuple(killed))


async def _listed(opts: RunscOptions) -> list[str]:
    try:
        done = await anyio.run_process(list_argv(opts), stdin=subprocess.DEVNULL, check=False)
    except FileNotFoundError as exc:
        raise Unavailable(f"{opts.binary!r} not found") from exc
    return parse_list(_text(done.stdout)) if done.returncode == 0 else []


def _strays(root: str) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    for pid, _argv in procfs.processes_of_root(root):
        st = procfs.read_stat(pid)
        if st is not None:
            found.append((pid, st.start_ticks))
    return found


def _empty_dir(path: str) -> None:
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


__all__ = [
    "CONFIG_FILE",
    "DEFAULT_ADDRESS",
    "IMAGE_FILE",
    "IMAGE_FORMAT",
    "RUNTIME_FILE",
    "CleanupReport",
    "RunscOptions",
    "RunscRuntime",
    "RunscTimeouts",
    "check_image",
    "cleanup_root",
    "parse_list",
    "parse_state",
    "parse_version",
    "runtime_record",
    "summarize_error",
]
