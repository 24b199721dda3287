"""Pure scheduling: which worker takes an actor (design §4, seed 000 step 3).

Nothing in this package performs I/O, reads the clock or the environment, or uses the
global random source: randomness is a :class:`random.Random` argument.

* :mod:`~substrate.sched.constraints` — the gates (:func:`applies`, :func:`has_room`);
* :mod:`~substrate.sched.load` — the load order used to pick the less loaded worker;
* :mod:`~substrate.sched.p2c` — power of two choices over a candidate list;
* :mod:`~substrate.sched.booking` — capacity booking arithmetic that never over-books;
* :mod:`~substrate.sched.index` — :class:`FleetIndex`, bucketed so a decision does not
  scan the fleet;
* :func:`schedule` — the decision over an index or a plain collection of workers.
"""

from substrate.sched.booking import book, release
from substrate.sched.constraints import (
    NO_ROOM,
    Constraints,
    applies,
    constraints_for,
    fits,
    has_free_slot,
    has_room,
)
from substrate.sched.index import FleetIndex
from substrate.sched.load import compare_load, dominant_share, less_loaded, slot_share
from substrate.sched.p2c import choose, sample_two
from substrate.sched.scheduler import candidates, schedule

__all__ = [
    "NO_ROOM",
    "Constraints",
    "FleetIndex",
    "applies",
    "book",
    "candidates",
    "choose",
    "compare_load",
    "constraints_for",
    "dominant_share",
    "fits",
    "has_free_slot",
    "has_room",
    "less_loaded",
    "release",
    "sample_two",
    "schedule",
    "slot_share",
]
