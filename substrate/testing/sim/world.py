"""A discrete-event world: a seeded RNG, a virtual clock and an ordered event heap."""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable


class SimWorld:
    """Runs callbacks in virtual-time order; ties break by scheduling order (deterministic)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.steps = 0

    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at virtual time ``when`` (never in the past)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), fn))

    def after(self, delay: float, fn: Callable[[], None]) -> None:
        self.at(self.now + max(0.0, delay), fn)

    def run_until(self, end: float) -> None:
        while self._heap and self._heap[0][0] <= end:
            when, _, fn = heapq.heappop(self._heap)
            self.now = when
            self.steps += 1
            fn()
        self.now = max(self.now, end)

    def pending(self) -> int:
        return len(self._heap)


__all__ = ["SimWorld"]
