"""Object storage adapters (obstore): snapshot copies and deletions for ateapi."""

from substrate.adapters.objectstore.snapshots import ObstoreSnapshotObjects

__all__ = ["ObstoreSnapshotObjects"]
