"""Build ateapi from its settings: store, worker cache, node agents, service, servers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import structlog
from prometheus_client import generate_latest

from daemons._common.lifecycle import run_until_signal
from daemons.ateapi.settings import Settings
from substrate.adapters.objectstore import ObstoreSnapshotObjects
from substrate.adapters.observability import PrometheusWorkflowMetrics
from substrate.adapters.urls import open_store
from substrate.api.atelet import GrpcNodeAgents
from substrate.api.server import serving
from substrate.core.ports import Store
from substrate.errors import Unavailable
from substrate.identity import TlsFiles
from substrate.identity.tls import client_context, server_context
from substrate.services.actors import ActorService, ServiceConfig
from substrate.services.admin_http import AdminResponse, serve_admin
from substrate.services.worker_cache import WorkerCache

log = structlog.get_logger("substrate.ateapi")


@asynccontextmanager
async def open_store_when_ready(url: str) -> AsyncIterator[Store]:
    """Open the store, waiting (and saying so) while its server is not reachable yet."""
    delay = 0.2
    while True:
        try:
            async with open_store(url) as store:
                yield store
                return
        except Unavailable as exc:
            log.warning("store not reachable yet; retrying", error=exc.description)
            await anyio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def run(settings: Settings) -> None:
    metrics = PrometheusWorkflowMetrics()
    server_ssl = client_ssl = None
    if settings.tls_dir is not None:
        files = TlsFiles.in_dir(settings.tls_dir, "ateapi")
        if missing := files.missing():
            raise SystemExit(f"missing TLS files: {', '.join(map(str, missing))}")
        server_ssl = server_context(files)
        # Every call pins the peer's SPIFFE id, so host names need not be in certificates.
        client_ssl = client_context(files, check_hostname=False)
    config = ServiceConfig(
        lease_ttl=settings.lease_ttl,
        heartbeat_timeout=settings.heartbeat_timeout,
        reconcile_every=settings.reconcile_every,
        default_storage_location=settings.default_storage_location,
        golden_enabled=settings.golden,
    )

    async def serve(stop: anyio.Event) -> None:
        async with AsyncExitStack() as stack:
            store = await stack.enter_async_context(open_store_when_ready(settings.store))
            cache = await stack.enter_async_context(WorkerCache(store, retry_cap=1.0))
            agents = await stack.enter_async_context(
                GrpcNodeAgents(
                    cache,
                    ssl=client_ssl,
                    trust_domain=settings.trust_domain,
                    insecure=settings.insecure,
                )
            )
            objects = ObstoreSnapshotObjects() if settings.objects else None
            service = await stack.enter_async_context(
                ActorService(
                    store=store,
                    agents=agents,
                    workers=cache,
                    objects=objects,
                    config=config,
                    metrics=metrics,
                )
            )
            host, port = settings.listen
            grpc = await stack.enter_async_context(
                serving(
                    service,
                    host,
                    port,
                    ssl=server_ssl,
                    insecure=settings.insecure,
                    trust_domain=settings.trust_domain,
                )
            )
            log.info("ateapi serving", address=grpc.address, tls=server_ssl is not None)
            async with anyio.create_task_group() as tg:
                tg.start_soon(service.run_background)
                if settings.admin_listen is not None:
                    tg.start_soon(serve_admin_endpoints, settings, store, cache, metrics)
                await stop.wait()
                log.info("draining: no new RPCs; finishing in-flight workflows")
                grpc.server.close()
                with anyio.move_on_after(settings.lease_ttl):
                    await grpc.server.wait_closed()
                tg.cancel_scope.cancel()

    await run_until_signal(serve)


async def serve_admin_endpoints(
    settings: Settings, store: Store, cache: WorkerCache, metrics: PrometheusWorkflowMetrics
) -> None:
    assert settings.admin_listen is not None

    async def readyz(_target: str) -> AdminResponse:
        if not cache.ready:
            return AdminResponse(503, "worker cache not ready\n")
        try:
            with anyio.fail_after(2):
                await store.list_atespaces()
        except (Unavailable, TimeoutError) as exc:
            return AdminResponse(503, f"store unavailable: {exc}\n")
        return AdminResponse(200, "ok\n")

    async def healthz(_target: str) -> AdminResponse:
        return AdminResponse(200, "ok\n")

    async def prom(_target: str) -> AdminResponse:
        return AdminResponse(
            200, generate_latest(metrics.registry), "text/plain; version=0.0.4; charset=utf-8"
        )

    host, port = settings.admin_listen
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    log.info("admin endpoints", address=f"{host}:{port}", paths="/readyz /healthz /metrics")
    await serve_admin(listener, {"/readyz": readyz, "/healthz": healthz, "/metrics": prom})
