"""Simulate a bursty, oversubscribed fleet with the real scheduler and parking lot.

    python examples/simulation.py [--seed N] [--actors 2000] [--workers 50] [--duration 120]

Runs in a few seconds of wall time: time is virtual, every placement is a real
`substrate.sched.FleetIndex` decision and every parked request goes through the real
`substrate.net.ParkingLot`.
"""

from __future__ import annotations

import argparse
import sys
import time

from substrate.net import ParkingConfig
from substrate.testing.sim import SimConfig, simulate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--actors", type=int, default=2000)
    p.add_argument("--workers", type=int, default=50)
    p.add_argument("--slots", type=int, default=16, help="actor slots per worker")
    p.add_argument("--duration", type=float, default=120.0, help="virtual seconds of traffic")
    p.add_argument("--burst-rate", type=float, default=1500.0, help="requests/s during bursts")
    p.add_argument("--lot", type=int, default=1024, help="parked-request-max (0 disables)")
    p.add_argument("--budget", type=float, default=5.0, help="parked-request-budget, seconds")
    args = p.parse_args(argv)
    cfg = SimConfig(
        seed=args.seed,
        actors=args.actors,
        workers=args.workers,
        slots_per_worker=args.slots,
        duration=args.duration,
        burst_rate=args.burst_rate,
        parking=ParkingConfig(max_parked=args.lot, budget=args.budget),
    )
    print(
        f"simulating {cfg.actors} actors on {cfg.workers} workers x {cfg.slots_per_worker} slots "
        f"for {cfg.duration:.0f} virtual seconds (bursts of {cfg.burst_rate:.0f} req/s "
        f"every {cfg.burst_every:.0f} s)"
    )
    started = time.perf_counter()
    report = simulate(cfg)
    wall = time.perf_counter() - started
    for line in report.lines():
        print(line)
    print(f"  {report.steps} events in {wall:.2f} s of wall time")
    if report.violations:
        for v in report.violations[:20]:
            print("  VIOLATION:", v)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
