"""Capacity booking arithmetic: the only way the scheduler changes a worker's allocation.

An actor books its cpu and memory limits plus one actor slot. :func:`book` refuses to
over-book, and :func:`release` never drives an allocation negative, so a worker's
allocation stays within ``[0, capacity]`` whatever sequence of calls is made.
"""

from __future__ import annotations

import attrs

from substrate.core.model import Resources, Worker
from substrate.errors import ResourceExhausted
from substrate.sched.constraints import has_room


def book(worker: Worker, resources: Resources) -> Worker:
    """``worker`` with ``resources`` and one actor slot added to its allocation.

    Raises :class:`~substrate.errors.ResourceExhausted` (and books nothing) if the worker
    has no room (:func:`~substrate.sched.constraints.has_room`): an unreported capacity,
    no free actor slot, or not enough cpu or memory left. Only the allocation changes; the
    record's metadata is left to the store.
    """
    if not has_room(worker, resources):
        raise ResourceExhausted(
            f"worker {worker.ref.name} has no room for "
            f"{resources.cpu_milli}m cpu and {resources.memory_bytes} bytes of memory"
        )
    return attrs.evolve(worker, allocated=worker.allocated.plus(resources))


def release(worker: Worker, resources: Resources) -> Worker:
    """``worker`` with ``resources`` and one actor slot taken off its allocation.

    Each dimension is clamped at zero, so releasing more than was booked (a duplicate
    release, or one after the allocation was reset by a newer record) is harmless.
    """
    return attrs.evolve(worker, allocated=worker.allocated.minus(resources))


__all__ = ["book", "release"]
