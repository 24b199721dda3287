"""Build the router from its settings: ateapi client, atunnel pool, router, admin pages."""

from __future__ import annotations

import anyio
import structlog
from prometheus_client import generate_latest

from daemons._common.lifecycle import run_until_signal
from daemons.router.settings import Settings
from substrate.adapters.observability.router_metrics import PrometheusRouterMetrics
from substrate.client import AteClient
from substrate.identity import Identity, TlsFiles
from substrate.services.admin_http import AdminResponse, serve_admin
from substrate.services.router import Router
from substrate.services.router_status import (
    render_html,
    render_json,
    status_snapshot,
    wants_json,
)
from substrate.services.router_upstream import TunnelPool, tunnel_client_context

log = structlog.get_logger("substrate.router")


async def run(settings: Settings) -> None:
    files = TlsFiles.in_dir(settings.tls_dir, "router")
    if missing := files.missing():
        raise SystemExit(f"missing TLS files: {', '.join(map(str, missing))}")
    metrics = PrometheusRouterMetrics()
    config = settings.router

    async def serve(stop: anyio.Event) -> None:
        async with AteClient.connect(
            settings.ateapi_address,
            tls_dir=settings.tls_dir,
            name="router",
            timeout=settings.ateapi_timeout,
            server_id=Identity.ateapi(settings.trust_domain),
            check_hostname=False,
        ) as ateapi:
            pool = TunnelPool(
                tunnel_client_context(files),
                trust_domain=settings.trust_domain,
                connect_timeout=config.connect_timeout,
                idle_timeout=config.upstream_idle_timeout,
            )
            async with (
                Router(
                    ateapi,
                    pool,
                    config,
                    metrics=metrics,
                    info=settings.redacted(),
                    ateapi_address=settings.ateapi_address,
                ) as router,
                anyio.create_task_group() as tg,
            ):
                host, port = settings.listen
                bound = await router.listen(host, port)
                log.info("router serving", address=f"{host}:{bound}")
                if settings.admin_listen is not None:
                    tg.start_soon(serve_admin_endpoints, settings, router, metrics)
                await stop.wait()
                log.info("draining: no new connections; finishing parked and in-flight requests")
                await router.shutdown()
                tg.cancel_scope.cancel()

    await run_until_signal(serve)


async def serve_admin_endpoints(
    settings: Settings, router: Router, metrics: PrometheusRouterMetrics
) -> None:
    assert settings.admin_listen is not None

    async def statusz(target: str) -> AdminResponse:
        snapshot = status_snapshot(router)
        if wants_json(target):
            return AdminResponse(200, render_json(snapshot), "application/json")
        return AdminResponse(200, render_html(snapshot), "text/html; charset=utf-8")

    async def healthz(_target: str) -> AdminResponse:
        return AdminResponse(200, "ok\n")

    async def readyz(_target: str) -> AdminResponse:
        if router.draining:
            return AdminResponse(503, "draining\n")
        return AdminResponse(200, "ok\n")

    async def prom(_target: str) -> AdminResponse:
        return AdminResponse(
            200, generate_latest(metrics.registry), "text/plain; version=0.0.4; charset=utf-8"
        )

    host, port = settings.admin_listen
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    log.info("admin endpoints", address=f"{host}:{port}", paths="/statusz /metrics /readyz")
    await serve_admin(
        listener, {"/statusz": statusz, "/metrics": prom, "/healthz": healthz, "/readyz": readyz}
    )
