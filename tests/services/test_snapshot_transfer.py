"""Snapshot upload/download through every BlobStore kind: commit order, corruption, outages."""

from __future__ import annotations

import functools
import hashlib
import os
import random
from pathlib import Path

import anyio
import pytest
import zstandard

from substrate.adapters.memory import InMemoryBlobStore
from substrate.adapters.objectstore import open_blobstore, split_uri
from substrate.core.model import Fidelity
from substrate.errors import (
    FailedPrecondition,
    GrpcCode,
    Internal,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from substrate.services.snapshots import (
    INLINE_MAX,
    download_snapshot,
    is_corrupt,
    read_manifest,
    snapshot_committed,
    upload_snapshot,
)
from substrate.snapshot import Asset, Manifest, actor_snapshot_prefix, manifest_key, object_key
from substrate.snapshot.ports import BlobStore
from substrate.testing.contracts.blobstore import MakeBlobStore, names
from substrate.testing.s3 import S3Server
from tests.contracts.blob_fixtures import (
    BLOBSTORE_KINDS,
    blobstore_factory,
    shared_s3_server,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """obstore's async calls need asyncio."""
    return "asyncio"


@pytest.fixture(scope="session")
def s3_server(request: pytest.FixtureRequest) -> S3Server:
    return shared_s3_server(request)


@pytest.fixture(params=BLOBSTORE_KINDS)
def make_blobstore(request: pytest.FixtureRequest) -> MakeBlobStore:
    """A factory of fresh, empty stores of every adapter kind."""
    return blobstore_factory(request.param, request)


URI = actor_snapshot_prefix("s3://bucket/objects", "lab", "uid-1", "snap-1")
PREFIX = split_uri(URI, "s3://bucket/objects")[1]
"""``atespaces/lab/actors/uid-1/snapshots/snap-1/``: keys relative to the store root."""
SHA = "ab" * 32
MIB = 1 << 20


@functools.cache
def _files() -> dict[str, bytes]:
    rng = random.Random(42)
    text = "".join(f"{i} page {i * 7919 % 10007}\n" for i in range(120_000)).encode()
    return {
        "checkpoint.img": rng.randbytes(200_000),
        "pages_meta.img": text,  # compressible, below INLINE_MAX
        "empty.img": b"",
        # above INLINE_MAX: goes through a temporary file and a multipart upload
        "pages.img": rng.randbytes(7 * MIB) + text + rng.randbytes(123),
    }


def _write_checkpoint(directory: Path, files: dict[str, bytes]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


async def _upload(store: BlobStore, local: Path, **kwargs: object) -> Manifest:
    return await upload_snapshot(
        store,
        PREFIX,
        local,
        sandbox_class="gvisor",
        runtime_version="runsc-20250101",
        assets={"runsc": Asset(url="https://example.invalid/runsc", sha256=SHA)},
        fidelity=Fidelity.MEMORY,
        created_at=1_700_000_000.5,
        **kwargs,  # type: ignore[arg-type]
    )


_listing = names


async def test_round_trip(make_blobstore: MakeBlobStore, tmp_path: Path) -> None:
    files = _files()
    assert len(files["pages.img"]) > INLINE_MAX
    local = _write_checkpoint(tmp_path / "ckpt", files)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    async with make_blobstore() as store:
        manifest = await _upload(store, local, scratch_dir=scratch)

        assert manifest.file_names == tuple(sorted(files))
        for entry in manifest.files:
            assert entry.size == len(files[entry.name])
            assert entry.sha256 == hashlib.sha256(files[entry.name]).hexdigest()
        assert manifest.sandbox_class == "gvisor"
        assert manifest.runtime_version == "runsc-20250101"
        assert manifest.created_at == 1_700_000_000.5
        assert _listing(scratch) == []  # staging is cleaned up
        assert _listing(local) == sorted(files)  # the local checkpoint is untouched

        keys = await store.list(PREFIX)
        assert keys == sorted([manifest_key(PREFIX)] + [object_key(PREFIX, name) for name in files])
        assert await store.get(manifest_key(PREFIX)) == manifest.to_bytes()
        for name, data in files.items():
            stored = await store.get(object_key(PREFIX, name))
            assert zstandard.ZstdDecompressor().stream_reader(stored).read() == data
        text_stored = await store.head(object_key(PREFIX, "pages_meta.img"))
        assert text_stored < len(files["pages_meta.img"]) / 3  # text compresses well
        assert await snapshot_committed(store, PREFIX)

        restored = tmp_path / "restore" / "here"
        got = await download_snapshot(store, PREFIX, restored)
        assert got == manifest
        assert _listing(restored) == sorted(files)  # no temporary files left
        for name, data in files.items():
            assert (restored / name).read_bytes() == data
        assert await read_manifest(store, PREFIX) == manifest


async def test_manifest_is_written_last(tmp_path: Path) -> None:
    store = InMemoryBlobStore()
    local = _write_checkpoint(tmp_path / "ckpt", _files())
    await _upload(store, local, concurrency=2)
    writes = [(op, key) for op, key in store.history if op == "put"]
    assert writes[-1] == ("put", manifest_key(PREFIX))
    assert sorted(key for _, key in writes[:-1]) == sorted(object_key(PREFIX, n) for n in _files())
    # A re-upload un-commits first: the old manifest goes before any file is replaced.
    store.history.clear()
    await _upload(store, local)
    assert store.history[0] == ("delete", manifest_key(PREFIX))
    assert store.history[-1] == ("put", manifest_key(PREFIX))


class FailingStore:
    """Delegates to ``inner`` but fails writes of keys ending with ``fail_suffix``."""

    def __init__(self, inner: BlobStore, fail_suffix: str) -> None:
        self.inner = inner
        self.fail_suffix = fail_suffix
        self.armed = True

    def _check(self, key: str) -> None:
        if self.armed and key.endswith(self.fail_suffix):
            raise Unavailable(f"injected failure writing {key}")

    async def put(self, key: str, data: bytes) -> None:
        self._check(key)
        await self.inner.put(key, data)

    async def put_file(self, key: str, path: Path) -> None:
        self._check(key)
        await self.inner.put_file(key, path)

    async def get(self, key: str) -> bytes:
        return await self.inner.get(key)

    async def get_to_file(self, key: str, path: Path) -> None:
        await self.inner.get_to_file(key, path)

    async def head(self, key: str) -> int:
        return await self.inner.head(key)

    async def list(self, prefix: str = "") -> list[str]:
        return await self.inner.list(prefix)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def copy(self, src: str, dst: str) -> None:
        await self.inner.copy(src, dst)


@pytest.mark.parametrize("failing", ["pages.img.zstd", "empty.img.zstd"])
async def test_failure_mid_upload_commits_nothing(
    make_blobstore: MakeBlobStore, tmp_path: Path, failing: str
) -> None:
    local = _write_checkpoint(tmp_path / "ckpt", _files())
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    async with make_blobstore() as inner:
        store = FailingStore(inner, failing)
        with pytest.raises(Unavailable, match="injected"):
            await _upload(store, local, scratch_dir=scratch)
        assert not await snapshot_committed(store, PREFIX)
        assert manifest_key(PREFIX) not in await store.list(PREFIX)
        with pytest.raises(NotFound, match="no committed snapshot"):
            await download_snapshot(store, PREFIX, tmp_path / "restore")
        assert _listing(scratch) == []
        assert _listing(local) == sorted(_files())  # the local checkpoint is kept
        # The retry (the store is back) commits.
        store.armed = False
        manifest = await _upload(store, local, scratch_dir=scratch)
        assert await snapshot_committed(store, PREFIX)
        await download_snapshot(store, PREFIX, tmp_path / "restore")
        assert _listing(tmp_path / "restore") == sorted(manifest.file_names)


async def test_download_of_uncommitted_prefix_is_not_found(
    make_blobstore: MakeBlobStore, tmp_path: Path
) -> None:
    async with make_blobstore() as store:
        assert not await snapshot_committed(store, PREFIX)
        with pytest.raises(NotFound, match="no committed snapshot"):
            await download_snapshot(store, PREFIX, tmp_path / "r")
        await store.put(object_key(PREFIX, "pages.img"), b"orphan data object")
        with pytest.raises(NotFound):
            await download_snapshot(store, PREFIX, tmp_path / "r")
        assert not await snapshot_committed(store, PREFIX)


async def _committed(tmp_path: Path) -> tuple[InMemoryBlobStore, Manifest]:
    store = InMemoryBlobStore()
    local = _write_checkpoint(tmp_path / "ckpt", _files())
    return store, await _upload(store, local)


async def test_sha256_mismatch_is_detected(tmp_path: Path) -> None:
    store, _ = await _committed(tmp_path)
    original = _files()["checkpoint.img"]
    tampered = bytes([original[0] ^ 1]) + original[1:]  # same size, different content
    store.objects[object_key(PREFIX, "checkpoint.img")] = zstandard.compress(tampered)
    restored = tmp_path / "restore"
    with pytest.raises(Internal, match="sha256") as caught:
        await download_snapshot(store, PREFIX, restored)
    assert is_corrupt(caught.value)
    assert caught.value.code is GrpcCode.INTERNAL
    assert "checkpoint.img" not in _listing(restored)
    assert not [n for n in _listing(restored) if n.endswith(".part")]


async def test_sha256_mismatch_of_a_large_file_is_detected(tmp_path: Path) -> None:
    store, _ = await _committed(tmp_path)
    original = _files()["pages.img"]
    tampered = original[:-1] + bytes([original[-1] ^ 0xFF])
    store.objects[object_key(PREFIX, "pages.img")] = zstandard.compress(tampered)
    restored = tmp_path / "restore"
    with pytest.raises(Internal, match="sha256"):
        await download_snapshot(store, PREFIX, restored)
    assert "pages.img" not in _listing(restored)
    assert not [n for n in _listing(restored) if n.startswith(".")]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (zstandard.compress(b"short"), "decompressed to 5 bytes"),
        (zstandard.compress(b"x" * 300_000), "more than"),
        (b"definitely not zstd", "not valid zstd"),
        (zstandard.compress(b"y" * 200_000)[:-20], "decompressed to"),  # truncated
    ],
    ids=["short", "long", "garbage", "truncated"],
)
async def test_damaged_objects_are_corrupt(tmp_path: Path, data: bytes, match: str) -> None:
    store, _ = await _committed(tmp_path)
    store.objects[object_key(PREFIX, "checkpoint.img")] = data
    with pytest.raises(Internal, match=match) as caught:
        await download_snapshot(store, PREFIX, tmp_path / "restore")
    assert is_corrupt(caught.value)


async def test_missing_object_and_bad_manifest_are_corrupt(tmp_path: Path) -> None:
    store, _ = await _committed(tmp_path)
    del store.objects[object_key(PREFIX, "empty.img")]
    with pytest.raises(Internal, match="missing") as caught:
        await download_snapshot(store, PREFIX, tmp_path / "r1")
    assert is_corrupt(caught.value)
    store.objects[manifest_key(PREFIX)] = b'{"formatVersion": 1'
    with pytest.raises(Internal, match="not a valid manifest") as caught:
        await download_snapshot(store, PREFIX, tmp_path / "r2")
    assert is_corrupt(caught.value)
    assert not is_corrupt(Internal("local I/O failed"))


async def test_store_outages(tmp_path: Path) -> None:
    store, _ = await _committed(tmp_path)
    store.down = True
    with pytest.raises(Unavailable):
        await download_snapshot(store, PREFIX, tmp_path / "r")
    with pytest.raises(Unavailable):
        await snapshot_committed(store, PREFIX)
    with pytest.raises(Unavailable):
        await _upload(store, tmp_path / "ckpt")
    store.down = False
    store.blackhole = True
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.2):
            await download_snapshot(store, PREFIX, tmp_path / "r")
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.2):
            await _upload(store, tmp_path / "ckpt")
    store.blackhole = False
    # The hung re-upload never got past its first call: the old commit is intact.
    assert await snapshot_committed(store, PREFIX)
    assert len((await download_snapshot(store, PREFIX, tmp_path / "r2")).files) == 4


class HangingStore(FailingStore):
    """Hangs (until cancelled) on the streamed upload of ``fail_suffix``."""

    def __init__(self, inner: BlobStore, fail_suffix: str) -> None:
        super().__init__(inner, fail_suffix)
        self.hanging = anyio.Event()

    async def put_file(self, key: str, path: Path) -> None:
        if key.endswith(self.fail_suffix):
            self.hanging.set()
            await anyio.sleep_forever()
        await self.inner.put_file(key, path)


async def test_cancelled_upload_commits_nothing_and_cleans_up(tmp_path: Path) -> None:
    inner = InMemoryBlobStore()
    store = HangingStore(inner, "pages.img.zstd")
    local = _write_checkpoint(tmp_path / "ckpt", _files())
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _upload(store, local, scratch_dir=scratch))
            await store.hanging.wait()
            tg.cancel_scope.cancel()
    assert _listing(scratch) == []
    assert not await snapshot_committed(store, PREFIX)
    assert _listing(local) == sorted(_files())


async def test_bad_inputs(tmp_path: Path) -> None:
    store = InMemoryBlobStore()
    with pytest.raises(FailedPrecondition, match="does not exist"):
        await _upload(store, tmp_path / "missing")
    local = _write_checkpoint(tmp_path / "ckpt", {"ok.img": b"1"})
    for kwargs in ({"concurrency": 0}, {"level": 99}, {"threads": -1}):
        with pytest.raises(InvalidArgument):
            await _upload(store, local, **kwargs)
    with pytest.raises(InvalidArgument):
        await upload_snapshot(store, PREFIX, local, sandbox_class="")
    with pytest.raises(InvalidArgument):
        await download_snapshot(store, PREFIX, tmp_path / "r", concurrency=0)
    (local / "bad name.img").write_bytes(b"2")
    with pytest.raises(InvalidArgument, match="bad name"):
        await _upload(store, local)
    assert store.objects == {}  # nothing was sent


async def test_only_regular_files_are_uploaded(tmp_path: Path) -> None:
    store = InMemoryBlobStore()
    local = _write_checkpoint(tmp_path / "ckpt", {"a.img": b"a", "b.img": b"bb"})
    (local / "subdir").mkdir()
    (local / "subdir" / "inner").write_bytes(b"x")
    os.symlink(local / "a.img", local / "link.img")
    manifest = await _upload(store, local)
    assert manifest.file_names == ("a.img", "b.img")
    empty = _write_checkpoint(tmp_path / "empty", {})
    manifest = await upload_snapshot(store, "x/y/", empty, sandbox_class="gvisor")
    assert manifest.files == ()
    assert (await download_snapshot(store, "x/y", tmp_path / "r")).files == ()


async def test_file_store_keys_match_the_layout(tmp_path: Path) -> None:
    objects = tmp_path / "objects"
    store = open_blobstore(f"file://{objects}")
    local = _write_checkpoint(tmp_path / "ckpt", {"pages.img": b"p" * 1000})
    await _upload(store, local)
    snapshot_dir = objects / PREFIX
    assert _listing(snapshot_dir) == ["manifest.json", "pages.img.zstd"]
    await store.delete(manifest_key(PREFIX))
    await store.delete(object_key(PREFIX, "pages.img"))
    assert not snapshot_dir.exists()  # empty directories are cleaned up
    assert objects.is_dir()
