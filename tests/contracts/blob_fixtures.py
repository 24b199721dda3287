"""Fixtures of the BlobStore tests: a factory per adapter, and a local moto S3 server.

A test module declares thin fixtures over these helpers::

    @pytest.fixture(scope="session")
    def s3_server(request: pytest.FixtureRequest) -> S3Server:
        return shared_s3_server(request)

    @pytest.fixture(params=BLOBSTORE_KINDS)
    def make_blobstore(request: pytest.FixtureRequest) -> MakeBlobStore:
        return blobstore_factory(request.param, request)

The S3 server is moto's standalone server (:mod:`substrate.testing.s3`, from the test
dependency ``moto[server]``) on 127.0.0.1 and a free port, started once per test session
and stopped at its end; each S3 store gets a fresh bucket, and clients use
:func:`s3_options`. Without moto the S3 tests skip with the reason (CI turns skips into
failures).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import pytest

from substrate.adapters.memory import InMemoryBlobStore
from substrate.adapters.objectstore import ObjectStoreOptions, open_blobstore
from substrate.snapshot.ports import BlobStore
from substrate.testing.contracts.blobstore import MakeBlobStore
from substrate.testing.s3 import S3Server, start_moto

S3_MAX_RETRIES: Final = 2
S3_RETRY_TIMEOUT: Final = 10.0
S3_CONNECT_TIMEOUT: Final = 2.0


def s3_options(server: S3Server) -> ObjectStoreOptions:
    """The tests' client options for ``server``: few retries, short timeouts."""
    return server.options(
        max_retries=S3_MAX_RETRIES,
        retry_timeout=S3_RETRY_TIMEOUT,
        connect_timeout=S3_CONNECT_TIMEOUT,
    )


_server: S3Server | None = None
_server_error: str | None = None


def shared_s3_server(request: pytest.FixtureRequest) -> S3Server:
    """The session's moto S3 server: one per process, stopped when the session ends.

    Skips the requesting test (with the reason) if the server cannot be started.
    """
    global _server, _server_error
    if _server is None and _server_error is None:
        try:
            _server = start_moto()
        except RuntimeError as exc:
            _server_error = str(exc)
        else:
            request.config.add_cleanup(_stop_server)
    if _server is None:
        pytest.skip(f"no local S3 server: {_server_error}")
    return _server


def _stop_server() -> None:
    global _server
    if _server is not None:
        _server.stop()
        _server = None


# --- store factories --------------------------------------------------------------------


def inmemory_factory() -> MakeBlobStore:
    @asynccontextmanager
    async def make() -> AsyncIterator[BlobStore]:
        yield InMemoryBlobStore()

    return make


def obstore_memory_factory() -> MakeBlobStore:
    @asynccontextmanager
    async def make() -> AsyncIterator[BlobStore]:
        yield open_blobstore("memory://")

    return make


@contextlib.contextmanager
def _temporary_directory() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="blobstore-") as tmp:
        yield Path(tmp)


def obstore_file_factory() -> MakeBlobStore:
    @asynccontextmanager
    async def make() -> AsyncIterator[BlobStore]:
        with _temporary_directory() as tmp:
            yield open_blobstore(f"file://{tmp}/objects")

    return make


def obstore_s3_factory(server: S3Server) -> MakeBlobStore:
    @asynccontextmanager
    async def make() -> AsyncIterator[BlobStore]:
        bucket = server.new_bucket()
        yield open_blobstore(f"s3://{bucket}/under/a/prefix", options=s3_options(server))

    return make


BLOBSTORE_KINDS: Final = [
    pytest.param("inmemory", id="inmemory"),
    pytest.param("obstore-memory", id="obstore-memory"),
    pytest.param("obstore-file", id="obstore-file"),
    pytest.param("obstore-s3", id="obstore-s3", marks=pytest.mark.s3),
]


def blobstore_factory(kind: str, request: pytest.FixtureRequest) -> MakeBlobStore:
    """The factory for one of :data:`BLOBSTORE_KINDS` (S3 uses the ``s3_server`` fixture)."""
    match kind:
        case "inmemory":
            return inmemory_factory()
        case "obstore-memory":
            return obstore_memory_factory()
        case "obstore-file":
            return obstore_file_factory()
        case "obstore-s3":
            return obstore_s3_factory(request.getfixturevalue("s3_server"))
    raise AssertionError(f"unknown blob store kind {kind!r}")
