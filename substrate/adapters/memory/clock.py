"""A manual clock: time moves only when a test or the simulator advances it."""

from __future__ import annotations

from typing import Final

from substrate.errors import InvalidArgument

DEFAULT_START: Final = 1_700_000_000.0
"""Where a :class:`ManualClock` starts: a plausible epoch time, so stamps are non-zero."""


class ManualClock:
    """A ``Callable[[], float]`` clock that only moves when told to."""

    def __init__(self, start: float = DEFAULT_START) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (never backwards)."""
        if seconds < 0:
            raise InvalidArgument(f"a clock cannot go backwards (advance by {seconds})")
        self.now += seconds
