"""The worker's workload manager over the fake runtime, in process and over its Unix socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from substrate.adapters.memory import FakeSandboxRuntime
from substrate.adapters.memory.network import FakeHostNetwork
from substrate.api.worker import GrpcWorker, serve_worker
from substrate.core.ids import ActorRef, NodeRef
from substrate.core.model import Capacity, Container, Probe, Resources, SandboxClass
from substrate.errors import (
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from substrate.net.plan import plan_for
from substrate.sandbox.node_layout import NodeLayout
from substrate.sandbox.spec import SandboxAddress, SandboxSpec, sandbox_id_for
from substrate.sandbox.worker_ports import WorkerApi, WorkloadRequest
from substrate.services.workloads import WorkerConfig, WorkloadManager, next_epoch
from substrate.testing.contracts.sandbox import held_connection, http_get
from substrate.testing.contracts.store import raises

pytestmark = pytest.mark.anyio

ACTOR = ActorRef("as1", "counter")
COUNTER = Container(
    name="main",
    image="counter:1",
    command=("/bin/counter",),
    ports=(80,),
    wakeup_probe=Probe(path="/readyz", port=80),
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class RecordingIngress:
    """atunnel's part, recorded: which actors are routed where, and how often reset."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[ActorRef, SandboxAddress]] = {}
        self.aborts: list[str] = []

    def activate(
        self,
        actor: ActorRef,
        actor_uid: str,
        address: SandboxAddress,
        *,
        default_port: int | None = None,
    ) -> None:
        assert default_port == 80
        self.routes[actor_uid] = (actor, address)

    async def abort(self, actor_uid: str) -> int:
        await anyio.lowlevel.checkpoint()
        self.aborts.append(actor_uid)
        return 0

    async def deactivate(self, actor_uid: str) -> None:
        await anyio.lowlevel.checkpoint()
        self.routes.pop(actor_uid, None)


@asynccontextmanager
async def worker(
    tmp_path: Path,
    name: str,
    *,
    actors: int = 4,
    probe_timeout: float = 5.0,
    runtime: FakeSandboxRuntime | None = None,
    max_concurrent_starts: int = 2,
) -> AsyncIterator[tuple[WorkloadManager, FakeHostNetwork, RecordingIngress]]:
    network = FakeHostNetwork()
    ingress = RecordingIngress()
    async with runtime or FakeSandboxRuntime() as rt:
        manager = WorkloadManager(
            WorkerConfig(
                name=name,
                node=NodeRef("node-a"),
                capacity=Capacity(cpu_milli=4000, memory_bytes=4 << 30, actors=actors),
                sandbox_class=SandboxClass.FAKE,
                probe_timeout=probe_timeout,
                max_concurrent_starts=max_concurrent_starts,
            ),
            layout=NodeLayout(str(tmp_path / "node")),
            runtime=rt,
            network=network,
            ingress=ingress,
            epoch=7,
        )
        async with manager.serving():
            yield manager, network, ingress


def request(tmp_path: Path, uid: str, **kw: object) -> WorkloadRequest:
    fields: dict[str, object] = {
        "actor": ACTOR,
        "actor_uid": uid,
        "bundle_dir": str(tmp_path / "node" / "actors" / uid / "bundle"),
        "containers": (COUNTER,),
        "resources": Resources(cpu_milli=250, memory_bytes=64 << 20),
    }
    fields.update(kw)
    return WorkloadRequest(**fields)  # type: ignore[arg-type]


def exists(path: str) -> bool:
    return Path(path).exists()


def is_dir(path: str) -> bool:
    return Path(path).is_dir()


def mode(path: str) -> int:
    return Path(path).stat().st_mode & 0o777


async def count(address: SandboxAddress) -> int:
    answer = await http_get(address, 80, "/")
    assert answer.status == 200
    return int(answer.body.split()[0].split(b"=")[1])


async def test_run_checkpoint_restore_elsewhere(tmp_path: Path) -> None:
    image = str(tmp_path / "img")
    async with worker(tmp_path, "w1") as (w1, net1, in1):
        started = await w1.run(request(tmp_path, "u1"))
        assert started.worker_epoch == 7
        assert {"network", "run", "probe"} <= set(started.timings)
        assert await net1.exists(plan_for("w1", "u1"))
        _, address = in1.routes["u1"]
        assert await count(address) == 1
        assert await count(address) == 2
        # re-entry after a lost reply: nothing new starts
        assert (await w1.run(request(tmp_path, "u1"))).worker_epoch == 7
        assert await count(address) == 3
        assert (await w1.stats("u1")).memory_bytes >= 0

        done = await w1.checkpoint("u1", image, worker_epoch=7)
        assert done.files and done.runtime_version == "fake-1"
        assert in1.aborts == ["u1"]
        assert "u1" not in in1.routes
        await w1.settled()  # the network goes after the reply
        assert not await net1.exists(plan_for("w1", "u1"))
        assert w1.running() == []
        with raises(NotFound):
            await w1.stats("u1")

    async with worker(tmp_path, "w2") as (w2, net2, in2):
        restored = await w2.restore(request(tmp_path, "u1", restore_dir=image))
        assert "restore" in restored.timings
        _, address = in2.routes["u1"]
        assert await count(address) == 4, "the counter continued from the image"
        assert is_dir(image), "preserve_restore_dir defaults to keeping it"
        await w2.terminate("u1")
        await w2.terminate("u1")  # idempotent
        assert "u1" not in in2.routes
        assert not await net2.exists(plan_for("w2", "u1"))


async def test_restore_removes_a_downloaded_copy(tmp_path: Path) -> None:
    image = str(tmp_path / "img")
    async with worker(tmp_path, "w1") as (w1, _, _):
        await w1.run(request(tmp_path, "u1"))
        await w1.checkpoint("u1", image)
        await w1.restore(request(tmp_path, "u1", restore_dir=image, preserve_restore_dir=False))
        assert not exists(image)


async def test_wrong_epoch_starts_nothing(tmp_path: Path) -> None:
    async with worker(tmp_path, "w1") as (w1, net, ingress):
        started = await w1.run(request(tmp_path, "u1", worker_epoch=3))
        assert started.worker_epoch == 7
        assert not ingress.routes
        assert not await net.exists(plan_for("w1", "u1"))
        await w1.run(request(tmp_path, "u1", worker_epoch=7))
        with raises(FailedPrecondition, match="epoch 7"):
            await w1.checkpoint("u1", str(tmp_path / "img"), worker_epoch=3)
        await w1.terminate("u1", worker_epoch=3)  # that epoch's sandboxes are long gone
        assert w1.running() == ["u1"]


async def test_probe_that_never_answers_fails_and_leaves_nothing(tmp_path: Path) -> None:
    broken = Container(
        name="main",
        image="counter:1",
        command=("/bin/counter",),
        wakeup_probe=Probe(path="/missing", port=80),
    )
    async with worker(tmp_path, "w1", probe_timeout=0.3) as (w1, net, ingress):
        with raises(FailedPrecondition, match="did not answer 200 within 0.3 s"):
            await w1.run(request(tmp_path, "u1", containers=(broken,)))
        assert not ingress.routes
        assert not await net.exists(plan_for("w1", "u1"))
        with raises(NotFound):
            await w1.runtime.state(sandbox_id_for("u1"))
        # and the actor can be started again normally
        await w1.run(request(tmp_path, "u1"))


async def test_failed_checkpoint_is_reported_and_cleaned_up(tmp_path: Path) -> None:
    async with worker(tmp_path, "w1", runtime=FakeSandboxRuntime(close_grace_seconds=0.01)) as (
        w1,
        net,
        ingress,
    ):
        await w1.run(request(tmp_path, "u1"))
        _, address = ingress.routes["u1"]
        async with held_connection(address, 80):  # a connection nobody resets
            with raises(Internal, match="checkpoint failed"):
                await w1.checkpoint("u1", str(tmp_path / "img"))
        assert w1.running() == []
        assert not await net.exists(plan_for("w1", "u1"))
        with raises(FailedPrecondition):
            await w1.checkpoint("u1", str(tmp_path / "img"))


async def test_capacity_and_bad_requests(tmp_path: Path) -> None:
    async with worker(tmp_path, "w1", actors=1) as (w1, _, _):
        await w1.run(request(tmp_path, "u1"))
        with raises(ResourceExhausted, match="full"):
            await w1.run(request(tmp_path, "u2"))
        with raises(InvalidArgument, match="one container per sandbox"):
            await w1.run(request(tmp_path, "u3", containers=(COUNTER, COUNTER)))
        with raises(InvalidArgument, match="restore_dir"):
            await w1.restore(request(tmp_path, "u4"))
        no_command = Container(name="main", image="x:1")
        await w1.terminate("u1")
        with raises(InvalidArgument, match="no command"):
            await w1.run(request(tmp_path, "u5", containers=(no_command,)))
        await w1.run(request(tmp_path, "u6", containers=(no_command,), image_args=("/bin/x",)))


async def test_start_removes_leftovers_of_an_earlier_run(tmp_path: Path) -> None:
    network = FakeHostNetwork()
    await network.create(plan_for("w1", "old"))
    await network.create(plan_for("other", "theirs"))
    async with FakeSandboxRuntime() as rt:
        manager = WorkloadManager(
            WorkerConfig(name="w1", node=NodeRef("n"), capacity=Capacity(actors=1)),
            layout=NodeLayout(str(tmp_path)),
            runtime=rt,
            network=network,
        )
        async with manager.serving():
            assert not await network.exists(plan_for("w1", "old"))
            assert await network.exists(plan_for("other", "theirs"))


class SlowBootRuntime(FakeSandboxRuntime):
    """Boots take 50 ms; records how many ran at once."""

    def __init__(self) -> None:
        super().__init__()
        self.booting = 0
        self.most = 0

    async def run(self, spec: SandboxSpec) -> None:
        self.booting += 1
        self.most = max(self.most, self.booting)
        try:
            await anyio.sleep(0.05)
            await super().run(spec)
        finally:
            self.booting -= 1


async def test_only_a_few_sandboxes_boot_at_once_and_the_rest_wait(tmp_path: Path) -> None:
    runtime = SlowBootRuntime()
    async with worker(tmp_path, "w-1", actors=6, runtime=runtime, max_concurrent_starts=2) as (
        manager,
        _,
        ingress,
    ):
        started = []

        async def start(i: int) -> None:
            started.append(await manager.run(request(tmp_path, f"uid-{i}")))

        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(start, i)
        assert runtime.most == 2
        assert len(ingress.routes) == 5
        assert sum(1 for s in started if s.timings.get("queued", 0) > 0.02) >= 2


def test_concurrent_starts_must_be_positive() -> None:
    with pytest.raises(InvalidArgument, match="max_concurrent_starts"):
        WorkerConfig(
            name="w",
            node=NodeRef("n"),
            capacity=Capacity(cpu_milli=1, memory_bytes=1, actors=1),
            max_concurrent_starts=0,
        )


def test_epoch_rises_on_every_start(tmp_path: Path) -> None:
    path = str(tmp_path / "w" / "epoch")
    assert next_epoch(path) == 1
    assert next_epoch(path) == 2
    Path(path).write_text("garbage")
    assert next_epoch(path) == 1
    Path(path).write_text("41\n")
    assert next_epoch(path) == 42


async def test_the_same_over_the_unix_socket(tmp_path: Path) -> None:
    socket_path = str(tmp_path / "node" / "workers" / "w1" / "worker.sock")
    image = str(tmp_path / "img")
    async with worker(tmp_path, "w1") as (w1, _, ingress):
        async with serve_worker(w1, socket_path), GrpcWorker(socket_path) as client:
            api: WorkerApi = client
            info = await api.info()
            assert (info.name, info.epoch, info.node) == ("w1", 7, NodeRef("node-a"))
            assert info.sandbox_class is SandboxClass.FAKE
            assert info.runtime_versions == ("fake-1",)
            assert info.capacity.actors == 4
            assert (await api.run(request(tmp_path, "u1"))).worker_epoch == 7
            _, address = ingress.routes["u1"]
            assert await count(address) == 1
            assert (await api.stats("u1")).uptime_seconds >= 0
            done = await api.checkpoint("u1", image, worker_epoch=7)
            assert done.files and done.size_bytes > 0
            with raises(NotFound):
                await api.stats("u1")
            with raises(FailedPrecondition):
                await api.checkpoint("u1", image)
            await api.restore(request(tmp_path, "u1", restore_dir=image))
            _, address = ingress.routes["u1"]
            assert await count(address) == 2
            await api.terminate("u1", worker_epoch=7)
            assert mode(socket_path) == 0o600
        assert not exists(socket_path)
    with raises(Unavailable, match="cannot reach"):
        async with GrpcWorker(socket_path) as gone:
            await gone.info()
