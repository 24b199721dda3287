"""ObstoreSnapshotObjects on a local directory and in memory."""

from __future__ import annotations

from pathlib import Path

import obstore
import pytest

from substrate.adapters.objectstore import ObstoreSnapshotObjects
from substrate.errors import NotFound

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_copy_and_delete_on_file_urls(tmp_path: Path) -> None:
    objects = ObstoreSnapshotObjects()
    base = f"file://{tmp_path}/objects/atespaces/lab"
    src = f"{base}/actors/u1/snapshots/s1/"
    dst = f"{base}/tags/t1/"
    (tmp_path / "objects/atespaces/lab/actors/u1/snapshots/s1").mkdir(parents=True)
    for name, data in (("pages.img.zstd", b"pages"), ("manifest.json", b"{}")):
        (tmp_path / "objects/atespaces/lab/actors/u1/snapshots/s1" / name).write_bytes(data)
    await objects.copy_prefix(src, dst)
    tag_dir = tmp_path / "objects/atespaces/lab/tags/t1"
    assert sorted(p.name for p in tag_dir.iterdir()) == ["manifest.json", "pages.img.zstd"]
    assert (tag_dir / "pages.img.zstd").read_bytes() == b"pages"
    await objects.delete_prefix(src)
    assert not list((tmp_path / "objects/atespaces/lab/actors/u1/snapshots/s1").glob("*"))
    assert (tag_dir / "manifest.json").exists()  # deleting the actor's copy keeps the tag's
    await objects.delete_prefix(src)  # idempotent


async def test_copy_refuses_an_uncommitted_snapshot(tmp_path: Path) -> None:
    objects = ObstoreSnapshotObjects()
    d = tmp_path / "a/snapshots/s2"
    d.mkdir(parents=True)
    (d / "pages.img.zstd").write_bytes(b"x")  # no manifest: the upload never committed
    with pytest.raises(NotFound, match="manifest"):
        await objects.copy_prefix(f"file://{d}/", f"file://{tmp_path}/tags/t/")


async def test_memory_store_round_trip() -> None:
    objects = ObstoreSnapshotObjects()
    store = objects.store_for("memory://")
    await obstore.put_async(store, "p/s/manifest.json", b"{}")
    await obstore.put_async(store, "p/s/a.zstd", b"a")
    await objects.copy_prefix("memory:///p/s/", "memory:///p/t/")
    got = await obstore.get_async(store, "p/t/a.zstd")
    assert bytes(await got.bytes_async()) == b"a"
    await objects.delete_prefix("memory:///p/t/")
    keys = [m["path"] for batch in obstore.list(store, prefix="p/") for m in batch]
    assert sorted(keys) == ["p/s/a.zstd", "p/s/manifest.json"]
