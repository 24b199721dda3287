"""The simulator over fixed seeds: invariants hold and runs are reproducible."""

from __future__ import annotations

import pytest

from substrate.net import ParkingConfig
from substrate.testing.sim import SimConfig, simulate


@pytest.mark.parametrize("seed", range(6))
def test_invariants_hold_for_fixed_seeds(seed: int) -> None:
    report = simulate(
        SimConfig(seed=seed, actors=400, workers=10, nodes=3, slots_per_worker=12, duration=30)
    )
    assert report.violations == ()
    assert report.requests > 1000
    assert report.outcomes.get("served", 0) > 0
    assert report.max_wait <= 5.0 + 1e-9
    assert report.max_parked_seen <= 1024


def test_same_seed_same_report() -> None:
    cfg = SimConfig(seed=42, actors=300, workers=8, nodes=2, duration=20)
    assert simulate(cfg) == simulate(cfg)


def test_a_small_lot_sheds_and_never_overflows() -> None:
    cfg = SimConfig(
        seed=3,
        actors=500,
        workers=5,
        nodes=1,
        slots_per_worker=8,
        duration=20,
        burst_rate=3000,
        parking=ParkingConfig(max_parked=50),
    )
    report = simulate(cfg)
    assert report.violations == ()
    assert report.shed > 0
    assert report.max_parked_seen <= 50


def test_disabled_parking_fails_fast_on_saturation() -> None:
    cfg = SimConfig(
        seed=4,
        actors=500,
        workers=4,
        nodes=1,
        slots_per_worker=8,
        duration=15,
        parking=ParkingConfig(max_parked=0),
    )
    report = simulate(cfg)
    assert report.violations == ()
    assert report.shed == 0
    assert report.outcomes.get("error", 0) > 0  # ResourceExhausted is not retried
    assert report.outcomes.get("budget_exhausted", 0) == 0
