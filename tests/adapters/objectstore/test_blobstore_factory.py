"""open_blobstore by URL, split_uri, options from the environment, BlobStores, error mapping."""

from __future__ import annotations

from pathlib import Path

import obstore
import pytest
from obstore.exceptions import (
    GenericError,
    NotSupportedError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from obstore.store import GCSStore, LocalStore, MemoryStore, S3Store

from substrate.adapters.objectstore import (
    BlobStores,
    ObjectStoreOptions,
    ObstoreBlobStore,
    ObstoreSnapshotObjects,
    open_blobstore,
    options_from_env,
    split_uri,
    translate_error,
)
from substrate.errors import (
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from substrate.snapshot import actor_snapshot_prefix, normalize_prefix, validate_key
from substrate.testing.s3 import S3Server
from tests.contracts.blob_fixtures import shared_s3_server

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def s3_server(request: pytest.FixtureRequest) -> S3Server:
    return shared_s3_server(request)


# --- split_uri --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bucket/p/k", ("s3://bucket", "p/k")),
        ("s3://bucket/p/dir/", ("s3://bucket", "p/dir/")),
        ("s3://bucket", ("s3://bucket", "")),
        ("s3://bucket/", ("s3://bucket", "")),
        ("gs://b/k", ("gs://b", "k")),
        ("memory:///p/k/", ("memory://", "p/k/")),
        ("memory://", ("memory://", "")),
        ("file:///var/lib/ate/objects/x/", ("file:///", "var/lib/ate/objects/x/")),
        ("file:///", ("file:///", "")),
    ],
)
def test_split_uri(uri: str, expected: tuple[str, str]) -> None:
    assert split_uri(uri) == expected


def test_split_uri_against_a_root() -> None:
    location = "file:///var/lib/ate/objects"
    uri = actor_snapshot_prefix(location, "lab", "u1", "s1")
    assert uri == "file:///var/lib/ate/objects/atespaces/lab/actors/u1/snapshots/s1/"
    root, key = split_uri(uri, location)
    assert root == "file:///var/lib/ate/objects"
    assert key == "atespaces/lab/actors/u1/snapshots/s1/"
    assert split_uri("s3://b/base/x/y", "s3://b/base/") == ("s3://b/base", "x/y")
    assert split_uri("s3://b/base", "s3://b/base") == ("s3://b/base", "")
    for outside, root_url in [
        ("s3://b/basement/x", "s3://b/base"),
        ("s3://other/base/x", "s3://b/base"),
        ("gs://b/base/x", "s3://b/base"),
        ("file:///var/lib/other/x", location),
    ]:
        with pytest.raises(InvalidArgument, match="not under"):
            split_uri(outside, root_url)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "relative/path",
        "http://host/x",
        "s3://",
        "s3:///no-bucket",
        "file://host/x",
        "memory://name",
        "s3://b/x?versionId=1",
        "s3://b/x#frag",
        "file:///var/../etc",
    ],
)
def test_bad_urls(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        split_uri(bad)
    with pytest.raises(InvalidArgument):
        open_blobstore(bad)


# --- open_blobstore ---------------------------------------------------------------------


async def test_open_file_creates_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b"
    store = open_blobstore(f"file://{root}")
    assert isinstance(store.raw, LocalStore)
    assert root.is_dir()
    await store.put("x/y", b"1")
    assert (root / "x" / "y").read_bytes() == b"1"
    same = open_blobstore(f"file://{root}/")
    assert await same.get("x/y") == b"1"


async def test_open_memory_is_fresh_each_time() -> None:
    one = open_blobstore("memory://")
    two = open_blobstore("memory:///sub")
    assert isinstance(one.raw, MemoryStore)
    await one.put("k", b"1")
    assert await two.list() == []
    assert two.prefix == "sub/"


def test_open_s3_and_gcs_do_no_io() -> None:
    options = ObjectStoreOptions(
        endpoint="http://127.0.0.1:1",
        region="eu-west-1",
        access_key_id="AKIA",
        secret_access_key="secret",
        session_token="token",
        path_style=False,
    )
    s3 = open_blobstore("s3://bucket/some/prefix", options=options)
    assert isinstance(s3.raw, S3Store)
    assert s3.prefix == "some/prefix/"
    assert s3.name == "s3://bucket/some/prefix"
    config = s3.raw.config
    assert config["endpoint"] == "http://127.0.0.1:1"
    assert config["region"] == "eu-west-1"
    assert str(config["virtual_hosted_style_request"]).lower() == "true"
    assert "secret" not in repr(options)
    gs = open_blobstore(
        "gs://bucket", options=ObjectStoreOptions(skip_signature=True, endpoint="http://x")
    )
    assert isinstance(gs.raw, GCSStore)
    assert gs.prefix == ""


def test_bad_options() -> None:
    with pytest.raises(InvalidArgument, match="both"):
        open_blobstore("s3://b", options=ObjectStoreOptions(access_key_id="only-the-id"))
    with pytest.raises(InvalidArgument):
        ObjectStoreOptions(connect_timeout=0)
    with pytest.raises(InvalidArgument):
        ObjectStoreOptions(max_retries=-1)
    with pytest.raises(InvalidArgument, match="5 MiB"):
        open_blobstore("memory://", options=ObjectStoreOptions(chunk_size=1024))


def test_options_from_env_and_merge() -> None:
    env = {
        "AWS_ENDPOINT_URL": "http://minio:9000",
        "AWS_DEFAULT_REGION": "us-west-2",
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "tok",
        "AWS_S3_FORCE_PATH_STYLE": "true",
        "AWS_ALLOW_HTTP": "1",
        "GOOGLE_APPLICATION_CREDENTIALS": "/etc/adc.json",
        "UNRELATED": "x",
    }
    got = options_from_env(env)
    assert got == ObjectStoreOptions(
        endpoint="http://minio:9000",
        region="us-west-2",
        access_key_id="id",
        secret_access_key="secret",
        session_token="tok",
        path_style=True,
        allow_http=True,
        application_credentials="/etc/adc.json",
    )
    assert options_from_env({"AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true"}).path_style is False
    assert options_from_env({}) == ObjectStoreOptions()
    with pytest.raises(InvalidArgument, match="AWS_ALLOW_HTTP"):
        options_from_env({"AWS_ALLOW_HTTP": "maybe"})
    explicit = ObjectStoreOptions(region="eu-central-1", max_retries=0)
    merged = explicit.over(got)
    assert merged.region == "eu-central-1"  # explicit options win
    assert merged.endpoint == "http://minio:9000"
    assert merged.max_retries == 0


def test_from_env_is_opt_in() -> None:
    env = {"AWS_ENDPOINT_URL": "http://10.0.0.1:9000", "AWS_REGION": "ap-south-1"}
    options = ObjectStoreOptions(access_key_id="a", secret_access_key="b")
    with_env = open_blobstore("s3://b", options=options, from_env=True, environ=env)
    assert with_env.raw.config["endpoint"] == "http://10.0.0.1:9000"  # type: ignore[union-attr]
    without = open_blobstore("s3://b", options=options, environ=env)
    assert without.raw.config.get("endpoint") != "http://10.0.0.1:9000"  # type: ignore[union-attr]


@pytest.mark.s3
async def test_s3_from_env_round_trip(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    env = {
        "AWS_ENDPOINT_URL": s3_server.endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }
    store = open_blobstore(f"s3://{bucket}/env", from_env=True, environ=env)
    await store.put("a/b", b"payload")
    assert await store.get("a/b") == b"payload"
    assert await store.list("a") == ["a/b"]


# --- BlobStores and ObstoreSnapshotObjects ----------------------------------------------


async def test_blobstores_resolve_and_cache(tmp_path: Path) -> None:
    location = f"file://{tmp_path}/objects"
    stores = BlobStores(roots=[location, "memory:///m"])
    uri = actor_snapshot_prefix(location, "lab", "u1", "s1")
    store, key = stores.resolve(uri)
    assert key == "atespaces/lab/actors/u1/snapshots/s1/"
    assert store is stores.store(location)
    assert stores.resolve(uri)[0] is store
    other, other_key = stores.resolve(f"file://{tmp_path}/elsewhere/k")
    assert other is not store
    assert other_key.endswith("/elsewhere/k")
    under, k = stores.resolve("memory:///m/x/y")
    top, k2 = stores.resolve("memory:///z")
    assert (k, k2) == ("x/y", "z")
    await under.put(k, b"shared")
    assert await top.get("m/x/y") == b"shared"  # every memory root shares one store


async def test_snapshot_objects_copy_and_delete_guards() -> None:
    objects = ObstoreSnapshotObjects()
    with pytest.raises(InvalidArgument, match="onto itself"):
        await objects.copy_prefix("memory:///p/s/", "memory:///p/s")
    with pytest.raises(InvalidArgument, match="one object store"):
        await objects.copy_prefix("memory:///p/s/", "s3://b/p/t/")
    with pytest.raises(InvalidArgument, match="whole store"):
        await objects.delete_prefix("memory://")
    with pytest.raises(NotFound, match="manifest"):
        await objects.copy_prefix("memory:///p/s/", "memory:///p/t/")
    raw = objects.store_for("memory://")
    await obstore.put_async(raw, "p/s/sub/x.zstd", b"x")
    await obstore.put_async(raw, "p/s/manifest.json", b"{}")
    await objects.copy_prefix("memory:///p/s/", "memory:///p/t/")
    got = await obstore.get_async(raw, "p/t/sub/x.zstd")
    assert bytes(await got.bytes_async()) == b"x"
    await objects.delete_prefix("memory:///p/s")
    await objects.delete_prefix("memory:///p/s")
    keys = sorted(m["path"] for batch in obstore.list(raw) for m in batch)
    assert keys == ["p/t/manifest.json", "p/t/sub/x.zstd"]


# --- keys and errors --------------------------------------------------------------------


def test_key_rules() -> None:
    assert validate_key("atespaces/a/actors/u/snapshots/s/pages.img.zstd")
    assert normalize_prefix("") == ""
    assert normalize_prefix("a/b") == "a/b/"
    assert normalize_prefix("a/b/") == "a/b/"
    for bad in ("a//b/", "/", "//"):
        with pytest.raises(InvalidArgument):
            normalize_prefix(bad)


@pytest.mark.parametrize(
    ("exc", "op", "expected"),
    [
        (FileNotFoundError("gone"), "get", NotFound),
        (FileNotFoundError("gone"), "put", Unavailable),
        (FileNotFoundError("<Code>NoSuchBucket</Code>"), "get", Unavailable),
        (PermissionDeniedError("no"), "get", PermissionDenied),
        (UnauthenticatedError("who"), "get", Unauthenticated),
        (ValueError("bad path"), "get", InvalidArgument),
        (GenericError("connection refused\nDebug source: ..."), "list", Unavailable),
        (TimeoutError("slow"), "head", Unavailable),
        (ConnectionRefusedError("refused"), "head", Unavailable),
    ],
)
def test_translate_error(exc: Exception, op: str, expected: type[Exception]) -> None:
    got = translate_error(exc, op=op, key="k", store="s3://b")
    assert type(got) is expected
    assert "\n" not in got.description


def test_not_supported_is_internal() -> None:
    got = translate_error(NotSupportedError("nope"), op="copy", key="k", store="x")
    assert type(got) is Internal


async def test_put_rejects_non_bytes() -> None:
    store = ObstoreBlobStore(MemoryStore())
    with pytest.raises(InvalidArgument, match="bytes"):
        await store.put("k", "text")  # type: ignore[arg-type]


async def test_local_fast_path_with_a_key_prefix(tmp_path: Path) -> None:
    store = ObstoreBlobStore(LocalStore(prefix=tmp_path / "root", mkdir=True), prefix="pre/x")
    source = tmp_path / "src"
    source.write_bytes(b"hello")
    await store.put_file("k/a", source)
    assert (tmp_path / "root" / "pre" / "x" / "k" / "a").read_bytes() == b"hello"
    assert await store.list() == ["k/a"]
    await store.get_to_file("k/a", tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b"hello"
    with pytest.raises(NotFound):
        await store.get_to_file("k/missing", tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "root" / "pre" / "x" / "k").iterdir()) == ["a"]
