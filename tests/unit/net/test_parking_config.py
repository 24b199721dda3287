"""Parking configuration, the retry classifier and the backoff schedule."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from substrate.errors import GrpcCode, InvalidArgument
from substrate.net.backoff import Backoff
from substrate.net.parking import (
    DRAIN_HEADROOM,
    Outcome,
    ParkingConfig,
    Verdict,
    classify,
)


class FixedRandom(random.Random):
    """A ``random.Random`` whose ``random()`` always returns one value (a fake, not a mock)."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


# --- the seed's defaults and labels ----------------------------------------------------


def test_defaults_are_the_seed_flags() -> None:
    config = ParkingConfig()
    assert config.budget == 5.0
    assert config.max_parked == 1024
    assert config.retry_interval == 0.1
    assert config.retry_factor == 1.1
    assert config.retry_jitter == 0.1
    assert config.disabled_abort_budget == 15.0
    assert config.enabled
    assert config.effective_budget == 5.0


def test_max_parked_zero_disables_parking_and_uses_the_fifteen_second_budget() -> None:
    config = ParkingConfig(max_parked=0)
    assert not config.enabled
    assert config.effective_budget == 15.0


def test_outcome_labels_are_the_metric_labels() -> None:
    assert [o.value for o in Outcome] == [
        "served",
        "budget_exhausted",
        "canceled",
        "timeout",
        "error",
    ]


# --- validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("budget", 0, "parking budget must be greater than 0, got 0"),
        ("budget", -1.0, "parking budget must be greater than 0"),
        ("budget", math.nan, "parking budget must be finite"),
        ("budget", math.inf, "parking budget must be finite"),
        ("budget", "5s", "parking budget must be a number"),
        ("budget", True, "parking budget must be a number"),
        ("max_parked", -1, "max_parked must be an integer >= 0 (0 disables parking), got -1"),
        ("max_parked", 1.5, "max_parked must be an integer >= 0"),
        ("max_parked", True, "max_parked must be an integer >= 0"),
        ("retry_interval", 0.0, "parking retry_interval must be greater than 0"),
        ("retry_factor", 0.99, "parking retry_factor must be >= 1, got 0.99"),
        ("retry_factor", math.nan, "parking retry_factor must be finite"),
        ("retry_jitter", -0.1, "parking retry_jitter must be in [0, 1), got -0.1"),
        ("retry_jitter", 1.0, "parking retry_jitter must be in [0, 1), got 1.0"),
        ("disabled_abort_budget", 0, "parking disabled_abort_budget must be greater than 0"),
    ],
)
def test_invalid_config_is_rejected_with_a_clear_message(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        ParkingConfig(**{field: value})  # type: ignore[arg-type]
    assert message in info.value.description


def test_boundary_values_are_accepted() -> None:
    config = ParkingConfig(retry_factor=1, retry_jitter=0, max_parked=0, budget=1)
    assert config.retry_factor == 1
    assert config.retry_jitter == 0
    assert config.backoff == Backoff(interval=0.1, factor=1, jitter=0)


def test_drain_timeout_defaults_to_budget_plus_headroom() -> None:
    assert ParkingConfig().drain_timeout() == 5.0 + DRAIN_HEADROOM
    assert ParkingConfig(max_parked=0).drain_timeout() == 15.0 + DRAIN_HEADROOM


def test_drain_timeout_must_cover_the_budget() -> None:
    assert ParkingConfig().drain_timeout(5.0) == 5.0
    assert ParkingConfig().drain_timeout(30) == 30.0
    with pytest.raises(InvalidArgument, match=r"drain timeout must be >= the park budget \(5s\)"):
        ParkingConfig().drain_timeout(4.9)
    with pytest.raises(InvalidArgument, match=r"\(15s\), got 10s"):
        ParkingConfig(max_parked=0).drain_timeout(10)
    with pytest.raises(InvalidArgument, match="drain timeout must be greater than 0"):
        ParkingConfig().drain_timeout(-1)


# --- the seed's result table, per attempt --------------------------------------------

# (code, verdict with parking enabled, verdict with parking disabled)
SEED_TABLE = [
    (GrpcCode.ABORTED, Verdict.RETRY, Verdict.RETRY),
    (GrpcCode.RESOURCE_EXHAUSTED, Verdict.RETRY, Verdict.FAIL),
    (GrpcCode.FAILED_PRECONDITION, Verdict.RETRY, Verdict.FAIL),
    (GrpcCode.UNAVAILABLE, Verdict.RETRY, Verdict.FAIL),
    (GrpcCode.NOT_FOUND, Verdict.FAIL, Verdict.FAIL),
    (GrpcCode.DEADLINE_EXCEEDED, Verdict.FAIL, Verdict.FAIL),
    (GrpcCode.PERMISSION_DENIED, Verdict.FAIL, Verdict.FAIL),
    (GrpcCode.UNAUTHENTICATED, Verdict.FAIL, Verdict.FAIL),
]


@pytest.mark.parametrize(("code", "enabled_verdict", "disabled_verdict"), SEED_TABLE)
def test_classify_follows_the_seed_table(
    code: GrpcCode, enabled_verdict: Verdict, disabled_verdict: Verdict
) -> None:
    assert classify(code, True) is enabled_verdict
    assert classify(code, False) is disabled_verdict


@pytest.mark.parametrize(
    "code", sorted(set(GrpcCode) - {row[0] for row in SEED_TABLE} - {GrpcCode.OK})
)
def test_any_other_code_fails_fast(code: GrpcCode) -> None:
    assert classify(code, True) is Verdict.FAIL
    assert classify(code, False) is Verdict.FAIL


def test_ok_is_not_a_failure() -> None:
    with pytest.raises(InvalidArgument, match="OK is not a failed attempt"):
        classify(GrpcCode.OK, True)


# --- backoff -------------------------------------------------------------------------------


def test_schedule_without_jitter_is_interval_times_factor_to_the_n() -> None:
    backoff = Backoff(interval=0.1, factor=1.1, jitter=0.0)
    rng = FixedRandom(0.5)
    delays = [backoff.delay(n, rng) for n in range(5)]
    assert delays == pytest.approx([0.1, 0.11, 0.121, 0.1331, 0.14641])


def test_jitter_adds_a_fraction_of_the_delay_in_zero_to_jitter() -> None:
    backoff = Backoff(interval=0.1, factor=1.1, jitter=0.1)
    assert backoff.delay(0, FixedRandom(0.0)) == 0.1
    assert backoff.delay(2, FixedRandom(0.5)) == pytest.approx(0.121 * 1.05)
    almost_one = math.nextafter(1.0, 0.0)
    extra = backoff.jitter_for(0.121, FixedRandom(almost_one))
    assert 0 <= extra < 0.121 * 0.1


def test_no_cap_and_no_attempt_limit() -> None:
    backoff = Backoff(interval=0.1, factor=1.1, jitter=0.1)
    assert backoff.base_delay(50) == pytest.approx(0.1 * 1.1**50)
    assert backoff.base_delay(50) > 10
    assert backoff.base_delay(100_000) == math.inf
    assert backoff.delay(100_000, random.Random(1)) == math.inf


def test_factor_one_gives_a_constant_schedule() -> None:
    backoff = Backoff(interval=0.25, factor=1.0, jitter=0.0)
    assert {backoff.base_delay(n) for n in range(0, 10_000, 997)} == {0.25}


def test_backoff_validates_its_fields() -> None:
    with pytest.raises(InvalidArgument, match="retry interval must be greater than 0"):
        Backoff(interval=0, factor=1.1, jitter=0.1)
    with pytest.raises(InvalidArgument, match="retry factor must be >= 1"):
        Backoff(interval=0.1, factor=0.5, jitter=0.1)
    with pytest.raises(InvalidArgument, match=r"retry jitter must be in \[0, 1\)"):
        Backoff(interval=0.1, factor=1.1, jitter=1.5)
    with pytest.raises(InvalidArgument, match="retry number must be >= 0"):
        Backoff(interval=0.1, factor=1.1, jitter=0.1).base_delay(-1)


@given(
    retry=st.integers(0, 200),
    interval=st.floats(1e-3, 10.0),
    factor=st.floats(1.0, 3.0),
    jitter=st.just(0.0) | st.floats(1e-9, 0.99),
    rng=st.randoms(use_true_random=False),
)
def test_every_delay_lies_in_base_to_base_times_one_plus_jitter(
    retry: int, interval: float, factor: float, jitter: float, rng: random.Random
) -> None:
    backoff = Backoff(interval=interval, factor=factor, jitter=jitter)
    base = backoff.base_delay(retry)
    extra = backoff.jitter_for(base, rng)
    if math.isinf(base):
        assert extra == 0.0
        return
    assert base >= interval
    assert extra >= 0.0
    if jitter == 0.0:
        assert extra == 0.0
    else:
        assert extra < base * jitter
    delay = backoff.delay(retry, rng)
    assert base <= delay <= base + base * jitter
