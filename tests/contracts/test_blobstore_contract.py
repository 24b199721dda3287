"""Every BlobStore case against every adapter, plus the outage behaviour of each kind."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio
import pytest

if "substrate.testing.contracts.blobstore" not in sys.modules:
    pytest.register_assert_rewrite("substrate.testing.contracts.blobstore")

from substrate.adapters.memory import InMemoryBlobStore
from substrate.adapters.objectstore import ObjectStoreOptions, open_blobstore
from substrate.cli.stack import free_port
from substrate.errors import InvalidArgument, NotFound, Unavailable
from substrate.snapshot.ports import BlobStore
from substrate.testing.contracts.blobstore import (
    BLOBSTORE_CASES,
    BlobStoreCase,
    MakeBlobStore,
    names,
)
from substrate.testing.s3 import S3Server
from tests.contracts.blob_fixtures import (
    BLOBSTORE_KINDS,
    blobstore_factory,
    s3_options,
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


@pytest.mark.parametrize("case", BLOBSTORE_CASES, ids=lambda case: case.__name__)
async def test_blobstore_contract(case: BlobStoreCase, make_blobstore: MakeBlobStore) -> None:
    await case(make_blobstore)


async def test_every_adapter_is_a_blobstore(make_blobstore: MakeBlobStore) -> None:
    async with make_blobstore() as store:
        assert isinstance(store, BlobStore)


# --- outages ----------------------------------------------------------------------------


async def _every_call_fails(store: BlobStore, tmp_path: Path, expected: type[Exception]) -> None:
    source = tmp_path / "source"
    source.write_bytes(b"data")
    calls = [
        lambda: store.put("k", b"x"),
        lambda: store.put_file("k", source),
        lambda: store.get("k"),
        lambda: store.get_to_file("k", tmp_path / "out"),
        lambda: store.head("k"),
        lambda: store.list("p/"),
        lambda: store.delete("k"),
        lambda: store.copy("k", "k2"),
    ]
    for call in calls:
        with pytest.raises(expected):
            await call()
    assert names(tmp_path) == ["source"]


def _unreachable_options(port: int) -> ObjectStoreOptions:
    return ObjectStoreOptions(
        endpoint=f"http://127.0.0.1:{port}",
        region="us-east-1",
        access_key_id="test",
        secret_access_key="test",
        connect_timeout=0.5,
        timeout=2.0,
        max_retries=1,
        retry_timeout=1.0,
    )


async def test_s3_down_is_unavailable_quickly(tmp_path: Path) -> None:
    store = open_blobstore("s3://bucket/p", options=_unreachable_options(free_port()))
    started = time.monotonic()
    with anyio.fail_after(20):
        await _every_call_fails(store, tmp_path, Unavailable)
    assert time.monotonic() - started < 10


async def test_gcs_down_is_unavailable(tmp_path: Path) -> None:
    options = ObjectStoreOptions(
        endpoint=f"http://127.0.0.1:{free_port()}",
        skip_signature=True,
        connect_timeout=0.5,
        timeout=2.0,
        max_retries=1,
        retry_timeout=1.0,
    )
    store = open_blobstore("gs://bucket/p", options=options)
    with anyio.fail_after(20):
        await _every_call_fails(store, tmp_path, Unavailable)


@pytest.mark.s3
async def test_s3_missing_bucket_is_unavailable(s3_server: S3Server, tmp_path: Path) -> None:
    store = open_blobstore("s3://no-such-bucket-here", options=s3_options(s3_server))
    with anyio.fail_after(20):
        for call in (
            lambda: store.put("k", b"x"),
            lambda: store.get("k"),
            lambda: store.list(),
        ):
            with pytest.raises(Unavailable, match="bucket does not exist"):
                await call()


@pytest.mark.s3
async def test_s3_prefixes_isolate_stores(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    options = s3_options(s3_server)
    root = open_blobstore(f"s3://{bucket}", options=options)
    left = open_blobstore(f"s3://{bucket}/left", options=options)
    right = open_blobstore(f"s3://{bucket}/left-not", options=options)
    await left.put("k", b"L")
    await right.put("k", b"R")
    assert await left.list() == ["k"]
    assert await right.list() == ["k"]
    assert await root.list() == ["left-not/k", "left/k"]
    assert await root.get("left/k") == b"L"
    with pytest.raises(NotFound):
        await left.get("left-not/k")


async def test_inmemory_down_switch(tmp_path: Path) -> None:
    store = InMemoryBlobStore()
    await store.put("k", b"v")
    store.down = True
    await _every_call_fails(store, tmp_path, Unavailable)
    store.down = False
    assert await store.get("k") == b"v"


async def test_inmemory_blackhole_hangs_until_cancelled() -> None:
    store = InMemoryBlobStore()
    store.blackhole = True
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.05):
            await store.get("k")
    with anyio.move_on_after(0.05) as scope:
        await store.put("k", b"v")
    assert scope.cancelled_caught
    store.blackhole = False
    assert await store.list() == []  # the hung put never happened


async def test_inmemory_fail_when_and_history() -> None:
    store = InMemoryBlobStore()
    store.fail_when = lambda op, key: op == "put" and key.endswith("bad")
    await store.put("a", b"1")
    with pytest.raises(Unavailable, match="injected"):
        await store.put("x/bad", b"2")
    await store.copy("a", "b")
    await store.delete("a")
    assert store.history == [("put", "a"), ("copy", "b"), ("delete", "a")]
    assert store.calls["put"] == 2
    with pytest.raises(InvalidArgument):
        await store.put("k", "text")  # type: ignore[arg-type]
