"""The daemons of a small cluster as real processes: ateapi, atelets, ateworkers.

Every process gets its own mTLS identity from one test CA; the S3 bucket is a local moto
server. Output goes to ``<tmp>/logs/<name>.log``; ``Stack.logs()`` prints the tails when a
test fails. Everything started is stopped (SIGTERM, then SIGKILL by pid) at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from urllib.request import urlopen

import anyio
import attrs

from substrate.adapters.gvisor.images import LocalImages, build_counter_image
from substrate.cli.daemon_args import ateapi_argv, atelet_argv, worker_argv
from substrate.cli.stack import child_env, free_port
from substrate.identity import CertificateAuthority, Identity, TlsFiles, client_context
from substrate.identity.ca import CA_VALIDITY
from substrate.identity.files import write_bundle
from tests.http_client import H11Client, Reply

TRUST_DOMAIN = "ate"
NOW = datetime.now(UTC)
COUNTER_IMAGE = "counter:1"


def wait_http(url: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urlopen(url, timeout=1) as r:
                return str(r.read().decode())
        except OSError as exc:
            last = str(exc)
            time.sleep(0.1)
    raise AssertionError(f"{url} never answered 200: {last}")


@attrs.define
class Proc:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self, timeout: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


@attrs.define
class Stack:
    tmp: Path
    ca: CertificateAuthority
    env: dict[str, str]
    procs: list[Proc] = attrs.Factory(list)
    ateapi_address: str = ""
    ateapi_admin: str = ""
    tunnels: dict[str, str] = attrs.Factory(dict)

    @property
    def tls(self) -> Path:
        return self.tmp / "tls"

    @property
    def images(self) -> Path:
        return self.tmp / "images"

    def identity_dir(self, dirname: str, name: str, identity: Identity) -> Path:
        directory = self.tls / dirname
        write_bundle(directory, name, self.ca.issue(identity, now=NOW, valid_for=CA_VALIDITY))
        return directory

    def node_dir(self, node: str) -> Path:
        return self.tmp / "nodes" / node

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        logs = self.tmp / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{name}.log"
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=child_env({**os.environ, **self.env, **(env or {})}),
            )
        proc = Proc(name=name, process=process, log=log)
        self.procs.append(proc)
        return proc

    def start_ateapi(self, *, store: str = "memory://", objects: str = "") -> Proc:
        tls = self.identity_dir("ateapi", "ateapi", Identity.ateapi(TRUST_DOMAIN))
        port, admin = free_port(), free_port()
        self.ateapi_address = f"127.0.0.1:{port}"
        self.ateapi_admin = f"127.0.0.1:{admin}"
        argv = ateapi_argv(
            listen=self.ateapi_address,
            admin_listen=self.ateapi_admin,
            tls_dir=tls,
            trust_domain=TRUST_DOMAIN,
            store=store,
            objects=objects,
            reconcile_every=0.5,
            heartbeat_timeout=10,
        )
        proc = self._spawn("ateapi", argv)
        wait_http(f"http://{self.ateapi_admin}/healthz")
        return proc

    def start_atelet(self, node: str, *, objects: str = "") -> Proc:
        tls = self.identity_dir(node, "atelet", Identity.atelet(node, TRUST_DOMAIN))
        argv = atelet_argv(
            node=node,
            node_dir=self.node_dir(node),
            images=self.images,
            listen="127.0.0.1:0",
            ateapi=self.ateapi_address,
            tls_dir=tls,
            trust_domain=TRUST_DOMAIN,
            objects=[objects],
            heartbeat_every=1,
        )
        return self._spawn(f"atelet-{node}", argv)

    def start_worker(
        self,
        name: str,
        node: str,
        *,
        runtime: str = "gvisor",
        labels: dict[str, str] | None = None,
        max_actors: int = 4,
        probe_timeout: float = 20.0,
    ) -> Proc:
        tls = self.identity_dir(f"worker-{name}", "worker", Identity.worker(name, TRUST_DOMAIN))
        port = free_port()
        self.tunnels[name] = f"127.0.0.1:{port}"
        argv = worker_argv(
            name=name,
            node=node,
            node_dir=self.node_dir(node),
            runtime=runtime,
            tunnel_listen=f"127.0.0.1:{port}",
            tls_dir=tls,
            trust_domain=TRUST_DOMAIN,
            max_actors=max_actors,
            memory="2Gi",
            probe_timeout=probe_timeout,
            labels=labels,
        )
        return self._spawn(f"worker-{name}", argv)

    def client_dir(self) -> Path:
        return self.identity_dir("client", "client", Identity.client("e2e", TRUST_DOMAIN))

    def router_files(self) -> TlsFiles:
        directory = self.identity_dir("router", "router", Identity.router(TRUST_DOMAIN))
        return TlsFiles.in_dir(directory, "router")

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.tail()}" for p in self.procs)

    def stop_all(self) -> dict[str, int]:
        return {p.name: p.stop() for p in reversed(self.procs)}


@contextmanager
def stack(tmp: Path, env: dict[str, str] | None = None) -> Iterator[Stack]:
    ca = CertificateAuthority.create(TRUST_DOMAIN, now=NOW)
    s = Stack(tmp=tmp, ca=ca, env=dict(env or {}))
    build_counter_image(LocalImages(s.images).path_for(COUNTER_IMAGE))
    try:
        yield s
    except BaseException:
        print(s.logs())
        raise
    finally:
        s.stop_all()


async def tunnel_get(
    files: TlsFiles,
    tunnel: str,
    actor: str,
    path: str = "/",
    *,
    port: int | None = None,
) -> Reply:
    """One GET through a worker's atunnel, as the router would send it."""
    ctx = client_context(files, check_hostname=False)
    ctx.set_alpn_protocols(["http/1.1"])
    host, _, tport = tunnel.rpartition(":")
    with anyio.fail_after(30):
        stream = await anyio.connect_tcp(
            host, int(tport), ssl_context=ctx, tls_standard_compatible=False
        )
        async with stream:
            headers = [("ate-target-actor", actor)]
            if port is not None:
                headers.append(("ate-target-port", str(port)))
            return await H11Client(stream).request("GET", path, headers)


@asynccontextmanager
async def held_tunnel(files: TlsFiles, tunnel: str, actor: str) -> AsyncIterator[bytes]:
    """A CONNECT tunnel through atunnel to the actor, one keep-alive GET answered, left open.

    Yields the first answer's bytes; the connection stays open until the block ends.
    """
    ctx = client_context(files, check_hostname=False)
    ctx.set_alpn_protocols(["http/1.1"])
    host, _, tport = tunnel.rpartition(":")
    stream = await anyio.connect_tcp(
        host, int(tport), ssl_context=ctx, tls_standard_compatible=False
    )
    try:
        with anyio.fail_after(30):
            connect = "CONNECT actor:80 HTTP/1.1\r\nHost: actor:80\r\n"
            await stream.send(f"{connect}ate-target-actor: {actor}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive()
            assert head.startswith(b"HTTP/1.1 200"), head
            await stream.send(b"GET / HTTP/1.1\r\nHost: actor.example\r\n\r\n")
            answer = b""
            while b"count=" not in answer:
                answer += await stream.receive()
        yield answer
    finally:
        await stream.aclose()
