"""Benchmark: raw runsc checkpoint/restore vs the same through ateworker and atelet (issue 4).

For each workload size (the counter image with ``FILL_MIB`` = 0, 50, 200: the workload
allocates and touches that much random memory after it starts listening), ``--runs``
repetitions of two paths, interleaved (raw first on even repetitions, the stack first on
odd ones), after one untimed warm-up of each:

* **raw**: a network namespace and veth (made with :class:`LinuxHostNetwork`, so only the
  runsc-level work differs), a bundle of the counter image with ``config.json`` from
  :func:`substrate.sandbox.oci.render_config`, ``runsc run -detach`` (argv from
  :mod:`substrate.sandbox.runsc_argv`, stdin ``/dev/null``, output on an ``O_APPEND``
  log); wait until ``GET /fill`` reports the fill done; **time** ``runsc checkpoint``;
  ``runsc delete -force`` (timed too: without a subreaper it waits for pid 1 to reap the
  sandbox); a fresh namespace; **time** ``runsc restore -detach`` alone and until the first
  HTTP 200 on ``GET /`` (polled every 5 ms).
* **stack**: an in-process :class:`WorkloadManager` (ateworker's core: RunscRuntime with
  its subreaper, LinuxHostNetwork, EgressProxy; no ingress) served on a Unix socket with
  :func:`serve_worker`; a :class:`NodeAgentService` (atelet's core) whose worker is a
  :class:`GrpcWorker` on that socket, served with :func:`serve_atelet` over mTLS and
  called through :class:`GrpcNodeAgent` with ateapi's identity. Cold start
  (``agent.start``), wait for the fill; **time** ``agent.checkpoint(mode=PAUSE)`` (a
  node-local snapshot); wait until the worker has removed the old sandbox (it does that in
  the background); **time** ``agent.start`` restoring from that LOCAL copy plus the first
  HTTP 200 on ``GET /``.

Both paths check the state after the restore: the same boot token, the counter exactly one
past its last value before the checkpoint, the fill still complete. A failed check (or any
error) exits 1; a missed goal does not. Probes bind to the actor's host veth
(``SO_BINDTODEVICE``) and close with RST (``SO_LINGER {1, 0}``). Everything this script
creates (namespaces ``bgv-raw`` and the worker ``bench-w``'s ``ate-<tag>-*``, veths
``bgvraw0`` and ``av<tag>*``, the nft table ``ate_egress_<tag>``, runsc state under a
temporary directory) is removed on exit, also after an error or Ctrl-C, and checked.

Run (root, runsc, nft): ``.venv/bin/python benchmarks/bench_gvisor.py [--sizes 0,50,200]
[--runs 5]``. Exit code 2: not root, or runsc/nft/unshare/compiler/busybox missing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import anyio
import anyio.to_thread
import attrs
import structlog

from substrate.adapters.gvisor import procfs
from substrate.adapters.gvisor.image_store import LocalImageStore
from substrate.adapters.gvisor.images import LocalImages, build_counter_image, unpack_rootfs
from substrate.adapters.gvisor.runtime import IMAGE_FILE, RunscRuntime, cleanup_root
from substrate.adapters.linux.netlink import LinuxHostNetwork
from substrate.adapters.objectstore.factory import BlobStores
from substrate.api.atelet import GrpcNodeAgent, serve_atelet
from substrate.api.worker import GrpcWorker, serve_worker
from substrate.core.agent_ports import (
    CheckpointMode,
    CheckpointRequest,
    StartRequest,
    WorkloadTarget,
)
from substrate.core.ids import ActorRef, NodeRef, TemplateRef, WorkerRef
from substrate.core.model import (
    ActorTemplate,
    Capacity,
    Container,
    Durability,
    EnvVar,
    Fidelity,
    Probe,
    Resources,
    SandboxClass,
    Snapshot,
    SnapshotStorage,
    StorageStatus,
)
from substrate.errors import NotFound, SubstrateError, Unavailable
from substrate.identity import (
    CertificateAuthority,
    Identity,
    TlsFiles,
    client_context,
    server_context,
    write_bundle,
)
from substrate.net.plan import (
    ACTOR_ADDRESS,
    ActorNetworkPlan,
    netns_prefix,
    plan_for,
    veth_prefix,
    worker_tag,
)
from substrate.sandbox.node_layout import NodeLayout
from substrate.sandbox.oci import render_config
from substrate.sandbox.runsc_argv import (
    RunscOptions,
    checkpoint_argv,
    delete_argv,
    restore_argv,
    run_argv,
)
from substrate.sandbox.spec import SandboxSpec, SandboxStats, sandbox_id_for
from substrate.sandbox.worker_ports import (
    WorkerApi,
    WorkerInfo,
    WorkloadCheckpointed,
    WorkloadRequest,
    WorkloadStarted,
)
from substrate.services.egress import EgressProxy
from substrate.services.node_agent import NodeAgentService
from substrate.services.workloads import WorkerConfig, WorkloadManager

MIB: Final = 1 << 20
GOAL: Final = 1.3
"""The issue's goal: the stack takes at most this many times the raw time."""
DEFAULT_SIZES: Final = (0, 50, 200)
DEFAULT_RUNS: Final = 5

WORKER: Final = "bench-w"
NODE: Final = NodeRef("bench-node")
TRUST_DOMAIN: Final = "ate"
IMAGE_REF: Final = "counter:1"
HTTP_PORT: Final = 80
RAW_NETNS: Final = "bgv-raw"
RAW_VETH: Final = "bgvraw0"
RAW_ID: Final = "bgv-raw"
LOCAL_NAME: Final = "p1"

POLL: Final = 0.005
"""Seconds between two probe attempts of this script."""
CONNECT_TIMEOUT: Final = 0.1
EXCHANGE_TIMEOUT: Final = 5.0
FILL_LIMIT: Final = 180.0
_LINGER_RST: Final = struct.pack("ii", 1, 0)


class BenchError(Exception):
    """A run went wrong (e.g. a failed state check): exit 1."""


# --- HTTP to the sandbox (blocking; called in worker threads) ----------------------------


def http_get(device: str, path: str) -> tuple[int, str]:
    """One keep-alive GET of ``path`` through ``device``; closed with RST. OSError if none."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
        sock.settimeout(CONNECT_TIMEOUT)
        sock.connect((ACTOR_ADDRESS, HTTP_PORT))
        sock.settimeout(EXCHANGE_TIMEOUT)
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {ACTOR_ADDRESS}\r\nUser-Agent: bench-gvisor\r\n\r\n"
        )
        sock.sendall(request.encode("ascii"))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                raise OSError("connection closed before the answer")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split()[1])
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
        except (IndexError, ValueError) as exc:
            raise OSError(f"not an HTTP answer: {data[:60]!r}") from exc
        while len(body) < length:
            chunk = sock.recv(4096)
            if not chunk:
                raise OSError("connection closed in the answer's body")
            body += chunk
        return status, body[:length].decode("latin-1")
    finally:
        sock.close()  # SO_LINGER {1, 0}: RST, no TIME_WAIT in the sandbox


def wait_answer(
    device: str, path: str, accept: Callable[[str], bool], *, limit: float
) -> tuple[float, str]:
    """Poll ``GET path`` until a 200 whose body ``accept`` takes; (seconds, body)."""
    start = time.perf_counter()
    last = "no answer"
    while True:
        try:
            status, body = http_get(device, path)
            if status == 200 and accept(body):
                return time.perf_counter() - start, body
            last = f"HTTP {status}: {body[:80]}"
        except OSError as exc:
            last = str(exc) or type(exc).__name__
        if time.perf_counter() - start > limit:
            raise BenchError(f"GET {path} via {device}: no acceptable answer in {limit} s ({last})")
        time.sleep(POLL)


def fill_done(mib: int) -> Callable[[str], bool]:
    return lambda body: body.strip() == f"filled={mib}"


def any_body(_body: str) -> bool:
    return True


def parse_count(body: str) -> tuple[int, str]:
    fields = dict(part.split("=", 1) for part in body.split() if "=" in part)
    try:
        return int(fields["count"]), fields["boot"]
    except (KeyError, ValueError) as exc:
        raise BenchError(f"GET / answered {body!r}, not 'count=N boot=TOKEN'") from exc


def check_state(path: str, before: str, after: str, fill_after: str, mib: int) -> None:
    """The restored sandbox continued: same boot token, counter +1, fill complete."""
    count1, boot1 = parse_count(before)
    count2, boot2 = parse_count(after)
    if boot2 != boot1 or count2 != count1 + 1 or fill_after.strip() != f"filled={mib}":
        raise BenchError(
            f"{path}: state check failed after restore: before {before!r}, after {after!r}, "
            f"fill {fill_after!r} (want boot {boot1}, count {count1 + 1}, filled={mib})"
        )


def get_ok(device: str, path: str) -> str:
    status, body = http_get(device, path)
    if status != 200:
        raise BenchError(f"GET {path} via {device} answered {status}: {body[:80]}")
    return body


# --- raw runsc ---------------------------------------------------------------------------


@attrs.frozen
class RawRep:
    fill_s: float
    checkpoint_s: float
    delete_s: float
    restore_cmd_s: float
    restore_answer_s: float
    image_bytes: int


def run_command(argv: Sequence[str], *, log: str | None = None) -> tuple[float, str]:
    """Run ``argv`` to completion; (seconds, output). BenchError unless it exits 0.

    With ``log`` (run/restore): stdin /dev/null, stdout/stderr appended to ``log`` (the
    sandbox inherits them, so a pipe would never close).
    """
    start = time.perf_counter()
    if log is not None:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        try:
            done = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, check=False, timeout=600
            )
        finally:
            os.close(fd)
        output = ""
    else:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, check=False, timeout=600
        )
        output = (done.stdout + done.stderr).decode(errors="replace")
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        if log is not None:
            with open(log, "rb") as f:
                output = f.read()[-2000:].decode(errors="replace")
        raise BenchError(f"{' '.join(argv[-4:])} exited {done.returncode}: {output[-2000:]}")
    return seconds, output


@attrs.define
class RawPath:
    """The raw runsc path: one sandbox id in its own ``--root``, one namespace."""

    work: Path
    image_dir: Path
    network: LinuxHostNetwork
    opts: RunscOptions = attrs.field(init=False)
    plan: ActorNetworkPlan = attrs.field(init=False)
    bundle: Path = attrs.field(init=False)
    log: str = attrs.field(init=False)
    sysinfo: Path = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.opts = RunscOptions(root=str(self.work / "raw" / "runsc"))
        self.plan = ActorNetworkPlan(netns=RAW_NETNS, host_veth=RAW_VETH)
        self.bundle = self.work / "raw" / "bundle"
        self.log = str(self.work / "raw" / "sandbox.log")
        self.sysinfo = self.work / "raw" / "sysinfo"

    def prepare(self) -> None:
        os.makedirs(self.opts.root, mode=0o711, exist_ok=True)
        unpack_rootfs(self.image_dir, self.bundle)
        self.sysinfo.mkdir(parents=True, exist_ok=True)
        for name, value in (("atespace", "bench"), ("name", "raw"), ("uid", RAW_ID)):
            (self.sysinfo / name).write_text(value)

    def write_config(self, mib: int) -> None:
        spec = SandboxSpec(
            sandbox_id=RAW_ID,
            bundle_dir=str(self.bundle),
            netns_path=self.plan.netns_path,
            args=("/bin/counter",),
            env=(EnvVar(name="FILL_MIB", value=str(mib)),),
            sysinfo_dir=str(self.sysinfo),
        )
        (self.bundle / "config.json").write_text(render_config(spec))

    async def once(self, mib: int) -> RawRep:
        images = self.work / "raw" / "images"
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(images, ignore_errors=True))
        images.mkdir(parents=True)
        device = self.plan.host_veth
        await self.network.create(self.plan)
        await anyio.to_thread.run_sync(self.write_config, mib)

        def boot() -> tuple[float, str]:
            start = time.perf_counter()
            run_command(run_argv(self.opts, RAW_ID, str(self.bundle)), log=self.log)
            wait_answer(device, "/fill", fill_done(mib), limit=FILL_LIMIT)
            return time.perf_counter() - start, get_ok(device, "/")

        fill_s, before = await anyio.to_thread.run_sync(boot)
        checkpoint_s, _ = await anyio.to_thread.run_sync(
            lambda: run_command(checkpoint_argv(self.opts, RAW_ID, str(images)))
        )
        image_bytes = (images / IMAGE_FILE).stat().st_size
        delete_s, _ = await anyio.to_thread.run_sync(
            lambda: run_command(delete_argv(self.opts, RAW_ID))
        )
        await self.network.destroy(self.plan)
        await self.network.create(self.plan)  # a fresh namespace, same name and addresses

        def restore() -> tuple[float, float, str, str]:
            start = time.perf_counter()
            run_command(
                restore_argv(self.opts, RAW_ID, str(self.bundle), str(images)), log=self.log
            )
            command = time.perf_counter() - start
            _, after = wait_answer(device, "/", any_body, limit=60)
            answered = time.perf_counter() - start
            return command, answered, after, get_ok(device, "/fill")

        restore_cmd_s, restore_answer_s, after, fill_after = await anyio.to_thread.run_sync(restore)
        check_state("raw", before, after, fill_after, mib)
        await anyio.to_thread.run_sync(lambda: run_command(delete_argv(self.opts, RAW_ID)))
        await self.network.destroy(self.plan)
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(images, ignore_errors=True))
        return RawRep(
            fill_s=fill_s,
            checkpoint_s=checkpoint_s,
            delete_s=delete_s,
            restore_cmd_s=restore_cmd_s,
            restore_answer_s=restore_answer_s,
            image_bytes=image_bytes,
        )

    async def cleanup(self) -> None:
        """Remove the raw sandbox (by id and by pid of processes on this root), its netns."""
        with contextlib.suppress(Exception):
            await anyio.run_process(
                delete_argv(self.opts, RAW_ID), stdin=subprocess.DEVNULL, check=False
            )
        with contextlib.suppress(Exception):
            await cleanup_root(self.opts.root)
        with contextlib.suppress(Exception):
            await self.network.destroy(self.plan)


# --- through ateworker and atelet ----------------------------------------------------------


class RecordingWorker:
    """The node agent's view of the worker (a GrpcWorker), keeping the worker's timings.

    ``*_call_s``: how long the call over the worker's socket took, seen from atelet.
    """

    def __init__(self, inner: WorkerApi) -> None:
        self.inner = inner
        self.started: WorkloadStarted | None = None
        self.checkpointed: WorkloadCheckpointed | None = None
        self.restore_call_s = 0.0
        self.checkpoint_call_s = 0.0

    async def info(self) -> WorkerInfo:
        return await self.inner.info()

    async def run(self, request: WorkloadRequest) -> WorkloadStarted:
        self.started = await self.inner.run(request)
        return self.started

    async def restore(self, request: WorkloadRequest) -> WorkloadStarted:
        start = time.perf_counter()
        self.started = await self.inner.restore(request)
        self.restore_call_s = time.perf_counter() - start
        return self.started

    async def checkpoint(
        self, actor_uid: str, checkpoint_dir: str, *, worker_epoch: int = 0
    ) -> WorkloadCheckpointed:
        start = time.perf_counter()
        self.checkpointed = await self.inner.checkpoint(
            actor_uid, checkpoint_dir, worker_epoch=worker_epoch
        )
        self.checkpoint_call_s = time.perf_counter() - start
        return self.checkpointed

    async def terminate(self, actor_uid: str, *, worker_epoch: int = 0) -> None:
        await self.inner.terminate(actor_uid, worker_epoch=worker_epoch)

    async def stats(self, actor_uid: str) -> SandboxStats:
        return await self.inner.stats(actor_uid)


@attrs.frozen
class StackRep:
    fill_s: float
    checkpoint_s: float
    checkpoint_call_s: float
    """atelet's call to the worker (socket, worker, teardown)."""
    worker_checkpoint_s: float
    """The worker's own figure: connection aborts + runtime.checkpoint."""
    reap_s: float
    start_s: float
    restore_answer_s: float
    restore_call_s: float
    worker_total_s: float
    worker_network_s: float
    worker_restore_s: float
    worker_probe_s: float
    image_bytes: int


def template(mib: int) -> ActorTemplate:
    return ActorTemplate(
        ref=TemplateRef(atespace="bench", name="counter"),
        containers=(
            Container(
                name="app",
                image=IMAGE_REF,
                env=(EnvVar(name="FILL_MIB", value=str(mib)),),
                wakeup_probe=Probe(path="/readyz"),
            ),
        ),
        resources=Resources(cpu_milli=1000, memory_bytes=512 * MIB),
        sandbox_class=SandboxClass.GVISOR,
    )


@attrs.define
class StackPath:
    agent: GrpcNodeAgent
    worker: RecordingWorker
    runtime: RunscRuntime
    manager: WorkloadManager
    epoch: int
    serial: int = 0

    async def once(self, mib: int) -> StackRep:
        self.serial += 1
        uid = f"bgv-{mib}-{self.serial}"
        target = WorkloadTarget(
            actor=ActorRef(atespace="bench", name=f"c{mib}-{self.serial}"),
            actor_uid=uid,
            worker=WorkerRef(WORKER),
            node=NODE,
            worker_epoch=self.epoch,
        )
        tmpl = template(mib)
        device = plan_for(WORKER, uid).host_veth
        try:
            start = time.perf_counter()
            await self.agent.start(StartRequest(target=target, template=tmpl))
            await anyio.to_thread.run_sync(
                lambda: wait_answer(device, "/fill", fill_done(mib), limit=FILL_LIMIT)
            )
            fill_s = time.perf_counter() - start
            before = await anyio.to_thread.run_sync(get_ok, device, "/")
            generation = Snapshot(
                generation=1,
                snapshot_id=f"snap-{uid}",
                sandbox_class=SandboxClass.GVISOR,
                captured_at=time.time(),
                storages=[
                    SnapshotStorage(
                        durability=Durability.LOCAL,
                        status=StorageStatus.IN_PROGRESS,
                        fidelity=Fidelity.MEMORY,
                        local_name=LOCAL_NAME,
                        node=NODE,
                    )
                ],
            )
            start = time.perf_counter()
            result = await self.agent.checkpoint(
                CheckpointRequest(
                    target=target, template=tmpl, mode=CheckpointMode.PAUSE, snapshot=generation
                )
            )
            checkpoint_s = time.perf_counter() - start
            checkpoint_call_s = self.worker.checkpoint_call_s
            done = self.worker.checkpointed
            assert done is not None
            reap_s = await self.wait_reaped(sandbox_id_for(uid))
            local = result.snapshot.local()
            if local is None or not local.completed:
                raise BenchError(
                    f"stack: the PAUSE checkpoint left no completed local copy: {local}"
                )

            start = time.perf_counter()
            await self.agent.start(
                StartRequest(target=target, template=tmpl, snapshot=result.snapshot, storage=local)
            )
            start_s = time.perf_counter() - start
            _, after = await anyio.to_thread.run_sync(
                lambda: wait_answer(device, "/", any_body, limit=60)
            )
            restore_answer_s = time.perf_counter() - start
            fill_after = await anyio.to_thread.run_sync(get_ok, device, "/fill")
            check_state("stack", before, after, fill_after, mib)
            started = self.worker.started
            timings = dict(started.timings) if started is not None else {}
            return StackRep(
                fill_s=fill_s,
                checkpoint_s=checkpoint_s,
                checkpoint_call_s=checkpoint_call_s,
                worker_checkpoint_s=float(done.timings.get("checkpoint", 0.0)),
                reap_s=reap_s,
                start_s=start_s,
                restore_answer_s=restore_answer_s,
                restore_call_s=self.worker.restore_call_s,
                worker_total_s=float(timings.get("total", 0.0)),
                worker_network_s=float(timings.get("network", 0.0)),
                worker_restore_s=float(timings.get("restore", 0.0)),
                worker_probe_s=float(timings.get("probe", 0.0)),
                image_bytes=done.size_bytes,
            )
        finally:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(SubstrateError, OSError):
                    await self.agent.terminate(target)
                with contextlib.suppress(SubstrateError, OSError):
                    await self.agent.drop_local(uid, LOCAL_NAME)

    async def wait_reaped(self, sandbox_id: str, limit: float = 30.0) -> float:
        """Seconds until the worker has removed the checkpointed sandbox (in the background).

        Read from the in-process runtime only; the measured calls never depend on it.
        """
        start = time.perf_counter()
        with anyio.fail_after(limit):
            await self.manager.settled()  # the sandbox, egress rules and namespace are gone
        while time.perf_counter() - start < limit:
            try:
                await self.runtime.state(sandbox_id)
            except NotFound:
                return time.perf_counter() - start
            await anyio.sleep(0.01)
        raise BenchError(f"stack: sandbox {sandbox_id} was not removed within {limit} s")


# --- reporting ---------------------------------------------------------------------------


def med(values: Sequence[float]) -> float:
    return statistics.median(values)


def cell(values: Sequence[float]) -> str:
    return f"{med(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def size_label(mib: int) -> str:
    return "~0 MiB" if mib == 0 else f"{mib} MiB"


def report(
    sizes: Sequence[int], raw: dict[int, list[RawRep]], stack: dict[int, list[StackRep]]
) -> None:
    print()
    print("Seconds, median (min-max); ratio = stack median / raw median; goal ≤ 1.3x.")
    print()
    print(
        "| touched memory | image | checkpoint raw | checkpoint stack | ratio "
        "| restore → first answer raw | restore → first answer stack | ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    verdicts: list[str] = []
    for mib in sizes:
        r, s = raw[mib], stack[mib]
        ck = med([x.checkpoint_s for x in s]) / med([x.checkpoint_s for x in r])
        rs = med([x.restore_answer_s for x in s]) / med([x.restore_answer_s for x in r])
        image = med([x.image_bytes for x in r]) / 1e6
        print(
            f"| {size_label(mib)} | {image:.1f} MB | {cell([x.checkpoint_s for x in r])} "
            f"| {cell([x.checkpoint_s for x in s])} | {ck:.2f}x "
            f"| {cell([x.restore_answer_s for x in r])} "
            f"| {cell([x.restore_answer_s for x in s])} | {rs:.2f}x |"
        )
        verdicts.append(
            f"{size_label(mib)}: checkpoint {ck:.2f}x "
            f"({'goal met' if ck <= GOAL else 'goal MISSED'}), restore → first answer "
            f"{rs:.2f}x ({'goal met' if rs <= GOAL else 'goal MISSED'})"
        )
    print()
    for line in verdicts:
        print(line)
    print()
    print("Raw details: restore command alone, delete -force right after the checkpoint,")
    print("run → fill done; image = checkpoint.img (raw) / image directory (stack):")
    print()
    print(
        "| touched memory | raw restore cmd | raw delete after ckpt | raw run → filled "
        "| stack image |"
    )
    print("|---|---:|---:|---:|---:|")
    for mib in sizes:
        r, s = raw[mib], stack[mib]
        print(
            f"| {size_label(mib)} | {cell([x.restore_cmd_s for x in r])} "
            f"| {cell([x.delete_s for x in r])} | {med([x.fill_s for x in r]):.3f} "
            f"| {med([x.image_bytes for x in s]) / 1e6:.1f} MB |"
        )
    print()
    print("Where the stack's checkpoint time goes (medians): atelet + its gRPC = total - the")
    print("worker call; socket + teardown = the worker call - the worker's own figure (which is")
    print("the connection aborts + runtime.checkpoint, i.e. runsc checkpoint + image record):")
    print()
    print(
        "| touched memory | stack total | atelet + mTLS gRPC | worker socket + teardown "
        "| worker checkpoint | raw checkpoint |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for mib in sizes:
        s, r = stack[mib], raw[mib]
        print(
            f"| {size_label(mib)} | {med([x.checkpoint_s for x in s]):.3f} "
            f"| {med([x.checkpoint_s - x.checkpoint_call_s for x in s]):.3f} "
            f"| {med([x.checkpoint_call_s - x.worker_checkpoint_s for x in s]):.3f} "
            f"| {med([x.worker_checkpoint_s for x in s]):.3f} "
            f"| {med([x.checkpoint_s for x in r]):.3f} |"
        )
    print()
    print("Where the stack's restore time goes (medians): atelet + its gRPC = agent.start - the")
    print("worker call; socket = the worker call - the worker's total; then the worker's")
    print("network (netns, veth, egress), runtime.restore (image check, config, runsc restore,")
    print("runsc state) and wakeup probe; first GET / = the script's answer after agent.start;")
    print("reap = the worker's background removal of the checkpointed sandbox (in no figure):")
    print()
    print(
        "| touched memory | stack total | atelet + mTLS gRPC | worker socket | network "
        "| runtime.restore | probe | first GET / | raw restore cmd | reap |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mib in sizes:
        s, r = stack[mib], raw[mib]
        print(
            f"| {size_label(mib)} | {med([x.restore_answer_s for x in s]):.3f} "
            f"| {med([x.start_s - x.restore_call_s for x in s]):.3f} "
            f"| {med([x.restore_call_s - x.worker_total_s for x in s]):.3f} "
            f"| {med([x.worker_network_s for x in s]):.3f} "
            f"| {med([x.worker_restore_s for x in s]):.3f} "
            f"| {med([x.worker_probe_s for x in s]):.3f} "
            f"| {med([x.restore_answer_s - x.start_s for x in s]):.3f} "
            f"| {med([x.restore_cmd_s for x in r]):.3f} "
            f"| {med([x.reap_s for x in s]):.3f} |"
        )


# --- leftovers ------------------------------------------------------------------------------


async def leftovers(roots: Sequence[str], table: str) -> list[str]:
    """What this script created and is still there (should be nothing)."""
    found: list[str] = []
    network = LinuxHostNetwork()
    for ns_prefix, link_prefix in (
        (RAW_NETNS, RAW_VETH),
        (netns_prefix(WORKER), veth_prefix(WORKER)),
    ):
        names, veths = await network.owned(ns_prefix, link_prefix)
        found += [f"netns {n}" for n in names] + [f"link {v}" for v in veths]
    for root in roots:
        found += [f"process {pid} on {root}" for pid, _ in procfs.processes_of_root(root)]
    listed = await anyio.run_process(["nft", "list", "tables"], check=False)
    if any(line.strip() == f"table ip {table}" for line in listed.stdout.decode().splitlines()):
        found.append(f"nft table ip {table}")
    return sorted(set(found))


# --- main ------------------------------------------------------------------------------------


def machine() -> str:
    version = subprocess.run(
        ["runsc", "--version"], capture_output=True, text=True, check=False
    ).stdout.split("\n", 1)[0]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, {version.strip()}, load average {load}"
    )


async def bench(sizes: Sequence[int], runs: int, warmup: int, work: Path) -> int:
    images_root = work / "images"
    image_dir = await anyio.to_thread.run_sync(
        lambda: build_counter_image(LocalImages(images_root).path_for(IMAGE_REF))
    )
    layout = NodeLayout(str(work / "node"))
    network = LinuxHostNetwork()
    raw = RawPath(work=work, image_dir=image_dir, network=network)
    await anyio.to_thread.run_sync(raw.prepare)
    table = f"ate_egress_{worker_tag(WORKER)}"
    worker_root = layout.worker_runsc_root(WORKER)

    now = datetime.now(UTC)
    ca = CertificateAuthority.create(TRUST_DOMAIN, now=now)
    atelet_tls = write_bundle(
        work / "tls" / "atelet",
        "atelet",
        ca.issue(Identity.atelet(NODE.name, TRUST_DOMAIN), now=now),
    )
    ateapi_tls = write_bundle(
        work / "tls" / "ateapi", "ateapi", ca.issue(Identity.ateapi(TRUST_DOMAIN), now=now)
    )

    failed = False
    try:
        try:
            await measure(
                sizes, runs, warmup, layout, network, raw, images_root, tls=(atelet_tls, ateapi_tls)
            )
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(60):
                await raw.cleanup()
    except BaseException:
        failed = True
        raise
    finally:
        # The stack's own exits removed its actors, table and sandboxes; sweep anyway.
        with anyio.CancelScope(shield=True), anyio.move_on_after(120):
            with contextlib.suppress(Exception):
                await network.remove_owned(netns_prefix(WORKER), veth_prefix(WORKER))
            with contextlib.suppress(Exception):
                await cleanup_root(worker_root)
            with contextlib.suppress(Exception):
                await network.remove_egress(table)
            left = await leftovers([raw.opts.root, worker_root], table)
            if left:
                print(f"LEFTOVERS after cleanup: {', '.join(left)}", file=sys.stderr)
                failed = True
            else:
                print("cleanup: no namespaces, veths, nft table or runsc processes left")
    return 1 if failed else 0


async def measure(
    sizes: Sequence[int],
    runs: int,
    warmup: int,
    layout: NodeLayout,
    network: LinuxHostNetwork,
    raw: RawPath,
    images_root: Path,
    *,
    tls: tuple[TlsFiles, TlsFiles],
) -> None:
    """Bring up ateworker and atelet in-process, run every repetition, print the tables."""
    atelet_tls, ateapi_tls = tls
    table = f"ate_egress_{worker_tag(WORKER)}"
    async with AsyncExitStack() as stack:
        proxy = EgressProxy(network, table=table, veth_prefix=veth_prefix(WORKER))
        egress = await stack.enter_async_context(proxy)
        runtime = await stack.enter_async_context(
            RunscRuntime(
                RunscOptions(root=layout.worker_runsc_root(WORKER)),
                log_dir=layout.worker_logs_dir(WORKER),
            )
        )
        epoch = 1
        manager = WorkloadManager(
            WorkerConfig(
                name=WORKER,
                node=NODE,
                capacity=Capacity(cpu_milli=2000, memory_bytes=4 << 30, actors=4),
                sandbox_class=SandboxClass.GVISOR,
                probe_timeout=60.0,
                actor_address=ACTOR_ADDRESS,
            ),
            layout=layout,
            runtime=runtime,
            network=network,
            egress=egress,
            epoch=epoch,
        )
        await stack.enter_async_context(manager.serving())
        await stack.enter_async_context(serve_worker(manager, layout.worker_socket(WORKER)))
        grpc_worker = GrpcWorker(layout.worker_socket(WORKER))
        stack.push_async_callback(grpc_worker.close)
        recorder = RecordingWorker(grpc_worker)
        service = NodeAgentService(
            NODE,
            layout,
            {WorkerRef(WORKER): recorder},
            BlobStores(),
            LocalImageStore(str(images_root)),
        )
        serving = await stack.enter_async_context(
            serve_atelet(
                service,
                "127.0.0.1",
                0,
                ssl=server_context(atelet_tls),
                trust_domain=TRUST_DOMAIN,
            )
        )
        agent = GrpcNodeAgent.connect(
            NODE,
            serving.address,
            ssl=client_context(ateapi_tls, check_hostname=False),
            trust_domain=TRUST_DOMAIN,
        )
        stack.push_async_callback(agent.close)
        path = StackPath(
            agent=agent, worker=recorder, runtime=runtime, manager=manager, epoch=epoch
        )

        for i in range(warmup):
            print(f"warm-up {i + 1}/{warmup} (~0 MiB, both paths, not counted)", flush=True)
            await raw.once(0)
            await path.once(0)
        raw_results: dict[int, list[RawRep]] = {mib: [] for mib in sizes}
        stack_results: dict[int, list[StackRep]] = {mib: [] for mib in sizes}
        for mib in sizes:
            for rep in range(runs):
                order = ("raw", "stack") if rep % 2 == 0 else ("stack", "raw")
                for which in order:
                    if which == "raw":
                        r = await raw.once(mib)
                        raw_results[mib].append(r)
                        line = (
                            f"ckpt {r.checkpoint_s:.3f} delete {r.delete_s:.3f} "
                            f"restore cmd {r.restore_cmd_s:.3f} → answer {r.restore_answer_s:.3f}"
                        )
                    else:
                        s = await path.once(mib)
                        stack_results[mib].append(s)
                        line = (
                            f"ckpt {s.checkpoint_s:.3f} (worker {s.worker_checkpoint_s:.3f}) "
                            f"reap {s.reap_s:.3f} start {s.start_s:.3f} → answer "
                            f"{s.restore_answer_s:.3f}"
                        )
                    print(
                        f"{size_label(mib):>7} run {rep + 1}/{runs} {which:>5}: {line}", flush=True
                    )
        report(sizes, raw_results, stack_results)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument(
        "--sizes",
        default=",".join(str(s) for s in DEFAULT_SIZES),
        help="comma-separated MiB the workload touches (default: 0,50,200)",
    )
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="repetitions per size")
    parser.add_argument("--warmup", type=int, default=1, help="untimed ~0 MiB rounds first")
    args = parser.parse_args(argv)
    try:
        args.size_list = [int(s) for s in str(args.sizes).split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r} must be comma-separated integers")
    if not args.size_list or any(s < 0 or s > 4096 for s in args.size_list):
        parser.error("--sizes must name sizes between 0 and 4096 MiB")
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be ≥ 1 and --warmup ≥ 0")
    return args


def guard() -> str:
    """Why this machine cannot run the benchmark ("" if it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veths, nftables, runsc)"
    for tool in ("runsc", "nft", "unshare"):
        if shutil.which(tool) is None:
            return f"needs {tool} on the PATH"
    return ""


def innermost(exc: BaseException) -> BaseException:
    """The one exception inside (nested) single-exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    why = guard()
    if why:
        print(f"bench_gvisor: refusing to run: {why}", file=sys.stderr)
        return 2
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    print(f"bench_gvisor: {machine()}")
    print(
        f"sizes {args.size_list} MiB, {args.runs} runs each (+{args.warmup} warm-up), "
        f"date {datetime.now(UTC):%Y-%m-%d}"
    )
    work = Path(tempfile.mkdtemp(prefix="bgv-", dir="/var/tmp"))
    total = time.perf_counter()
    try:
        return anyio.run(bench, args.size_list, args.runs, args.warmup, work)
    except KeyboardInterrupt:
        print("bench_gvisor: interrupted; cleaned up", file=sys.stderr)
        return 130
    except BaseException as exc:
        cause = innermost(exc)
        if isinstance(cause, Unavailable):
            print(f"bench_gvisor: cannot run: {cause.description}", file=sys.stderr)
            return 2
        if isinstance(cause, BenchError):
            print(f"bench_gvisor: FAILED: {cause}", file=sys.stderr)
            return 1
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
        print(f"total {time.perf_counter() - total:.1f} s; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
