"""Fixtures of the BlobStore tests: a factory per adapter, and a local moto S3 server.

A test module declares thin fixtures over these helpers::

    @pytest.fixture(scope="session")
    def s3_server(request: pytest.FixtureRequest) -> S3Server:
        return shared_s3_server(request)

    @pytest.fixture(params=BLOBSTORE_KINDS)
    def make_blobstore(request: pytest.FixtureRequest) -> MakeBlobStore:
        return blobstore_factory(request.param, request)

The S3 server is moto's standalone server (``python -m moto.server``, from the test
dependency ``moto[server]``) on 127.0.0.1 and a free port, started once per test session
and stopped at its end; each S3 store gets a fresh bucket. Without moto the S3 tests skip
with the reason (CI turns skips into failures).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import attrs
import pytest

from substrate.adapters.memory import InMemoryBlobStore
from substrate.adapters.objectstore import ObjectStoreOptions, open_blobstore
from substrate.cli.stack import free_port
from substrate.snapshot.ports import BlobStore
from substrate.testing.contracts.blobstore import MakeBlobStore

STARTUP_TIMEOUT: Final = 30.0
_buckets = itertools.count(1)


@attrs.define
class S3Server:
    """A running moto S3 server."""

    endpoint: str
    process: subprocess.Popen[bytes]
    log: Path

    def options(self) -> ObjectStoreOptions:
        """Client options for this server (dummy credentials; moto does not check them)."""
        return ObjectStoreOptions(
            endpoint=self.endpoint,
            region="us-east-1",
            access_key_id="test",
            secret_access_key="test",
            path_style=True,
            max_retries=2,
            retry_timeout=10.0,
            connect_timeout=2.0,
        )

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200, response.status

    def new_bucket(self) -> str:
        name = f"substrate-test-{next(_buckets):05d}"
        self.create_bucket(name)
        return name

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(OSError):
            self.log.unlink()


def start_moto_server() -> S3Server:
    """Start ``python -m moto.server`` on a free local port and wait until it answers.

    Raises ``RuntimeError`` (with the server's output) if it does not come up.
    """
    try:
        import moto.server  # noqa: F401  (only checks that moto[server] is installed)
    except ImportError as exc:
        raise RuntimeError(f'moto is not installed (pip install "moto[server]"): {exc}') from exc
    port = free_port()
    fd, log_name = tempfile.mkstemp(prefix="moto-server-", suffix=".log")
    log = Path(log_name)
    with os.fdopen(fd, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    server = S3Server(endpoint=f"http://127.0.0.1:{port}", process=process, log=log)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            with urllib.request.urlopen(server.endpoint + "/", timeout=1) as response:
                if response.status == 200:
                    return server
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    output = log.read_text(errors="replace")[-2000:]
    server.stop()
    raise RuntimeError(f"moto server did not start on port {port}: {output}")


_server: S3Server | None = None
_server_error: str | None = None


def shared_s3_server(request: pytest.FixtureRequest) -> S3Server:
    """The session's moto S3 server: one per process, stopped when the session ends.

    Skips the requesting test (with the reason) if the server cannot be started.
    """
    global _server, _server_error
    if _server is None and _server_error is None:
        try:
            _server = start_moto_server()
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
        yield open_blobstore(f"s3://{bucket}/under/a/prefix", options=server.options())

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
