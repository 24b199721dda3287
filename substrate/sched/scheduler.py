"""The top-level decision over either a :class:`FleetIndex` or a plain collection of workers."""

from __future__ import annotations

import random
from collections.abc import Iterable

from substrate.core.model import Worker
from substrate.sched.constraints import Constraints, fits
from substrate.sched.index import FleetIndex
from substrate.sched.p2c import choose


def candidates(workers: Iterable[Worker], c: Constraints) -> list[Worker]:
    """Every worker of ``workers`` that passes every gate of ``c``, in input order (O(n))."""
    return [w for w in workers if fits(w, c)]


def schedule(fleet: FleetIndex | Iterable[Worker], c: Constraints, *, rng: random.Random) -> Worker:
    """Choose the worker that should take an actor with constraints ``c``.

    A :class:`FleetIndex` answers from its buckets (:meth:`FleetIndex.schedule`); any other
    iterable of workers is filtered exactly (O(n)). Either way: only a worker passing
    :func:`~substrate.sched.constraints.applies` and
    :func:`~substrate.sched.constraints.has_room` is returned; workers on
    ``c.preferred_node`` are chosen among first, and the rest only if none qualifies; the
    choice among candidates is power of two choices with ``rng``
    (:func:`~substrate.sched.p2c.choose`). Nothing is booked. Raises
    :class:`~substrate.errors.ResourceExhausted` ("no worker has room for the actor") when no
    worker qualifies.
    """
    if isinstance(fleet, FleetIndex):
        return fleet.schedule(c, rng=rng)
    found = candidates(fleet, c)
    if c.preferred_node is not None:
        preferred = [w for w in found if w.node == c.preferred_node]
        if preferred:
            return choose(preferred, rng=rng)
    return choose(found, rng=rng)


__all__ = ["candidates", "schedule"]
