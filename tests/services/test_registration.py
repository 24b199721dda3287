"""atelet's worker registration: register, heartbeat, re-register, survive outages."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import anyio
import anyio.lowlevel
import attrs
import pytest

from substrate.adapters.memory.clock import ManualClock
from substrate.adapters.memory.sandbox import FakeSandboxRuntime
from substrate.client.registry import GrpcRegistry
from substrate.core.ids import Labels, NodeRef, WorkerRef
from substrate.core.model import Capacity, SandboxClass, Worker, WorkerState
from substrate.errors import FailedPrecondition, NotFound, PermissionDenied, Unavailable
from substrate.net.backoff import Backoff
from substrate.services.registration import RegistrarConfig, WorkerRegistrar
from substrate.testing.fake_worker import FakeWorker
from tests.api.mtls_stack import TRUST_DOMAIN, api_stack, make_pki

pytestmark = pytest.mark.anyio

NODE = NodeRef("node-0")
ATELET = "10.0.0.5:7443"
CONFIG = RegistrarConfig(
    heartbeat_every=10.0, retry=Backoff(interval=1.0, factor=2.0, jitter=0.0), retry_cap=8.0
)


class FakeRegistry:
    """ateapi's registry in memory: the epoch rule, and an outage switch."""

    def __init__(self) -> None:
        self.workers: dict[WorkerRef, Worker] = {}
        self.down = False
        self.calls: list[str] = []

    def _check(self) -> None:
        if self.down:
            raise Unavailable("ateapi unreachable")

    async def register(self, worker: Worker) -> Worker:
        await anyio.lowlevel.checkpoint()
        self.calls.append(f"register:{worker.ref.name}:{worker.epoch}")
        self._check()
        current = self.workers.get(worker.ref)
        if current is not None and worker.epoch < current.epoch:
            raise FailedPrecondition("older epoch")
        stored = attrs.evolve(worker, state=WorkerState.ACTIVE)
        self.workers[worker.ref] = stored
        return stored

    async def heartbeat(
        self, ref: WorkerRef, epoch: int, capacity: Capacity | None = None
    ) -> Worker:
        await anyio.lowlevel.checkpoint()
        self.calls.append(f"heartbeat:{ref.name}:{epoch}:{capacity is not None}")
        self._check()
        current = self.workers.get(ref)
        if current is None:
            raise NotFound(f"worker {ref} not found")
        if current.epoch != epoch:
            raise FailedPrecondition("register again")
        if capacity is not None:
            current = attrs.evolve(current, capacity=capacity)
            self.workers[ref] = current
        return current


def fake_workers(*names: str, node: NodeRef = NODE) -> dict[WorkerRef, FakeWorker]:
    runtime = FakeSandboxRuntime()  # info() never touches it
    return {
        WorkerRef(n): FakeWorker(
            runtime,
            name=n,
            node=node,
            tunnel_address=f"10.1.0.{i + 1}:8443",
            labels={"zone": "a"},
            capacity=Capacity(cpu_milli=2000, memory_bytes=4 << 30, actors=4),
        )
        for i, n in enumerate(names)
    }


def registrar(
    registry: FakeRegistry, workers: dict[WorkerRef, FakeWorker], clock: ManualClock
) -> WorkerRegistrar:
    return WorkerRegistrar(
        registry,
        dict(workers),
        node=NODE,
        atelet_address=ATELET,
        labels={"node-kind": "big", "zone": "ignored"},
        config=CONFIG,
        clock=clock,
        rng=random.Random(1),
    )


async def test_registers_every_worker_with_what_ateapi_schedules_on() -> None:
    registry, clock = FakeRegistry(), ManualClock()
    workers = fake_workers("w-0-0", "w-0-1")
    reg = registrar(registry, workers, clock)
    assert await reg.sync_once()
    stored = registry.workers[WorkerRef("w-0-0")]
    assert stored.node == NODE
    assert stored.epoch == 1
    assert stored.atelet_address == ATELET
    assert stored.tunnel_address == "10.1.0.1:8443"
    assert stored.ips == ("10.1.0.1",)
    assert stored.labels == Labels({"node-kind": "big", "zone": "a"})  # the worker's win
    assert stored.sandbox_class is SandboxClass.FAKE
    assert stored.runtime_versions == frozenset({"fake-1"})
    assert stored.capacity == Capacity(cpu_milli=2000, memory_bytes=4 << 30, actors=4)
    assert sorted(registry.calls) == ["register:w-0-0:1", "register:w-0-1:1"]


async def test_heartbeats_when_due_and_capacity_only_when_changed() -> None:
    registry, clock = FakeRegistry(), ManualClock()
    workers = fake_workers("w-0-0")
    reg = registrar(registry, workers, clock)
    await reg.sync_once()
    registry.calls.clear()
    await reg.sync_once()  # not due yet
    assert registry.calls == []
    clock.advance(10.0)
    await reg.sync_once()
    assert registry.calls == ["heartbeat:w-0-0:1:False"]
    workers[WorkerRef("w-0-0")].capacity = Capacity(cpu_milli=1000, actors=2)
    clock.advance(10.0)
    await reg.sync_once()
    assert registry.calls[-1] == "heartbeat:w-0-0:1:True"
    assert registry.workers[WorkerRef("w-0-0")].capacity == Capacity(cpu_milli=1000, actors=2)
    clock.advance(10.0)
    await reg.sync_once()
    assert registry.calls[-1] == "heartbeat:w-0-0:1:False"


async def test_epoch_change_registers_again() -> None:
    registry, clock = FakeRegistry(), ManualClock()
    workers = fake_workers("w-0-0")
    reg = registrar(registry, workers, clock)
    await reg.sync_once()
    await workers[WorkerRef("w-0-0")].restart()
    clock.advance(10.0)
    await reg.sync_once()
    assert registry.calls[-1] == "register:w-0-0:2"
    assert registry.workers[WorkerRef("w-0-0")].epoch == 2


async def test_register_again_when_a_heartbeat_says_so() -> None:
    registry, clock = FakeRegistry(), ManualClock()
    workers = fake_workers("w-0-0", "w-0-1")
    reg = registrar(registry, workers, clock)
    await reg.sync_once()
    # ateapi lost one worker and holds another epoch for the other.
    del registry.workers[WorkerRef("w-0-0")]
    registry.workers[WorkerRef("w-0-1")] = attrs.evolve(
        registry.workers[WorkerRef("w-0-1")], epoch=0
    )
    registry.calls.clear()
    clock.advance(10.0)
    assert await reg.sync_once()
    assert sorted(registry.calls) == [
        "heartbeat:w-0-0:1:False",
        "heartbeat:w-0-1:1:False",
        "register:w-0-0:1",
        "register:w-0-1:1",
    ]
    assert reg.states[WorkerRef("w-0-0")].registrations == 2


async def test_outage_backs_off_and_recovers_without_crashing() -> None:
    registry, clock = FakeRegistry(), ManualClock()
    registry.down = True
    workers = fake_workers("w-0-0")
    reg = registrar(registry, workers, clock)
    delays = []
    for _ in range(6):
        assert not await reg.sync_once()
        state = reg.states[WorkerRef("w-0-0")]
        delays.append(state.next_at - clock())
        assert "Unavailable" in state.last_error
        clock.advance(state.next_at - clock())
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]  # exponential, capped
    registry.down = False
    assert await reg.sync_once()
    assert registry.workers[WorkerRef("w-0-0")].epoch == 1
    assert reg.states[WorkerRef("w-0-0")].failures == 0


async def test_a_broken_worker_does_not_delay_the_others() -> None:
    registry, clock = FakeRegistry(), ManualClock()
    workers = fake_workers("w-0-0", "w-0-1")
    workers[WorkerRef("w-0-1")].down = True
    reg = registrar(registry, workers, clock)
    assert not await reg.sync_once()
    assert list(registry.workers) == [WorkerRef("w-0-0")]
    for _ in range(3):
        clock.advance(10.0)
        await reg.sync_once()
    assert registry.calls.count("heartbeat:w-0-0:1:False") == 3
    workers[WorkerRef("w-0-1")].down = False
    clock.advance(10.0)
    assert await reg.sync_once()
    assert WorkerRef("w-0-1") in registry.workers


async def test_worker_of_another_node_is_not_registered() -> None:
    registry, clock = FakeRegistry(), ManualClock()
    workers = fake_workers("w-1-0", node=NodeRef("node-1"))
    reg = registrar(registry, workers, clock)
    assert not await reg.sync_once()
    assert registry.workers == {}
    assert "node-1" in reg.states[WorkerRef("w-1-0")].last_error


async def test_run_loop_heartbeats_on_schedule() -> None:
    registry, clock = FakeRegistry(), ManualClock()
    workers = fake_workers("w-0-0")
    slept: list[float] = []
    beaten = anyio.Event()

    async def sleep(seconds: float) -> None:
        state = reg.states.get(WorkerRef("w-0-0"))
        if state is not None and state.heartbeats >= 3:
            beaten.set()
        slept.append(seconds)
        clock.advance(seconds)
        await anyio.lowlevel.checkpoint()

    reg = WorkerRegistrar(
        registry,
        dict(workers),
        node=NODE,
        atelet_address=ATELET,
        config=CONFIG,
        clock=clock,
        sleep=sleep,
    )
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(reg.run)
            await beaten.wait()
            tg.cancel_scope.cancel()
    assert registry.calls[:4] == [
        "register:w-0-0:1",
        "heartbeat:w-0-0:1:False",
        "heartbeat:w-0-0:1:False",
        "heartbeat:w-0-0:1:False",
    ]
    assert slept[:3] == [10.0, 10.0, 10.0]


# --- over real gRPC, against an in-process ateapi ------------------------------------------


async def test_grpc_registry_against_ateapi(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    async with api_stack(pki) as st:
        registry = GrpcRegistry.connect(
            st.address, tls=pki.files("atelet-0"), trust_domain=TRUST_DOMAIN
        )
        async with registry:
            workers = fake_workers("w-0-0", "w-0-9")
            await workers[WorkerRef("w-0-0")].restart()  # the harness registered epoch 1
            reg = WorkerRegistrar(
                registry,
                dict(workers),
                node=NODE,
                atelet_address="127.0.0.1:7443",
                config=CONFIG,
            )
            assert await reg.sync_once()
            stored = await st.cluster.store.get_worker(WorkerRef("w-0-0"))
            assert stored.epoch == 2
            assert stored.atelet_address == "127.0.0.1:7443"
            assert stored.state is WorkerState.ACTIVE
            new = await st.cluster.store.get_worker(WorkerRef("w-0-9"))
            assert new.node == NODE
            assert new.tunnel_address == "10.1.0.2:8443"
            assert new.labels == Labels({"zone": "a"})

            assert await reg.sync_once(force=True)  # heartbeats now
            assert reg.states[WorkerRef("w-0-0")].heartbeats == 1
            assert reg.states[WorkerRef("w-0-9")].heartbeats == 1

            # A heartbeat for a stale epoch: ateapi answers "register again".
            with pytest.raises(FailedPrecondition, match="register again"):
                await registry.heartbeat(WorkerRef("w-0-0"), 1)
            # atelet-0 may not act for node-1's workers.
            with pytest.raises(PermissionDenied):
                await registry.heartbeat(WorkerRef("w-1-0"), 1)


async def test_grpc_registry_unreachable_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with GrpcRegistry.connect(f"127.0.0.1:{port}", insecure=True, timeout=2.0) as registry:
        with pytest.raises(Unavailable):
            await registry.heartbeat(WorkerRef("w-0-0"), 1)
