"""Build ateworker from its settings: runtime, network, egress, atunnel, manager, socket."""

from __future__ import annotations

from contextlib import AsyncExitStack

import anyio
import structlog

from daemons._common.lifecycle import run_until_signal
from daemons.ateworker.settings import Settings
from substrate.adapters.gvisor.runtime import RunscRuntime, cleanup_root
from substrate.adapters.linux.netlink import LinuxHostNetwork
from substrate.adapters.memory import FakeSandboxRuntime
from substrate.adapters.memory.network import FakeHostNetwork
from substrate.api.worker import serve_worker
from substrate.core.ids import NodeRef
from substrate.core.model import SandboxClass
from substrate.identity import TlsFiles
from substrate.net.egress_policy import EgressPolicy
from substrate.net.plan import ACTOR_ADDRESS, veth_prefix, worker_tag
from substrate.net.ports import HostNetwork
from substrate.sandbox.node_layout import NodeLayout
from substrate.sandbox.ports import SandboxRuntime
from substrate.sandbox.runsc_argv import RunscOptions
from substrate.services.atunnel import Atunnel, atunnel_server_context
from substrate.services.egress import EgressProxy
from substrate.services.workloads import (
    Egress,
    WorkerConfig,
    WorkloadManager,
    next_epoch,
)

log = structlog.get_logger("substrate.ateworker")


async def run(settings: Settings) -> None:
    if settings.tls_dir is None:
        raise SystemExit("atunnel needs --tls-dir (worker.crt, worker.key, ca.crt)")
    files = TlsFiles.in_dir(settings.tls_dir, "worker")
    if missing := files.missing():
        raise SystemExit(f"missing TLS files: {', '.join(map(str, missing))}")
    layout = NodeLayout(str(settings.node_dir))
    gvisor = settings.runtime == "gvisor"
    epoch = next_epoch(layout.worker_epoch_file(settings.name))

    async def serve(stop: anyio.Event) -> None:
        async with AsyncExitStack() as stack:
            runtime: SandboxRuntime
            network: HostNetwork
            egress: Egress | None = None
            if gvisor:
                root = layout.worker_runsc_root(settings.name)
                report = await cleanup_root(root, binary=settings.runsc)
                log.info("cleaned up an earlier run", report=str(report))
                network = LinuxHostNetwork()
                table = f"ate_egress_{worker_tag(settings.name)}"
                proxy = EgressProxy(
                    network,
                    table=table,
                    veth_prefix=veth_prefix(settings.name),
                    policy=EgressPolicy.parse(settings.egress_allow),
                    upstream=settings.egress_proxy or None,
                )
                egress = await stack.enter_async_context(proxy)
                runtime = await stack.enter_async_context(
                    RunscRuntime(
                        RunscOptions(
                            root=root,
                            binary=settings.runsc,
                            debug_log_dir=settings.runsc_debug_dir,
                        ),
                        log_dir=layout.worker_logs_dir(settings.name),
                    )
                )
            else:
                network = FakeHostNetwork()
                runtime = await stack.enter_async_context(FakeSandboxRuntime())
            tunnel = await stack.enter_async_context(
                Atunnel(
                    atunnel_server_context(files),
                    host=settings.tunnel_listen[0],
                    port=settings.tunnel_listen[1],
                    trust_domain=settings.trust_domain,
                )
            )
            advertise = settings.tunnel_advertise or f"{tunnel.host}:{tunnel.port}"
            manager = WorkloadManager(
                WorkerConfig(
                    name=settings.name,
                    node=NodeRef(settings.node),
                    capacity=settings.capacity,
                    sandbox_class=SandboxClass.GVISOR if gvisor else SandboxClass.FAKE,
                    pool=settings.pool,
                    labels=dict(settings.labels),
                    tunnel_address=advertise,
                    probe_timeout=settings.probe_timeout,
                    max_concurrent_starts=settings.max_concurrent_starts,
                    actor_address=ACTOR_ADDRESS if gvisor else "",
                ),
                layout=layout,
                runtime=runtime,
                network=network,
                ingress=tunnel,
                egress=egress,
                epoch=epoch,
            )
            await stack.enter_async_context(manager.serving())
            socket_path = layout.worker_socket(settings.name)
            await stack.enter_async_context(serve_worker(manager, socket_path))
            log.info(
                "ateworker serving",
                worker=settings.name,
                epoch=epoch,
                socket=socket_path,
                tunnel=advertise,
                runtime=settings.runtime,
            )
            await stop.wait()
            log.info("stopping: terminating every sandbox of this worker")

    await run_until_signal(serve)
