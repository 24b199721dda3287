"""Load comparison between two workers: the "take the less loaded" half of p2c.

All shares are compared exactly, as integer fractions by cross-multiplication, never as
floats. Loads are measured on the workers as they are, i.e. *before* booking the actor
being placed: the same booking is about to be added to whichever worker wins, and measuring
before keeps the comparison a property of the two records alone.

The order, most significant first:

1. actor-slot share ``allocated.actors / capacity.actors``;
2. dominant share ``max(allocated.cpu / capacity.cpu, allocated.memory / capacity.memory)``;
3. raw ``allocated.actors``;
4. worker name (lexicographic), so that the comparison is a total order and deterministic.

A worker with an unreported capacity or zero actor slots counts as infinitely loaded in
both shares. A cpu or memory dimension with zero capacity counts as share 0 when nothing
is allocated in it and as infinitely loaded otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from substrate.core.model import Worker

_FULL: Final = (1, 0)
"""The fraction ``1/0``: infinitely loaded (compares above every finite share)."""
_EMPTY: Final = (0, 1)


def _fraction(num: int, den: int) -> tuple[int, int]:
    if den > 0:
        return (num, den)
    return _FULL if num > 0 else _EMPTY


def _cmp_fraction(a: tuple[int, int], b: tuple[int, int]) -> int:
    """Three-way compare of ``a[0]/a[1]`` and ``b[0]/b[1]`` (denominator 0 = +infinity)."""
    left = a[0] * b[1]
    right = b[0] * a[1]
    return (left > right) - (left < right)


Usage = Sequence[int]
"""``(cap_cpu, cap_memory, cap_actors, alloc_cpu, alloc_memory, alloc_actors)``.

An unreported capacity is written as ``-1`` in all three capacity fields.
"""

UNREPORTED: Final = -1


def usage(worker: Worker) -> tuple[int, int, int, int, int, int]:
    """The :data:`Usage` vector of ``worker``."""
    cap, alloc = worker.capacity, worker.allocated
    if cap is None:
        return (
            UNREPORTED,
            UNREPORTED,
            UNREPORTED,
            alloc.cpu_milli,
            alloc.memory_bytes,
            alloc.actors,
        )
    return (
        cap.cpu_milli,
        cap.memory_bytes,
        cap.actors,
        alloc.cpu_milli,
        alloc.memory_bytes,
        alloc.actors,
    )


def _slot_share(u: Usage) -> tuple[int, int]:
    if u[2] <= 0:
        return _FULL
    return (u[5], u[2])


def _dominant_share(u: Usage) -> tuple[int, int]:
    if u[0] < 0:
        return _FULL
    cpu = _fraction(u[3], u[0])
    mem = _fraction(u[4], u[1])
    return cpu if _cmp_fraction(cpu, mem) >= 0 else mem


def slot_share(worker: Worker) -> tuple[int, int]:
    """The actor-slot share as ``(allocated, capacity)``; ``(1, 0)`` (full) if no slots."""
    return _slot_share(usage(worker))


def dominant_share(worker: Worker) -> tuple[int, int]:
    """The larger of the cpu and memory utilisation as an exact ``(numerator, denominator)``."""
    return _dominant_share(usage(worker))


def compare_usage(a: Usage, b: Usage) -> int:
    """Three-way compare of two :data:`Usage` vectors by the load order, without names.

    Negative if ``a`` is less loaded: slot share, then dominant share, then raw allocated
    actors. Zero means a tie that only the worker names can break.
    """
    c = _cmp_fraction(_slot_share(a), _slot_share(b))
    if c:
        return c
    c = _cmp_fraction(_dominant_share(a), _dominant_share(b))
    if c:
        return c
    return (a[5] > b[5]) - (a[5] < b[5])


def compare_load(a: Worker, b: Worker) -> int:
    """Three-way compare: negative if ``a`` is less loaded than ``b``, positive if more.

    :func:`compare_usage` of the two workers, then their names. Zero only when the loads
    are equal *and* the names are equal.
    """
    c = compare_usage(usage(a), usage(b))
    if c:
        return c
    sa, sb = a.ref.name, b.ref.name
    return (sa > sb) - (sa < sb)


def less_loaded(a: Worker, b: Worker) -> Worker:
    """The less loaded of ``a`` and ``b`` by :func:`compare_load`; ``a`` on a full tie."""
    return b if compare_load(b, a) < 0 else a


__all__ = [
    "UNREPORTED",
    "Usage",
    "compare_load",
    "compare_usage",
    "dominant_share",
    "less_loaded",
    "slot_share",
    "usage",
]
