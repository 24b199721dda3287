"""Resume+suspend cycles per second through ActorService with fake nodes: memory vs PostgreSQL.

    python benchmarks/bench_workflows.py [--actors 32] [--seconds 5] [--runs 5] [--pg DSN]
                                         [--only memory|postgresql] [--full]

``--pg`` may name a Unix socket, e.g. ``postgresql://postgres@/postgres?host=/var/run/postgresql``.

Each cycle is a full resume (lease, load, schedule, bind transaction, node start, finalize)
followed by an ASYNC suspend (lease, mark, node checkpoint, finalize, release). Prints the
median cycles/s over the runs for each store, and the ratio.

With ``--full`` every worker slot is taken first and the actors' resumes are all refused
("no worker has room"): refused resumes/s, what parked routers' retries cost ateapi when
the fleet is saturated (drill 6).
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import secrets
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg
import structlog

from substrate.adapters.memory import MemoryStore
from substrate.adapters.postgres import PostgresStore
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
from substrate.core.ports import Store
from substrate.errors import ResourceExhausted
from substrate.services.actors import ActorService, ServiceConfig
from substrate.services.worker_cache import WorkerCache
from substrate.testing.fake_node import FakeNodes


@asynccontextmanager
async def pg_store(dsn: str) -> AsyncIterator[Store]:
    name = f"bench_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        if os.environ.get("BENCH_ASYNC_COMMIT"):
            await admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    finally:
        await admin.close()
    try:
        url = urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))
        async with await PostgresStore.connect(url, min_size=4, max_size=16) as s:
            yield s
    finally:
        admin = await asyncpg.connect(dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@asynccontextmanager
async def memory_store() -> AsyncIterator[Store]:
    async with MemoryStore() as s:
        yield s


async def run_once(kind: str, dsn: str, actors: int, seconds: float) -> float:
    """Resume+suspend cycles per second."""
    return await _run(kind, dsn, actors, seconds, full=False)


async def run_refusals(kind: str, dsn: str, actors: int, seconds: float) -> float:
    """Refused resumes per second: every slot of the fleet is taken, so each ResumeActor
    ends "no worker has room" (what parked routers' retries cost ateapi under saturation)."""
    return await _run(kind, dsn, actors, seconds, full=True)


async def _run(kind: str, dsn: str, actors: int, seconds: float, *, full: bool) -> float:
    opener = pg_store(dsn) if kind == "postgresql" else memory_store()
    ids = itertools.count()
    slots = 1 if full else 64
    async with opener as store:
        fake = FakeNodes()
        cache = WorkerCache(store, relist_every=3600)
        svc = ActorService(
            store=store,
            agents=fake,
            workers=cache,
            objects=fake.bucket,
            config=ServiceConfig(default_storage_location="memory://bench"),
            rng=random.Random(1),
            new_id=lambda: f"s{next(ids)}",
        )
        async with cache, svc:
            await svc.create_atespace("bench")
            t = await svc.create_template(
                ActorTemplate(
                    ref=TemplateRef(atespace="bench", name="t"),
                    containers=(Container(name="app", image="local/app"),),
                    resources=Resources(cpu_milli=10, memory_bytes=1 << 20),
                    sandbox_class=SandboxClass.FAKE,
                    snapshot_config=SnapshotConfig(storage_location="memory://bench"),
                )
            )
            workers: list[WorkerRef] = []
            for n in range(2):
                node = NodeRef(name=f"n{n}")
                refs = [WorkerRef(name=f"w{n}-{i}") for i in range(4)]
                workers += refs
                fake.add_node(node, refs)
                for ref in refs:
                    await svc.register_worker(
                        Worker(
                            ref=ref,
                            node=node,
                            sandbox_class=SandboxClass.FAKE,
                            epoch=1,
                            capacity=Capacity(cpu_milli=64000, memory_bytes=1 << 36, actors=slots),
                        )
                    )
            await cache.wait_ready()
            refs = []
            for i in range(actors):
                a = await svc.create_actor(ActorRef(atespace="bench", name=f"a{i}"), template=t.ref)
                refs.append(a.ref)
            done = 0
            if full:  # one actor per worker takes every slot; the others are refused
                for filler in range(len(workers)):
                    a = await svc.create_actor(
                        ActorRef(atespace="bench", name=f"f{filler}"), template=t.ref
                    )
                    await svc.resume(a.ref)
            deadline = time.perf_counter() + seconds

            async def cycle(ref: ActorRef) -> None:
                nonlocal done
                while time.perf_counter() < deadline:
                    if full:
                        try:
                            await svc.resume(ref)
                        except ResourceExhausted:
                            done += 1
                            continue
                        raise AssertionError(f"{ref} was placed on a full fleet")
                    await svc.resume(ref)
                    await svc.suspend(ref)
                    done += 1

            started = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for ref in refs:
                    tg.start_soon(cycle, ref)
            return done / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--actors", type=int, default=32, help="concurrent actors cycling")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument(
        "--pg", default=os.environ.get("PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    p.add_argument(
        "--only", choices=("memory", "postgresql"), default=None, help="run one store only"
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="measure refused resumes/s on a fleet with every slot taken instead of cycles/s",
    )
    args = p.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    what, unit, fn = (
        ("refused resumes/s (every slot taken)", "refusals/s", run_refusals)
        if args.full
        else ("resume+suspend cycles/s", "cycles/s", run_once)
    )
    print(f"{what}, {args.actors} concurrent actors, {args.runs} runs of {args.seconds:.0f} s")
    medians = {}
    kinds = (args.only,) if args.only else ("memory", "postgresql")
    for kind in kinds:
        rates = [anyio.run(fn, kind, args.pg, args.actors, args.seconds) for _ in range(args.runs)]
        medians[kind] = statistics.median(rates)
        runs = ", ".join(f"{r:.0f}" for r in rates)
        print(f"  {kind:<10} median {medians[kind]:8.1f} {unit}  (runs: {runs})")
    if len(medians) == 2:
        print(f"  postgresql / memory: {medians['postgresql'] / medians['memory']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
