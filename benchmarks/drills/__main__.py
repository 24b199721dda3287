"""``python -m benchmarks.drills``: run the failure drills (all six by default) and print
the summary, our figures beside the original's; ``--bench`` also runs the end-to-end
benchmarks (``benchmarks/bench_e2e.py``). ``make drills`` runs both.

Each drill starts its own stack (private PostgreSQL, moto S3 behind a proxy, ateapi,
atelets, workers, router; gVisor as root with runsc, else the fake runtime), injects its
fault, checks its expectations and stops everything it started. Timelines, reports and
the summary go to ``--out`` (default ``$TMPDIR/substrate-drills``). Exit status 1 if any
expectation was not met.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import anyio
import attrs

from benchmarks.drills.common import DrillConfig
from benchmarks.drills.runner import (
    DRILLS,
    cleanup_out,
    run_drills,
    summary_markdown,
    write_summary,
)

DEFAULT_OUT = Path(tempfile.gettempdir()) / "substrate-drills"


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, DrillConfig]:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.drills", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--only", default="", help="comma-separated drill numbers or names (default: all six)"
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results (default {DEFAULT_OUT})")
    p.add_argument("--short", action="store_true", help="the test suite's short outages")
    p.add_argument("--runtime", choices=("auto", "gvisor", "fake"), default="auto")
    p.add_argument("--pg-away", type=float, help="seconds PostgreSQL is away (default 60)")
    p.add_argument(
        "--pg-fault",
        choices=("stop", "refuse", "blackhole"),
        help="stop: pg_ctl stop/start (default); refuse/blackhole: a proxy in front of it",
    )
    p.add_argument("--api-away", type=float, help="seconds ateapi is away (default 60)")
    p.add_argument("--bucket-away", type=float, help="seconds per bucket outage (default 30)")
    p.add_argument("--node-down", type=float, help="seconds until node-2 returns (default 40)")
    p.add_argument("--heartbeat-timeout", type=float, help="ateapi's (default 10 s)")
    p.add_argument("--burst-requests", type=int)
    p.add_argument("--burst-actors", type=int)
    p.add_argument("--budget", type=float, help="the router's park budget (default 5 s)")
    p.add_argument("--keep", action="store_true", help="keep the stacks' directories")
    p.add_argument("--bench", action="store_true", help="then run benchmarks/bench_e2e.py")
    p.add_argument("--bench-args", default="", help="arguments for bench_e2e.py")
    a = p.parse_args(argv)
    out = a.out.absolute()
    cfg = DrillConfig.short(out) if a.short else DrillConfig(out=out)
    changes: dict[str, object] = {"runtime": a.runtime, "keep": a.keep}
    for flag, field in (
        ("pg_away", "pg_away"),
        ("pg_fault", "pg_fault"),
        ("api_away", "api_away"),
        ("bucket_away", "bucket_away"),
        ("node_down", "node_down"),
        ("heartbeat_timeout", "heartbeat_timeout"),
        ("burst_requests", "burst_requests"),
        ("burst_actors", "burst_actors"),
        ("budget", "budget"),
    ):
        value = getattr(a, flag)
        if value is not None:
            changes[field] = value
    return a, attrs.evolve(cfg, **changes)  # type: ignore[arg-type]


def selected(only: str) -> list[int]:
    if not only:
        return sorted(DRILLS)
    names = {key: n for n, (key, _) in DRILLS.items()}
    out = []
    for part in only.split(","):
        part = part.strip()
        if part.isdigit() and int(part) in DRILLS:
            out.append(int(part))
        elif part in names:
            out.append(names[part])
        else:
            raise SystemExit(f"unknown drill {part!r}: use 1-6 or {', '.join(names)}")
    return out


def main(argv: list[str] | None = None) -> int:
    a, cfg = parse(argv)
    numbers = selected(a.only)
    started = time.monotonic()

    def progress(text: str) -> None:
        print(f"{time.monotonic() - started:7.1f}s  {text}", flush=True)

    progress(f"drills {', '.join(map(str, numbers))} → {cfg.out}")
    results = anyio.run(run_drills, numbers, cfg, progress)
    for r in results:
        print()
        print(r.report())
    path = write_summary(cfg, results)
    cleanup_out(cfg)
    print()
    print(summary_markdown(results))
    print(f"summary: {path}")
    status = 0 if all(r.passed for r in results) else 1
    if a.bench:
        from benchmarks import bench_e2e

        bench_args = [*a.bench_args.split(), "--runtime", cfg.runtime]
        status = max(status, bench_e2e.main(bench_args))
    return status


if __name__ == "__main__":
    sys.exit(main())
