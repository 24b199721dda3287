"""A custom control plane in one process: substrate's scheduler and workflows as a library.

    python examples/custom_control_plane.py [--workers 4] [--actors 6]

No daemons, no network: the memory store (``substrate.adapters.memory.MemoryStore``), the
fleet cache (``substrate.services.worker_cache.WorkerCache``) and the workflows
(``substrate.services.actors.ActorService``: create, resume — which runs the real
scheduler —, suspend, pause, revert, tags) drive fake nodes from ``substrate.testing``.
Swap the fake nodes for ``substrate.api.atelet.GrpcNodeAgents`` and the store for
PostgreSQL (``substrate.adapters.urls.open_store``) and this is ateapi without its gRPC
front: ``daemons/ateapi/wiring.py`` does exactly that.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
from collections import Counter

import anyio
import structlog

from substrate.adapters.memory.store import MemoryStore
from substrate.core.ids import ActorRef, NodeRef, TagRef, TemplateRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorTemplate,
    Capacity,
    Container,
    Probe,
    Resources,
    SandboxClass,
    SnapshotConfig,
    SuspendMode,
    Worker,
)
from substrate.services.actors import ActorService, ServiceConfig
from substrate.services.worker_cache import WorkerCache
from substrate.testing.fake_node import FakeNodes

LOCATION = "memory://bucket"


async def run(workers: int, actors: int) -> int:
    nodes = FakeNodes()  # fake atelets: sandboxes are counters, snapshots go to a fake bucket
    async with MemoryStore() as store:
        cache = WorkerCache(store)
        service = ActorService(
            store=store,
            agents=nodes,
            workers=cache,
            objects=nodes.bucket,
            config=ServiceConfig(default_storage_location=LOCATION),
            rng=random.Random(7),
        )
        async with cache, service:
            # the fleet: two nodes, their workers registered as atelets would
            for n in range(2):
                node = NodeRef(name=f"node-{n}")
                refs = [WorkerRef(name=f"w-{n}-{i}") for i in range(workers // 2)]
                nodes.add_node(node, refs)
                for ref in refs:
                    await service.register_worker(
                        Worker(
                            ref=ref,
                            node=node,
                            ips=("127.0.0.1",),
                            sandbox_class=SandboxClass.FAKE,
                            runtime_versions=frozenset({"fake-1"}),
                            epoch=1,
                            capacity=Capacity(cpu_milli=1000, memory_bytes=1 << 30, actors=4),
                        )
                    )
            await cache.wait_ready()

            await service.create_atespace("lab")
            template = await service.create_template(
                ActorTemplate(
                    ref=TemplateRef(atespace="lab", name="counter"),
                    containers=(
                        Container(
                            name="app", image="counter:1", wakeup_probe=Probe(path="/readyz")
                        ),
                    ),
                    resources=Resources(cpu_milli=250, memory_bytes=64 << 20),
                    sandbox_class=SandboxClass.FAKE,
                    snapshot_config=SnapshotConfig(storage_location=LOCATION),
                )
            )

            # resume = schedule (power of two choices over the fleet index) + restore/boot
            placed: Counter[str] = Counter()
            refs = [ActorRef(atespace="lab", name=f"a{i}") for i in range(actors)]
            for ref in refs:
                await service.create_actor(ref, template=template.ref)
                result = await service.resume(ref)
                assignment = result.actor.status.assignment
                assert assignment is not None
                placed[assignment.worker.name] += 1
                print(f"{ref} -> {assignment.worker.name} ({result.provenance})")
            print("placements:", dict(sorted(placed.items())))

            # a request is a counter increment on the fake node the actor runs on
            def call(a: Actor) -> int:
                assignment = a.status.assignment
                assert assignment is not None
                return nodes.for_node(assignment.node).request(assignment.worker, a.metadata.uid)

            first = refs[0]
            actor = await store.get_actor(first)
            print(f"{first}: count={call(actor)}, count={call(actor)}")
            await service.suspend(first, SuspendMode.SYNC)
            resumed = await service.resume(first)
            print(
                f"{first}: suspended and resumed from {resumed.provenance} "
                f"(generation {resumed.generation}): count={call(resumed.actor)}"
            )
            await service.suspend(first, SuspendMode.SYNC)
            tag = await service.create_tag(TagRef(atespace="lab", name="gold"), first)
            clone = ActorRef(atespace="lab", name="clone")
            await service.create_actor(clone, template=template.ref, source_tag=tag.ref)
            started = await service.resume(clone)
            print(
                f"{clone}: started from tag {tag.ref} ({started.provenance}): "
                f"count={call(started.actor)}"
            )
            await service.drain_worker(WorkerRef(name="w-0-0"))
            listed, _ = await store.list_actors("lab", page_size=1000)
            left = [
                a.ref.name
                for a in listed
                if a.status.assignment is not None and a.status.assignment.worker.name == "w-0-0"
            ]
            print(f"drained w-0-0: its actors were suspended; left on it: {left or 'none'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workers", type=int, default=4, help="workers (split over two nodes)")
    p.add_argument("--actors", type=int, default=6)
    p.add_argument("--verbose", action="store_true", help="show the workflows' log lines")
    args = p.parse_args(argv)
    if not args.verbose:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    return anyio.run(run, max(2, args.workers), args.actors)


if __name__ == "__main__":
    sys.exit(main())
