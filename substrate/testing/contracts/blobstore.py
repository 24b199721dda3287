"""The BlobStore conformance suite: every case runs unchanged against every adapter.

A case is ``async def case_...(make_blobstore)``; ``make_blobstore()`` is an async context
manager giving a fresh, empty store. The cases check the contract written in the
docstrings of :class:`substrate.snapshot.ports.BlobStore` with plain ``assert`` and
:func:`~substrate.testing.contracts.store.raises`, so the suite needs no pytest::

    @pytest.mark.parametrize("case", BLOBSTORE_CASES, ids=lambda c: c.__name__)
    async def test_blobstore_contract(case, make_blobstore):
        await case(make_blobstore)
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Final, Protocol

import anyio

from substrate.errors import InvalidArgument, NotFound, SubstrateError
from substrate.snapshot.ports import BlobStore
from substrate.testing.contracts.store import raises

MIB: Final = 1 << 20
BIG_SIZE: Final = 9 * MIB + 12345
"""Larger than one 8 MiB multipart chunk, and not a multiple of anything convenient."""

BAD_KEYS: Final = (
    "",
    "/abs",
    "trailing/",
    "a//b",
    "a/../b",
    "./a",
    "a/.",
    "sp ace",
    "back\\slash",
    "caf\u00e9",
    "new\nline",
    "q?x",
    "h#x",
    "x" * 1025,
)


class MakeBlobStore(Protocol):
    """A factory of fresh, empty stores: ``async with make_blobstore() as store``."""

    def __call__(self) -> AbstractAsyncContextManager[BlobStore]: ...


BlobStoreCase = Callable[[MakeBlobStore], Awaitable[None]]


def names(directory: Path) -> list[str]:
    """The sorted entry names of a local directory (temporary files would show here)."""
    return sorted(p.name for p in directory.iterdir())


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic pseudo-random bytes."""
    return random.Random(seed).randbytes(size)


# --- cases ------------------------------------------------------------------------------


async def case_get_after_put(make_blobstore: MakeBlobStore) -> None:
    async with make_blobstore() as store:
        await store.put("k", b"hello")
        got = await store.get("k")
        assert got == b"hello"
        assert type(got) is bytes
        assert await store.head("k") == 5
        await store.put("empty", b"")
        assert await store.get("empty") == b""
        assert await store.head("empty") == 0


async def case_missing_key_not_found(make_blobstore: MakeBlobStore) -> None:
    async with make_blobstore() as store:
        with raises(NotFound, match="missing"):
            await store.get("missing")
        with raises(NotFound):
            await store.head("missing")
        with raises(NotFound):
            await store.copy("missing", "elsewhere")
        assert await store.list() == []
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / "out"
            with raises(NotFound):
                await store.get_to_file("missing", target)
            assert not target.exists()
            target.write_bytes(b"keep")
            with raises(NotFound):
                await store.get_to_file("missing", target)
            assert target.read_bytes() == b"keep"
            assert names(Path(tmp)) == ["out"]


async def case_overwrite(make_blobstore: MakeBlobStore) -> None:
    async with make_blobstore() as store:
        await store.put("k", b"first version")
        await store.put("k", b"second")
        assert await store.get("k") == b"second"
        assert await store.head("k") == 6
        assert await store.list() == ["k"]


async def case_prefix_listing(make_blobstore: MakeBlobStore) -> None:
    async with make_blobstore() as store:
        keys = ["a/b/1", "a/b/2", "a/b/deep/3", "a/bc/4", "a/x", "z"]
        for i, key in enumerate(reversed(keys)):
            await store.put(key, bytes([i]))
        assert await store.list() == sorted(keys)
        assert await store.list("") == sorted(keys)
        assert await store.list("a/b/") == ["a/b/1", "a/b/2", "a/b/deep/3"]
        assert await store.list("a/b") == ["a/b/1", "a/b/2", "a/b/deep/3"]  # whole segments
        assert await store.list("a/") == ["a/b/1", "a/b/2", "a/b/deep/3", "a/bc/4", "a/x"]
        assert await store.list("a/b/deep/") == ["a/b/deep/3"]
        assert await store.list("nope/") == []
        assert await store.list("a/b/1/") == []  # a key is not a prefix of itself


async def case_delete_idempotent(make_blobstore: MakeBlobStore) -> None:
    async with make_blobstore() as store:
        await store.put("d/one", b"1")
        await store.put("d/two", b"2")
        await store.delete("d/one")
        with raises(NotFound):
            await store.get("d/one")
        assert await store.list("d/") == ["d/two"]
        await store.delete("d/one")  # again: no error
        await store.delete("never/existed")
        await store.delete("d/two")
        assert await store.list() == []
        await store.put("d/one", b"back")  # a deleted key can be written again
        assert await store.get("d/one") == b"back"


async def case_copy(make_blobstore: MakeBlobStore) -> None:
    async with make_blobstore() as store:
        await store.put("src/a", b"original")
        await store.copy("src/a", "dst/nested/a")
        assert await store.get("dst/nested/a") == b"original"
        assert await store.get("src/a") == b"original"
        await store.put("other", b"replacement")
        await store.copy("other", "dst/nested/a")  # replaces the destination
        assert await store.get("dst/nested/a") == b"replacement"
        await store.put("src/a", b"changed")  # the copy is independent of its source
        assert await store.get("dst/nested/a") == b"replacement"
        assert await store.list() == ["dst/nested/a", "other", "src/a"]


async def case_put_file_get_to_file_big(make_blobstore: MakeBlobStore) -> None:
    data = payload(BIG_SIZE, seed=7)
    async with make_blobstore() as store:
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "source.img"
            source.write_bytes(data)
            await store.put_file("big/pages.img", source)
            assert await store.head("big/pages.img") == BIG_SIZE
            target = Path(tmp) / "restored.img"
            target.write_bytes(b"stale content that must be replaced")
            await store.get_to_file("big/pages.img", target)
            assert target.read_bytes() == data
            assert await store.get("big/pages.img") == data
            assert names(Path(tmp)) == ["restored.img", "source.img"]


async def case_put_file_small_and_empty(make_blobstore: MakeBlobStore) -> None:
    async with make_blobstore() as store:
        with tempfile.TemporaryDirectory() as tmp:
            empty = Path(tmp) / "empty"
            empty.write_bytes(b"")
            await store.put_file("e", empty)
            assert await store.get("e") == b""
            out = Path(tmp) / "out"
            await store.get_to_file("e", out)
            assert out.read_bytes() == b""
            with raises(InvalidArgument):
                await store.put_file("x", Path(tmp) / "does-not-exist")
            with raises(InvalidArgument):
                await store.put_file("x", Path(tmp))  # a directory is not a file
            with raises(NotFound):
                await store.get("x")


async def case_local_errors_stay_oserror(make_blobstore: MakeBlobStore) -> None:
    async with make_blobstore() as store:
        await store.put("k", b"data")
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / "no" / "such" / "dir" / "out"
            try:
                await store.get_to_file("k", target)
            except SubstrateError as exc:
                raise AssertionError(f"a local error became {exc!r}") from exc
            except OSError:
                pass
            else:
                raise AssertionError("writing into a missing directory succeeded")
            assert names(Path(tmp)) == []
        assert await store.get("k") == b"data"


async def case_nested_keys(make_blobstore: MakeBlobStore) -> None:
    base = "atespaces/lab/actors/u-1/snapshots/s.01"
    async with make_blobstore() as store:
        await store.put(f"{base}/pages.img.zstd", b"pages")
        await store.put(f"{base}/checkpoint.img.zstd", b"ckpt")
        await store.put(f"{base}/manifest.json", b"{}")
        await store.put("atespaces/lab/tags/t-1/manifest.json", b"{}")
        assert await store.list(f"{base}/") == [
            f"{base}/checkpoint.img.zstd",
            f"{base}/manifest.json",
            f"{base}/pages.img.zstd",
        ]
        assert len(await store.list("atespaces/lab/")) == 4
        assert await store.list("atespaces/lab/tags") == ["atespaces/lab/tags/t-1/manifest.json"]
        assert await store.get(f"{base}/pages.img.zstd") == b"pages"
        odd = "a_b/c+d=e@f,g~h-i.j/k"
        await store.put(odd, b"odd")
        assert await store.get(odd) == b"odd"
        assert odd in await store.list()


async def case_invalid_keys(make_blobstore: MakeBlobStore) -> None:
    async with make_blobstore() as store:
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "f"
            source.write_bytes(b"x")
            for key in BAD_KEYS:
                with raises(InvalidArgument):
                    await store.put(key, b"x")
                with raises(InvalidArgument):
                    await store.put_file(key, source)
                with raises(InvalidArgument):
                    await store.get(key)
                with raises(InvalidArgument):
                    await store.get_to_file(key, Path(tmp) / "out")
                with raises(InvalidArgument):
                    await store.head(key)
                with raises(InvalidArgument):
                    await store.delete(key)
                with raises(InvalidArgument):
                    await store.copy(key, "ok")
                with raises(InvalidArgument):
                    await store.copy("ok", key)
            for prefix in ("/abs/", "a//b/", "../x/", "sp ace/"):
                with raises(InvalidArgument):
                    await store.list(prefix)
        assert await store.list() == []


async def case_concurrent_puts(make_blobstore: MakeBlobStore) -> None:
    async with make_blobstore() as store:
        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(store.put, f"c/{i:02d}", payload(1000 + i, seed=i))
        keys = await store.list("c/")
        assert keys == [f"c/{i:02d}" for i in range(16)]
        for i in range(16):
            assert await store.get(f"c/{i:02d}") == payload(1000 + i, seed=i)


BLOBSTORE_CASES: Final[tuple[BlobStoreCase, ...]] = (
    case_get_after_put,
    case_missing_key_not_found,
    case_overwrite,
    case_prefix_listing,
    case_delete_idempotent,
    case_copy,
    case_put_file_get_to_file_big,
    case_put_file_small_and_empty,
    case_local_errors_stay_oserror,
    case_nested_keys,
    case_invalid_keys,
    case_concurrent_puts,
)
"""Every case, in a stable order (test ids are the function names)."""

__all__ = [
    "BAD_KEYS",
    "BLOBSTORE_CASES",
    "BlobStoreCase",
    "MakeBlobStore",
    "names",
    "payload",
]
