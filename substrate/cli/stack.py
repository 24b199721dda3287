"""The local stack behind ``ate up``, ``ate down`` and ``ate status``.

``ate up`` starts, as separate processes (``python -m daemons.<x>``, each in a new session,
stdin from ``/dev/null``, output appended to ``<state-dir>/logs/<name>.log``):

* ateapi (``--store``: ``memory://`` by default, or ``postgresql://…``), with the object
  store ``file://<state-dir>/objects`` unless told otherwise;
* per node an atelet and M ateworkers (``node-1`` … with workers ``node-1-w1`` …), each
  node with its directory ``<state-dir>/nodes/<node>``;
* the router (plain HTTP for clients, mTLS to the workers' atunnels).

Every process has its own identity from one CA kept in ``<state-dir>/pki`` (made on the
first ``ate up``, reused afterwards); the bundles are in ``<state-dir>/tls/<identity>/``,
the client's in ``<state-dir>/tls/client``. The pids (with their start times, so a reused
pid is never mistaken for ours) and the endpoints go to ``<state-dir>/stack.json``
(:mod:`substrate.client.local`). ``ate up`` waits until ateapi answers ``/healthz``, every
worker registered ACTIVE in this run (a higher epoch than before) and the router answers
``/readyz``.

``ate down`` stops the recorded processes (SIGTERM, then SIGKILL of their sessions), then
removes whatever the workers may have left: runsc containers and processes of each
worker's runsc root, the network namespaces and veths named after the workers, their
nftables tables, and mounts below the state directory. Snapshots, the PKI and the node
directories stay, so ``ate up`` again with the same PostgreSQL store and state directory
finds its actors and snapshots.

The runtime is gVisor when asked for, or by default when running as root with runsc, nft
and ip available; otherwise the workers use the fake in-process runtime, and the stack
says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import anyio
import attrs
import h11

from substrate.adapters.gvisor import procfs
from substrate.cli.daemon_args import ateapi_argv, atelet_argv, router_argv, worker_argv
from substrate.client import AteClient
from substrate.client.local import (
    CLIENT_TLS_NAME,
    STATE_FILE,
    LocalStack,
    NodeRecord,
    ProcessRecord,
    read_local_stack,
    redact_url,
)
from substrate.core.model import WorkerState
from substrate.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    SubstrateError,
    Unavailable,
)
from substrate.identity import CertificateAuthority, Identity, load_ca, write_bundle, write_ca
from substrate.identity.ca import CA_VALIDITY
from substrate.sandbox.node_layout import NodeLayout

TRUST_DOMAIN: Final = "ate"
COUNTER_IMAGE: Final = "counter:1"
RUNTIMES: Final = ("auto", "gvisor", "fake")
HOST: Final = "127.0.0.1"
READY_TIMEOUT: Final = 120.0
STOP_TIMEOUT: Final = 30.0
LOG_TAIL_LINES: Final = 15

Progress = Callable[[str], None]
"""Told each step of a long operation, as one line of text."""


def _quiet(_message: str) -> None:
    return None


# --- options ---------------------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class UpOptions:
    state_dir: Path
    nodes: int = 2
    workers_per_node: int = 2
    store: str = "memory://"
    objects: str = ""
    """Object store URL; default ``file://<state-dir>/objects``."""
    runtime: str = "auto"
    max_actors: int = 8
    """Actor slots per worker."""
    env: Mapping[str, str] = attrs.field(factory=dict)
    """The daemons' environment (the CLI passes its own)."""
    python: str
    """The interpreter that runs ``-m daemons.<x>``."""
    ready_timeout: float = READY_TIMEOUT

    def validate(self) -> UpOptions:
        if not 1 <= self.nodes <= 16:
            raise InvalidArgument(f"--nodes must be in 1..16 (got {self.nodes})")
        if not 1 <= self.workers_per_node <= 16:
            raise InvalidArgument(
                f"--workers-per-node must be in 1..16 (got {self.workers_per_node})"
            )
        if self.max_actors < 1:
            raise InvalidArgument(f"--max-actors must be positive (got {self.max_actors})")
        if self.runtime not in RUNTIMES:
            raise InvalidArgument(f"--runtime must be one of {', '.join(RUNTIMES)}")
        scheme = self.store.partition("://")[0]
        if scheme not in ("memory", "postgresql", "postgres"):
            raise InvalidArgument(
                f"--store {redact_url(self.store)!r} must be memory:// or postgresql://…"
            )
        if self.objects and "://" not in self.objects:
            raise InvalidArgument(f"--objects {self.objects!r} must be a URL (file:///dir, s3://…)")
        return self


def node_names(nodes: int) -> list[str]:
    return [f"node-{n}" for n in range(1, nodes + 1)]


def worker_names(node: str, per_node: int) -> list[str]:
    return [f"{node}-w{i}" for i in range(1, per_node + 1)]


def choose_runtime(requested: str, *, euid: int, path: str) -> tuple[str, str]:
    """(runtime, note): gVisor if asked or possible, else the fake runtime and why."""
    missing = [tool for tool in ("runsc", "nft", "ip") if shutil.which(tool, path=path) is None]
    why = ""
    if euid != 0:
        why = "not running as root"
    elif missing:
        why = f"{', '.join(missing)} not found"
    if requested == "gvisor":
        if why:
            raise FailedPrecondition(
                f"the gvisor runtime needs root with runsc, nft and ip: {why} "
                "(run `make system-deps` as root, or use --runtime fake)"
            )
        return "gvisor", ""
    if requested == "fake":
        return "fake", ""
    if why:
        return "fake", (
            f"gVisor is not available ({why}): the workers use the fake runtime, "
            "in-process stand-ins for sandboxes"
        )
    return "gvisor", ""


# --- small helpers ------------------------------------------------------------------------------


def _mkdir(path: str | Path) -> None:
    Path(path).mkdir(parents=True, exist_ok=True)


def _isdir(path: str | Path) -> bool:
    return Path(path).is_dir()


def _isfile(path: Path) -> bool:
    return path.is_file()


def _absolute(path: Path) -> Path:
    return path.expanduser().absolute()


def free_port(host: str = HOST) -> int:
    """A TCP port on ``host`` that is free now, for a daemon to bind a moment later.

    Chosen *below* the kernel's ephemeral range (``ip_local_port_range``), so no outgoing
    connection made meanwhile can take it: a port from the ephemeral range (``bind`` to 0)
    was sometimes the local port of one of the stack's own client connections by the time
    the router, started last, tried to listen on it ("Address already in use"). Falls back
    to an ephemeral port when the range below is unusable.
    """
    low, _ = _ephemeral_range()
    floor = max(1024, low - _BELOW_EPHEMERAL)
    if low - floor >= 1000:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(floor, low)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


_BELOW_EPHEMERAL: Final = 12_000
"""How far below the ephemeral range :func:`free_port` looks."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        low, high = (int(part) for part in text.split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def file_url(path: Path) -> str:
    return f"file://{path.absolute()}"


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Hold ``<state-dir>/.lock``: one ``ate up``/``ate down`` at a time per directory."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(state_dir / ".lock", "a+b") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FailedPrecondition(
                f"another `ate up` or `ate down` is running on {state_dir}"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def write_state(stack: LocalStack) -> None:
    path = stack.state_dir / STATE_FILE
    tmp = path.with_name(f".{STATE_FILE}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(stack.to_json(), out, indent=1)
        out.write("\n")
    os.replace(tmp, path)


def alive(p: ProcessRecord) -> bool:
    return procfs.alive(p.pid, p.start_ticks)


def _session_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    # fields[0] is field 3 (state); the session id is field 6
    return int(fields[3]) if len(fields) > 3 else None


def session_members(session: int) -> list[int]:
    """Live pids of session ``session`` (the daemons start their own, named by their pid)."""
    out = []
    for pid in procfs.pids():
        if _session_of(pid) == session:
            st = procfs.read_stat(pid)
            if st is not None and not st.gone:
                out.append(pid)
    return out


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is our child (``ate up`` run in-process); harmless otherwise."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


async def admin_get(address: str, path: str, *, timeout: float = 2.0) -> tuple[int, str]:  # noqa: ASYNC109
    """``GET http://<address><path>`` → (status, body); (0, error) if it cannot connect."""
    host, _, port = address.rpartition(":")
    try:
        with anyio.fail_after(timeout):
            async with await anyio.connect_tcp(host, int(port)) as stream:
                conn = h11.Connection(h11.CLIENT)
                await stream.send(
                    conn.send(
                        h11.Request(
                            method="GET",
                            target=path,
                            headers=[("Host", address), ("Connection", "close")],
                        )
                    )
                    + conn.send(h11.EndOfMessage())
                )
                status, body = 0, b""
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        try:
                            conn.receive_data(await stream.receive())
                        except anyio.EndOfStream:
                            conn.receive_data(b"")
                    elif isinstance(event, h11.Response):
                        status = event.status_code
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                        return status, body.decode(errors="replace")
    except (OSError, TimeoutError, anyio.BrokenResourceError, h11.ProtocolError) as exc:
        return 0, str(exc) or type(exc).__name__


# --- the PKI ---------------------------------------------------------------------------------


def ensure_ca(pki: Path, now: datetime) -> CertificateAuthority:
    if (pki / "ca.crt").is_file() and (pki / "ca.key").is_file():
        return load_ca(pki)
    ca = CertificateAuthority.create(TRUST_DOMAIN, now=now)
    write_ca(pki, ca)
    return ca


def issue(
    ca: CertificateAuthority, tls: Path, name: str, identity: Identity, now: datetime
) -> Path:
    write_bundle(tls, name, ca.issue(identity, now=now, valid_for=CA_VALIDITY))
    return tls


# --- the image -----------------------------------------------------------------------------------


def prepare_image(images: Path, runtime: str) -> str:
    """Build the counter image (a stub for the fake runtime if it cannot be built)."""
    from substrate.adapters.gvisor.images import LocalImages, build_counter_image

    dest = LocalImages(images).path_for(COUNTER_IMAGE)
    try:
        build_counter_image(dest)
        return f"counter image built at {dest}"
    except SubstrateError as exc:
        if runtime == "gvisor":
            raise
        # The fake runtime runs no process: an image with an empty root filesystem will do.
        (dest / "rootfs").mkdir(parents=True, exist_ok=True)
        (dest / "image.json").write_text(json.dumps({"entrypoint": ["/bin/counter"]}))
        return f"counter image not built ({exc.description}); a stub serves the fake runtime"


# --- starting --------------------------------------------------------------------------------


def child_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` for a daemon: unbuffered output, this checkout first on ``PYTHONPATH``."""
    env = dict(base)
    env["PYTHONUNBUFFERED"] = "1"
    root = Path(__file__).resolve().parents[2]
    if (root / "daemons").is_dir() and (root / "substrate").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    return env


def spawn(
    name: str, argv: list[str], *, logs: Path, env: Mapping[str, str], python: str
) -> ProcessRecord:
    """``python -m <argv>`` in a new session, stdin /dev/null, output appended to its log."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    full = [python, "-m", *argv]
    pid = os.posix_spawn(
        python,
        full,
        dict(env),
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )
    st = procfs.read_stat(pid)
    return ProcessRecord(
        name=name, pid=pid, start_ticks=st.start_ticks if st else 0, log=str(log), argv=tuple(full)
    )


@attrs.define
class _Starting:
    stack: LocalStack
    progress: Progress

    def add(self, record: ProcessRecord) -> None:
        self.stack = attrs.evolve(self.stack, processes=(*self.stack.processes, record))
        write_state(self.stack)

    def check_alive(self) -> None:
        for p in self.stack.processes:
            if not alive(p):
                _reap(p.pid)
                tail = log_tail(p.log)
                if tail:
                    self.progress(f"last lines of {p.log}:\n{tail}")
                raise Unavailable(f"{p.name} exited during start-up; see its log {p.log}")


async def _wait(
    what: str,
    starting: _Starting,
    check: Callable[[], Awaitable[str | None]],
    *,
    deadline: float,
) -> None:
    """Call ``check`` until it returns None (ready); it returns a progress text otherwise."""
    last = ""
    while True:
        starting.check_alive()
        state = await check()
        if state is None:
            return
        if state != last:
            starting.progress(f"waiting for {what}: {state}")
            last = state
        if time.monotonic() > deadline:
            raise Unavailable(f"{what} not ready after the start-up timeout ({state})")
        await anyio.sleep(0.2)


def _previous_epochs(layout: NodeLayout, workers: list[str]) -> dict[str, int]:
    out = {}
    for w in workers:
        try:
            out[w] = int(Path(layout.worker_epoch_file(w)).read_text().strip() or "0")
        except (OSError, ValueError):
            out[w] = 0
    return out


async def up(options: UpOptions, progress: Progress = _quiet) -> LocalStack:
    """Start the local stack in ``options.state_dir``; return it once ready."""
    options = options.validate()
    state_dir = _absolute(options.state_dir)
    with locked(state_dir):
        try:
            previous = read_local_stack(state_dir)
        except NotFound:
            previous = None
        if previous is not None:
            running = [p for p in previous.processes if alive(p)]
            if running:
                raise FailedPrecondition(
                    f"a stack is already up in {state_dir} ({running[0].name} pid "
                    f"{running[0].pid}); run `ate down` first"
                )
            progress("cleaning up after an earlier stack that is no longer running")
            await _cleanup(previous, progress)
            (state_dir / STATE_FILE).unlink(missing_ok=True)
        runtime, note = choose_runtime(
            options.runtime, euid=os.geteuid(), path=options.env.get("PATH", os.defpath)
        )
        if note:
            progress(f"NOTE: {note}")
        return await _start(options, state_dir, runtime, note, progress)


async def _start(
    options: UpOptions, state_dir: Path, runtime: str, note: str, progress: Progress
) -> LocalStack:
    now = datetime.now(UTC)
    env = child_env(options.env)
    logs = state_dir / "logs"
    tls = state_dir / "tls"
    images = state_dir / "images"
    objects = options.objects or file_url(state_dir / "objects")
    if objects.startswith("file://"):
        _mkdir(objects.removeprefix("file://"))
    progress("building the counter workload image")
    progress(await anyio.to_thread.run_sync(prepare_image, images, runtime))
    progress("issuing certificates")
    ca = ensure_ca(state_dir / "pki", now)
    api_port, api_admin, router_port, router_admin = (free_port() for _ in range(4))
    nodes = [
        NodeRecord(
            name=n,
            directory=str(state_dir / "nodes" / n),
            workers=tuple(worker_names(n, options.workers_per_node)),
        )
        for n in node_names(options.nodes)
    ]
    stack = LocalStack(
        state_dir=state_dir,
        ateapi_address=f"{HOST}:{api_port}",
        ateapi_admin=f"{HOST}:{api_admin}",
        router_url=f"http://{HOST}:{router_port}",
        router_admin=f"{HOST}:{router_admin}",
        trust_domain=TRUST_DOMAIN,
        runtime=runtime,
        store=options.store,
        objects=objects,
        nodes=tuple(nodes),
        started_at=time.time(),
        note=note,
    )
    issue(ca, tls / CLIENT_TLS_NAME, CLIENT_TLS_NAME, Identity.client("local", TRUST_DOMAIN), now)
    starting = _Starting(stack=stack, progress=progress)
    write_state(stack)
    deadline = time.monotonic() + options.ready_timeout
    try:
        progress(f"starting ateapi (store {redact_url(options.store)})")
        api_tls = issue(ca, tls / "ateapi", "ateapi", Identity.ateapi(TRUST_DOMAIN), now)
        starting.add(
            spawn(
                "ateapi",
                ateapi_argv(
                    listen=stack.ateapi_address,
                    admin_listen=stack.ateapi_admin,
                    tls_dir=api_tls,
                    trust_domain=TRUST_DOMAIN,
                    store=options.store,
                    objects=objects,
                ),
                logs=logs,
                env=env,
                python=options.python,
            )
        )

        async def ateapi_ready() -> str | None:
            status, _ = await admin_get(stack.ateapi_admin, "/healthz")
            return None if status == 200 else "not answering /healthz yet"

        await _wait("ateapi", starting, ateapi_ready, deadline=deadline)
        epochs: dict[str, int] = {}
        for node in nodes:
            layout = NodeLayout(node.directory)
            _mkdir(node.directory)
            epochs.update(_previous_epochs(layout, list(node.workers)))
            progress(f"starting {node.name}: atelet and {len(node.workers)} worker(s) ({runtime})")
            let_tls = issue(
                ca,
                tls / f"atelet-{node.name}",
                "atelet",
                Identity.atelet(node.name, TRUST_DOMAIN),
                now,
            )
            starting.add(
                spawn(
                    f"atelet-{node.name}",
                    atelet_argv(
                        node=node.name,
                        node_dir=node.directory,
                        images=images,
                        listen=f"{HOST}:0",
                        ateapi=stack.ateapi_address,
                        tls_dir=let_tls,
                        trust_domain=TRUST_DOMAIN,
                        objects=[objects],
                        heartbeat_every=1,
                    ),
                    logs=logs,
                    env=env,
                    python=options.python,
                )
            )
            for worker in node.workers:
                w_tls = issue(
                    ca,
                    tls / f"worker-{worker}",
                    "worker",
                    Identity.worker(worker, TRUST_DOMAIN),
                    now,
                )
                starting.add(
                    spawn(
                        f"worker-{worker}",
                        worker_argv(
                            name=worker,
                            node=node.name,
                            node_dir=node.directory,
                            runtime=runtime,
                            tunnel_listen=f"{HOST}:0",
                            tls_dir=w_tls,
                            trust_domain=TRUST_DOMAIN,
                            max_actors=options.max_actors,
                            memory="4Gi",
                        ),
                        logs=logs,
                        env=env,
                        python=options.python,
                    )
                )
        progress("starting the router")
        r_tls = issue(ca, tls / "router", "router", Identity.router(TRUST_DOMAIN), now)
        starting.add(
            spawn(
                "router",
                router_argv(
                    listen=stack.router_url.removeprefix("http://"),
                    admin_listen=stack.router_admin,
                    ateapi_address=stack.ateapi_address,
                    tls_dir=r_tls,
                    trust_domain=TRUST_DOMAIN,
                ),
                logs=logs,
                env=env,
                python=options.python,
            )
        )
        expected = {w for n in nodes for w in n.workers}
        async with AteClient.connect(
            stack.ateapi_address,
            tls_dir=stack.tls_dir,
            name=CLIENT_TLS_NAME,
            timeout=5.0,
            server_id=Identity.ateapi(TRUST_DOMAIN),
        ) as client:

            async def workers_ready() -> str | None:
                try:
                    workers = await client.list_workers()
                except Unavailable as exc:
                    return f"ateapi unreachable ({exc.description})"
                ready = {
                    w.ref.name
                    for w in workers
                    if w.state is WorkerState.ACTIVE
                    and w.ref.name in expected
                    and w.epoch > epochs.get(w.ref.name, 0)
                }
                if ready >= expected:
                    return None
                return f"{len(ready)}/{len(expected)} active"

            await _wait("workers", starting, workers_ready, deadline=deadline)

        async def router_ready() -> str | None:
            status, body = await admin_get(stack.router_admin, "/readyz")
            return None if status == 200 else f"not ready yet ({body.strip()[:60] or status})"

        await _wait("the router", starting, router_ready, deadline=deadline)
    except BaseException:
        with anyio.CancelScope(shield=True):
            progress("start-up failed: stopping what was started")
            await _stop_processes(starting.stack, _quiet)
            await _cleanup(starting.stack, _quiet)
            (state_dir / STATE_FILE).unlink(missing_ok=True)
        raise
    return starting.stack


# --- stopping --------------------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class DownReport:
    stopped: tuple[str, ...] = ()
    killed: tuple[str, ...] = ()
    """Processes that needed SIGKILL."""
    leftovers: tuple[str, ...] = ()
    """What the clean-up removed besides the processes."""


def _stop_order(p: ProcessRecord) -> int:
    if p.name == "router":
        return 0
    if p.name.startswith("worker-"):
        return 1
    if p.name.startswith("atelet-"):
        return 2
    return 3


async def _stop_group(
    group: list[ProcessRecord],
    timeout: float,  # noqa: ASYNC109
) -> tuple[list[str], list[str]]:
    stopped: list[str] = []
    killed: list[str] = []
    live = [p for p in group if alive(p)]
    for p in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    pending = list(live)
    while pending and time.monotonic() < deadline:
        await anyio.sleep(0.1)
        for p in pending:
            _reap(p.pid)
        pending = [p for p in pending if alive(p)]
    for p in pending:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        killed.append(p.name)
    # whatever else is left in the sessions the daemons led (e.g. a stuck child); only of
    # the daemons that were ours when this began (a dead one's pid may be someone else's)
    for p in live:
        for pid in session_members(p.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        for p in group:
            _reap(p.pid)
        if not any(alive(p) for p in group):
            break
        await anyio.sleep(0.1)
    stopped += [p.name for p in live if p.name not in killed]
    return stopped, killed


async def _stop_processes(
    stack: LocalStack,
    progress: Progress,
    timeout: float = STOP_TIMEOUT,  # noqa: ASYNC109
) -> tuple[list[str], list[str]]:
    stopped: list[str] = []
    killed: list[str] = []
    for order in range(4):
        group = [p for p in stack.processes if _stop_order(p) == order]
        if not group:
            continue
        names = ", ".join(p.name for p in group)
        progress(f"stopping {names}")
        s, k = await _stop_group(group, timeout)
        stopped += s
        killed += k
    return stopped, killed


def _mounts_below(directory: Path) -> list[str]:
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    prefix = str(directory).rstrip("/") + "/"
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].encode().decode("unicode_escape")
            if point.startswith(prefix):
                out.append(point)
    return sorted(out, key=len, reverse=True)


async def _cleanup(stack: LocalStack, progress: Progress) -> list[str]:
    """Remove what the stack's workers may have left; what was removed, as text."""
    removed: list[str] = []
    if os.geteuid() != 0:
        return removed  # without root nothing of that kind can have been made
    from substrate.adapters.gvisor.runtime import cleanup_root
    from substrate.adapters.linux.netlink import LinuxHostNetwork
    from substrate.net.plan import netns_prefix, veth_prefix, worker_tag

    network: LinuxHostNetwork | None = None
    with contextlib.suppress(SubstrateError, OSError):
        network = LinuxHostNetwork()
    has_runsc = shutil.which("runsc") is not None
    for node in stack.nodes:
        layout = NodeLayout(node.directory)
        for worker in node.workers:
            root = layout.worker_runsc_root(worker)
            if has_runsc and _isdir(root):
                try:
                    report = await cleanup_root(root)
                except SubstrateError as exc:
                    progress(f"could not clean runsc root {root}: {exc.description}")
                else:
                    removed += [f"runsc container {sid}" for sid in report.deleted]
                    removed += [f"runsc process {pid}" for pid in report.killed]
            if network is None:
                continue
            try:
                netns, veths = await network.owned(netns_prefix(worker), veth_prefix(worker))
                if netns or veths:
                    await network.remove_owned(netns_prefix(worker), veth_prefix(worker))
                    removed += [f"netns {n}" for n in netns] + [f"veth {v}" for v in veths]
            except SubstrateError as exc:
                progress(f"could not remove the networks of {worker}: {exc.description}")
            if shutil.which("nft") is not None:
                table = f"ate_egress_{worker_tag(worker)}"
                listed = await anyio.run_process(
                    ["nft", "list", "table", "ip", table], check=False, stdin=subprocess.DEVNULL
                )
                if listed.returncode == 0:
                    with contextlib.suppress(SubstrateError):
                        await network.remove_egress(table)
                        removed.append(f"nft table {table}")
    for point in _mounts_below(stack.state_dir):
        done = await anyio.run_process(
            ["umount", "-l", point], check=False, stdin=subprocess.DEVNULL
        )
        if done.returncode == 0:
            removed.append(f"mount {point}")
    for item in removed:
        progress(f"removed leftover {item}")
    return removed


async def down(state_dir: Path, progress: Progress = _quiet, *, purge: bool = False) -> DownReport:
    """Stop the stack recorded in ``state_dir`` and remove its leftovers.

    :class:`NotFound` if no stack is recorded there (nothing to do). With ``purge`` the
    whole state directory goes too (actors' snapshots, PKI, logs).
    """
    state_dir = _absolute(state_dir)
    if not _isfile(state_dir / STATE_FILE):
        if purge and _isdir(state_dir):
            shutil.rmtree(state_dir)
        raise NotFound(f"no local stack in {state_dir}")
    with locked(state_dir):
        stack = read_local_stack(state_dir)
        stopped, killed = await _stop_processes(stack, progress)
        leftovers = await _cleanup(stack, progress)
        (state_dir / STATE_FILE).unlink(missing_ok=True)
    if purge:
        shutil.rmtree(state_dir, ignore_errors=True)
    return DownReport(stopped=tuple(stopped), killed=tuple(killed), leftovers=tuple(leftovers))


# --- status ----------------------------------------------------------------------------------


async def status(state_dir: Path) -> dict[str, Any]:
    """The recorded stack, which of its processes live, and its workers if ateapi answers."""
    stack = read_local_stack(state_dir)
    out = stack.to_json()
    out["store"] = stack.store_redacted
    out["tlsDir"] = str(stack.tls_dir)
    out["processes"] = [
        {"name": p.name, "pid": p.pid, "alive": alive(p), "log": p.log} for p in stack.processes
    ]
    out["nodes"] = {
        n.name: {"directory": n.directory, "workers": list(n.workers)} for n in stack.nodes
    }
    health, _ = await admin_get(stack.ateapi_admin, "/healthz", timeout=1.0)
    router, _ = await admin_get(stack.router_admin, "/readyz", timeout=1.0)
    out["ateapiHealthy"] = health == 200
    out["routerReady"] = router == 200
    workers: list[dict[str, Any]] = []
    if health == 200:
        with contextlib.suppress(SubstrateError):
            async with AteClient.connect(
                stack.ateapi_address,
                tls_dir=stack.tls_dir,
                name=CLIENT_TLS_NAME,
                timeout=3.0,
                server_id=Identity.ateapi(stack.trust_domain),
            ) as client:
                workers = [
                    {
                        "name": w.ref.name,
                        "node": w.node.name,
                        "state": w.state.name,
                        "actors": w.allocated.actors,
                        "capacity": w.capacity.actors if w.capacity else 0,
                    }
                    for w in await client.list_workers()
                ]
    out["workers"] = workers
    out.pop("format", None)
    return out


__all__ = [
    "COUNTER_IMAGE",
    "RUNTIMES",
    "TRUST_DOMAIN",
    "DownReport",
    "UpOptions",
    "choose_runtime",
    "down",
    "status",
    "up",
]
