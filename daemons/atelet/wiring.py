"""Build atelet from its settings: node directory, workers, object stores, gRPC, registrar."""

from __future__ import annotations

from contextlib import AsyncExitStack

import anyio
import structlog

from daemons._common.lifecycle import run_until_signal
from daemons.atelet.settings import Settings
from substrate.adapters.gvisor.image_store import LocalImageStore
from substrate.adapters.objectstore.factory import BlobStores
from substrate.api.atelet import serve_atelet
from substrate.api.worker import NodeWorkers
from substrate.client.registry import GrpcRegistry
from substrate.core.ids import NodeRef
from substrate.identity import TlsFiles
from substrate.identity.tls import server_context
from substrate.net.backoff import Backoff
from substrate.sandbox.node_layout import NodeLayout
from substrate.services.node_agent import NodeAgentConfig, NodeAgentService
from substrate.services.registration import RegistrarConfig, WorkerRegistrar

log = structlog.get_logger("substrate.atelet")


async def run(settings: Settings) -> None:
    server_ssl = None
    tls = None
    if settings.tls_dir is not None:
        tls = TlsFiles.in_dir(settings.tls_dir, "atelet")
        if missing := tls.missing():
            raise SystemExit(f"missing TLS files: {', '.join(map(str, missing))}")
        server_ssl = server_context(tls)
    layout = NodeLayout(str(settings.node_dir))
    node = NodeRef(settings.node)

    async def serve(stop: anyio.Event) -> None:
        async with AsyncExitStack() as stack:
            workers = NodeWorkers(layout, timeout=None)
            stack.push_async_callback(workers.close)
            agent = NodeAgentService(
                node,
                layout,
                workers,
                BlobStores(from_env=True, roots=settings.objects),
                LocalImageStore(str(settings.images)),
                config=NodeAgentConfig(tag_cache_max_bytes=settings.tag_cache_max_bytes),
            )
            host, port = settings.listen
            grpc = await stack.enter_async_context(
                serve_atelet(
                    agent,
                    host,
                    port,
                    ssl=server_ssl,
                    insecure=settings.insecure,
                    trust_domain=settings.trust_domain,
                )
            )
            advertise = settings.advertise or grpc.address
            log.info("atelet serving", address=grpc.address, advertise=advertise, node=node.name)
            registry = GrpcRegistry.connect(
                settings.ateapi,
                tls=tls,
                trust_domain=settings.trust_domain,
                insecure=settings.insecure,
            )
            await stack.enter_async_context(registry)
            registrar = WorkerRegistrar(
                registry,
                workers.current,
                node=node,
                atelet_address=advertise,
                ips=settings.ips,
                config=RegistrarConfig(
                    heartbeat_every=settings.heartbeat_every,
                    retry=Backoff(interval=0.2, factor=2.0, jitter=0.2),
                    retry_cap=2.0,
                ),
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(registrar.run)
                await stop.wait()
                log.info("draining: no new RPCs")
                grpc.server.close()
                with anyio.move_on_after(30):
                    await grpc.server.wait_closed()
                tg.cancel_scope.cancel()

    await run_until_signal(serve)
