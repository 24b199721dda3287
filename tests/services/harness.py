"""A small cluster for workflow tests: a store, the worker cache, fake nodes, the service."""

from __future__ import annotations

import itertools
import random
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import attrs

from substrate.adapters.memory.clock import ManualClock
from substrate.adapters.memory.store import MemoryStore
from substrate.core.ids import ActorRef, NodeRef, TemplateRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorTemplate,
    Capacity,
    Container,
    Probe,
    Resources,
    SandboxClass,
    SnapshotConfig,
    Worker,
)
from substrate.core.ports import Store
from substrate.services.actors import ActorService, ServiceConfig
from substrate.services.worker_cache import WorkerCache
from substrate.testing.fake_node import FakeNodeAgent, FakeNodes

StoreFactory = Callable[[ManualClock], AbstractAsyncContextManager[Store]]


@asynccontextmanager
async def memory_store(clock: ManualClock) -> AsyncIterator[Store]:
    async with MemoryStore(clock=clock) as store:
        yield store


@attrs.define
class Cluster:
    store: Store
    svc: ActorService
    cache: WorkerCache
    nodes: FakeNodes
    clock: ManualClock
    template: ActorTemplate
    workers: list[Worker]

    def agent(self, node: str) -> FakeNodeAgent:
        return self.nodes.for_node(NodeRef(name=node))

    async def actor(self, name: str) -> Actor:
        return await self.store.get_actor(ActorRef(atespace="lab", name=name))

    async def new_actor(self, name: str) -> Actor:
        return await self.svc.create_actor(
            ActorRef(atespace="lab", name=name), template=self.template.ref
        )

    def call(self, actor: Actor) -> int:
        """An HTTP request to a RUNNING actor, through the fake node it runs on."""
        a = actor.status.assignment
        assert a is not None, f"{actor.ref} has no worker"
        return self.nodes.for_node(a.node).request(a.worker, actor.metadata.uid)

    async def allocated_matches_bindings(self) -> None:
        bindings = await self.store.list_bindings()
        for w in await self.store.list_workers():
            mine = [b for b in bindings if b.worker == w.ref]
            assert w.allocated.actors == len(mine), (w.ref, w.allocated, mine)
            assert w.allocated.cpu_milli == sum(b.resources.cpu_milli for b in mine)


@asynccontextmanager
async def cluster(
    make_store: StoreFactory = memory_store,
    *,
    nodes: int = 2,
    workers_per_node: int = 2,
    slots: int = 2,
    config: ServiceConfig | None = None,
) -> AsyncIterator[Cluster]:
    clock = ManualClock(1_000_000.0)
    ids = itertools.count(1)
    fake = FakeNodes()
    async with make_store(clock) as store:
        cache = WorkerCache(store, relist_every=3600, retry_initial=0.01, retry_cap=0.05)
        svc = ActorService(
            store=store,
            agents=fake,
            workers=cache,
            objects=fake.bucket,
            config=config or ServiceConfig(default_storage_location="memory://bucket"),
            clock=clock,
            rng=random.Random(7),
            new_id=lambda: f"snap{next(ids)}",
        )
        async with cache, svc:
            await svc.create_atespace("lab")
            template = await svc.create_template(
                ActorTemplate(
                    ref=TemplateRef(atespace="lab", name="counter"),
                    containers=(
                        Container(
                            name="app", image="local/counter", wakeup_probe=Probe(path="/readyz")
                        ),
                    ),
                    resources=Resources(cpu_milli=100, memory_bytes=64 << 20),
                    sandbox_class=SandboxClass.FAKE,
                    snapshot_config=SnapshotConfig(storage_location="memory://bucket"),
                )
            )
            registered = []
            for n in range(nodes):
                node = NodeRef(name=f"node-{n}")
                refs = [WorkerRef(name=f"w-{n}-{i}") for i in range(workers_per_node)]
                fake.add_node(node, refs)
                for ref in refs:
                    registered.append(  # noqa: PERF401 - awaits in order
                        await svc.register_worker(
                            Worker(
                                ref=ref,
                                node=node,
                                ips=("127.0.0.1",),
                                sandbox_class=SandboxClass.FAKE,
                                runtime_versions=frozenset({"fake-1"}),
                                epoch=1,
                                capacity=Capacity(
                                    cpu_milli=1000, memory_bytes=1 << 30, actors=slots
                                ),
                            )
                        )
                    )
            await cache.wait_ready()
            yield Cluster(
                store=store,
                svc=svc,
                cache=cache,
                nodes=fake,
                clock=clock,
                template=template,
                workers=registered,
            )
