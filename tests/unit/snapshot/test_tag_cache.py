"""The tag cache's eviction choice (pure): least recently used first, never what is in use."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from substrate.errors import InvalidArgument
from substrate.snapshot.tag_cache import TagCacheEntry, tag_cache_victims


def entry(key: str, size: int, used: float, *, in_use: bool = False) -> TagCacheEntry:
    return TagCacheEntry(key=key, size=size, last_used=used, in_use=in_use)


def test_the_least_recently_used_go_first_until_the_cache_fits() -> None:
    entries = [entry("new", 40, 3.0), entry("old", 40, 1.0), entry("mid", 40, 2.0)]
    assert [v.key for v in tag_cache_victims(entries, 100)] == ["old"]
    assert [v.key for v in tag_cache_victims(entries, 40)] == ["old", "mid"]
    assert tag_cache_victims(entries, 120) == []


def test_an_entry_in_use_is_skipped_even_if_the_cache_stays_over() -> None:
    entries = [entry("old", 50, 1.0, in_use=True), entry("new", 50, 2.0)]
    assert [v.key for v in tag_cache_victims(entries, 60)] == ["new"]
    assert tag_cache_victims([entry("only", 50, 1.0, in_use=True)], 10) == []


def test_zero_means_no_limit_and_ties_go_by_key() -> None:
    assert tag_cache_victims([entry("a", 10**12, 0.0)], 0) == []
    tied = [entry("b", 10, 1.0), entry("a", 10, 1.0)]
    assert [v.key for v in tag_cache_victims(tied, 10)] == ["a"]


def test_bad_limits_and_sizes_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="limit must be >= 0"):
        tag_cache_victims([], -1)
    with pytest.raises(InvalidArgument, match="negative size"):
        tag_cache_victims([entry("a", -1, 0.0)], 10)


entries_strategy = st.lists(
    st.builds(
        TagCacheEntry,
        key=st.text("abcdef", min_size=1, max_size=4),
        size=st.integers(0, 1000),
        last_used=st.floats(0, 100, allow_nan=False),
        in_use=st.booleans(),
    ),
    max_size=12,
    unique_by=lambda e: e.key,
)


@given(entries_strategy, st.integers(1, 5000))
def test_eviction_properties(entries: list[TagCacheEntry], limit: int) -> None:
    victims = tag_cache_victims(entries, limit)
    keys = {v.key for v in victims}
    left = [e for e in entries if e.key not in keys]
    assert not any(v.in_use for v in victims)
    # the cache fits, or everything that could go went
    assert sum(e.size for e in left) <= limit or all(e.in_use for e in left)
    # nothing went that was not needed: without the last victim the cache was over
    if victims:
        assert sum(e.size for e in left) + victims[-1].size > limit
    # least recently used first: every survivor not in use was used no earlier than a victim
    for survivor in (e for e in left if not e.in_use):
        assert all((v.last_used, v.key) <= (survivor.last_used, survivor.key) for v in victims)
