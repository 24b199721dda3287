"""How fast the router ingests a burst: N connections at once, almost all shed at the lot.

    python benchmarks/bench_router_burst.py [--requests 2800] [--runs 3]

The router daemon runs with ``--parked-request-max=1`` in front of bench_router's scripted
worker (its ResumeActor holds 20 slots for 3 s each), so one request parks and every other
is answered ``503 router at capacity`` as soon as the router has read it. The burst comes
from ``benchmarks/drills/burstload.c`` (one connection per request, clock from connect()).
What it measures is the router's cost per connection — accept, read and parse the head,
admit or shed, answer, close — which bounds how long the last request of a burst waits
before the router reads it (drill 6, docs/operations.md shortfall D).

Prints, per run and as medians: the wall time until every request was answered, the
median and p99 answer time at the client, and the router's CPU seconds per request
(user + system, from /proc).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import bench_router as B  # noqa: E402
from benchmarks.drills import burstload  # noqa: E402

HOLD_MS = 3000


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2800)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-burst-"))
    tls = tmp / "tls"
    B.make_pki(tls)
    binary = burstload.build(tmp)
    me = [sys.executable, str(Path(B.__file__))]
    print(f"{args.requests} connections at once, lot of 1 (all but one shed), {args.runs} runs")
    walls: list[float] = []
    p50s: list[float] = []
    p99s: list[float] = []
    cpus: list[float] = []
    with (
        B.child([*me, "--role=workload"], tmp / "workload.log") as (_, workload),
        B.child(
            [
                *me,
                "--role=worker",
                f"--tls={tls}",
                f"--workload-port={workload['port']}",
                "--slots=20",
                f"--hold-ms={HOLD_MS}",
            ],
            tmp / "worker.log",
        ) as (_, worker),
        B.router(tmp, tls, worker["ateapi"], "--parked-request-max=1") as (port, _admin),
    ):
        pid = next(
            int(p)
            for p in os.listdir("/proc")
            if p.isdigit()
            and f"--listen={B.HOST}:{port}".encode() in Path(f"/proc/{p}/cmdline").read_bytes()
        )
        for run in range(args.runs):
            actors = [f"sat/r{run}-{i % 100}" for i in range(args.requests)]
            cpu0 = cpu_seconds(pid)
            t0 = time.perf_counter()
            answers = anyio.run(
                functools.partial(
                    burstload.burst,
                    binary,
                    f"http://{B.HOST}:{port}",
                    actors,
                    limit=60,
                    on_answer=lambda _: None,
                )
            )
            wall = time.perf_counter() - t0
            cpu = (cpu_seconds(pid) - cpu0) / args.requests
            seconds = [a.seconds for a in answers]
            shed = sum(1 for a in answers if "router at capacity" in a.body)
            walls.append(wall)
            p50s.append(B.pct(seconds, 0.5))
            p99s.append(B.pct(seconds, 0.99))
            cpus.append(cpu)
            print(
                f"  run {run}: all answered in {wall:.2f} s; answer p50 {p50s[-1]:.2f} s, "
                f"p99 {p99s[-1]:.2f} s; {shed} shed; router CPU {cpu * 1e6:.0f} µs/request"
            )
            time.sleep(HOLD_MS / 1000 + 1)  # the parked one ends; the scripted slots free
    print(
        f"median: all answered in {statistics.median(walls):.2f} s "
        f"({args.requests / statistics.median(walls):.0f} connections/s); answer p50 "
        f"{statistics.median(p50s):.2f} s, p99 {statistics.median(p99s):.2f} s; router CPU "
        f"{statistics.median(cpus) * 1e6:.0f} µs/request"
    )


if __name__ == "__main__":
    main()
