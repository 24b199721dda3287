"""Snapshot transfer: a local checkpoint directory to a BlobStore and back (anyio shell).

Upload (:func:`upload_snapshot`) compresses each regular file of the checkpoint directory
with zstd in a worker thread, uploads the ``<name>.zstd`` objects in parallel and writes
``manifest.json`` LAST, so a prefix is committed exactly when its manifest exists.
Download (:func:`download_snapshot`) reads the manifest FIRST, then fetches and
decompresses every listed file in parallel into the restore directory, verifying size and
sha256 and renaming each file into place only once it is complete and correct.

Neither function retries: a failed upload raises and leaves the prefix uncommitted (no
manifest), so the caller keeps the local checkpoint COMPLETED and the durable copy
PENDING and calls :func:`upload_snapshot` again later (it is idempotent: a retry uploads
everything again and commits). Deadlines are the caller's: wrap a call in
``anyio.fail_after``; cancellation stops the transfer promptly (compression checks for
it between chunks) and removes temporary files.

Errors: :class:`InvalidArgument` for bad arguments or a file name the manifest cannot
hold; :class:`FailedPrecondition` when the local checkpoint directory is missing;
:class:`NotFound` when downloading a prefix that is not committed; an :class:`Internal`
built by :func:`corrupt` (see :func:`is_corrupt`) when a committed snapshot does not match
its manifest; :class:`ResourceExhausted` when the local disk is full; :class:`Internal` for
other local I/O errors; the store's :class:`Unavailable`, :class:`PermissionDenied` and
:class:`Unauthenticated` pass through unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import io
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, Final

import anyio
import anyio.from_thread
import anyio.to_thread
import attrs
import structlog
import zstandard

from substrate.core.model import Fidelity
from substrate.errors import (
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SubstrateError,
)
from substrate.snapshot.layout import manifest_key, object_key, validate_file_name
from substrate.snapshot.manifest import Asset, Manifest, ManifestFile
from substrate.snapshot.ports import BlobStore

_log = structlog.get_logger("substrate.snapshots")

MIB: Final = 1 << 20
DEFAULT_CONCURRENCY: Final = 4
"""Files compressed/uploaded (or downloaded/decompressed) at once."""
DEFAULT_LEVEL: Final = 3
"""zstd level; runsc images are already compressed, so higher levels buy little."""
DEFAULT_THREADS: Final = 2
"""zstd worker threads per file (``-T2``); 0 compresses on the calling worker thread."""
INLINE_MAX: Final = 8 * MIB
"""Files up to this size are compressed into memory and put whole; larger files go
through a compressed temporary file and a streamed (multipart) upload, and are downloaded
to a temporary file before decompression, so no large file is held in memory."""
IO_CHUNK: Final = 1 * MIB
"""Read size while hashing, compressing and decompressing."""
LEVEL_MIN: Final = -7
LEVEL_MAX: Final = 22


CORRUPT: Final = "snapshot corrupt"
"""Start of the description of the :class:`Internal` raised for a corrupt snapshot."""


def corrupt(detail: str) -> Internal:
    """The error for a committed snapshot that does not match its manifest.

    substrate.errors has no DATA_LOSS class, so this is an :class:`Internal` (gRPC
    INTERNAL) whose description starts with :data:`CORRUPT`; :func:`is_corrupt` tells it
    apart from other internal errors. Raised when ``manifest.json`` does not parse, a
    listed object is missing, an object is not valid zstd, or the decompressed bytes
    differ from the recorded size or sha256. Retrying cannot help: this durable copy is
    lost (restore from another copy, or cold boot).
    """
    return Internal(f"{CORRUPT}: {detail}")


def is_corrupt(error: BaseException) -> bool:
    """True for the error :func:`corrupt` builds."""
    return isinstance(error, Internal) and error.description.startswith(CORRUPT + ":")


@attrs.frozen(slots=True)
class _LocalFile:
    name: str
    path: Path
    size: int


# --- helpers ----------------------------------------------------------------------------


def _check_tuning(concurrency: int, level: int | None = None, threads: int | None = None) -> None:
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InvalidArgument(f"concurrency must be a positive integer, not {concurrency!r}")
    if level is not None and not LEVEL_MIN <= level <= LEVEL_MAX:
        raise InvalidArgument(f"zstd level must be between {LEVEL_MIN} and {LEVEL_MAX}")
    if threads is not None and threads < 0:
        raise InvalidArgument("zstd threads must be >= 0")


def _local_error(exc: OSError, what: str) -> SubstrateError:
    if exc.errno in {errno.ENOSPC, errno.EDQUOT}:
        return ResourceExhausted(f"local disk full while {what}: {exc}")
    return Internal(f"local I/O failed while {what}: {exc}")


async def _run_all(jobs: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """Run ``jobs`` concurrently; the first failure cancels the rest and is raised alone."""
    failures: list[Exception] = []
    async with anyio.create_task_group() as tg:

        async def guarded(job: Callable[[], Awaitable[None]]) -> None:
            try:
                await job()
            except Exception as exc:
                failures.append(exc)
                tg.cancel_scope.cancel()

        for job in jobs:
            tg.start_soon(guarded, job)
    if failures:
        raise failures[0]


async def _remove_tree(path: Path) -> None:
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(path, ignore_errors=True))


def _scan(local_dir: Path) -> list[_LocalFile]:
    """The regular files of ``local_dir`` (symlinks, directories and others skipped)."""
    if not local_dir.is_dir():
        raise FailedPrecondition(f"local checkpoint directory {str(local_dir)!r} does not exist")
    found: list[_LocalFile] = []
    with os.scandir(local_dir) as entries:
        for entry in entries:
            if not entry.is_file(follow_symlinks=False):
                continue
            validate_file_name(entry.name)
            size = entry.stat(follow_symlinks=False).st_size
            found.append(_LocalFile(entry.name, Path(entry.path), size))
    return sorted(found, key=lambda f: f.name)


def _compress(source: _LocalFile, out: BinaryIO, level: int, threads: int) -> ManifestFile:
    """Stream ``source`` through zstd into ``out``; size and sha256 of the input."""
    digest = hashlib.sha256()
    size = 0
    compressor = zstandard.ZstdCompressor(level=level, threads=threads)
    with (
        source.path.open("rb") as src,
        compressor.stream_writer(out, closefd=False) as writer,
    ):
        while chunk := src.read(IO_CHUNK):
            anyio.from_thread.check_cancelled()
            digest.update(chunk)
            size += len(chunk)
            writer.write(chunk)
    return ManifestFile(name=source.name, size=size, sha256=digest.hexdigest())


def _compress_to_bytes(source: _LocalFile, level: int, threads: int) -> tuple[bytes, ManifestFile]:
    buffer = io.BytesIO()
    record = _compress(source, buffer, level, threads)
    return buffer.getvalue(), record


def _compress_to_file(
    source: _LocalFile, target: Path, level: int, threads: int
) -> tuple[int, ManifestFile]:
    with target.open("wb") as out:
        record = _compress(source, out, level, threads)
        return out.tell(), record


def _decompress_into(src: BinaryIO, expected: ManifestFile, dest_dir: Path, where: str) -> None:
    """Decompress ``src`` into ``dest_dir/<name>`` atomically, verifying size and sha256."""
    fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=f".{expected.name}.", suffix=".part")
    try:
        digest = hashlib.sha256()
        size = 0
        reader = zstandard.ZstdDecompressor().stream_reader(src, read_size=IO_CHUNK, closefd=False)
        with os.fdopen(fd, "wb") as out, reader:
            while True:
                anyio.from_thread.check_cancelled()
                chunk = reader.read(IO_CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if size > expected.size:
                    raise corrupt(
                        f"{where}: decompresses to more than the {expected.size} bytes "
                        "the manifest records"
                    )
                digest.update(chunk)
                out.write(chunk)
        if size != expected.size:
            raise corrupt(
                f"{where}: decompressed to {size} bytes, the manifest records {expected.size}"
            )
        if digest.hexdigest() != expected.sha256:
            raise corrupt(f"{where}: sha256 does not match the manifest")
        os.replace(tmp, dest_dir / expected.name)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, zstandard.ZstdError):
            raise corrupt(f"{where}: not valid zstd data ({exc})") from exc
        raise


def _decompress_bytes(data: bytes, expected: ManifestFile, dest_dir: Path, where: str) -> None:
    _decompress_into(io.BytesIO(data), expected, dest_dir, where)


def _decompress_file(source: Path, expected: ManifestFile, dest_dir: Path, where: str) -> None:
    try:
        with source.open("rb") as src:
            _decompress_into(src, expected, dest_dir, where)
    finally:
        with contextlib.suppress(OSError):
            source.unlink()


# --- upload -----------------------------------------------------------------------------


async def upload_snapshot(
    store: BlobStore,
    prefix: str,
    local_dir: Path,
    *,
    sandbox_class: str,
    runtime_version: str = "",
    assets: Mapping[str, Asset] | None = None,
    fidelity: Fidelity = Fidelity.MEMORY,
    created_at: float = 0.0,
    concurrency: int = DEFAULT_CONCURRENCY,
    level: int = DEFAULT_LEVEL,
    threads: int = DEFAULT_THREADS,
    scratch_dir: Path | None = None,
) -> Manifest:
    """Upload the checkpoint in ``local_dir`` under ``prefix`` and commit it; the manifest.

    Every regular file directly in ``local_dir`` (symlinks and subdirectories are skipped;
    each name must pass :func:`~substrate.snapshot.layout.validate_file_name`) is
    compressed with zstd at ``level`` using ``threads`` zstd threads and stored as
    ``<prefix><name>.zstd``, up to ``concurrency`` files at a time. Only when every file
    is stored is ``<prefix>manifest.json`` written, recording the uncompressed size and
    sha256 of each file plus the given manifest fields. An existing manifest under
    ``prefix`` is deleted first, so the prefix is never committed while its files are
    being replaced.

    On any failure the first error is raised, the other transfers are cancelled and no
    manifest is written (:func:`snapshot_committed` is false); objects already uploaded
    stay until the next attempt overwrites them or the prefix is deleted. ``local_dir``
    is only read, never changed. Files larger than :data:`INLINE_MAX` are compressed into
    a temporary directory under ``scratch_dir`` (default: the system temporary
    directory), which is removed afterwards.
    """
    _check_tuning(concurrency, level, threads)
    commit_key = manifest_key(prefix)
    # Validate the manifest fields before touching the store.
    template = Manifest(
        sandbox_class=sandbox_class,
        runtime_version=runtime_version,
        assets=dict(assets or {}),
        fidelity=fidelity,
        created_at=created_at,
    )
    source_dir = Path(local_dir)
    try:
        files = await anyio.to_thread.run_sync(_scan, source_dir)
    except OSError as exc:
        raise _local_error(exc, f"listing {str(source_dir)!r}") from exc
    started = time.monotonic()
    await store.delete(commit_key)

    records: dict[str, ManifestFile] = {}
    stored_bytes: dict[str, int] = {}
    limiter = anyio.CapacityLimiter(concurrency)
    scratch: Path | None = None
    if any(f.size > INLINE_MAX for f in files):
        try:
            scratch = Path(
                await anyio.to_thread.run_sync(
                    lambda: tempfile.mkdtemp(prefix=".snapshot-upload-", dir=scratch_dir)
                )
            )
        except OSError as exc:
            raise _local_error(exc, "creating a scratch directory") from exc

    async def upload_one(source: _LocalFile) -> None:
        key = object_key(prefix, source.name)
        async with limiter:
            try:
                if scratch is None or source.size <= INLINE_MAX:
                    data, record = await anyio.to_thread.run_sync(
                        _compress_to_bytes, source, level, threads
                    )
                    await store.put(key, data)
                    stored_bytes[source.name] = len(data)
                else:
                    staged = scratch / f"{source.name}.zstd"
                    size, record = await anyio.to_thread.run_sync(
                        _compress_to_file, source, staged, level, threads
                    )
                    await store.put_file(key, staged)
                    await anyio.to_thread.run_sync(staged.unlink)
                    stored_bytes[source.name] = size
            except OSError as exc:
                raise _local_error(exc, f"compressing {str(source.path)!r}") from exc
        records[source.name] = record

    try:
        await _run_all([functools.partial(upload_one, f) for f in files])
    finally:
        if scratch is not None:
            await _remove_tree(scratch)

    manifest = attrs.evolve(template, files=[records[f.name] for f in files])
    await store.put(commit_key, manifest.to_bytes())
    _log.info(
        "snapshot.uploaded",
        prefix=prefix,
        files=len(files),
        bytes=manifest.total_size,
        stored_bytes=sum(stored_bytes.values()),
        seconds=round(time.monotonic() - started, 3),
    )
    return manifest


# --- download ---------------------------------------------------------------------------


async def read_manifest(store: BlobStore, prefix: str) -> Manifest:
    """The committed manifest under ``prefix``.

    Raises :class:`NotFound` if the snapshot is not committed (no ``manifest.json``) and
    :func:`corrupt` (an :class:`Internal`) if the manifest does not parse.
    """
    key = manifest_key(prefix)
    try:
        raw = await store.get(key)
    except NotFound as exc:
        raise NotFound(f"no committed snapshot under {prefix!r}: {key!r} does not exist") from exc
    try:
        return Manifest.from_bytes(raw)
    except InvalidArgument as exc:
        raise corrupt(f"{key!r} is not a valid manifest: {exc.description}") from exc


async def download_snapshot(
    store: BlobStore,
    prefix: str,
    dest_dir: Path,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> Manifest:
    """Restore the committed snapshot under ``prefix`` into ``dest_dir``; its manifest.

    Reads ``manifest.json`` first (:class:`NotFound` if the snapshot is not committed),
    then downloads every listed ``<name>.zstd`` (up to ``concurrency`` at a time) and
    decompresses it to ``dest_dir/<name>`` (``dest_dir`` is created if missing). Each file
    is written to a temporary file, checked against the manifest's size and sha256 and
    only then renamed into place, so ``dest_dir`` never holds a partial or unverified
    file under a listed name. Other files in ``dest_dir`` are left alone.

    On failure the first error is raised and the other downloads are cancelled; files
    already renamed into place stay (verified, but the set is incomplete), so the caller
    should discard ``dest_dir``. A listed object that is missing, not valid zstd or does
    not match the manifest raises :func:`corrupt` (an :class:`Internal`).
    """
    _check_tuning(concurrency)
    manifest = await read_manifest(store, prefix)
    dest = Path(dest_dir)
    try:
        await anyio.to_thread.run_sync(lambda: dest.mkdir(parents=True, exist_ok=True))
    except OSError as exc:
        raise _local_error(exc, f"creating {str(dest)!r}") from exc
    limiter = anyio.CapacityLimiter(concurrency)
    started = time.monotonic()

    async def download_one(entry: ManifestFile) -> None:
        key = object_key(prefix, entry.name)
        async with limiter:
            try:
                if entry.size <= INLINE_MAX:
                    data = await store.get(key)
                    await anyio.to_thread.run_sync(_decompress_bytes, data, entry, dest, key)
                else:
                    # Unique within ``dest``: manifest names are unique.
                    staged = dest / f".{entry.name}.zstd.download"
                    try:
                        await store.get_to_file(key, staged)
                        await anyio.to_thread.run_sync(_decompress_file, staged, entry, dest, key)
                    finally:
                        with contextlib.suppress(OSError):
                            staged.unlink()
            except NotFound as exc:
                raise corrupt(
                    f"snapshot under {prefix!r} lists {entry.name!r} but {key!r} is missing"
                ) from exc
            except OSError as exc:
                raise _local_error(exc, f"restoring {entry.name!r} into {str(dest)!r}") from exc

    await _run_all([functools.partial(download_one, e) for e in manifest.files])
    _log.info(
        "snapshot.downloaded",
        prefix=prefix,
        files=len(manifest.files),
        bytes=manifest.total_size,
        seconds=round(time.monotonic() - started, 3),
    )
    return manifest


async def snapshot_committed(store: BlobStore, prefix: str) -> bool:
    """True if ``prefix`` holds a committed snapshot (its ``manifest.json`` exists).

    Store trouble raises (:class:`Unavailable`) rather than answering false.
    """
    try:
        await store.head(manifest_key(prefix))
    except NotFound:
        return False
    return True


__all__ = [
    "CORRUPT",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_LEVEL",
    "DEFAULT_THREADS",
    "INLINE_MAX",
    "corrupt",
    "download_snapshot",
    "is_corrupt",
    "read_manifest",
    "snapshot_committed",
    "upload_snapshot",
]
