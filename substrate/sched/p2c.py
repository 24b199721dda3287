"""Power of two choices: sample two distinct candidates uniformly, take the less loaded."""

from __future__ import annotations

import random
from collections.abc import Sequence

from substrate.core.model import Worker
from substrate.errors import ResourceExhausted
from substrate.sched.constraints import NO_ROOM
from substrate.sched.load import less_loaded


def sample_two(n: int, rng: random.Random) -> tuple[int, int]:
    """Two distinct indices in ``range(n)``, uniform over ordered pairs (needs ``n >= 2``).

    Draws exactly two values from ``rng``, so a seeded ``rng`` gives a reproducible pair.
    """
    if n < 2:
        raise ValueError(f"sample_two needs at least two items (got {n})")
    i = rng.randrange(n)
    j = rng.randrange(n - 1)
    if j >= i:
        j += 1
    return i, j


def choose(candidates: Sequence[Worker], *, rng: random.Random) -> Worker:
    """Pick one of ``candidates`` (all assumed eligible and with room) by power of two choices.

    No candidate raises :class:`~substrate.errors.ResourceExhausted`; exactly one is
    returned as is without touching ``rng``; otherwise two distinct positions are sampled
    uniformly with ``rng`` and the less loaded worker (:func:`~substrate.sched.load.less_loaded`)
    is returned. The result depends only on the sequence and the state of ``rng``.
    """
    n = len(candidates)
    if n == 0:
        raise ResourceExhausted(NO_ROOM)
    if n == 1:
        return candidates[0]
    i, j = sample_two(n, rng)
    return less_loaded(candidates[i], candidates[j])


__all__ = ["choose", "sample_two"]
