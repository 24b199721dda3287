"""``ObstoreBlobStore``: the :class:`~substrate.snapshot.ports.BlobStore` port over obstore.

Wraps any obstore store (``MemoryStore``, ``LocalStore``, ``S3Store``, ``GCSStore``) and
translates obstore's errors into :mod:`substrate.errors` (see :func:`translate_error`).
Stores are usually opened by URL with
:func:`substrate.adapters.objectstore.factory.open_blobstore`.

obstore's async calls run on its own Tokio runtime and complete through asyncio futures,
so this adapter needs the asyncio backend of anyio (trio is not supported).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

import anyio
import anyio.to_thread
import obstore
from obstore.exceptions import (
    BaseError,
    InvalidPathError,
    NotSupportedError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnknownConfigurationKeyError,
)
from obstore.store import LocalStore

from substrate.errors import (
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    SubstrateError,
    Unauthenticated,
    Unavailable,
)
from substrate.snapshot.ports import normalize_prefix, validate_key

if TYPE_CHECKING:
    from obstore.store import ObjectStore

T = TypeVar("T")

MIB: Final = 1 << 20
DEFAULT_CHUNK_SIZE: Final = 8 * MIB
"""Part size of multipart uploads (S3's minimum part is 5 MiB)."""
DEFAULT_PART_CONCURRENCY: Final = 4
"""Parts of one multipart upload in flight at once."""
DEFAULT_READ_CHUNK: Final = 8 * MIB
"""Chunk size of streamed downloads (:meth:`ObstoreBlobStore.get_to_file`)."""
_DETAIL_MAX: Final = 300

_WRITES: Final = frozenset({"put", "put_file"})


def _detail(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= _DETAIL_MAX else text[:_DETAIL_MAX] + "..."


def translate_error(exc: Exception, *, op: str, key: str, store: str) -> SubstrateError:
    """The substrate error for an obstore failure of ``op`` on ``key``.

    * a missing object (``FileNotFoundError``) → :class:`NotFound`, except on a write,
      where it can only mean a missing bucket → :class:`Unavailable`;
    * an S3 ``NoSuchBucket`` answer → :class:`Unavailable` (the store is misconfigured,
      not the object missing);
    * invalid paths and configuration (``ValueError``, ``InvalidPathError``,
      ``UnknownConfigurationKeyError``) → :class:`InvalidArgument`;
    * refused credentials → :class:`PermissionDenied` / :class:`Unauthenticated`;
    * an operation the store does not support → :class:`Internal`;
    * everything else (connection refused, DNS, timeouts after retries, 5xx, local I/O
      errors inside the store) → :class:`Unavailable`.
    """
    if isinstance(exc, SubstrateError):
        return exc
    detail = _detail(exc)
    if "NoSuchBucket" in str(exc):
        return Unavailable(f"object store {store}: the bucket does not exist ({op} {key!r})")
    if isinstance(exc, FileNotFoundError):
        if op in _WRITES:
            return Unavailable(f"object store {store} cannot write {key!r}: {detail}")
        return NotFound(f"object {key!r} not found in {store}")
    if isinstance(exc, PermissionDeniedError):
        return PermissionDenied(f"object store {store} denied {op} {key!r}: {detail}")
    if isinstance(exc, UnauthenticatedError):
        return Unauthenticated(f"object store {store} rejected the credentials: {detail}")
    if isinstance(exc, InvalidPathError | UnknownConfigurationKeyError | ValueError):
        return InvalidArgument(f"object store {store} rejected {op} {key!r}: {detail}")
    if isinstance(exc, NotSupportedError):
        return Internal(f"object store {store} does not support {op}: {detail}")
    return Unavailable(f"object store {store} failed {op} {key!r}: {detail}")


_TRANSLATED: Final = (BaseError, OSError, TimeoutError, ValueError)
"""Exceptions obstore raises for store trouble; anything else is a bug and propagates."""


class ObstoreBlobStore:
    """A :class:`~substrate.snapshot.ports.BlobStore` over one obstore store.

    ``prefix`` (a key prefix, ``""`` for none) is prepended to every key and stripped from
    listings, so keys stay relative to the root the store was opened on. ``name`` appears
    in error messages (the URL, usually; never credentials). Uploads of more than
    ``chunk_size`` bytes are multipart with ``part_concurrency`` parts in flight.

    On a ``LocalStore`` with a directory prefix, :meth:`put_file` and :meth:`get_to_file`
    copy files directly (``shutil.copyfile``, i.e. ``sendfile``) into/out of the store's
    directory, with the same temporary-file-and-rename atomicity; streaming the bytes
    through obstore's async interface is several times slower for local files.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        prefix: str = "",
        name: str = "",
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        part_concurrency: int = DEFAULT_PART_CONCURRENCY,
        read_chunk_size: int = DEFAULT_READ_CHUNK,
    ) -> None:
        if chunk_size < 5 * MIB:
            raise InvalidArgument("multipart chunk size must be at least 5 MiB")
        if part_concurrency < 1 or read_chunk_size < 1:
            raise InvalidArgument("part concurrency and read chunk size must be positive")
        self._store = store
        self._prefix = normalize_prefix(prefix)
        self.name = name or type(store).__name__
        self._chunk_size = chunk_size
        self._part_concurrency = part_concurrency
        self._read_chunk_size = read_chunk_size
        self._local_root: Path | None = None
        if isinstance(store, LocalStore) and store.prefix is not None:
            self._local_root = Path(store.prefix)

    def __repr__(self) -> str:
        return f"ObstoreBlobStore({self.name!r})"

    @property
    def raw(self) -> ObjectStore:
        """The wrapped obstore store (keys on it include :attr:`prefix`)."""
        return self._store

    @property
    def prefix(self) -> str:
        return self._prefix

    def _full(self, key: str) -> str:
        return self._prefix + validate_key(key)

    async def _call(self, op: str, key: str, make: Callable[[], Awaitable[T]]) -> T:
        try:
            return await make()
        except _TRANSLATED as exc:
            raise translate_error(exc, op=op, key=key, store=self.name) from exc

    async def _local_copy(
        self, op: str, key: str, copy: Callable[[Path, Path], None], source: Path, target: Path
    ) -> None:
        try:
            await anyio.to_thread.run_sync(copy, source, target)
        except _StoreSide as side:
            raise translate_error(side.error, op=op, key=key, store=self.name) from side.error

    async def put(self, key: str, data: bytes) -> None:
        full = self._full(key)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidArgument("object data must be bytes")
        await self._call(
            "put",
            key,
            lambda: obstore.put_async(
                self._store,
                full,
                data,
                chunk_size=self._chunk_size,
                max_concurrency=self._part_concurrency,
            ),
        )

    async def put_file(self, key: str, path: Path) -> None:
        full = self._full(key)
        source = Path(path)
        if not await anyio.to_thread.run_sync(source.is_file):
            raise InvalidArgument(
                f"local file {str(source)!r} does not exist or is not a regular file"
            )
        if self._local_root is not None:
            stored = self._local_root / full
            await self._local_copy("put_file", key, _copy_into_store, source, stored)
            return
        await self._call(
            "put_file",
            key,
            lambda: obstore.put_async(
                self._store,
                full,
                source,
                chunk_size=self._chunk_size,
                max_concurrency=self._part_concurrency,
            ),
        )

    async def get(self, key: str) -> bytes:
        full = self._full(key)

        async def fetch() -> bytes:
            result = await obstore.get_async(self._store, full)
            return bytes(await result.bytes_async())

        return await self._call("get", key, fetch)

    async def get_to_file(self, key: str, path: Path) -> None:
        full = self._full(key)
        target = Path(path)
        if self._local_root is not None:
            stored = self._local_root / full
            await self._local_copy("get", key, _copy_out_of_store, stored, target)
            return
        result = await self._call("get", key, lambda: obstore.get_async(self._store, full))
        chunks = result.stream(min_chunk_size=self._read_chunk_size)
        fd, tmp = await anyio.to_thread.run_sync(_temp_beside, target)
        try:
            with os.fdopen(fd, "wb") as out:
                async for chunk in self._translated(chunks, op="get", key=key):
                    await anyio.to_thread.run_sync(out.write, chunk)
            await anyio.to_thread.run_sync(os.replace, tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    async def _translated(
        self, chunks: AsyncIterator[bytes], *, op: str, key: str
    ) -> AsyncIterator[bytes]:
        iterator = aiter(chunks)
        while True:
            try:
                chunk = await anext(iterator)
            except StopAsyncIteration:
                return
            except _TRANSLATED as exc:
                raise translate_error(exc, op=op, key=key, store=self.name) from exc
            yield chunk

    async def head(self, key: str) -> int:
        full = self._full(key)
        meta = await self._call("head", key, lambda: obstore.head_async(self._store, full))
        return int(meta["size"])

    async def list(self, prefix: str = "") -> list[str]:
        full = self._prefix + normalize_prefix(prefix)

        async def collect() -> list[str]:
            stream = obstore.list(self._store, prefix=full or None, chunk_size=1000)
            paths: list[str] = []
            async for batch in stream:
                paths.extend(str(meta["path"]) for meta in batch)
            return paths

        paths = await self._call("list", prefix, collect)
        start = len(self._prefix)
        return sorted(p[start:] for p in paths if p.startswith(full))

    async def delete(self, key: str) -> None:
        full = self._full(key)
        try:
            await self._call("delete", key, lambda: obstore.delete_async(self._store, full))
        except NotFound:
            return

    async def copy(self, src: str, dst: str) -> None:
        full_src = self._full(src)
        full_dst = self._full(dst)
        await self._call(
            "copy",
            src,
            lambda: obstore.copy_async(self._store, full_src, full_dst, overwrite=True),
        )


def _temp_beside(path: Path) -> tuple[int, str]:
    return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")


class _StoreSide(Exception):
    """An OSError of the store's own directory (translated), not of the caller's file."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _copy_atomically(source: Path, target: Path, staging: Path, *, store_is_source: bool) -> None:
    """Copy ``source`` to ``staging`` and rename it over ``target``.

    OSErrors of the store's side are wrapped in :class:`_StoreSide`; the other side's
    (the caller's local file) propagate unchanged.
    """
    try:
        shutil.copyfile(source, staging)
        os.replace(staging, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(staging)
        if isinstance(exc, OSError):
            about_source = exc.filename == str(source)
            if about_source == store_is_source:
                raise _StoreSide(exc) from exc
        raise


def _copy_into_store(source: Path, target: Path) -> None:
    """Like LocalStore's own put: parents created, staged beside the target, renamed over it.

    The staging file is named ``<name>#<digits>`` as LocalStore's are, which its listings
    skip, so a concurrent ``list`` never shows a half-written object.
    """
    rng = random.Random()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        while True:
            staging = target.with_name(f"{target.name}#{rng.randrange(10**12)}")
            try:
                fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            os.close(fd)
            break
    except OSError as exc:
        raise _StoreSide(exc) from exc
    _copy_atomically(source, target, staging, store_is_source=False)


def _copy_out_of_store(source: Path, target: Path) -> None:
    if not source.is_file():
        raise _StoreSide(FileNotFoundError(2, "object does not exist", str(source)))
    fd, staging = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    os.close(fd)
    _copy_atomically(source, target, Path(staging), store_is_source=True)


__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_PART_CONCURRENCY",
    "DEFAULT_READ_CHUNK",
    "ObstoreBlobStore",
    "translate_error",
]
