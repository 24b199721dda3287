"""The workload manager with real gVisor sandboxes, netns, nftables and the egress proxy.

What only a real sandbox can show: an actor's outbound TCP is redirected to the worker's
egress proxy (allowed destinations reached, others refused), and a checkpoint taken while
the actor holds an egress connection open succeeds because the worker resets it first —
runsc would otherwise refuse to checkpoint and kill the sandbox.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import pytest

from substrate.adapters.gvisor.images import unpack_rootfs
from substrate.adapters.gvisor.runtime import RunscRuntime
from substrate.adapters.linux.netlink import LinuxHostNetwork
from substrate.core.ids import ActorRef, NodeRef
from substrate.core.model import Capacity, Container, Probe, SandboxClass
from substrate.net.egress_policy import EgressPolicy
from substrate.net.plan import ACTOR_ADDRESS, netns_prefix, plan_for, veth_prefix, worker_tag
from substrate.sandbox.node_layout import NodeLayout
from substrate.sandbox.runsc_argv import RunscOptions
from substrate.sandbox.spec import sandbox_id_for
from substrate.sandbox.worker_ports import WorkloadRequest
from substrate.services.egress import EgressProxy
from substrate.services.probe import http_status
from substrate.services.workloads import WorkerConfig, WorkloadManager
from tests.contracts.gvisor_factory import counter_image
from tests.privileges import needs_nft, needs_runsc

pytestmark = [pytest.mark.anyio, pytest.mark.runsc, needs_runsc, needs_nft]

TARGET = "169.254.18.1"
"""An address on a dummy link of the test's own, reachable only through the redirect."""

COUNTER = Container(
    name="main", image="counter:1", command=("/bin/counter",), wakeup_probe=Probe(path="/readyz")
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _serve(listener: socket.socket, stop: threading.Event) -> None:
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nhello from outside\n")
            except OSError:
                pass


@contextmanager
def outside_server() -> Iterator[int]:
    """An HTTP server at TARGET, an address on a link only this test uses."""
    tag = secrets.token_hex(2)
    link, peer = f"tega{tag}", f"tegb{tag}"
    # no dummy links on this kernel: one end of a veth pair of our own carries the address
    subprocess.run(["ip", "link", "add", link, "type", "veth", "peer", "name", peer], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{TARGET}/32", "dev", link], check=True)
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
        subprocess.run(["ip", "link", "set", peer, "up"], check=True)
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((TARGET, 0))
        listener.listen()
        stop = threading.Event()
        thread = threading.Thread(target=_serve, args=(listener, stop), daemon=True)
        thread.start()
        try:
            yield int(listener.getsockname()[1])
        finally:
            stop.set()
            thread.join(5)
            listener.close()
    finally:
        subprocess.run(["ip", "link", "del", link], check=False)


@asynccontextmanager
async def gvisor_worker(tmp_path: Path, allow: str) -> AsyncIterator[WorkloadManager]:
    name = f"tgw-{secrets.token_hex(3)}"
    layout = NodeLayout(str(tmp_path / "node"))
    network = LinuxHostNetwork()
    proxy = EgressProxy(
        network,
        table=f"tgw_{worker_tag(name)}",
        veth_prefix=veth_prefix(name),
        policy=EgressPolicy.parse(allow),
    )
    runtime = RunscRuntime(RunscOptions(root=layout.worker_runsc_root(name)))
    async with proxy, runtime:
        manager = WorkloadManager(
            WorkerConfig(
                name=name,
                node=NodeRef("n1"),
                capacity=Capacity(cpu_milli=1000, memory_bytes=1 << 30, actors=2),
                sandbox_class=SandboxClass.GVISOR,
                actor_address=ACTOR_ADDRESS,
                probe_timeout=20,
            ),
            layout=layout,
            runtime=runtime,
            network=network,
            egress=proxy,
        )
        async with manager.serving():
            yield manager
    netns, veths = await network.owned(netns_prefix(name), veth_prefix(name))
    assert (netns, veths) == ([], []), "the worker left network behind"


async def in_sandbox(manager: WorkloadManager, uid: str, script: str) -> str:
    runtime = manager.runtime
    assert isinstance(runtime, RunscRuntime)
    opts = runtime.options
    argv = ["runsc", "--root", opts.root, "exec", sandbox_id_for(uid), "/bin/sh", "-c", script]
    done = await anyio.run_process(argv, check=False)
    return done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")


def request(tmp_path: Path, uid: str, **kw: object) -> WorkloadRequest:
    bundle = tmp_path / "bundles" / uid
    unpack_rootfs(counter_image(), bundle)
    fields: dict[str, object] = {
        "actor": ActorRef("lab", uid),
        "actor_uid": uid,
        "bundle_dir": str(bundle),
        "containers": (COUNTER,),
    }
    fields.update(kw)
    return WorkloadRequest(**fields)  # type: ignore[arg-type]


async def test_egress_is_redirected_allowed_and_refused(tmp_path: Path) -> None:
    with outside_server() as port:
        async with gvisor_worker(tmp_path, f"{TARGET}/32:{port}") as worker:
            await worker.run(request(tmp_path, "eg1"))
            allowed = await in_sandbox(
                worker, "eg1", f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc {TARGET} {port}"
            )
            assert "hello from outside" in allowed, allowed
            denied = await in_sandbox(
                worker, "eg1", f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc {TARGET} {port + 1}"
            )
            assert "hello from outside" not in denied, denied
            await worker.terminate("eg1")


async def test_checkpoint_with_an_open_egress_connection(tmp_path: Path) -> None:
    image = str(tmp_path / "img")
    with outside_server() as port:
        async with gvisor_worker(tmp_path, f"{TARGET}/32:{port}") as worker:
            await worker.run(request(tmp_path, "eg2"))
            plan = plan_for(worker.config.name, "eg2")
            address = await worker.runtime.address(sandbox_id_for("eg2"))
            assert address.device == plan.host_veth
            assert await http_status(address, 80, "/") == 200
            # the actor opens a connection out and keeps it open
            await in_sandbox(worker, "eg2", f"(sleep 60 | nc {TARGET} {port}) >/dev/null 2>&1 &")
            proxy = worker.egress
            assert isinstance(proxy, EgressProxy)
            with anyio.fail_after(10):
                while not proxy.connections("eg2"):  # noqa: ASYNC110 - polling another task's state
                    await anyio.sleep(0.05)
            done = await worker.checkpoint("eg2", image)
            assert "checkpoint.img" in done.files
            await worker.restore(request(tmp_path, "eg2", restore_dir=image))
            address = await worker.runtime.address(sandbox_id_for("eg2"))
            assert await http_status(address, 80, "/") == 200
            await worker.terminate("eg2")
