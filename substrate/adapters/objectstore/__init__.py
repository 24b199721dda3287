"""Object storage adapters (obstore): the BlobStore port by URL, and ateapi's snapshot objects."""

from substrate.adapters.objectstore.blobstore import ObstoreBlobStore, translate_error
from substrate.adapters.objectstore.factory import (
    BlobStores,
    ObjectStoreOptions,
    open_blobstore,
    options_from_env,
    split_uri,
)
from substrate.adapters.objectstore.snapshots import ObstoreSnapshotObjects

__all__ = [
    "BlobStores",
    "ObjectStoreOptions",
    "ObstoreBlobStore",
    "ObstoreSnapshotObjects",
    "open_blobstore",
    "options_from_env",
    "split_uri",
    "translate_error",
]
