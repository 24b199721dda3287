"""ateapi's SnapshotObjects over obstore: copy a snapshot prefix for a tag, delete one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import obstore
from obstore.store import from_url

from substrate.errors import InvalidArgument, NotFound, Unavailable

MANIFEST = "manifest.json"


def _split(uri: str) -> tuple[str, str]:
    """``scheme://authority/path`` → (store root URL, key prefix without leading slash)."""
    parts = urlsplit(uri)
    if not parts.scheme:
        raise InvalidArgument(f"snapshot location {uri!r} has no scheme")
    if parts.scheme == "file":
        return "file:///", parts.path.lstrip("/")
    return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")


class ObstoreSnapshotObjects:
    """Implements ``SnapshotObjects`` for ``file://``, ``memory://``, ``s3://`` and ``gs://``.

    One obstore store is opened per (scheme, bucket); ``options`` are passed to
    ``obstore.store.from_url`` (S3 endpoint, region, credentials, path-style, ...).
    ``memory://`` stores live in this process only (tests).
    """

    def __init__(
        self,
        options: dict[str, Any] | None = None,
        *,
        opener: Callable[..., Any] = from_url,
    ) -> None:
        self._options = options or {}
        self._opener = opener
        self._stores: dict[str, Any] = {}

    def store_for(self, root: str) -> Any:
        store = self._stores.get(root)
        if store is None:
            options = {} if root.startswith(("file:", "memory:")) else self._options
            store = self._opener(root, **options)
            self._stores[root] = store
        return store

    async def _keys(self, store: Any, prefix: str) -> list[str]:
        keys: list[str] = []
        try:
            async for batch in obstore.list(store, prefix=prefix):
                keys.extend(str(meta["path"]) for meta in batch)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise Unavailable(f"object store unreachable listing {prefix!r}: {exc}") from exc
        return keys

    async def copy_prefix(self, src: str, dst: str) -> None:
        src_root, src_key = _split(src)
        dst_root, dst_key = _split(dst)
        if src_root != dst_root:
            raise InvalidArgument("a snapshot can only be copied within one object store")
        store = self.store_for(src_root)
        src_key = src_key.rstrip("/") + "/"
        dst_key = dst_key.rstrip("/") + "/"
        keys = await self._keys(store, src_key)
        if not any(k.endswith("/" + MANIFEST) or k == src_key + MANIFEST for k in keys):
            raise NotFound(f"no committed snapshot (manifest.json) under {src}")
        ordered = sorted(keys, key=lambda k: k.endswith(MANIFEST))  # the manifest last
        try:
            for key in ordered:
                await obstore.copy_async(store, key, dst_key + key[len(src_key) :])
        except Exception as exc:
            raise Unavailable(f"object store copy failed: {exc}") from exc

    async def delete_prefix(self, uri: str) -> None:
        root, key = _split(uri)
        store = self.store_for(root)
        prefix = key.rstrip("/") + "/"
        keys = await self._keys(store, prefix)
        # The manifest first, so a half-deleted snapshot is never taken for a committed one.
        ordered = sorted(keys, key=lambda k: not k.endswith(MANIFEST))
        try:
            for k in ordered:
                await obstore.delete_async(store, k)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise Unavailable(f"object store delete failed: {exc}") from exc


__all__ = ["ObstoreSnapshotObjects"]
