"""Booking arithmetic: book never over-books, release never goes negative."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substrate.core.model import Capacity, Resources, Worker
from substrate.errors import ResourceExhausted
from substrate.sched import book, has_room, release

from .sched_support import GIB, worker

CAP = Capacity(cpu_milli=1000, memory_bytes=4 * GIB, actors=2)


def test_book_adds_resources_and_one_slot() -> None:
    w = worker(capacity=CAP)
    booked = book(w, Resources(cpu_milli=300, memory_bytes=GIB))
    assert booked.allocated == Capacity(cpu_milli=300, memory_bytes=GIB, actors=1)
    assert booked.capacity == CAP
    assert booked.metadata == w.metadata  # metadata is the store's business
    assert w.allocated == Capacity()  # records are immutable


def test_book_refuses_to_over_book_each_dimension() -> None:
    w = worker(capacity=CAP)
    with pytest.raises(ResourceExhausted, match="no room"):
        book(w, Resources(cpu_milli=1001))
    with pytest.raises(ResourceExhausted):
        book(w, Resources(memory_bytes=4 * GIB + 1))
    full = book(book(w, Resources()), Resources())
    assert full.allocated.actors == 2
    with pytest.raises(ResourceExhausted):
        book(full, Resources())


def test_book_refuses_unreported_and_slotless_capacity() -> None:
    with pytest.raises(ResourceExhausted):
        book(worker(capacity=None), Resources())
    with pytest.raises(ResourceExhausted):
        book(worker(capacity=Capacity(cpu_milli=10, memory_bytes=10, actors=0)), Resources())


def test_release_clamps_at_zero() -> None:
    w = worker(capacity=CAP, allocated=Capacity(cpu_milli=100, memory_bytes=GIB, actors=1))
    r = release(w, Resources(cpu_milli=300, memory_bytes=GIB))
    assert r.allocated == Capacity()
    assert release(r, Resources(cpu_milli=1)).allocated == Capacity()


requests = st.builds(
    Resources,
    cpu_milli=st.integers(0, 600),
    memory_bytes=st.integers(0, 3).map(lambda n: n * GIB),
)


@settings(max_examples=200)
@given(st.lists(st.tuples(st.booleans(), requests), max_size=30))
def test_any_sequence_stays_within_capacity(ops: list[tuple[bool, Resources]]) -> None:
    w: Worker = worker(capacity=CAP)
    booked: list[Resources] = []
    for is_book, r in ops:
        if is_book:
            room = has_room(w, r)
            try:
                w = book(w, r)
            except ResourceExhausted:
                assert not room
            else:
                assert room
                booked.append(r)
        elif booked:
            w = release(w, booked.pop(0))
        assert CAP.covers(w.allocated)
        assert w.allocated == Capacity(
            cpu_milli=sum(b.cpu_milli for b in booked),
            memory_bytes=sum(b.memory_bytes for b in booked),
            actors=len(booked),
        )
