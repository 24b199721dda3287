"""Which tag snapshots a node's tag cache gives up when it is over its size (no I/O).

atelet keeps each tag snapshot it downloaded (``<node>/cache/tags/<tag>/<snapshot>/``) so
the next actor started from that tag restores without a download. The cache is bounded by
a byte budget: when it is over, the least recently used entries go first, and an entry a
start is using right now (being filled, or restored from) never goes — the caller says
which are in use. gVisor reads a snapshot's files completely during ``runsc restore``
(there is no lazy restore), so an entry is free again as soon as the restore returned.
"""

from __future__ import annotations

import attrs

from substrate.errors import InvalidArgument


@attrs.frozen(slots=True, kw_only=True)
class TagCacheEntry:
    """One cached tag snapshot, as the node last saw it."""

    key: str
    """Identifies the entry (its directory)."""
    size: int
    """Bytes on disk."""
    last_used: float
    """When a start last used it (any clock, as long as all entries share it)."""
    in_use: bool = False
    """A start is filling it or restoring from it now."""


def tag_cache_victims(entries: list[TagCacheEntry], max_bytes: int) -> list[TagCacheEntry]:
    """The entries to remove so that the cache fits ``max_bytes``, oldest use first.

    ``max_bytes`` 0 means no limit (nothing is removed). Entries in use are never chosen,
    so the cache may stay over the limit while they are used; then every entry not in use
    is chosen. Ties in ``last_used`` go by ``key``, so the choice is deterministic.
    Raises :class:`InvalidArgument` for a negative limit or size.
    """
    if max_bytes < 0:
        raise InvalidArgument(f"the tag cache limit must be >= 0 bytes, got {max_bytes}")
    if any(e.size < 0 for e in entries):
        raise InvalidArgument("a tag cache entry cannot have a negative size")
    if max_bytes == 0:
        return []
    total = sum(e.size for e in entries)
    victims: list[TagCacheEntry] = []
    for entry in sorted(entries, key=lambda e: (e.last_used, e.key)):
        if total <= max_bytes:
            break
        if entry.in_use:
            continue
        victims.append(entry)
        total -= entry.size
    return victims


__all__ = ["TagCacheEntry", "tag_cache_victims"]
