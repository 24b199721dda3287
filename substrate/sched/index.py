"""An in-memory fleet index that answers a scheduling decision without scanning the fleet.

Layout
------
Every stored worker gets a small integer *slot*; the record lives in ``records[slot]`` and
its capacity and allocation (:func:`~substrate.sched.load.usage`) in a packed
``array('q')`` of six numbers per slot, so checking the room of a sampled worker and
comparing two loads read one small, contiguous piece of memory instead of chasing the
record's objects (which is what keeps a decision on 100,000 workers as cheap as on 100).

A worker is *open* when it is ACTIVE and has reported a capacity with at least one free
actor slot; only open workers can take any actor, and only they are placed in buckets:

* by sandbox class;
* by (sandbox class, node);
* by (sandbox class, label key, label value), one bucket per label of the worker (as
  :meth:`~substrate.core.ids.Labels.matches` reads them: the last value of a repeated key).

A bucket is a random-access set of slots (a packed array plus a position map) with O(1)
insert, delete, membership and uniform sampling. Booking and releasing update the packed
numbers and move a worker out of (or back into) its buckets when its last free actor slot
is taken (or given back).

A decision
----------
For one pass (see :meth:`FleetIndex.schedule` for the preferred-node pass) the gates map
onto buckets: the class and ACTIVE gates hold for every bucket member, a selector pair
``(k, v)`` means membership of the ``(class, k, v)`` bucket, and a pinned node means
membership of the ``(class, node)`` bucket. The index takes the *narrowest* of these
buckets and checks a member by membership of the others, its packed free numbers and (for
a MEMORY restore) :meth:`~substrate.core.model.Worker.can_restore` — exactly
:func:`~substrate.sched.constraints.fits`. Then:

1. **fast path** — draw members uniformly from that bucket, keep those that qualify, and
   take the less loaded of the first two distinct ones (the order of
   :func:`~substrate.sched.load.less_loaded`, computed on the packed numbers).
   Rejection sampling keeps the pair uniform over the candidates, so this is exactly power
   of two choices. At most ``max(sample_attempts, min(MAX_SAMPLE_ATTEMPTS, size // 8))``
   draws are made (``sample_attempts`` defaults to :data:`SAMPLE_ATTEMPTS`);
2. **exact fallback** — if fewer than two candidates were found (or the bucket holds at
   most ``scan_at_most`` workers, default :data:`SCAN_AT_MOST`), every member of the
   bucket is checked and :func:`~substrate.sched.p2c.choose` picks among the candidates.

So a decision never depends on sampling luck: if any worker qualifies, one is returned.
Its cost is O(1) when a fair share of the narrowest bucket has room (the common case) and
O(size of the narrowest bucket) when almost none does.

The index is a plain single-threaded data structure; callers that share it between tasks
must serialise access (a decision followed by :meth:`FleetIndex.book` is atomic as long as
nothing else runs in between).
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterable, Iterator
from typing import Final, TypeVar

from substrate.core.ids import NodeRef, WorkerRef
from substrate.core.model import Resources, SandboxClass, Worker, WorkerState
from substrate.errors import Internal, InvalidArgument, NotFound, ResourceExhausted
from substrate.sched import booking
from substrate.sched.constraints import NO_ROOM, Constraints, has_free_slot
from substrate.sched.load import compare_usage, usage
from substrate.sched.p2c import choose

SAMPLE_ATTEMPTS: Final = 64
"""The fewest draws the fast path makes from a bucket before the exact fallback."""

MAX_SAMPLE_ATTEMPTS: Final = 512
"""The most draws the fast path makes (reached for buckets of 4096 workers and more)."""

SCAN_AT_MOST: Final = 8
"""Buckets this small are always scanned exactly (sampling would buy nothing)."""

INT64_MAX: Final = (1 << 63) - 1
"""Capacities and allocations are packed as signed 64-bit integers."""

_STRIDE: Final = 6
"""Packed numbers per slot: the worker's :data:`~substrate.sched.load.Usage` vector."""

_NodeKey = tuple[SandboxClass, str]
_LabelKey = tuple[SandboxClass, str, str]
_K = TypeVar("_K")


class _Bag:
    """A set of slots with O(1) add, discard, membership and uniform random access."""

    __slots__ = ("_pos", "items")

    def __init__(self) -> None:
        self.items = array("q")
        self._pos: dict[int, int] = {}

    def add(self, slot: int) -> None:
        if slot not in self._pos:
            self._pos[slot] = len(self.items)
            self.items.append(slot)

    def discard(self, slot: int) -> None:
        i = self._pos.pop(slot, None)
        if i is None:
            return
        last = self.items.pop()
        if i < len(self.items):
            self.items[i] = last
            self._pos[last] = i

    def __contains__(self, slot: object) -> bool:
        return slot in self._pos

    def __len__(self) -> int:
        return len(self.items)

    def consistent(self) -> bool:
        """The array and the position map describe the same set (O(size); for checks)."""
        return len(self.items) == len(self._pos) and all(
            self.items[i] == slot for slot, i in self._pos.items()
        )


def _is_open(worker: Worker) -> bool:
    """ACTIVE with a reported capacity and a free actor slot: may take some actor."""
    return worker.state is WorkerState.ACTIVE and has_free_slot(worker)


def _check_packable(worker: Worker) -> None:
    for c in (worker.capacity, worker.allocated):
        if c is not None and max(c.cpu_milli, c.memory_bytes, c.actors) > INT64_MAX:
            raise InvalidArgument(
                f"worker {worker.ref.name} capacity or allocation exceeds {INT64_MAX}"
            )


class FleetIndex:
    """The workers of a fleet, bucketed so that one scheduling decision is (nearly) O(1).

    Records are replaced whole: :meth:`upsert` keeps the record with the higher
    ``metadata.version``. :meth:`book` and :meth:`release` change only the allocation of
    the stored record (through :mod:`substrate.sched.booking`, so it is never over-booked).
    Capacities and allocations must fit in a signed 64-bit integer.
    """

    __slots__ = (
        "_by_class",
        "_by_label",
        "_by_node",
        "_free_slots",
        "_records",
        "_sample_attempts",
        "_scan_at_most",
        "_slots",
        "_usage",
    )

    def __init__(
        self,
        workers: Iterable[Worker] = (),
        *,
        scan_at_most: int = SCAN_AT_MOST,
        sample_attempts: int = SAMPLE_ATTEMPTS,
    ) -> None:
        """Index ``workers`` (as :meth:`upsert` does, one by one).

        ``scan_at_most`` and ``sample_attempts`` tune the decision (see the module
        docstring); they change its cost, never its outcome's eligibility.
        """
        if scan_at_most < 0 or sample_attempts < 0:
            raise InvalidArgument("scan_at_most and sample_attempts must not be negative")
        self._scan_at_most = scan_at_most
        self._sample_attempts = sample_attempts
        self._slots: dict[str, int] = {}
        """Worker name -> slot."""
        self._records: list[Worker] = []
        """Slot -> record (a freed slot keeps its last record until it is reused)."""
        self._free_slots: list[int] = []
        self._usage = array("q")
        """``_STRIDE`` packed numbers per slot: :func:`~substrate.sched.load.usage`."""
        self._by_class: dict[SandboxClass, _Bag] = {}
        self._by_node: dict[_NodeKey, _Bag] = {}
        self._by_label: dict[_LabelKey, _Bag] = {}
        for w in workers:
            self.upsert(w)

    # --- reading ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, ref: object) -> bool:
        return isinstance(ref, WorkerRef) and ref.name in self._slots

    def __iter__(self) -> Iterator[Worker]:
        """Every stored record (in insertion order); do not modify the index meanwhile."""
        records = self._records
        return (records[slot] for slot in self._slots.values())

    def get(self, ref: WorkerRef) -> Worker | None:
        """The stored record of ``ref``, or ``None``."""
        slot = self._slots.get(ref.name)
        return None if slot is None else self._records[slot]

    # --- writing ----------------------------------------------------------------------

    def upsert(self, worker: Worker) -> bool:
        """Store ``worker`` unless a record with the same or a higher version is stored.

        Returns True if the record was stored. A record with an equal version is treated
        as a replay and ignored (which also keeps any allocation booked locally since).
        Raises :class:`~substrate.errors.InvalidArgument` (storing nothing) if a capacity or
        allocation does not fit in a signed 64-bit integer.
        """
        name = worker.ref.name
        slot = self._slots.get(name)
        if slot is not None:
            old = self._records[slot]
            if worker.metadata.version <= old.metadata.version:
                return False
            _check_packable(worker)
            if _is_open(old):
                self._unindex(slot, old)
        else:
            _check_packable(worker)
            slot = self._new_slot(worker)
            self._slots[name] = slot
        self._records[slot] = worker
        self._pack(slot, worker)
        if _is_open(worker):
            self._index(slot, worker)
        return True

    def remove(self, ref: WorkerRef) -> Worker | None:
        """Forget ``ref``; returns the record that was stored, or ``None``."""
        slot = self._slots.pop(ref.name, None)
        if slot is None:
            return None
        old = self._records[slot]
        if _is_open(old):
            self._unindex(slot, old)
        self._free_slots.append(slot)
        return old

    def book(self, ref: WorkerRef, resources: Resources) -> Worker:
        """Book ``resources`` plus one actor slot on ``ref``; returns the updated record.

        Raises :class:`~substrate.errors.NotFound` for an unknown worker and
        :class:`~substrate.errors.ResourceExhausted` (changing nothing) if it has no room.
        """
        slot = self._require(ref)
        old = self._records[slot]
        new = booking.book(old, resources)
        self._replace_allocation(slot, old, new)
        return new

    def release(self, ref: WorkerRef, resources: Resources) -> Worker:
        """Give back ``resources`` plus one actor slot on ``ref``; returns the updated record.

        Raises :class:`~substrate.errors.NotFound` for an unknown worker. The allocation is
        clamped at zero (:func:`~substrate.sched.booking.release`).
        """
        slot = self._require(ref)
        old = self._records[slot]
        new = booking.release(old, resources)
        self._replace_allocation(slot, old, new)
        return new

    # --- deciding ---------------------------------------------------------------------

    def schedule(self, c: Constraints, *, rng: random.Random) -> Worker:
        """Choose a worker for ``c`` by power of two choices; the index is not changed.

        When ``c.preferred_node`` is set and the actor is not pinned elsewhere, the workers
        on that node are tried first and the rest of the fleet only if none of them
        qualifies. Raises :class:`~substrate.errors.ResourceExhausted` ("no worker has room
        for the actor") if no worker passes every gate — and only then.
        """
        found = self._decide(c, rng)
        if found is None:
            raise ResourceExhausted(NO_ROOM)
        return found

    def schedule_and_book(self, c: Constraints, *, rng: random.Random) -> Worker:
        """:meth:`schedule` then :meth:`book` the chosen worker; returns the booked record."""
        chosen = self.schedule(c, rng=rng)
        return self.book(chosen.ref, c.resources)

    def pool_size(self, c: Constraints) -> int:
        """How many workers the narrowest bucket for ``c`` holds (ignoring the preferred node).

        An upper bound on the number of records one pass of a decision may examine.
        """
        gates = self._gates(c, c.required_node)
        return 0 if gates is None else len(gates[0])

    # --- checking ---------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise :class:`~substrate.errors.Internal` if the internal structures disagree.

        O(fleet); meant for tests and debugging.
        """
        want_class: dict[SandboxClass, set[int]] = {}
        want_node: dict[_NodeKey, set[int]] = {}
        want_label: dict[_LabelKey, set[int]] = {}
        if set(self._slots.values()) & set(self._free_slots):
            raise Internal("a slot is both used and free")
        if len(self._slots) + len(self._free_slots) != len(self._records):
            raise Internal("slots leaked")
        for name, slot in self._slots.items():
            w = self._records[slot]
            if w.ref.name != name:
                raise Internal(f"worker {w.ref.name} stored under {name}")
            b = slot * _STRIDE
            if tuple(self._usage[b : b + _STRIDE]) != usage(w):
                raise Internal(f"packed usage of worker {name} is stale")
            if not _is_open(w):
                continue
            cls = w.sandbox_class
            want_class.setdefault(cls, set()).add(slot)
            want_node.setdefault((cls, w.node.name), set()).add(slot)
            for k, v in w.labels.as_dict().items():
                want_label.setdefault((cls, k, v), set()).add(slot)
        _check_buckets("class", self._by_class, want_class)
        _check_buckets("node", self._by_node, want_node)
        _check_buckets("label", self._by_label, want_label)

    # --- internals --------------------------------------------------------------------

    def _require(self, ref: WorkerRef) -> int:
        slot = self._slots.get(ref.name)
        if slot is None:
            raise NotFound(f"worker {ref.name} not found")
        return slot

    def _new_slot(self, worker: Worker) -> int:
        """A free slot (reused or new); the caller stores ``worker`` and its numbers there."""
        if self._free_slots:
            return self._free_slots.pop()
        self._records.append(worker)
        self._usage.extend((0,) * _STRIDE)
        return len(self._records) - 1

    def _pack(self, slot: int, w: Worker) -> None:
        b = slot * _STRIDE
        self._usage[b : b + _STRIDE] = array("q", usage(w))

    def _replace_allocation(self, slot: int, old: Worker, new: Worker) -> None:
        was, now = _is_open(old), _is_open(new)
        self._records[slot] = new
        self._pack(slot, new)
        if was and not now:
            self._unindex(slot, old)
        elif now and not was:
            self._index(slot, new)

    def _index(self, slot: int, w: Worker) -> None:
        cls = w.sandbox_class
        _bag(self._by_class, cls).add(slot)
        _bag(self._by_node, (cls, w.node.name)).add(slot)
        for k, v in w.labels.as_dict().items():
            _bag(self._by_label, (cls, k, v)).add(slot)

    def _unindex(self, slot: int, w: Worker) -> None:
        cls = w.sandbox_class
        _drop(self._by_class, cls, slot)
        _drop(self._by_node, (cls, w.node.name), slot)
        for k, v in w.labels.as_dict().items():
            _drop(self._by_label, (cls, k, v), slot)

    def _gates(self, c: Constraints, node: NodeRef | None) -> list[_Bag] | None:
        """The buckets a candidate on ``node`` (any node if None) must belong to.

        The narrowest comes first; the class bucket is dropped from the rest because every
        bucket only holds workers of its class. None if some bucket is missing or empty
        (no worker can qualify).
        """
        cls = c.sandbox_class
        class_bag = self._by_class.get(cls)
        if class_bag is None:
            return None
        gates: list[_Bag] = []
        if node is not None:
            bag = self._by_node.get((cls, node.name))
            if bag is None:
                return None
            gates.append(bag)
        items = c.selector_items()
        if items:
            if len({k for k, _ in items}) != len(items):
                return None  # the two selectors want different values for one key
            for k, v in items:
                bag = self._by_label.get((cls, k, v))
                if bag is None:
                    return None
                gates.append(bag)
        if not gates:
            return [class_bag]
        gates.sort(key=len)
        return gates

    def _less_loaded(self, a: int, b: int) -> int:
        """The slot of the less loaded worker, as :func:`~substrate.sched.load.less_loaded`."""
        packed = self._usage
        ia, ib = a * _STRIDE, b * _STRIDE
        c = compare_usage(packed[ia : ia + _STRIDE], packed[ib : ib + _STRIDE])
        if c == 0:  # equal loads: the smaller name wins (names of two slots differ)
            return b if self._records[b].ref.name < self._records[a].ref.name else a
        return b if c > 0 else a

    def _decide(self, c: Constraints, rng: random.Random) -> Worker | None:
        preferred = c.preferred_node
        if preferred is not None and c.required_node is None:
            found = self._pick(c, preferred, rng)
            if found is not None:
                return found
        # With a pin, a different preferred node cannot qualify and an equal one is the pin.
        return self._pick(c, c.required_node, rng)

    def _pick(self, c: Constraints, node: NodeRef | None, rng: random.Random) -> Worker | None:
        """One pass: a candidate on ``node`` (any node if None) chosen by p2c, or None."""
        gates = self._gates(c, node)
        if gates is None:
            return None
        bag, others = gates[0], gates[1:]
        packed = self._usage
        records = self._records
        cpu = c.resources.cpu_milli
        mem = c.resources.memory_bytes
        runtime = c.runtime_version

        def qualifies(slot: int) -> bool:
            if others and not all(slot in other for other in others):
                return False
            b = slot * _STRIDE
            return (
                packed[b + 3] + cpu <= packed[b]
                and packed[b + 4] + mem <= packed[b + 1]
                and packed[b + 5] < packed[b + 2]
                and (not runtime or records[slot].can_restore(runtime))
            )

        items = bag.items
        n = len(items)
        if n > self._scan_at_most:
            # The fast path inlines ``qualifies`` (membership first: it fails most often).
            first = -1
            randrange = rng.randrange
            other = others[0] if len(others) == 1 else None
            for _ in range(max(self._sample_attempts, min(MAX_SAMPLE_ATTEMPTS, n >> 3))):
                slot = items[randrange(n)]
                if slot == first:
                    continue
                if other is not None:
                    if slot not in other:
                        continue
                elif others and not all(slot in o for o in others):
                    continue
                b = slot * _STRIDE
                if (
                    packed[b + 3] + cpu > packed[b]
                    or packed[b + 4] + mem > packed[b + 1]
                    or packed[b + 5] >= packed[b + 2]
                ):
                    continue
                if runtime and not records[slot].can_restore(runtime):
                    continue
                if first < 0:
                    first = slot
                else:
                    return records[self._less_loaded(first, slot)]
        candidates = [records[slot] for slot in items if qualifies(slot)]
        if not candidates:
            return None
        return choose(candidates, rng=rng)


def _check_buckets(what: str, have: dict[_K, _Bag], want: dict[_K, set[int]]) -> None:
    if {key: set(bag.items) for key, bag in have.items()} != want:
        raise Internal(f"{what} buckets disagree with the stored workers")
    for bag in have.values():
        if not bag.consistent():
            raise Internal(f"a {what} bucket's position map is corrupt")


def _bag(buckets: dict[_K, _Bag], key: _K) -> _Bag:
    bag = buckets.get(key)
    if bag is None:
        bag = buckets[key] = _Bag()
    return bag


def _drop(buckets: dict[_K, _Bag], key: _K, slot: int) -> None:
    bag = buckets.get(key)
    if bag is not None:
        bag.discard(slot)
        if not bag:
            del buckets[key]


__all__ = ["MAX_SAMPLE_ATTEMPTS", "SAMPLE_ATTEMPTS", "SCAN_AT_MOST", "FleetIndex"]
