"""The router's cost: added latency and throughput vs direct and vs nginx, cold bursts, parking.

    python benchmarks/bench_router.py [--seconds 3] [--runs 3] [--concurrency 1,50,200]

Processes (all on 127.0.0.1):

* a *workload*: a minimal keep-alive HTTP/1.1 server (asyncio protocol, fixed 2-byte body);
* a *worker*: a real atunnel (mTLS, ``Identity.worker("w-0")``; on asyncio's loop, as the
  ateworker daemon runs it, or on uvloop with ``--uvloop``) in front of the workload, and
  a scripted ateapi (grpclib + mTLS + the real authorizer). Its ResumeActor answers RUNNING
  for ``bench/hot``; "restores" ``bench/cold-*`` actors (activates them in atunnel after
  ``--restore-ms``); and for ``sat/*`` actors admits at most ``--slots`` at a time, each
  holding its slot for ``--hold-ms`` (ResourceExhausted otherwise: saturation);
* the *router*: ``python -m daemons.router`` (cache hits: no ateapi call);
* *nginx* (``/usr/sbin/nginx``, one worker process, upstream keep-alive) in front of the same
  workload, started in the foreground with a config in a temp dir and stopped by pid;
* the load generator (this process): N keep-alive connections, each sending the next request
  as soon as the previous answer is complete (closed loop), for ``--seconds``.

Paths measured: *direct* (client → workload), *nginx* (client → nginx → workload),
*atunnel* (client with the router's identity → atunnel → workload: the worker-side hop
alone) and *router* (client → router → atunnel → workload). Prints medians over ``--runs``
of p50/p99 latency and requests/s, then the added latency and ratios.

On the 2-vCPU development VM all these processes share two cores with the load generator,
so absolute figures are pessimistic; compare the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from substrate.cli.daemon_args import router_argv
from substrate.cli.stack import free_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HOST = "127.0.0.1"
TD = "bench"
HOT = "bench/hot"


# --- the workload -----------------------------------------------------------------------------


class _Workload(asyncio.Protocol):
    RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        out = []
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            self.buffer = self.buffer[end + 4 :]
            out.append(self.RESPONSE)
        if out:
            self.transport.write(b"".join(out))


async def serve_workload() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Workload, HOST, 0, backlog=1024)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    await asyncio.Event().wait()


# --- the worker: atunnel + a scripted ateapi --------------------------------------------------


async def serve_worker(
    tls: Path, workload_port: int, restore_ms: int, slots: int, hold_ms: int
) -> None:
    import anyio
    import structlog
    from grpclib.events import RecvRequest, listen
    from grpclib.server import Server

    from substrate.api import convert, pb
    from substrate.api.server import Authorizer, RequestCodec, started
    from substrate.api.status import grpc_errors
    from substrate.core.ids import ActorRef, NodeRef, TemplateRef, WorkerRef
    from substrate.core.model import (
        Actor,
        ActorState,
        ActorStatus,
        RestoreSource,
        ResumeResult,
        Worker,
        WorkerAssignment,
        WorkerState,
    )
    from substrate.errors import NotFound, ResourceExhausted
    from substrate.identity import TlsFiles, server_context
    from substrate.sandbox.spec import SandboxAddress
    from substrate.services.atunnel import Atunnel, atunnel_server_context

    # As the daemons configure it (cached loggers), at ERROR: the bench measures the path.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(40), cache_logger_on_first_use=True
    )
    address = SandboxAddress(host=HOST, ports=((80, workload_port),))
    used = 0
    stats = {"resume_calls": 0}

    def answer(ref: ActorRef, resumed: bool) -> pb.ResumeActorResponse:
        actor = Actor(
            ref=ref,
            template=TemplateRef(ref.atespace, "tpl"),
            status=ActorStatus(
                state=ActorState.RUNNING,
                assignment=WorkerAssignment(
                    worker=WorkerRef("w-0"), node=NodeRef("n-0"), worker_epoch=1
                ),
            ),
        )
        result = ResumeResult(
            actor=actor,
            resumed=resumed,
            source=RestoreSource.LOCAL if resumed else None,
            generation=1 if resumed else 0,
            snapshot_age_seconds=1.0 if resumed else 0.0,
            resume_duration_seconds=restore_ms / 1000 if resumed else 0.0,
        )
        return convert.resume_result_to_proto(result)

    async with Atunnel(
        atunnel_server_context(TlsFiles.in_dir(tls, "w-0")), host=HOST, port=0, trust_domain=TD
    ) as tunnel:
        uids = iter(range(10**9))

        def activate(ref: ActorRef) -> None:
            tunnel.activate(ref, f"u{next(uids)}", address)

        activate(ActorRef.parse(HOT))

        async def release_later(ref: ActorRef) -> None:
            nonlocal used
            await anyio.sleep(hold_ms / 1000)
            used -= 1

        class Control(pb.ControlBase):
            async def resume_actor(self, request: pb.ResumeActorRequest) -> pb.ResumeActorResponse:
                nonlocal used
                with grpc_errors():
                    ref = convert.actor_ref_from_proto(request.ref)
                    stats["resume_calls"] += 1
                    if tunnel.is_active(ref):
                        return answer(ref, resumed=False)
                    if ref.atespace == "sat":
                        if used >= slots:
                            raise ResourceExhausted("no worker has room for the actor")
                        used += 1
                        tg.start_soon(release_later, ref)
                    await anyio.sleep(restore_ms / 1000)
                    activate(ref)
                    return answer(ref, resumed=True)

            async def get_worker(self, request: pb.GetWorkerRequest) -> pb.Worker:
                with grpc_errors():
                    if request.name != "w-0":
                        raise NotFound(request.name)
                    return convert.worker_to_proto(worker)

            async def list_workers(self, request: pb.ListWorkersRequest) -> pb.ListWorkersResponse:
                return pb.ListWorkersResponse(workers=[convert.worker_to_proto(worker)])

        worker = Worker(
            ref=WorkerRef("w-0"),
            node=NodeRef("n-0"),
            state=WorkerState.ACTIVE,
            tunnel_address=f"{HOST}:{tunnel.port}",
        )
        server = Server([Control()], codec=RequestCodec())
        listen(server, RecvRequest, Authorizer(trust_domain=TD, insecure=False))
        async with (
            started(server, HOST, 0, ssl=server_context(TlsFiles.in_dir(tls, "ateapi"))) as grpc,
            anyio.create_task_group() as tg,
        ):
            print(json.dumps({"tunnel": tunnel.port, "ateapi": grpc.port}), flush=True)
            await anyio.sleep_forever()


# --- processes --------------------------------------------------------------------------------


def event_loop_options(uvloop: bool) -> dict[str, Any]:
    """anyio's asyncio options: uvloop when asked for and installed."""
    if not uvloop:
        return {}
    try:
        import uvloop as _  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}


def make_pki(base: Path) -> None:
    from substrate.identity import CertificateAuthority, Identity, write_bundle

    now = datetime.now(UTC)
    ca = CertificateAuthority.create(TD, now=now)
    for name, identity in {
        "ateapi": Identity.ateapi(TD),
        "router": Identity.router(TD),
        "w-0": Identity.worker("w-0", TD),
    }.items():
        write_bundle(base, name, ca.issue(identity, now=now))


@contextmanager
def child(
    argv: list[str], log: Path, *, ready: bool = True
) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    out = open(log, "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE if ready else out,
        stderr=out,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        info: dict[str, Any] = {}
        if ready:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{argv[:3]} died: see {log}")
            info = json.loads(line)
        yield proc, info
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} never answered")


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


@contextmanager
def router(tmp: Path, tls: Path, ateapi_port: int, *flags: str) -> Iterator[tuple[int, int]]:
    port, admin = free_port(), free_port()
    argv = [
        sys.executable,
        "-m",
        *router_argv(
            listen=f"{HOST}:{port}",
            admin_listen=f"{HOST}:{admin}",
            ateapi_address=f"{HOST}:{ateapi_port}",
            tls_dir=tls,
            trust_domain=TD,
        ),
        "--log-level=warning",
        "--health-interval=5s",
        *flags,
    ]
    with child(argv, tmp / f"router-{port}.log", ready=False):
        wait_http(f"http://{HOST}:{admin}/readyz")
        yield port, admin


@contextmanager
def nginx(tmp: Path, workload_port: int) -> Iterator[int]:
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    port = free_port()
    prefix = tmp / "nginx"
    (prefix / "logs").mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(
        f"""
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 10000000;
    upstream workload {{
        server {HOST}:{workload_port};
        keepalive 256;
        keepalive_requests 10000000;
    }}
    server {{
        listen {HOST}:{port};
        location / {{
            proxy_pass http://workload;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""
    )
    argv = [binary, "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"]
    with child(argv, tmp / "nginx.log", ready=False):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{HOST}:{port}/", timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        yield port


# --- the load generator -----------------------------------------------------------------------


class _Client(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = b""
        self.waiter: asyncio.Future[int] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].lower()
        at = head.find(b"content-length:")
        length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return
        status = int(self.buffer[9:12])
        self.buffer = self.buffer[end + 4 + length :]
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("closed"))

    async def request(self, data: bytes) -> int:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.waiter


def request_bytes(headers: dict[str, str]) -> bytes:
    lines = ["GET / HTTP/1.1", "Host: bench.example", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def load(
    port: int,
    data: bytes,
    connections: int,
    seconds: float,
    ssl: Any = None,
) -> tuple[list[float], int, float]:
    """Closed-loop load: latencies (s), non-200 answers, elapsed seconds."""
    loop = asyncio.get_running_loop()
    clients = []
    for _ in range(connections):
        _, proto = await loop.create_connection(_Client, HOST, port, ssl=ssl)
        clients.append(proto)
    for c in clients:  # warm every connection (and every pooled hop behind it)
        await c.request(data)
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds

    async def run(c: _Client) -> None:
        nonlocal errors
        clock = time.perf_counter
        while clock() < stop:
            t0 = clock()
            status = await c.request(data)
            latencies.append(clock() - t0)
            if status != 200:
                errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(run(c) for c in clients))
    elapsed = time.perf_counter() - started
    for c in clients:
        assert c.transport is not None
        c.transport.close()
    return latencies, errors, elapsed


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- scenarios --------------------------------------------------------------------------------


def bench_paths(
    ports: dict[str, int], ssl: Any, concurrency: list[int], seconds: float, runs: int
) -> dict[tuple[str, int], tuple[float, float, float]]:
    hot = {"ate-target-actor": HOT}
    requests = {
        "direct": request_bytes({}),
        "nginx": request_bytes({}),
        "atunnel": request_bytes({**hot, "ate-target-port": "80"}),
        "router": request_bytes(hot),
    }
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for c in concurrency:
        for _ in range(runs):
            for path in ("direct", "nginx", "atunnel", "router"):
                print(f"  measuring {path} at {c} connections", file=sys.stderr, flush=True)
                lat, errors, elapsed = asyncio.run(
                    load(
                        ports[path],
                        requests[path],
                        c,
                        seconds,
                        ssl=ssl if path == "atunnel" else None,
                    )
                )
                assert errors == 0, f"{path}: {errors} non-200 answers"
                sample = (pct(lat, 0.5) * 1000, pct(lat, 0.99) * 1000, len(lat) / elapsed)
                results.setdefault((path, c), []).append(sample)
    return {
        key: tuple(statistics.median(s[i] for s in samples) for i in range(3))  # type: ignore[misc]
        for key, samples in results.items()
    }


async def burst(port: int, actor: str, size: int) -> list[tuple[int, float]]:
    data = request_bytes({"ate-target-actor": actor})
    loop = asyncio.get_running_loop()
    clients = []
    for _ in range(size):
        _, proto = await loop.create_connection(_Client, HOST, port)
        clients.append(proto)

    async def one(c: _Client) -> tuple[int, float]:
        t0 = time.perf_counter()
        status = await c.request(data)
        return status, time.perf_counter() - t0

    answers = await asyncio.gather(*(one(c) for c in clients))
    for c in clients:
        assert c.transport is not None
        c.transport.close()
    return answers


def resume_calls(admin: int) -> float:
    text = fetch(f"http://{HOST}:{admin}/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith("atenet_router_resume_calls_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", default="1,50,200")
    parser.add_argument("--restore-ms", type=int, default=100)
    parser.add_argument("--slots", type=int, default=20)
    parser.add_argument("--hold-ms", type=int, default=1000)
    parser.add_argument("--role", choices=("workload", "worker"), default=None)
    parser.add_argument("--tls", type=Path)
    parser.add_argument("--workload-port", type=int, default=0)
    parser.add_argument(
        "--uvloop",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="run the worker's atunnel on uvloop (if installed); the daemons do not: with "
        "anyio's streams, libuv reads up to 32 x 256 KiB per wakeup, so a streamed body "
        "is no longer held to one 64 KiB read per direction",
    )
    args = parser.parse_args()
    if args.role == "workload":
        asyncio.run(serve_workload())
        return
    if args.role == "worker":
        import anyio

        anyio.run(
            serve_worker,
            args.tls,
            args.workload_port,
            args.restore_ms,
            args.slots,
            args.hold_ms,
            backend_options=event_loop_options(args.uvloop),
        )
        return

    from substrate.identity import TlsFiles
    from substrate.services.router_upstream import tunnel_client_context

    concurrency = [int(c) for c in args.concurrency.split(",")]
    me = [sys.executable, str(Path(__file__).resolve())]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        tls = tmp / "tls"
        make_pki(tls)
        with (
            child([*me, "--role=workload"], tmp / "workload.log") as (_, workload),
            child(
                [
                    *me,
                    "--role=worker",
                    f"--tls={tls}",
                    f"--workload-port={workload['port']}",
                    f"--restore-ms={args.restore_ms}",
                    f"--slots={args.slots}",
                    f"--hold-ms={args.hold_ms}",
                ],
                tmp / "worker.log",
            ) as (_, worker),
            nginx(tmp, workload["port"]) as nginx_port,
            router(tmp, tls, worker["ateapi"]) as (router_port, router_admin),
        ):
            ssl = tunnel_client_context(TlsFiles.in_dir(tls, "router"))
            ports = {
                "direct": workload["port"],
                "nginx": nginx_port,
                "atunnel": worker["tunnel"],
                "router": router_port,
            }
            print(
                f"cache-hit requests, closed loop, {args.seconds:g} s per point, "
                f"median of {args.runs} runs"
            )
            table = bench_paths(ports, ssl, concurrency, args.seconds, args.runs)
            print(f"{'conns':>5} {'path':>8} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}")
            for c in concurrency:
                for path in ("direct", "nginx", "atunnel", "router"):
                    p50, p99, rps = table[(path, c)]
                    print(f"{c:>5} {path:>8} {p50:>8.3f} {p99:>8.3f} {rps:>8.0f}")
            print()
            print("added latency over direct (p50 / p99 ms) and throughput ratios")
            for c in concurrency:
                d50, d99, _ = table[("direct", c)]
                n50, n99, nrps = table[("nginx", c)]
                t50, t99, trps = table[("atunnel", c)]
                r50, r99, rrps = table[("router", c)]
                print(
                    f"{c:>5} conns: nginx +{n50 - d50:.3f}/+{n99 - d99:.3f}  "
                    f"router(+atunnel) +{r50 - d50:.3f}/+{r99 - d99:.3f}  "
                    f"router alone (vs atunnel) +{r50 - t50:.3f}/+{r99 - t99:.3f}  "
                    f"router/nginx req/s {rrps / nrps:.2f}  router/atunnel req/s {rrps / trps:.2f}"
                )

            print()
            print(f"burst to a cold actor: 50 concurrent requests, restore {args.restore_ms} ms")
            before = resume_calls(router_admin)
            lat: list[float] = []
            trials = 5
            for trial in range(trials):
                answers = asyncio.run(burst(router_port, f"bench/cold-{trial}", 50))
                assert all(status == 200 for status, _ in answers), answers
                lat += [seconds for _, seconds in answers]
            calls = (resume_calls(router_admin) - before) / trials
            print(
                f"  p50 {pct(lat, 0.5) * 1000:.1f} ms  p99 {pct(lat, 0.99) * 1000:.1f} ms  "
                f"max {max(lat) * 1000:.1f} ms  ResumeActor calls per burst: {calls:g}"
            )

        # saturation needs fresh processes (ateapi's slots) and two router configurations
        print()
        print(
            f"parking under saturation: 200 requests at once to 200 cold actors; ateapi admits "
            f"{args.slots} resumes at a time, each holding its slot {args.hold_ms} ms"
        )
        for flags in ((), ("--parked-request-max=50",)):
            with (
                child([*me, "--role=workload"], tmp / "workload2.log") as (_, workload),
                child(
                    [
                        *me,
                        "--role=worker",
                        f"--tls={tls}",
                        f"--workload-port={workload['port']}",
                        f"--restore-ms={args.restore_ms}",
                        f"--slots={args.slots}",
                        f"--hold-ms={args.hold_ms}",
                    ],
                    tmp / "worker2.log",
                ) as (_, worker),
                router(tmp, tls, worker["ateapi"], *flags) as (router_port, router_admin),
            ):
                outcomes = asyncio.run(saturate(router_port, 200))
                served = [s for status, s, _ in outcomes if status == 200]
                shed = sum(1 for _, _, body in outcomes if b"router at capacity" in body)
                budget = sum(
                    1 for status, _, body in outcomes if status == 503 and b"no worker" in body
                )
                label = flags[0] if flags else "--parked-request-max=1024 (default)"
                print(
                    f"  {label}: served {len(served)}, budget_exhausted {budget}, shed {shed}; "
                    f"served wait p50 {pct(served, 0.5) * 1000:.0f} ms, "
                    f"max {max(served) * 1000:.0f} ms"
                )


async def saturate(port: int, size: int) -> list[tuple[int, float, bytes]]:
    """``size`` requests at once, each to its own cold actor; (status, seconds, body)."""

    async def one(i: int) -> tuple[int, float, bytes]:
        reader, writer = await asyncio.open_connection(HOST, port)
        t0 = time.perf_counter()
        writer.write(request_bytes({"ate-target-actor": f"sat/a-{i}"}))
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.lower().split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        seconds = time.perf_counter() - t0
        writer.close()
        return status, seconds, body

    return await asyncio.gather(*(one(i) for i in range(size)))


if __name__ == "__main__":
    main()
