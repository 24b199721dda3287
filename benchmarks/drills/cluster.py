"""The stack a drill runs on: PostgreSQL, an S3 server, and the daemons as processes.

:class:`Cluster` starts, in a state directory of its own:

* a private PostgreSQL (:class:`~benchmarks.drills.faults.PrivatePostgres`), optionally
  behind a :class:`~benchmarks.drills.faults.TcpProxy`;
* moto's S3 server (:func:`substrate.testing.s3.start_moto`) with one bucket, behind a
  TCP proxy (the bucket drill cuts it); snapshots go to ``s3://<bucket>/snapshots``;
  :meth:`Cluster.s3_options` are client options through the proxy;
* ateapi (``--store postgresql://…``), per node an atelet and its ateworkers, and the
  router — started like ``ate up`` does (``python -m daemons.<x>``, a session each, stdin
  ``/dev/null``, output appended to ``<state-dir>/logs/<name>.log``, mTLS identities from
  one CA), but with the timers and parking flags a drill needs. Worker names carry a
  random run id (their network namespaces and veths are named after them, so two stacks
  on one machine never collide) and a ``node=<node>`` label, so an actor can be placed on
  a node with a worker selector.

It writes ``<state-dir>/stack.json`` in the format of ``ate up``
(:class:`substrate.client.local.LocalStack`), so ``ate proxy --state-dir …`` talks to it
and :func:`substrate.cli.stack.down` stops it and removes what its workers left. A drill
stops and starts single processes (ateapi; one node's atelet and workers) through the
recorded pids; the record is updated on every restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Final

import anyio
import attrs

from benchmarks.drills.faults import PrivatePostgres, TcpProxy, free_port
from substrate.adapters.gvisor import procfs
from substrate.adapters.objectstore import ObjectStoreOptions
from substrate.cli.daemon_args import ateapi_argv, atelet_argv, router_argv, worker_argv
from substrate.cli.stack import admin_get, choose_runtime, down, spawn
from substrate.client import AteClient
from substrate.client.local import (
    CLIENT_TLS_NAME,
    STATE_FILE,
    LocalStack,
    NodeRecord,
    ProcessRecord,
)
from substrate.core.model import Worker, WorkerState
from substrate.errors import SubstrateError
from substrate.identity import CertificateAuthority, Identity, write_bundle
from substrate.identity.ca import CA_VALIDITY
from substrate.sandbox.node_layout import NodeLayout
from substrate.testing.s3 import S3Server, start_moto

ROOT: Final = Path(__file__).resolve().parents[2]
TRUST_DOMAIN: Final = "ate"
HOST: Final = "127.0.0.1"
COUNTER_IMAGE: Final = "counter:1"

Progress = Callable[[str], None]


def _quiet(_text: str) -> None:
    return None


@attrs.frozen(kw_only=True)
class ClusterOptions:
    nodes: int = 2
    workers_per_node: int = 1
    max_actors: int = 16
    """Actor slots per worker."""
    runtime: str = "auto"
    """``auto`` (gVisor as root with runsc, else fake), ``gvisor`` or ``fake``."""
    heartbeat_timeout: float = 10.0
    heartbeat_every: float = 1.0
    reconcile_every: float = 2.0
    parked_budget: float = 5.0
    parked_max: int = 1024
    pg_proxy: bool = False
    """Put a TCP proxy between ateapi and PostgreSQL (to cut it instead of stopping it)."""
    worker_memory: str = "8Gi"
    ready_timeout: float = 120.0


def session_pids(session: int) -> list[int]:
    """Live pids whose session id is ``session`` (a daemon leads its own session)."""
    out = []
    for pid in procfs.pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 3 and int(fields[3]) == session and fields[0] not in ("Z", "X"):
            out.append(pid)
    return out


def alive(p: ProcessRecord) -> bool:
    return procfs.alive(p.pid, p.start_ticks)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


class Cluster:
    """One drill's stack; ``async with Cluster(dir, options) as c:`` starts and stops it."""

    def __init__(
        self, state_dir: Path, options: ClusterOptions, progress: Progress = _quiet
    ) -> None:
        self.state_dir = state_dir.absolute()
        self.options = options
        self.progress = progress
        self.run_id = secrets.token_hex(2)
        self.runtime, self.runtime_note = choose_runtime(
            options.runtime, euid=os.geteuid(), path=os.environ.get("PATH", os.defpath)
        )
        self.logs = self.state_dir / "logs"
        self.tls = self.state_dir / "tls"
        self.images = self.state_dir / "images"
        self.ca = CertificateAuthority.create(TRUST_DOMAIN, now=datetime.now(UTC))
        self.pg: PrivatePostgres | None = None
        self.pg_proxy: TcpProxy | None = None
        self.s3: S3Server | None = None
        self.s3_proxy: TcpProxy | None = None
        self.bucket = ""
        """The drill's bucket in :attr:`s3` (snapshots go to ``s3://<bucket>/snapshots``)."""
        self.records: dict[str, ProcessRecord] = {}
        self.argv: dict[str, list[str]] = {}
        self.ports: dict[str, int] = {}
        self.nodes: list[NodeRecord] = []
        self.env: dict[str, str] = {}
        self.store_url = ""
        self.location = ""
        self._client: AteClient | None = None
        self._client_cm: contextlib.AbstractAsyncContextManager[AteClient] | None = None

    # --- names and addresses ---------------------------------------------------------

    @property
    def ateapi_address(self) -> str:
        return f"{HOST}:{self.ports['ateapi']}"

    @property
    def ateapi_admin(self) -> str:
        return f"{HOST}:{self.ports['ateapi-admin']}"

    @property
    def router_url(self) -> str:
        return f"http://{HOST}:{self.ports['router']}"

    @property
    def router_admin(self) -> str:
        return f"{HOST}:{self.ports['router-admin']}"

    def s3_options(self) -> ObjectStoreOptions:
        """Client options for the drill's S3 server, through the proxy in front of it."""
        assert self.s3 is not None
        assert self.s3_proxy is not None
        return self.s3.options(endpoint=f"http://{self.s3_proxy.address}")

    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def workers_of(self, node: str) -> list[str]:
        return next(list(n.workers) for n in self.nodes if n.name == node)

    def node_of(self, worker: str) -> str:
        return next(n.name for n in self.nodes if worker in n.workers)

    @property
    def all_workers(self) -> list[str]:
        return [w for n in self.nodes for w in n.workers]

    # --- lifetime ---------------------------------------------------------------------

    async def __aenter__(self) -> Cluster:
        try:
            await self.start()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.close()

    async def start(self) -> None:
        o = self.options
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if (self.state_dir / STATE_FILE).exists():
            with contextlib.suppress(SubstrateError):
                await down(self.state_dir)
        self.progress(
            f"runtime: {self.runtime}{f' ({self.runtime_note})' if self.runtime_note else ''}"
        )
        await anyio.to_thread.run_sync(self._prepare_image)
        # PostgreSQL
        self.pg = PrivatePostgres()
        await anyio.to_thread.run_sync(self.pg.init)
        await anyio.to_thread.run_sync(self.pg.start)
        self.store_url = self.pg.url
        if o.pg_proxy:
            self.pg_proxy = TcpProxy(
                f"{HOST}:{self.pg.port}", log=self.logs / "pg-proxy.log", name="pg-proxy"
            )
            await anyio.to_thread.run_sync(self.pg_proxy.start)
            self.store_url = f"postgresql://postgres@{self.pg_proxy.address}/postgres"
        self.progress(f"PostgreSQL {self.pg.url} (pid {self.pg.pid()})")
        # S3
        self.s3 = await anyio.to_thread.run_sync(start_moto, self.logs / "moto.log")
        bucket = f"drill-{self.run_id}"
        await anyio.to_thread.run_sync(self.s3.create_bucket, bucket)
        self.bucket = bucket
        self.s3_proxy = TcpProxy(
            f"{self.s3.host}:{self.s3.port}", log=self.logs / "s3-proxy.log", name="s3"
        )
        await anyio.to_thread.run_sync(self.s3_proxy.start)
        self.location = f"s3://{bucket}/snapshots"
        self.progress(
            f"S3 (moto) {self.s3.endpoint}, bucket {bucket} behind {self.s3_proxy.address}"
        )
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
            ),
            "AWS_ENDPOINT_URL": f"http://{self.s3_proxy.address}",
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_S3_FORCE_PATH_STYLE": "true",
            "AWS_ALLOW_HTTP": "true",
        }
        for name in ("ateapi", "ateapi-admin", "router", "router-admin"):
            self.ports[name] = free_port()
        self.nodes = [
            NodeRecord(
                name=f"node-{n}",
                directory=str(self.state_dir / "nodes" / f"node-{n}"),
                workers=tuple(
                    f"node-{n}-w{i}-{self.run_id}" for i in range(1, o.workers_per_node + 1)
                ),
            )
            for n in range(1, o.nodes + 1)
        ]
        self._issue(CLIENT_TLS_NAME, CLIENT_TLS_NAME, Identity.client("drill", TRUST_DOMAIN))
        self._write_state()
        self.progress("starting ateapi, atelets, workers and the router")
        await self.start_ateapi()
        for node in self.nodes:
            self._spawn_node(node.name)
        self._spawn_router()
        await self.wait_workers_active(self.all_workers, since_epochs={})
        await self.wait_router_ready()

    async def close(self) -> None:
        if self._client_cm is not None:
            with contextlib.suppress(Exception):
                await self._client_cm.__aexit__(None, None, None)
            self._client_cm = self._client = None
        if (self.state_dir / STATE_FILE).exists():
            with contextlib.suppress(SubstrateError, OSError):
                await down(self.state_dir)
        for proxy in (self.s3_proxy, self.pg_proxy):
            if proxy is not None:
                await anyio.to_thread.run_sync(proxy.stop)
        if self.s3 is not None:
            await anyio.to_thread.run_sync(self.s3.stop)
        if self.pg is not None:
            await anyio.to_thread.run_sync(self.pg.destroy)

    # --- the image and identities ------------------------------------------------------

    def _prepare_image(self) -> None:
        from substrate.adapters.gvisor.images import LocalImages, build_counter_image

        dest = LocalImages(self.images).path_for(COUNTER_IMAGE)
        if (dest / "image.json").is_file():
            return
        try:
            build_counter_image(dest)
        except SubstrateError:
            if self.runtime == "gvisor":
                raise
            (dest / "rootfs").mkdir(parents=True, exist_ok=True)
            (dest / "image.json").write_text(json.dumps({"entrypoint": ["/bin/counter"]}))

    def _issue(self, dirname: str, name: str, identity: Identity) -> Path:
        directory = self.tls / dirname
        write_bundle(
            directory,
            name,
            self.ca.issue(identity, now=datetime.now(UTC), valid_for=CA_VALIDITY),
        )
        return directory

    # --- processes --------------------------------------------------------------------

    def _write_state(self) -> None:
        stack = LocalStack(
            state_dir=self.state_dir,
            ateapi_address=self.ateapi_address,
            ateapi_admin=self.ateapi_admin,
            router_url=self.router_url,
            router_admin=self.router_admin,
            trust_domain=TRUST_DOMAIN,
            runtime=self.runtime,
            store=self.store_url,
            objects=self.location,
            nodes=tuple(self.nodes),
            processes=tuple(self.records.values()),
            started_at=time.time(),
            note=self.runtime_note,
        )
        path = self.state_dir / STATE_FILE
        tmp = path.with_name(f".{STATE_FILE}.tmp")
        tmp.write_text(json.dumps(stack.to_json(), indent=1) + "\n")
        os.replace(tmp, path)

    def _spawn(self, name: str, argv: list[str]) -> ProcessRecord:
        record = spawn(name, argv, logs=self.logs, env=self.env, python=sys.executable)
        self.records[name] = record
        self.argv[name] = argv
        self._write_state()
        return record

    def respawn(self, name: str) -> ProcessRecord:
        """Start process ``name`` again with the argv it had."""
        with open(self.logs / f"{name}.log", "a") as f:
            f.write(f"\n===== drill: restarted at {datetime.now(UTC).isoformat()} =====\n")
        return self._spawn(name, self.argv[name])

    async def stop_process(
        self,
        name: str,
        *,
        kill: bool = False,
        timeout: float = 20.0,  # noqa: ASYNC109
    ) -> bool:
        """SIGTERM (or SIGKILL with ``kill``) and wait; then SIGKILL what is left of its
        session. True if it had to be killed."""
        record = self.records[name]
        forced = kill
        if alive(record):
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, signal.SIGKILL if kill else signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while alive(record) and time.monotonic() < deadline:
                _reap(record.pid)
                await anyio.sleep(0.05)
            if alive(record):
                forced = True
        for pid in session_pids(record.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            _reap(record.pid)
            if not alive(record):
                break
            await anyio.sleep(0.05)
        return forced

    # --- ateapi -------------------------------------------------------------------------

    async def start_ateapi(self) -> float:
        """Start (or restart) ateapi; seconds until it answered ``/readyz``."""
        started = time.monotonic()
        if "ateapi" in self.argv:
            self.respawn("ateapi")
        else:
            tls = self._issue("ateapi", "ateapi", Identity.ateapi(TRUST_DOMAIN))
            o = self.options
            self._spawn(
                "ateapi",
                ateapi_argv(
                    listen=self.ateapi_address,
                    admin_listen=self.ateapi_admin,
                    tls_dir=tls,
                    trust_domain=TRUST_DOMAIN,
                    store=self.store_url,
                    objects=self.location,
                    heartbeat_timeout=o.heartbeat_timeout,
                    reconcile_every=o.reconcile_every,
                ),
            )
        await self.wait_admin(self.ateapi_admin, "/readyz", "ateapi", "ateapi")
        return time.monotonic() - started

    async def stop_ateapi(self, *, kill: bool = False) -> bool:
        return await self.stop_process("ateapi", kill=kill)

    async def wait_admin(
        self,
        address: str,
        path: str,
        what: str,
        process: str,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        deadline = time.monotonic() + (timeout or self.options.ready_timeout)
        last = ""
        while True:
            status, body = await admin_get(address, path, timeout=1.0)
            if status == 200:
                return
            last = f"{status} {body.strip()[:80]}"
            record = self.records.get(process)
            if record is not None and not alive(record):
                _reap(record.pid)
                raise RuntimeError(f"{what} exited; see {record.log}\n{self.tail(process)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready at {address}{path}: {last}")
            await anyio.sleep(0.05)

    # --- nodes --------------------------------------------------------------------------

    def _spawn_node(self, node: str) -> None:
        record = next(n for n in self.nodes if n.name == node)
        if f"atelet-{node}" in self.argv:
            self.respawn(f"atelet-{node}")
            for w in record.workers:
                self.respawn(f"worker-{w}")
            return
        o = self.options
        Path(record.directory).mkdir(parents=True, exist_ok=True)
        let_tls = self._issue(f"atelet-{node}", "atelet", Identity.atelet(node, TRUST_DOMAIN))
        self._spawn(
            f"atelet-{node}",
            atelet_argv(
                node=node,
                node_dir=record.directory,
                images=self.images,
                listen=f"{HOST}:0",
                ateapi=self.ateapi_address,
                tls_dir=let_tls,
                trust_domain=TRUST_DOMAIN,
                objects=[self.location],
                heartbeat_every=o.heartbeat_every,
            ),
        )
        for w in record.workers:
            w_tls = self._issue(f"worker-{w}", "worker", Identity.worker(w, TRUST_DOMAIN))
            self._spawn(
                f"worker-{w}",
                worker_argv(
                    name=w,
                    node=node,
                    node_dir=record.directory,
                    runtime=self.runtime,
                    tunnel_listen=f"{HOST}:0",
                    tls_dir=w_tls,
                    trust_domain=TRUST_DOMAIN,
                    max_actors=o.max_actors,
                    memory=o.worker_memory,
                    labels={"node": node},
                ),
            )

    def epochs(self, workers: list[str]) -> dict[str, int]:
        out = {}
        for w in workers:
            layout = NodeLayout(next(n.directory for n in self.nodes if w in n.workers))
            try:
                out[w] = int(Path(layout.worker_epoch_file(w)).read_text().strip() or "0")
            except (OSError, ValueError):
                out[w] = 0
        return out

    async def stop_node(self, node: str) -> None:
        """The node loses power: atelet, workers and sandboxes killed, its network gone.

        Its directory (snapshots, epochs) stays, as a disk would."""
        record = next(n for n in self.nodes if n.name == node)
        names = [f"worker-{w}" for w in record.workers] + [f"atelet-{node}"]
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for name in names:
                    tg.start_soon(partial(self.stop_process, name, kill=True))
            await self._remove_node_leftovers(record)

    async def _remove_node_leftovers(self, record: NodeRecord) -> None:
        if self.runtime != "gvisor":
            return
        from substrate.adapters.gvisor.runtime import cleanup_root
        from substrate.adapters.linux.netlink import LinuxHostNetwork
        from substrate.net.plan import netns_prefix, veth_prefix, worker_tag

        network = LinuxHostNetwork()
        layout = NodeLayout(record.directory)
        for w in record.workers:
            with contextlib.suppress(SubstrateError, OSError):
                await cleanup_root(layout.worker_runsc_root(w))
            with contextlib.suppress(SubstrateError, OSError):
                await network.remove_owned(netns_prefix(w), veth_prefix(w))
            if shutil.which("nft"):
                with contextlib.suppress(SubstrateError, OSError):
                    table = f"ate_egress_{worker_tag(w)}"
                    listed = await anyio.run_process(
                        ["nft", "list", "table", "ip", table], check=False
                    )
                    if listed.returncode == 0:
                        await network.remove_egress(table)

    def start_node(self, node: str) -> dict[str, int]:
        """Start the node's atelet and workers again; their epochs before the start."""
        before = self.epochs(self.workers_of(node))
        self._spawn_node(node)
        return before

    # --- the router ---------------------------------------------------------------------

    def _spawn_router(self) -> None:
        o = self.options
        tls = self._issue("router", "router", Identity.router(TRUST_DOMAIN))
        self._spawn(
            "router",
            router_argv(
                listen=f"{HOST}:{self.ports['router']}",
                admin_listen=self.router_admin,
                ateapi_address=self.ateapi_address,
                tls_dir=tls,
                trust_domain=TRUST_DOMAIN,
                parked_request_budget=o.parked_budget,
                parked_request_max=o.parked_max,
            ),
        )

    async def wait_router_ready(self) -> None:
        await self.wait_admin(self.router_admin, "/readyz", "the router", "router")

    async def router_status(self) -> dict[str, object]:
        status, body = await admin_get(self.router_admin, "/statusz?format=json", timeout=2.0)
        if status != 200:
            return {}
        data = json.loads(body)
        return data if isinstance(data, dict) else {}

    # --- the control plane as a client --------------------------------------------------

    @asynccontextmanager
    async def connect(
        self,
        timeout: float = 10.0,  # noqa: ASYNC109 (each call's)
    ) -> AsyncIterator[AteClient]:
        async with AteClient.connect(
            self.ateapi_address,
            tls_dir=self.tls / CLIENT_TLS_NAME,
            name=CLIENT_TLS_NAME,
            timeout=timeout,
            server_id=Identity.ateapi(TRUST_DOMAIN),
        ) as client:
            yield client

    async def client(self) -> AteClient:
        """A client kept open for the drill (reconnects lazily after an ateapi restart)."""
        if self._client is None:
            cm = self.connect(timeout=120.0)
            self._client = await cm.__aenter__()
            self._client_cm = cm
        return self._client

    async def workers(self) -> list[Worker]:
        async with self.connect(timeout=3.0) as c:
            return await c.list_workers()

    async def wait_workers_active(
        self,
        names: list[str],
        *,
        since_epochs: Mapping[str, int],
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> float:
        """Until every worker of ``names`` is ACTIVE with an epoch above ``since_epochs``."""
        started = time.monotonic()
        deadline = started + (timeout or self.options.ready_timeout)
        last = ""
        while True:
            try:
                workers = await self.workers()
            except SubstrateError as exc:
                last = exc.description
            else:
                ready = {
                    w.ref.name
                    for w in workers
                    if w.state is WorkerState.ACTIVE and w.epoch > since_epochs.get(w.ref.name, 0)
                }
                if ready >= set(names):
                    return time.monotonic() - started
                last = f"{len(ready & set(names))}/{len(names)} active"
            for name in (f"worker-{n}" for n in names):
                record = self.records.get(name)
                if record is not None and not alive(record):
                    raise RuntimeError(f"{name} exited; see {record.log}\n{self.tail(name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not active: {last}")
            await anyio.sleep(0.1)

    # --- logs ---------------------------------------------------------------------------

    def tail(self, name: str, n: int = 3000) -> str:
        try:
            return (self.logs / f"{name}.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def tails(self, n: int = 2500) -> str:
        out = [f"===== {name} =====\n{self.tail(name, n)}" for name in self.records]
        if self.pg is not None:
            out.append(f"===== postgres =====\n{self.pg.log_tail(n)}")
        return "\n".join(out)


__all__ = ["Cluster", "ClusterOptions"]
