"""ateapi's SnapshotObjects on the BlobStore port: copy a snapshot prefix for a tag, delete one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from substrate.adapters.objectstore.factory import BlobStores, ObjectStoreOptions
from substrate.errors import InvalidArgument, NotFound
from substrate.snapshot.layout import MANIFEST_NAME
from substrate.snapshot.ports import BlobStore

if TYPE_CHECKING:
    from obstore.store import ObjectStore

MANIFEST = MANIFEST_NAME


def _as_prefix(key: str) -> str:
    return key.rstrip("/") + "/" if key.strip("/") else ""


class ObstoreSnapshotObjects:
    """Implements ``SnapshotObjects`` for ``file://``, ``memory://``, ``s3://`` and ``gs://``.

    Stores are opened per root (scheme and bucket, see
    :class:`~substrate.adapters.objectstore.factory.BlobStores`) with ``options`` (S3
    endpoint, region, credentials, path-style, timeouts). ``memory://`` stores live in
    this object only (tests). Errors are those of the BlobStore port: :class:`NotFound`
    for a snapshot that was never committed, :class:`Unavailable` for store trouble.
    """

    def __init__(
        self,
        options: ObjectStoreOptions | None = None,
        *,
        stores: BlobStores | None = None,
    ) -> None:
        self._stores = stores if stores is not None else BlobStores(options)

    def store_for(self, root: str) -> ObjectStore:
        """The raw obstore store opened on ``root`` (e.g. ``memory://``), for tests and tools."""
        return self._stores.store(root).raw

    def _resolve(self, uri: str) -> tuple[BlobStore, str]:
        store, key = self._stores.resolve(uri)
        return store, _as_prefix(key)

    async def copy_prefix(self, src: str, dst: str) -> None:
        """Copy the committed snapshot at ``src`` to ``dst``, ``manifest.json`` last.

        Raises :class:`NotFound` if ``src`` has no manifest (an unfinished upload) and
        :class:`InvalidArgument` if the two prefixes are in different stores.
        """
        store, src_key = self._resolve(src)
        dst_store, dst_key = self._resolve(dst)
        if dst_store is not store:
            raise InvalidArgument("a snapshot can only be copied within one object store")
        if src_key == dst_key:
            raise InvalidArgument("a snapshot cannot be copied onto itself")
        manifest = src_key + MANIFEST
        keys = await store.list(src_key)
        if manifest not in keys:
            raise NotFound(f"no committed snapshot (manifest.json) under {src}")
        for key in keys:
            if key != manifest:
                await store.copy(key, dst_key + key[len(src_key) :])
        await store.copy(manifest, dst_key + MANIFEST)

    async def delete_prefix(self, uri: str) -> None:
        """Delete every object under ``uri``, ``manifest.json`` first; idempotent."""
        store, key = self._resolve(uri)
        if not key:
            raise InvalidArgument(f"refusing to delete the whole store at {uri!r}")
        keys = await store.list(key)
        # The manifest first, so a half-deleted snapshot is never taken for a committed one.
        for k in sorted(keys, key=lambda k: k != key + MANIFEST):
            await store.delete(k)


__all__ = ["ObstoreSnapshotObjects"]
