"""End-to-end benchmarks of the whole stack (issue 7), in one run, side by side.

One stack as the drills start it (:class:`benchmarks.drills.cluster.Cluster`: a private
PostgreSQL, moto S3 behind a TCP proxy, ateapi, two nodes with one worker each, the
router; gVisor as root with runsc, else the fake runtime), then:

1. **Warm request**: ``--warm`` requests to a RUNNING actor through the router (a new
   connection each, as a client without keep-alive sends them), interleaved with the same
   number sent straight to the workload (its host veth, ``SO_BINDTODEVICE``, closed with
   RST — :func:`benchmarks.bench_gvisor.http_get`; gVisor only). Median and p99.
2. **Suspend and fresh resume, by touched memory** (``--sizes``, the counter's
   ``FILL_MIB``): per size ``--runs`` rounds on one actor, alternating nodes. A round:
   wait until the fill is done; time ``SuspendActor(SYNC)``; time the first request (the
   router resumes it from the *local* copy); time ``SuspendActor(ASYNC)`` (the upload
   continues in the background; the round waits for it); first request again (local);
   SYNC suspend; move the actor's worker selector to the other node; time the first
   request (it resumes from the *object store*).
   Beside them, raw runsc on the same image and size (:class:`benchmarks.bench_gvisor.RawPath`:
   ``runsc restore`` to the first HTTP answer), and the download of the same snapshot
   files from the bucket through the same proxy (obstore ``get`` of each object, no
   decompression) — "raw durable" = raw restore + that download.
3. **Resume throughput**: ``--throughput`` never-run actors requested all at once; cold
   actors resumed per second (wall time until the last answered 200), median of 3.

Run (root and runsc for gVisor): ``.venv/bin/python benchmarks/bench_e2e.py [--runs 5]
[--sizes 0,50,200] [--warm 300] [--throughput 16] [--markdown FILE]``. Prints Markdown
tables; exit 1 if a check failed (a request not 200, a resume not from where it should).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Final

import anyio
import attrs

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.drills.cluster import Cluster, ClusterOptions
from benchmarks.drills.common import (
    ATESPACE,
    count_of,
    durable_state,
    setup_template,
    worker_of,
)
from substrate.adapters.objectstore import open_blobstore
from substrate.client import AteClient
from substrate.client.http import call_actor
from substrate.core.model import Actor, SuspendMode

DEFAULT_SIZES: Final = (0, 50, 200)


class BenchError(Exception):
    pass


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def p99(xs: Sequence[float]) -> float:
    if not xs:
        return float("nan")
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def s3(x: float) -> str:
    return f"{x:.3f}"


def cell(xs: Sequence[float]) -> str:
    if not xs:
        return "—"
    return f"{med(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


@attrs.define
class SizeResult:
    mib: int
    sync: list[float] = attrs.Factory(list)
    async_: list[float] = attrs.Factory(list)
    local: list[float] = attrs.Factory(list)
    durable: list[float] = attrs.Factory(list)
    local_server: list[float] = attrs.Factory(list)
    durable_server: list[float] = attrs.Factory(list)
    upload: list[float] = attrs.Factory(list)
    download: list[float] = attrs.Factory(list)
    raw_restore: list[float] = attrs.Factory(list)
    image_mb: list[float] = attrs.Factory(list)


async def fill_done(cluster: Cluster, actor: str, mib: int, limit: float = 180.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        a = await call_actor(cluster.router_url, actor, "/fill", timeout=30)
        if a.status == 200 and a.text.strip() == f"filled={mib}":
            return
        await anyio.sleep(0.1)
    raise BenchError(f"{actor}: the fill of {mib} MiB did not finish")


async def timed_request(cluster: Cluster, actor: str, want: str) -> tuple[float, float]:
    """The first request after a suspend: (client seconds, the router's resume seconds)."""
    started = time.perf_counter()
    a = await call_actor(cluster.router_url, actor, timeout=120)
    took = time.perf_counter() - started
    if a.status != 200 or count_of(a.text) is None:
        raise BenchError(f"{actor}: HTTP {a.status} {a.text[:200]}")
    if a.restored_from != want:
        raise BenchError(f"{actor}: restored from {a.restored_from}, expected {want}")
    server = float(a.header("x-ate-resume-duration-seconds") or "nan")
    return took, server


async def wait_uploaded(c: AteClient, actor: str, limit: float = 300.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if durable_state(await c.get_actor(actor)) == "COMPLETED":
            return time.monotonic() - started
        await anyio.sleep(0.05)
    raise BenchError(f"{actor}: the async upload did not finish in {limit:g} s")


async def download_same_files(cluster: Cluster, actor: Actor, work: Path) -> tuple[float, int]:
    """Seconds to get every object of the actor's newest durable snapshot, and bytes."""
    durable = actor.status.snapshots[-1].durable()
    if durable is None or not durable.uri:
        raise BenchError(f"{actor.ref}: no durable copy to download")
    bucket_url = f"s3://{cluster.bucket}"
    prefix = durable.uri.removeprefix(bucket_url + "/").rstrip("/") + "/"
    store = open_blobstore(bucket_url, options=cluster.s3_options())
    keys = await store.list(prefix)
    dest = work / "download"
    dest.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i, key in enumerate(keys):
            tg.start_soon(store.get_to_file, key, dest / f"{i}")
    took = time.perf_counter() - started
    size = sum(p.stat().st_size for p in dest.iterdir())
    for p in dest.iterdir():
        p.unlink()
    return took, size


async def bench_warm(cluster: Cluster, c: AteClient, n: int) -> dict[str, list[float]]:
    actor = f"{ATESPACE}/warm"
    await c.create_actor(actor, template=f"{ATESPACE}/m0")
    await call_actor(cluster.router_url, actor, timeout=60)
    a = await c.get_actor(actor)
    device = ""
    if cluster.runtime == "gvisor":
        from substrate.net.plan import plan_for

        device = plan_for(worker_of(a), a.metadata.uid).host_veth
    router: list[float] = []
    direct: list[float] = []
    for _ in range(min(20, n)):  # warm-up, not counted
        await call_actor(cluster.router_url, actor, timeout=10)
    for _ in range(n):
        started = time.perf_counter()
        r = await call_actor(cluster.router_url, actor, timeout=10)
        router.append(time.perf_counter() - started)
        if r.status != 200:
            raise BenchError(f"warm request answered {r.status}")
        if device:
            from benchmarks.bench_gvisor import http_get

            started = time.perf_counter()
            status, _ = await anyio.to_thread.run_sync(http_get, device, "/")
            direct.append(time.perf_counter() - started)
            if status != 200:
                raise BenchError(f"direct request answered {status}")
    await c.suspend_actor(actor, SuspendMode.ASYNC)
    return {"router": router, "direct": direct}


async def bench_size(cluster: Cluster, c: AteClient, mib: int, runs: int, work: Path) -> SizeResult:
    res = SizeResult(mib)
    actor = f"{ATESPACE}/s{mib}"
    nodes = cluster.node_names()
    await c.create_actor(actor, template=f"{ATESPACE}/m{mib}", worker_selector={"node": nodes[0]})
    await call_actor(cluster.router_url, actor, timeout=120)
    for i in range(runs):
        here, there = nodes[i % 2], nodes[(i + 1) % 2]
        await fill_done(cluster, actor, mib)
        started = time.perf_counter()
        await c.suspend_actor(actor, SuspendMode.SYNC)
        res.sync.append(time.perf_counter() - started)
        took, server = await timed_request(cluster, actor, "local")
        res.local.append(took)
        res.local_server.append(server)
        started = time.perf_counter()
        await c.suspend_actor(actor, SuspendMode.ASYNC)
        res.async_.append(time.perf_counter() - started)
        res.upload.append(await wait_uploaded(c, actor))
        took, server = await timed_request(cluster, actor, "local")
        res.local.append(took)
        res.local_server.append(server)
        started = time.perf_counter()
        suspended = await c.suspend_actor(actor, SuspendMode.SYNC)
        res.sync.append(time.perf_counter() - started)
        down, size = await download_same_files(cluster, suspended, work)
        res.download.append(down)
        res.image_mb.append(size / 1e6)
        await c.update_actor_selector(actor, {"node": there})
        took, server = await timed_request(cluster, actor, "durable")
        res.durable.append(took)
        res.durable_server.append(server)
        if worker_of(await c.get_actor(actor)) not in cluster.workers_of(there):
            raise BenchError(f"{actor} did not move to {there}")
        del here
    await c.suspend_actor(actor, SuspendMode.ASYNC)
    return res


async def bench_raw(
    cluster: Cluster, sizes: Sequence[int], runs: int, work: Path
) -> dict[int, list[float]]:
    """``runsc restore`` → first answer on the same image (gVisor only)."""
    if cluster.runtime != "gvisor":
        return {}
    from benchmarks.bench_gvisor import RawPath
    from substrate.adapters.gvisor.images import LocalImages
    from substrate.adapters.linux.netlink import LinuxHostNetwork

    raw = RawPath(
        work=work,
        image_dir=LocalImages(cluster.images).path_for("counter:1"),
        network=LinuxHostNetwork(),
    )
    await anyio.to_thread.run_sync(raw.prepare)
    out: dict[int, list[float]] = {}
    try:
        for mib in sizes:
            await raw.once(mib)  # warm-up
            out[mib] = [(await raw.once(mib)).restore_answer_s for _ in range(runs)]
    finally:
        with anyio.CancelScope(shield=True):
            await raw.cleanup()
    return out


async def bench_throughput(cluster: Cluster, c: AteClient, n: int, rounds: int = 3) -> list[float]:
    rates = []
    for r in range(rounds):
        names = [f"{ATESPACE}/t{r}-{i:02d}" for i in range(n)]
        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(partial(c.create_actor, name, template=f"{ATESPACE}/m0"))
        statuses: list[tuple[int, str]] = []
        started = time.perf_counter()

        async def one(name: str, into: list[tuple[int, str]]) -> None:
            a = await call_actor(cluster.router_url, name, timeout=120)
            into.append((a.status, f"{name}: {a.text[:160]}"))

        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(one, name, statuses)
        took = time.perf_counter() - started
        bad = [text for status, text in statuses if status != 200]
        if bad:
            raise BenchError(f"throughput round {r}: {len(bad)} of {n} failed: {bad}")
        rates.append(n / took)
        for name in names:
            with contextlib.suppress(Exception):
                await c.delete_actor(name, force=True)
    return rates


def machine(runtime: str) -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, runtime {runtime}, load average {load}"
    )


def render(
    runtime: str,
    warm: dict[str, list[float]],
    sizes: list[SizeResult],
    raw: dict[int, list[float]],
    rates: list[float],
    throughput_n: int,
) -> str:
    lines = [f"Machine: {machine(runtime)}.", ""]
    lines += [
        "Warm request to a RUNNING actor (a new connection per request):",
        "",
        "| path | n | median | p99 |",
        "|---|---:|---:|---:|",
        f"| through the router | {len(warm['router'])} | {ms(med(warm['router']))} "
        f"| {ms(p99(warm['router']))} |",
    ]
    if warm["direct"]:
        lines.append(
            f"| straight to the workload (host veth) | {len(warm['direct'])} "
            f"| {ms(med(warm['direct']))} | {ms(p99(warm['direct']))} |"
        )
    lines += [
        "",
        "Suspend, by touched memory (seconds, median (min-max)):",
        "",
        "| touched memory | snapshot size | suspend SYNC | suspend ASYNC | async upload after |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in sizes:
        lines.append(
            f"| {r.mib} MiB | {med(r.image_mb):.1f} MB | {cell(r.sync)} | {cell(r.async_)} "
            f"| {cell(r.upload)} |"
        )
    lines += [
        "",
        "Fresh resume → first answer, through the router (seconds, median (min-max)); raw = "
        "`runsc restore` → first answer on the same image; raw durable = raw + the download "
        "of the same snapshot files:",
        "",
        "| touched memory | local (stack) | raw restore | ratio | object store (stack) "
        "| download | raw + download | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sizes:
        raw_r = raw.get(r.mib, [])
        raw_med = med(raw_r)
        local_ratio = med(r.local) / raw_med if raw_r else float("nan")
        raw_durable = raw_med + med(r.download) if raw_r else float("nan")
        durable_ratio = med(r.durable) / raw_durable if raw_r else float("nan")
        lines.append(
            f"| {r.mib} MiB | {cell(r.local)} | {cell(raw_r)} | {local_ratio:.2f}x "
            f"| {cell(r.durable)} | {cell(r.download)} | {raw_durable:.3f} | {durable_ratio:.2f}x |"
        )
    lines += [
        "",
        "The router's own figure for the same resumes (X-Ate-Resume-Duration-Seconds, "
        "median): "
        + "; ".join(
            f"{r.mib} MiB local {med(r.local_server):.3f} s, object store "
            f"{med(r.durable_server):.3f} s"
            for r in sizes
        )
        + ".",
        "",
        f"Resume throughput: {throughput_n} never-run actors requested at once: "
        f"{med(rates):.1f} cold actors/s (median of {len(rates)}: "
        + ", ".join(f"{x:.1f}" for x in rates)
        + ").",
    ]
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace) -> str:
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    work = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    ok = False
    options = ClusterOptions(nodes=2, workers_per_node=1, max_actors=64, runtime=args.runtime)
    try:
        async with Cluster(
            work / "stack", options, lambda t: print(f"  · {t}", flush=True)
        ) as cluster:
            c = await cluster.client()
            for mib in sorted({0, *sizes}):
                await setup_template(c, cluster, name=f"m{mib}", fill_mib=mib, memory_mib=mib + 64)
            print("  · warm requests", flush=True)
            warm = await bench_warm(cluster, c, args.warm)
            results = []
            for mib in sizes:
                print(f"  · suspend/resume, {mib} MiB", flush=True)
                results.append(await bench_size(cluster, c, mib, args.runs, work))
            print("  · resume throughput", flush=True)
            rates = await bench_throughput(cluster, c, args.throughput)
            print("  · raw runsc restore", flush=True)
            raw = await bench_raw(cluster, sizes, args.runs, work / "raw")
            text = render(cluster.runtime, warm, results, raw, rates, args.throughput)
            ok = True
            return text
    finally:
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"  · the stack's logs are kept in {work / 'stack' / 'logs'}", flush=True)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=5, help="rounds per size (default 5)")
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="MiB, e.g. 0,50,200")
    p.add_argument("--warm", type=int, default=300, help="warm requests per path (default 300)")
    p.add_argument("--throughput", type=int, default=16, help="actors per round (default 16)")
    p.add_argument("--runtime", choices=("auto", "gvisor", "fake"), default="auto")
    p.add_argument("--markdown", type=Path, help="also write the tables to this file")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    print("end-to-end benchmarks (benchmarks/bench_e2e.py)", flush=True)
    try:
        text = anyio.run(run, args)
    except BenchError as exc:
        print(f"benchmark check failed: {exc}", file=sys.stderr)
        return 1
    print()
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
