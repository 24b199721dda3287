"""Warm-path ResumeActor over gRPC + mTLS: p50/p99 latency and requests/s.

    python benchmarks/bench_grpc.py [--calls 2000] [--concurrency 1,16] [--runs 5]

An in-process ateapi (memory store, fake nodes) serves on 127.0.0.1 with mutual TLS; a
client with the router's identity calls ResumeActor for an actor that is already RUNNING
(one store read, no lease) — the call every router cache miss for a running actor makes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import anyio
import structlog

from substrate.adapters.memory import MemoryStore
from substrate.api.server import serving
from substrate.client import AteClient
from substrate.core.ids import ActorRef, NodeRef, TemplateRef, WorkerRef
from substrate.core.model import (
    ActorTemplate,
    Capacity,
    Container,
    Resources,
    SandboxClass,
    SnapshotConfig,
    Worker,
)
from substrate.identity import (
    CertificateAuthority,
    Identity,
    TlsFiles,
    server_context,
    write_bundle,
)
from substrate.services.actors import ActorService, ServiceConfig
from substrate.services.worker_cache import WorkerCache
from substrate.testing.fake_node import FakeNodes

TD = "bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(tls: Path, calls: int, concurrency: int) -> tuple[float, float, float]:
    fake = FakeNodes()
    async with (
        MemoryStore() as store,
        WorkerCache(store) as cache,
        ActorService(
            store=store,
            agents=fake,
            workers=cache,
            objects=fake.bucket,
            config=ServiceConfig(default_storage_location="memory://b"),
            rng=random.Random(1),
        ) as svc,
    ):
        await svc.create_atespace("bench")
        await svc.create_template(
            ActorTemplate(
                ref=TemplateRef(atespace="bench", name="t"),
                containers=(Container(name="app", image="local/app"),),
                resources=Resources(cpu_milli=10, memory_bytes=1 << 20),
                sandbox_class=SandboxClass.FAKE,
                snapshot_config=SnapshotConfig(storage_location="memory://b"),
            )
        )
        node = NodeRef(name="n0")
        fake.add_node(node, [WorkerRef(name="w0")])
        await svc.register_worker(
            Worker(
                ref=WorkerRef(name="w0"),
                node=node,
                sandbox_class=SandboxClass.FAKE,
                epoch=1,
                capacity=Capacity(cpu_milli=1000, memory_bytes=1 << 30, actors=8),
            )
        )
        await cache.wait_ready()
        ref = ActorRef(atespace="bench", name="warm")
        await svc.create_actor(ref, template=TemplateRef(atespace="bench", name="t"))
        await svc.resume(ref)
        async with (
            serving(
                svc, ssl=server_context(TlsFiles.in_dir(tls, "ateapi")), trust_domain=TD
            ) as srv,
            AteClient.connect(srv.address, tls_dir=tls, name="router") as client,
        ):
            for _ in range(50):  # warm up the connection
                await client.resume_actor(ref)
            latencies: list[float] = []
            per_task = calls // concurrency

            async def worker() -> None:
                for _ in range(per_task):
                    t = time.perf_counter()
                    r = await client.resume_actor(ref)
                    latencies.append(time.perf_counter() - t)
                    assert r.resumed is False

            started = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(concurrency):
                    tg.start_soon(worker)
            wall = time.perf_counter() - started
    return percentile(latencies, 0.5), percentile(latencies, 0.99), len(latencies) / wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    now = datetime.now(UTC)
    ca = CertificateAuthority.create(TD, now=now)
    with tempfile.TemporaryDirectory() as tmp:
        tls = Path(tmp)
        write_bundle(tls, "ateapi", ca.issue(Identity.ateapi(TD), now=now))
        write_bundle(tls, "router", ca.issue(Identity.router(TD), now=now))
        print(f"warm-path ResumeActor over gRPC+mTLS, {args.calls} calls, median of {args.runs}")
        print(f"{'concurrency':>11} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>9}")
        for conc in (int(c) for c in args.concurrency.split(",")):
            results = [anyio.run(run, tls, args.calls, conc) for _ in range(args.runs)]
            p50 = statistics.median(r[0] for r in results) * 1000
            p99 = statistics.median(r[1] for r in results) * 1000
            rps = statistics.median(r[2] for r in results)
            print(f"{conc:>11} {p50:>8.2f} {p99:>8.2f} {rps:>9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
