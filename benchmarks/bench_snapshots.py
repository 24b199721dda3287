"""Benchmark: snapshot compression, and upload/download through the transfer service vs raw obstore.

Checkpoint-like files of ~0 MiB (640 KiB, like runsc's image of an idle sandbox), 50 MiB
and 200 MiB, each as incompressible random bytes (what runsc's own compression leaves)
and as number text (compressible memory, ``seq``-like lines whose digits are permuted per
4 MiB block so zstd cannot just repeat the previous block). Each figure is the median of
``RUNS`` repetitions (min-max in brackets where it matters):

* compression: ratio and wall time of ``zstandard`` at levels 1 and 3 with 2 threads
  (the service's setting), and the decompression time;
* transfer on ``file://`` (a local directory): ``upload_snapshot`` (level 3) and
  ``download_snapshot`` of a directory holding that one file, against obstore's own
  ``put_async`` of the same bytes from memory and ``get_async(...).bytes_async()`` into
  memory on the same store. The service reads and writes files, compresses, hashes
  (sha256), stages large files on disk and renames atomically, so the gap is its cost;
* the same on S3, against a local moto server (:mod:`substrate.testing.s3`), for ~0 and
  20 MiB files only: moto is a single Python process that ingests at a few tens of MiB/s,
  so its numbers show the protocol path (multipart upload, streamed download), not what
  real S3 does, and larger files would only measure moto. Skipped, with a note, if moto
  is not installed or ``--no-s3`` is given.

Throughput is uncompressed MiB per second of wall time. Exits non-zero only on errors
(e.g. a round trip that does not give back the same bytes).

Run: ``.venv/bin/python benchmarks/bench_snapshots.py [--no-s3] [--runs N]``
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import obstore
import structlog
import zstandard

from substrate.adapters.objectstore import ObstoreBlobStore, open_blobstore
from substrate.services.snapshots import DEFAULT_THREADS, download_snapshot, upload_snapshot
from substrate.testing.s3 import start_moto

MIB = 1 << 20
RUNS = 5
SIZES = [("~0 MiB", 640 * 1024), ("50 MiB", 50 * MIB), ("200 MiB", 200 * MIB)]
S3_SIZES = [("~0 MiB", 640 * 1024), ("20 MiB", 20 * MIB)]
KINDS = ("random", "text")
FILE_NAME = "pages.img"


# --- data -------------------------------------------------------------------------------


def make_random(size: int) -> bytes:
    return random.Random(size).randbytes(size)


def make_text(size: int) -> bytes:
    block_size = 4 * MIB
    lines: list[str] = []
    length = 0
    i = 1_000_000
    while length < block_size:
        line = f"{i}\n"
        lines.append(line)
        length += len(line)
        i += 7
    block = "".join(lines).encode()[:block_size]
    rng = random.Random(size)
    digits = b"0123456789"
    out = bytearray()
    while len(out) < size:
        shuffled = bytes(rng.sample(list(digits), 10))
        out += block.translate(bytes.maketrans(digits, shuffled))
    return bytes(out[:size])


# --- measuring --------------------------------------------------------------------------


def median_range(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def fmt_seconds(values: list[float]) -> str:
    med, lo, hi = median_range(values)
    if med < 0.1:
        return f"{med * 1000:.1f} ms"
    return f"{med:.2f} s ({lo:.2f}-{hi:.2f})"


def fmt_rate(size: int, values: list[float]) -> str:
    med = statistics.median(values)
    if size < MIB:
        return f"{med * 1000:.1f} ms"
    return f"{size / MIB / med:.0f} MiB/s"


def compression_row(label: str, kind: str, data: bytes, runs: int) -> list[str]:
    cells = [kind, label]
    compressed = b""
    for level in (1, 3):
        times: list[float] = []
        for _ in range(runs):
            cctx = zstandard.ZstdCompressor(level=level, threads=DEFAULT_THREADS)
            started = time.perf_counter()
            compressed = cctx.compress(data)
            times.append(time.perf_counter() - started)
        cells += [f"{len(data) / max(1, len(compressed)):.2f}x", fmt_seconds(times)]
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        back = zstandard.ZstdDecompressor().decompress(compressed)
        times.append(time.perf_counter() - started)
    if back != data:
        raise SystemExit("zstd round trip changed the data")
    cells.append(fmt_seconds(times))
    return cells


async def timed(make: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await make()
    return time.perf_counter() - started


async def transfer_row(
    store: ObstoreBlobStore, label: str, kind: str, data: bytes, work: Path, runs: int
) -> list[str]:
    local = work / "checkpoint"
    local.mkdir()
    (local / FILE_NAME).write_bytes(data)
    scratch = work / "scratch"
    scratch.mkdir()
    digest = hashlib.sha256(data).hexdigest()
    up: list[float] = []
    down: list[float] = []
    raw_up: list[float] = []
    raw_down: list[float] = []
    stored = 0
    for run in range(runs):
        prefix = f"bench/{kind}/{run}/"
        up.append(
            await timed(
                lambda prefix=prefix: upload_snapshot(
                    store, prefix, local, sandbox_class="gvisor", scratch_dir=scratch
                )
            )
        )
        stored = await store.head(prefix + FILE_NAME + ".zstd")
        restore = work / f"restore-{run}"
        down.append(
            await timed(
                lambda prefix=prefix, restore=restore: download_snapshot(store, prefix, restore)
            )
        )
        restored = restore / FILE_NAME
        if restored.stat().st_size != len(data):
            raise SystemExit("snapshot round trip changed the size")
        if run == 0 and hashlib.sha256(restored.read_bytes()).hexdigest() != digest:
            raise SystemExit("snapshot round trip changed the data")
        shutil.rmtree(restore)
        raw_key = f"raw/{kind}/{run}"
        raw_up.append(await timed(lambda k=raw_key: obstore.put_async(store.raw, k, data)))

        async def raw_get(key: str = raw_key) -> None:
            result = await obstore.get_async(store.raw, key)
            got = await result.bytes_async()
            if len(got) != len(data):
                raise SystemExit("raw get returned the wrong size")

        raw_down.append(await timed(raw_get))
        for key in await store.list(prefix):
            await store.delete(key)
        await obstore.delete_async(store.raw, raw_key)
    shutil.rmtree(local)
    shutil.rmtree(scratch)
    return [
        kind,
        label,
        f"{len(data) / max(1, stored):.2f}x",
        fmt_rate(len(data), up),
        fmt_rate(len(data), raw_up),
        fmt_rate(len(data), down),
        fmt_rate(len(data), raw_down),
    ]


# --- main -------------------------------------------------------------------------------


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


TRANSFER_HEADERS = [
    "data",
    "size",
    "stored ratio",
    "upload (service)",
    "put (raw obstore)",
    "download (service)",
    "get (raw obstore)",
]


async def run(args: argparse.Namespace) -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(40)  # keep the tables readable
    )
    total = time.perf_counter()
    print(
        f"bench_snapshots: median of {args.runs}; {os.cpu_count()} CPUs; zstd threads "
        f"{DEFAULT_THREADS}; zstandard {zstandard.__version__}; obstore {obstore.__version__}"
    )
    datasets = {
        (kind, label): (make_random if kind == "random" else make_text)(size)
        for kind in KINDS
        for label, size in SIZES + S3_SIZES
    }

    rows = [
        compression_row(label, kind, datasets[kind, label], args.runs)
        for kind in KINDS
        for label, _ in SIZES
    ]
    print("\n## zstd compression (in memory)\n")
    print(
        table(
            ["data", "size", "ratio -1", "time -1", "ratio -3", "time -3", "decompress"],
            rows,
        )
    )

    with tempfile.TemporaryDirectory(prefix="bench-snapshots-", dir=args.workdir) as tmp:
        work = Path(tmp)
        store = open_blobstore(f"file://{work}/objects")
        rows = []
        for kind in KINDS:
            for label, _ in SIZES:
                case_dir = work / f"case-{kind}-{label.strip('~ ')}"
                case_dir.mkdir()
                rows.append(
                    await transfer_row(
                        store, label, kind, datasets[kind, label], case_dir, args.runs
                    )
                )
                shutil.rmtree(case_dir)
        print("\n## file:// (local directory): service (zstd -3, sha256, atomic) vs raw obstore\n")
        print(table(TRANSFER_HEADERS, rows))
        print("\n(~0 MiB rows show the median time of one call instead of a throughput)")

        if args.no_s3:
            print("\n(S3 skipped: --no-s3)")
        else:
            try:
                server = start_moto()
            except RuntimeError as exc:
                print(f"\n(S3 skipped: {exc})")
            else:
                try:
                    bucket = server.create_bucket("bench")
                    s3 = open_blobstore(f"s3://{bucket}", options=server.options())
                    rows = []
                    for kind in KINDS:
                        for label, _ in S3_SIZES:
                            case_dir = work / f"s3-{kind}-{label.strip('~ ')}"
                            case_dir.mkdir()
                            rows.append(
                                await transfer_row(
                                    s3, label, kind, datasets[kind, label], case_dir, args.runs
                                )
                            )
                            shutil.rmtree(case_dir)
                    print("\n## S3 on a local moto server (Python; not representative of S3)\n")
                    print(table(TRANSFER_HEADERS, rows))
                finally:
                    server.stop()
    print(f"\ntotal {time.perf_counter() - total:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--workdir", default=None, help="where the file:// store lives")
    args = parser.parse_args()
    anyio.run(run, args, backend="asyncio")


if __name__ == "__main__":
    main()
