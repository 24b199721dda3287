"""Uncapped exponential backoff with additive jitter, computed without I/O."""

from __future__ import annotations

import math
import random

import attrs

from substrate.errors import InvalidArgument


def check_positive(value: object, *, what: str) -> float:
    """Return ``value`` as a float if it is a finite number > 0, else raise InvalidArgument."""
    number = _as_number(value, what=what)
    if not number > 0:
        raise InvalidArgument(f"{what} must be greater than 0, got {value!r}")
    return number


def check_factor(value: object, *, what: str) -> float:
    """Return ``value`` as a float if it is a finite number >= 1, else raise InvalidArgument.

    A factor below 1 shrinks the delays towards zero and turns a retry loop into a hot loop.
    """
    number = _as_number(value, what=what)
    if not number >= 1:
        raise InvalidArgument(f"{what} must be >= 1, got {value!r}")
    return number


def check_jitter(value: object, *, what: str) -> float:
    """Return ``value`` as a float if it lies in [0, 1), else raise InvalidArgument."""
    number = _as_number(value, what=what)
    if not 0 <= number < 1:
        raise InvalidArgument(f"{what} must be in [0, 1), got {value!r}")
    return number


def _as_number(value: object, *, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{what} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidArgument(f"{what} must be finite, got {value!r}")
    return number


@attrs.frozen(slots=True, kw_only=True)
class Backoff:
    """The delay before each retry: ``interval * factor**n``, plus jitter, with no cap.

    ``n`` counts retries from 0: the first retry waits ``interval``, the second
    ``interval * factor``, and so on. There is deliberately no cap and no attempt limit; a
    caller bounds the total wait with its own budget.

    Jitter is additive and one-sided. With ``u = rng.random()`` (uniform in [0, 1)), the
    delay is ``base + base * jitter * u``: the added part is a random fraction in
    ``[0, jitter)`` of the base delay, so a delay is never shorter than its base and always
    shorter than ``base * (1 + jitter)``. With ``jitter == 0`` the rng is not consulted.
    """

    interval: float
    factor: float
    jitter: float

    def __attrs_post_init__(self) -> None:
        check_positive(self.interval, what="retry interval")
        check_factor(self.factor, what="retry factor")
        check_jitter(self.jitter, what="retry jitter")

    def base_delay(self, retry: int) -> float:
        """The delay before retry number ``retry`` (from 0), without jitter; may be ``inf``."""
        if retry < 0:
            raise InvalidArgument(f"retry number must be >= 0, got {retry}")
        try:
            return self.interval * self.factor**retry
        except OverflowError:
            return math.inf

    def jitter_for(self, base: float, rng: random.Random) -> float:
        """The random amount added to ``base``: in ``[0, base * jitter)`` (0 if no jitter)."""
        if self.jitter == 0 or not math.isfinite(base):
            return 0.0
        ceiling = base * self.jitter
        extra = ceiling * rng.random()
        # ``ceiling * u`` with u < 1 can round up to ``ceiling``; keep the bound strict.
        return min(extra, math.nextafter(ceiling, 0.0))

    def delay(self, retry: int, rng: random.Random) -> float:
        """The jittered delay before retry number ``retry`` (from 0)."""
        base = self.base_delay(retry)
        return base + self.jitter_for(base, rng)


__all__ = ["Backoff", "check_factor", "check_jitter", "check_positive"]
