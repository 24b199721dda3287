"""The ateapi daemon as a real process: mTLS gRPC, admin endpoints, SIGTERM.

A fake node agent is served as the node's atelet (real gRPC + mTLS) in the test process;
the daemon learns its address from the worker registration, exactly as with a real atelet.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.request import urlopen

import anyio
import pytest
from grpclib.client import Channel

from substrate.api import pb
from substrate.api.atelet import serve_atelet
from substrate.api.convert import capacity_to_proto, sandbox_class_to_proto
from substrate.cli.daemon_args import ateapi_argv
from substrate.cli.stack import free_port
from substrate.client import AteClient
from substrate.client._async import _close_channel
from substrate.core.ids import NodeRef, TemplateRef, WorkerRef
from substrate.core.model import (
    ActorState,
    ActorTemplate,
    Capacity,
    Container,
    Probe,
    Resources,
    RestoreSource,
    SandboxClass,
    SnapshotConfig,
    SuspendMode,
)
from substrate.identity import client_context, server_context
from substrate.testing.fake_node import FakeBucket, FakeNodeAgent
from tests.api.mtls_stack import TRUST_DOMAIN, Pki, make_pki
from tests.pg import PgHandle

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def wait_http(url: str, timeout: float = 20.0) -> str:
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


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path)


def start_daemon(pki: Pki, store: str, tmp: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    grpc_port, admin_port = free_port(), free_port()
    with open(tmp / "ateapi.log", "ab") as log:
        argv = ateapi_argv(
            listen=f"127.0.0.1:{grpc_port}",
            admin_listen=f"127.0.0.1:{admin_port}",
            tls_dir=pki.dir,
            trust_domain=TRUST_DOMAIN,
            store=store,
            reconcile_every=0.5,
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", *argv, "--log-level=info"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    return proc, grpc_port, admin_port


async def _exercise(pki: Pki, store: str, tmp: Path) -> None:
    proc, grpc_port, admin_port = start_daemon(pki, store, tmp)
    try:
        await anyio.to_thread.run_sync(wait_http, f"http://127.0.0.1:{admin_port}/healthz")
        node = NodeRef(name="node-0")
        agent = FakeNodeAgent(node, FakeBucket(), [WorkerRef(name="w-0-0")])
        async with serve_atelet(
            agent, ssl=server_context(pki.files("atelet-0")), trust_domain=TRUST_DOMAIN
        ) as atelet:
            # the node's atelet registers its worker, naming its own address
            channel = Channel("127.0.0.1", grpc_port, ssl=client_context(pki.files("atelet-0")))
            try:
                registry = pb.WorkerRegistryStub(channel)
                await registry.register_worker(
                    pb.RegisterWorkerRequest(
                        name="w-0-0",
                        node="node-0",
                        ips=["127.0.0.1"],
                        sandbox_class=sandbox_class_to_proto(SandboxClass.FAKE),
                        runtime_versions=["fake-1"],
                        epoch=1,
                        capacity=capacity_to_proto(
                            Capacity(cpu_milli=1000, memory_bytes=1 << 30, actors=4)
                        ),
                        atelet_address=atelet.address,
                    )
                )
            finally:
                await _close_channel(channel)
            ready = await anyio.to_thread.run_sync(
                wait_http, f"http://127.0.0.1:{admin_port}/readyz"
            )
            assert ready.strip() == "ok"
            async with AteClient.connect(
                f"127.0.0.1:{grpc_port}", tls_dir=pki.dir, name="client"
            ) as client:
                await client.create_atespace("lab")
                await client.create_template(
                    ActorTemplate(
                        ref=TemplateRef(atespace="lab", name="counter"),
                        containers=(
                            Container(
                                name="app",
                                image="local/counter",
                                wakeup_probe=Probe(path="/readyz"),
                            ),
                        ),
                        resources=Resources(cpu_milli=100, memory_bytes=64 << 20),
                        sandbox_class=SandboxClass.FAKE,
                        snapshot_config=SnapshotConfig(storage_location="memory://bucket"),
                    )
                )
                actor = await client.create_actor("lab/c1", template="lab/counter")
                assert actor.state is ActorState.SUSPENDED
                r = await client.resume_actor("lab/c1")
                assert r.resumed and r.actor.state is ActorState.RUNNING
                uid = r.actor.metadata.uid
                assert agent.request(WorkerRef(name="w-0-0"), uid) == 1
                assert agent.request(WorkerRef(name="w-0-0"), uid) == 2
                s = await client.suspend_actor("lab/c1", mode=SuspendMode.ASYNC)
                assert s.state is ActorState.SUSPENDED
                r2 = await client.resume_actor("lab/c1")
                assert r2.source is RestoreSource.LOCAL
                assert agent.request(WorkerRef(name="w-0-0"), uid) == 3
                warm = await client.resume_actor("lab/c1")
                assert warm.resumed is False
                workers = await client.list_workers()
                assert [w.ref.name for w in workers] == ["w-0-0"]
                assert workers[0].atelet_address == atelet.address
        metrics = await anyio.to_thread.run_sync(
            wait_http, f"http://127.0.0.1:{admin_port}/metrics"
        )
        assert (
            'substrate_ateapi_workflow_duration_seconds_count{outcome="ok",workflow="resume"}'
            in metrics
        )
        proc.send_signal(signal.SIGTERM)
        code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=15))
        assert code == 0, (tmp / "ateapi.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_daemon_on_the_memory_store(pki: Pki, tmp_path: Path) -> None:
    await _exercise(pki, "memory://", tmp_path)


@pytest.mark.postgres
async def test_daemon_on_postgresql(pki: Pki, tmp_path: Path, pg_server: PgHandle) -> None:
    database = await pg_server.take_database()
    try:
        await _exercise(pki, pg_server.url(database), tmp_path)
    finally:
        await pg_server.discard_database(database)


def test_flags_are_validated() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "daemons.ateapi", "--store", "memory://"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "give exactly one of --tls-dir DIR and --insecure" in out.stderr
