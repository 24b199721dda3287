"""An in-process :class:`~substrate.sandbox.worker_ports.WorkerApi` over the fake sandbox runtime.

:class:`FakeWorker` is one ateworker whose sandboxes are real (small HTTP servers of
:class:`~substrate.adapters.memory.sandbox.FakeSandboxRuntime`): a run or restore starts
one, the wakeup probe is a real HTTP GET, a checkpoint writes the runtime's image files
into the directory atelet names and a restore reads them back, so the workload's counter
survives a suspend and a resume on another worker.

It checks what atelet must have prepared (the bundle's ``rootfs``, the system-info files,
a non-empty restore directory), writes a small ``config.json`` into the bundle as a real
worker does, removes a restore directory it was not asked to preserve, and records every
request in ``requests``. Faults: ``down`` (every call raises :class:`Unavailable`),
``checkpoint_fails`` (the checkpoint kills the sandbox), :meth:`FakeWorker.restart` (a new
epoch; every sandbox gone).
"""

from __future__ import annotations

import json
import shutil
import socket
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import anyio
import anyio.lowlevel
import anyio.to_thread
import attrs
from anyio.abc import SocketAttribute, SocketStream

from substrate.adapters.memory.sandbox import FAKE_RUNTIME_VERSION, FakeSandboxRuntime
from substrate.core.ids import NodeRef
from substrate.core.model import Capacity, EnvVar, SandboxClass
from substrate.errors import (
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    SubstrateError,
    Unavailable,
)
from substrate.sandbox.ports import CHECKPOINT_FAILED_MESSAGE
from substrate.sandbox.spec import (
    SandboxSpec,
    SandboxStats,
    netns_path_for,
    sandbox_id_for,
)
from substrate.sandbox.worker_ports import (
    WorkerInfo,
    WorkloadCheckpointed,
    WorkloadRequest,
    WorkloadStarted,
)

POD_IP: Final = "127.0.0.1"
PROBE_INTERVAL: Final = 0.01


@attrs.frozen(slots=True)
class HttpReply:
    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()


async def _close_with_rst(stream: SocketStream) -> None:
    """Close so the client side resets: the workload never sits in TIME_WAIT."""
    sock = stream.extra(SocketAttribute.raw_socket)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await stream.aclose()


async def http_get(host: str, port: int, path: str = "/") -> HttpReply:
    """One HTTP/1.1 GET, closed by a reset (as a worker's probe and atunnel do)."""
    stream = await anyio.connect_tcp(host, port)
    try:
        await stream.send(f"GET {path} HTTP/1.1\r\nHost: actor\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive()
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        while len(body) < length:
            body += await stream.receive()
        return HttpReply(status=status, body=body[:length])
    finally:
        with anyio.CancelScope(shield=True):
            await _close_with_rst(stream)


@attrs.define
class _Actor:
    uid: str
    epoch: int
    request: WorkloadRequest


def _write_config(bundle_dir: Path, spec: SandboxSpec) -> None:
    config = {
        "ociVersion": "1.0.2",
        "process": {"args": list(spec.args), "env": [f"{e.name}={e.value}" for e in spec.env]},
        "root": {"path": spec.rootfs, "readonly": True},
        "linux": {"namespaces": [{"type": "network", "path": spec.netns_path}]},
    }
    (bundle_dir / "config.json").write_text(json.dumps(config, indent=1))


class FakeWorker:
    """One fake ateworker (implements :class:`~substrate.sandbox.worker_ports.WorkerApi`)."""

    def __init__(
        self,
        runtime: FakeSandboxRuntime,
        *,
        name: str,
        node: NodeRef,
        epoch: int = 1,
        capacity: Capacity | None = None,
        runtime_versions: tuple[str, ...] = (FAKE_RUNTIME_VERSION,),
        sandbox_class: SandboxClass = SandboxClass.FAKE,
        tunnel_address: str = "",
        pool: str = "default",
        labels: Mapping[str, str] | None = None,
        probe_timeout: float = 5.0,
    ) -> None:
        self.runtime = runtime
        self.name = name
        self.node = node
        self.epoch = epoch
        self.capacity = capacity or Capacity(cpu_milli=4000, memory_bytes=8 << 30, actors=8)
        self.runtime_versions = runtime_versions
        self.sandbox_class = sandbox_class
        self.tunnel_address = tunnel_address
        self.pool = pool
        self.labels = dict(labels or {})
        self.probe_timeout = probe_timeout
        self.actors: dict[str, _Actor] = {}
        self.requests: list[tuple[str, WorkloadRequest]] = []
        """Every run/restore request, as ``("run"|"restore", request)``."""
        self.checkpoints: list[tuple[str, str]] = []
        """Every checkpoint call, as ``(actor_uid, directory)``."""
        self.down = False
        self.checkpoint_fails = False
        self.probe_fails = False

    # --- fault and inspection helpers -----------------------------------------------------

    def _check_up(self) -> None:
        if self.down:
            raise Unavailable(f"worker {self.name} is not serving")

    async def restart(self) -> int:
        """The worker process restarts: every sandbox is gone, the epoch rises."""
        for uid in list(self.actors):
            await self.runtime.terminate(sandbox_id_for(uid))
        self.actors.clear()
        self.epoch += 1
        return self.epoch

    async def call(self, actor_uid: str, path: str = "/") -> HttpReply:
        """An HTTP GET to the actor's first port (as atunnel would forward it)."""
        actor = self.actors.get(actor_uid)
        if actor is None:
            raise NotFound(f"actor {actor_uid} is not active on worker {self.name}")
        sandbox_id = sandbox_id_for(actor_uid)
        address = await self.runtime.address(sandbox_id)
        port = actor.request.containers[0].ports[0] if actor.request.containers[0].ports else 80
        return await http_get(address.host, address.host_port(port), path)

    async def count(self, actor_uid: str) -> int:
        """GET / on the actor's counter workload: the counter after the request."""
        reply = await self.call(actor_uid)
        assert reply.status == 200, reply
        first = reply.text.split()[0]
        return int(first.removeprefix("count="))

    # --- WorkerApi -----------------------------------------------------------------------

    async def info(self) -> WorkerInfo:
        await anyio.lowlevel.checkpoint()
        self._check_up()
        return WorkerInfo(
            name=self.name,
            node=self.node,
            epoch=self.epoch,
            sandbox_class=self.sandbox_class,
            runtime_versions=self.runtime_versions,
            capacity=self.capacity,
            tunnel_address=self.tunnel_address,
            pool=self.pool,
            labels=self.labels,
        )

    async def run(self, request: WorkloadRequest) -> WorkloadStarted:
        return await self._start("run", request)

    async def restore(self, request: WorkloadRequest) -> WorkloadStarted:
        return await self._start("restore", request)

    async def checkpoint(
        self, actor_uid: str, checkpoint_dir: str, *, worker_epoch: int = 0
    ) -> WorkloadCheckpointed:
        await anyio.lowlevel.checkpoint()
        self._check_up()
        if worker_epoch and worker_epoch != self.epoch:
            raise FailedPrecondition(
                f"worker {self.name} is in epoch {self.epoch}, not {worker_epoch}"
            )
        if actor_uid not in self.actors:
            raise FailedPrecondition(f"actor {actor_uid} is not running on worker {self.name}")
        self.checkpoints.append((actor_uid, checkpoint_dir))
        sandbox_id = sandbox_id_for(actor_uid)
        del self.actors[actor_uid]
        if self.checkpoint_fails:
            await self.runtime.terminate(sandbox_id)
            raise Internal(f"{CHECKPOINT_FAILED_MESSAGE}: {sandbox_id}: injected")
        try:
            info = await self.runtime.checkpoint(sandbox_id, checkpoint_dir)
        finally:
            await self.runtime.terminate(sandbox_id)
        return WorkloadCheckpointed(
            worker_epoch=self.epoch,
            files=info.files,
            runtime_version=info.runtime_version,
            size_bytes=info.size_bytes,
        )

    async def terminate(self, actor_uid: str, *, worker_epoch: int = 0) -> None:
        await anyio.lowlevel.checkpoint()
        self._check_up()
        if worker_epoch and worker_epoch != self.epoch:
            return  # that epoch's sandboxes are gone already
        self.actors.pop(actor_uid, None)
        await self.runtime.terminate(sandbox_id_for(actor_uid))

    async def stats(self, actor_uid: str) -> SandboxStats:
        await anyio.lowlevel.checkpoint()
        self._check_up()
        if actor_uid not in self.actors:
            raise NotFound(f"actor {actor_uid} is not on worker {self.name}")
        return await self.runtime.stats(sandbox_id_for(actor_uid))

    # --- internals ----------------------------------------------------------------------

    def _started(self) -> WorkloadStarted:
        return WorkloadStarted(worker_epoch=self.epoch, pod_ips=(POD_IP,))

    def _spec(self, request: WorkloadRequest) -> SandboxSpec:
        first = request.containers[0]
        args = tuple(first.command) or tuple(request.image_args)
        if not args:
            raise InvalidArgument(f"container {first.name!r} has no command and no image args")
        env = dict(request.image_env)
        env.update({e.name: e.value for e in first.env})
        return SandboxSpec(
            sandbox_id=sandbox_id_for(request.actor_uid),
            bundle_dir=request.bundle_dir,
            netns_path=netns_path_for(f"fake-{request.actor_uid}"),
            args=args,
            env=tuple(EnvVar(name=k, value=v) for k, v in env.items()),
            ports=first.ports,
            wakeup_probe=first.wakeup_probe,
            resources=request.resources,
        )

    def _check_prepared(self, kind: str, request: WorkloadRequest) -> None:
        bundle = Path(request.bundle_dir)
        if not (bundle / "rootfs").is_dir():
            raise InvalidArgument(f"bundle {bundle} has no rootfs")
        if request.sysinfo_dir:
            sysinfo = Path(request.sysinfo_dir)
            for name in ("name", "atespace", "uid"):
                if not (sysinfo / name).is_file():
                    raise InvalidArgument(f"system-info file {name} missing in {sysinfo}")
        if kind == "restore":
            if not request.restore_dir:
                raise InvalidArgument("a restore needs a restore directory")
            restore = Path(request.restore_dir)
            if not restore.is_dir() or not any(restore.iterdir()):
                raise InvalidArgument(f"restore directory {restore} is empty or missing")

    async def _start(self, kind: str, request: WorkloadRequest) -> WorkloadStarted:
        await anyio.lowlevel.checkpoint()
        self._check_up()
        if request.worker_epoch and request.worker_epoch != self.epoch:
            return self._started()
        uid = request.actor_uid
        if uid in self.actors:
            return self._started()  # already running: idempotent
        await anyio.to_thread.run_sync(self._check_prepared, kind, request)
        spec = self._spec(request)
        await anyio.to_thread.run_sync(_write_config, Path(request.bundle_dir), spec)
        self.requests.append((kind, request))
        if kind == "restore":
            await self.runtime.restore(spec, request.restore_dir)
            if not request.preserve_restore_dir:
                await anyio.to_thread.run_sync(
                    lambda: shutil.rmtree(request.restore_dir, ignore_errors=True)
                )
        else:
            await self.runtime.run(spec)
        self.actors[uid] = _Actor(uid=uid, epoch=self.epoch, request=request)
        try:
            await self._probe(uid, spec)
        except BaseException:
            self.actors.pop(uid, None)
            with anyio.CancelScope(shield=True):
                await self.runtime.terminate(spec.sandbox_id)
            raise
        return self._started()

    async def _probe(self, uid: str, spec: SandboxSpec) -> None:
        probe = spec.wakeup_probe
        if probe is None:
            return
        address = await self.runtime.address(spec.sandbox_id)
        port = address.host_port(probe.port)
        with anyio.move_on_after(self.probe_timeout):
            while True:
                if not self.probe_fails:
                    try:
                        reply = await http_get(address.host, port, probe.path)
                    except (OSError, SubstrateError):
                        reply = None
                    if reply is not None and reply.status == 200:
                        return
                await anyio.sleep(PROBE_INTERVAL)
        raise FailedPrecondition(
            f"wakeup probe of actor {uid} did not answer 200 within {self.probe_timeout} s"
        )


__all__ = ["POD_IP", "FakeWorker", "HttpReply", "http_get"]
