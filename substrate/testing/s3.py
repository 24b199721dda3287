"""A local S3 server for tests and benchmarks: moto's standalone server as a process.

``start_moto()`` runs ``python -m moto.server`` on 127.0.0.1 and a free port (from
:func:`substrate.cli.stack.free_port`) and waits until it answers; :class:`S3Server` is
the running server: make buckets in it, build :class:`ObjectStoreOptions` for it (dummy
credentials, path-style addressing), stop it. moto (``moto[server]``) is a test and
benchmark dependency, not one of the package: it is looked for when a server starts, and
its absence is a clear :class:`RuntimeError`.

Everything here blocks: call it from a worker thread in async code.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Final

import attrs

from substrate.adapters.objectstore import ObjectStoreOptions
from substrate.cli.stack import free_port

HOST: Final = "127.0.0.1"
REGION: Final = "us-east-1"
ACCESS_KEY: Final = "test"
"""moto accepts any credentials; both the key id and the secret are this."""
STARTUP_TIMEOUT: Final = 30.0
STOP_TIMEOUT: Final = 10.0
LOG_TAIL: Final = 2000
"""Characters of the server's output quoted when it does not come up."""

_buckets = itertools.count(1)


@attrs.define
class S3Server:
    """A running moto S3 server (see :func:`start_moto`)."""

    host: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    """The server's output."""
    remove_log: bool = False
    """Whether :meth:`stop` deletes :attr:`log` (a temporary file of :func:`start_moto`)."""

    @property
    def endpoint(self) -> str:
        """``http://host:port``, where the server listens."""
        return f"http://{self.host}:{self.port}"

    def options(
        self,
        *,
        endpoint: str | None = None,
        max_retries: int | None = None,
        retry_timeout: float | None = None,
        connect_timeout: float | None = None,
    ) -> ObjectStoreOptions:
        """Client options for this server: dummy credentials, path-style addressing.

        ``endpoint`` replaces the server's own (e.g. a proxy in front of it); the retry
        and timeout settings left ``None`` are the client's defaults.
        """
        return ObjectStoreOptions(
            endpoint=endpoint or self.endpoint,
            region=REGION,
            access_key_id=ACCESS_KEY,
            secret_access_key=ACCESS_KEY,
            path_style=True,
            max_retries=max_retries,
            retry_timeout=retry_timeout,
            connect_timeout=connect_timeout,
        )

    def create_bucket(self, name: str) -> str:
        """Create the bucket ``name``; return it. ``RuntimeError`` if moto refuses."""
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        if status != 200:
            raise RuntimeError(f"creating bucket {name}: HTTP {status}")
        return name

    def new_bucket(self, prefix: str = "substrate-test") -> str:
        """A fresh bucket, ``<prefix>-<n>`` (numbered within this process)."""
        return self.create_bucket(f"{prefix}-{next(_buckets):05d}")

    def log_tail(self, n: int = LOG_TAIL) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Terminate the server (kill it after ``timeout`` seconds); idempotent."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.remove_log:
            with contextlib.suppress(OSError):
                self.log.unlink()


def start_moto(
    log: Path | None = None, *, host: str = HOST, timeout: float = STARTUP_TIMEOUT
) -> S3Server:
    """Start ``python -m moto.server`` on a free port of ``host``; wait until it answers.

    Its output is appended to ``log`` (kept), or without one goes to a temporary file that
    :meth:`S3Server.stop` removes. Raises ``RuntimeError`` if moto is not installed, or,
    with the tail of the server's output, if it does not answer within ``timeout`` seconds
    (the process is stopped then).
    """
    try:
        importlib.import_module("moto.server")  # only checks that moto[server] is installed
    except ImportError as exc:
        raise RuntimeError(f'moto is not installed (pip install "moto[server]"): {exc}') from exc
    port = free_port(host)
    if log is None:
        fd, name = tempfile.mkstemp(prefix="moto-server-", suffix=".log")
        os.close(fd)
        log_path, remove_log = Path(name), True
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        log_path, remove_log = log, False
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = S3Server(host=host, port=port, process=process, log=log_path, remove_log=remove_log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(server.endpoint + "/", timeout=1) as response:
                if response.status == 200:
                    return server
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    tail = server.log_tail()
    exited = process.poll()
    server.stop()
    state = f"exited with {exited}" if exited is not None else f"no answer in {timeout:g} s"
    raise RuntimeError(f"moto server did not start on port {port} ({state}): {tail}")


__all__ = ["S3Server", "start_moto"]
