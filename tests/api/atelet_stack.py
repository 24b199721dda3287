"""ateapi driving atelets over real gRPC: a fake node agent served over mTLS per node.

``grpc_cluster(pki)`` is the workflow harness of ``tests/services/harness.py`` with the
node agents behind :func:`substrate.api.atelet.serve_atelet` (one server per node on
127.0.0.1, a free port, the node's ``atelet-<n>`` certificate) and ateapi reaching them
through :class:`substrate.api.atelet.GrpcNodeAgents` (ateapi's certificate), addressed by
the ``atelet_address`` its workers registered with.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import attrs

from substrate.adapters.memory.clock import ManualClock
from substrate.adapters.memory.store import MemoryStore
from substrate.api.atelet import GrpcNodeAgents, serve_atelet
from substrate.api.server import Serving
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
from substrate.identity import client_context, server_context
from substrate.services.actors import ActorService, ServiceConfig
from substrate.services.worker_cache import WorkerCache
from substrate.testing.fake_node import FakeBucket, FakeNodeAgent

from .mtls_stack import TRUST_DOMAIN, Pki

STORAGE = "memory://bucket"


def worker_record(ref: WorkerRef, node: NodeRef, atelet_address: str, *, slots: int = 2) -> Worker:
    """A worker as its atelet registers it (FAKE sandboxes, runtime ``fake-1``)."""
    return Worker(
        ref=ref,
        node=node,
        ips=("127.0.0.1",),
        sandbox_class=SandboxClass.FAKE,
        runtime_versions=frozenset({"fake-1"}),
        epoch=1,
        capacity=Capacity(cpu_milli=1000, memory_bytes=1 << 30, actors=slots),
        atelet_address=atelet_address,
    )


@attrs.define
class GrpcCluster:
    store: Store
    svc: ActorService
    cache: WorkerCache
    agents: GrpcNodeAgents
    bucket: FakeBucket
    fakes: dict[NodeRef, FakeNodeAgent]
    servers: dict[NodeRef, Serving]
    clock: ManualClock
    template: ActorTemplate
    workers: list[Worker]

    def fake(self, node: str | NodeRef) -> FakeNodeAgent:
        return self.fakes[node if isinstance(node, NodeRef) else NodeRef(node)]

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
        return self.fakes[a.node].request(a.worker, actor.metadata.uid)

    def all_fakes(self) -> list[FakeNodeAgent]:
        return list(self.fakes.values())


@asynccontextmanager
async def grpc_cluster(
    pki: Pki,
    *,
    nodes: int = 2,
    workers_per_node: int = 2,
    slots: int = 2,
    insecure: bool = False,
    ateapi_bundle: str = "ateapi",
) -> AsyncIterator[GrpcCluster]:
    """A store, the worker cache, one served fake atelet per node, and the service."""
    assert nodes <= 2, "the PKI has atelet bundles for node-0 and node-1 only"
    clock = ManualClock(1_000_000.0)
    ids = itertools.count(1)
    bucket = FakeBucket()
    async with AsyncExitStack() as stack:
        store: Store = await stack.enter_async_context(MemoryStore(clock=clock))
        fakes: dict[NodeRef, FakeNodeAgent] = {}
        servers: dict[NodeRef, Serving] = {}
        refs_of: dict[NodeRef, list[WorkerRef]] = {}
        for n in range(nodes):
            node = NodeRef(name=f"node-{n}")
            refs = [WorkerRef(name=f"w-{n}-{i}") for i in range(workers_per_node)]
            refs_of[node] = refs
            fakes[node] = FakeNodeAgent(node, bucket, refs)
            servers[node] = await stack.enter_async_context(
                serve_atelet(
                    fakes[node],
                    "127.0.0.1",
                    0,
                    ssl=None if insecure else server_context(pki.files(f"atelet-{n}")),
                    insecure=insecure,
                    trust_domain=TRUST_DOMAIN,
                )
            )
        cache = WorkerCache(store, relist_every=3600, retry_initial=0.01, retry_cap=0.05)
        await stack.enter_async_context(cache)
        agents = GrpcNodeAgents(
            cache,
            ssl=None if insecure else client_context(pki.files(ateapi_bundle)),
            trust_domain=TRUST_DOMAIN,
            insecure=insecure,
        )
        await stack.enter_async_context(agents)
        svc = ActorService(
            store=store,
            agents=agents,
            workers=cache,
            objects=bucket,
            config=ServiceConfig(default_storage_location=STORAGE),
            clock=clock,
            rng=random.Random(7),
            new_id=lambda: f"snap{next(ids)}",
        )
        await stack.enter_async_context(svc)
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
                snapshot_config=SnapshotConfig(storage_location=STORAGE),
            )
        )
        registered = []
        for node, refs in refs_of.items():
            for ref in refs:
                registered.append(  # noqa: PERF401 - awaits in order
                    await svc.register_worker(
                        worker_record(ref, node, servers[node].address, slots=slots)
                    )
                )
        await cache.wait_ready()
        yield GrpcCluster(
            store=store,
            svc=svc,
            cache=cache,
            agents=agents,
            bucket=bucket,
            fakes=fakes,
            servers=servers,
            clock=clock,
            template=template,
            workers=registered,
        )
