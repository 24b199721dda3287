"""ateworker flags, parsed once into a frozen record."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import attrs

from daemons._common.lifecycle import split_host_port
from daemons._common.sizes import parse_size
from substrate.core.model import Capacity
from substrate.services.workloads import default_concurrent_starts


def parse_label(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"bad label {value!r}: want key=value")
    return key, val


@attrs.frozen(slots=True, kw_only=True)
class Settings:
    name: str
    node: str
    node_dir: Path
    runtime: str
    pool: str
    labels: tuple[tuple[str, str], ...]
    capacity: Capacity
    tunnel_listen: tuple[str, int]
    tunnel_advertise: str
    tls_dir: Path | None
    insecure: bool
    trust_domain: str
    egress_allow: tuple[str, ...]
    egress_proxy: str
    probe_timeout: float
    max_concurrent_starts: int
    runsc: str
    runsc_debug_dir: str
    log_level: str

    def redacted(self) -> dict[str, object]:
        return {k: str(v) for k, v in attrs.asdict(self).items()}


def parse(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(
        prog="ateworker", description="substrate worker: actor sandboxes, their network, atunnel"
    )
    p.add_argument("--name", required=True, help="fleet-unique worker name")
    p.add_argument("--node", required=True, help="the node this worker runs on")
    p.add_argument("--node-dir", type=Path, required=True, help="node directory (/var/lib/ate)")
    p.add_argument(
        "--runtime",
        choices=("gvisor", "fake"),
        default="gvisor",
        help="gvisor: runsc sandboxes in network namespaces (root); fake: in-process workloads",
    )
    p.add_argument("--pool", default="default")
    p.add_argument("--label", type=parse_label, action="append", default=[], help="key=value")
    p.add_argument("--cpu-milli", type=int, default=(os.cpu_count() or 1) * 1000)
    p.add_argument("--memory", type=parse_size, default=parse_size("4Gi"))
    p.add_argument("--max-actors", type=int, default=16)
    p.add_argument("--tunnel-listen", default="127.0.0.1:0", help="atunnel mTLS host:port")
    p.add_argument(
        "--tunnel-advertise", default="", help="host:port the router dials (default: bound)"
    )
    p.add_argument("--tls-dir", type=Path, help="directory with worker.crt, worker.key, ca.crt")
    p.add_argument("--insecure", action="store_true", help="atunnel without TLS (debugging)")
    p.add_argument("--trust-domain", default="substrate.local")
    p.add_argument(
        "--egress-allow",
        action="append",
        default=[],
        help="CIDR[:port] actors may connect to (repeat; default: nothing)",
    )
    p.add_argument("--egress-proxy", default="", help="host:port of an HTTP CONNECT proxy")
    p.add_argument("--probe-timeout", type=float, default=30.0, help="seconds")
    p.add_argument(
        "--max-concurrent-starts",
        type=int,
        default=0,
        help="sandboxes booted or restored at once (default 0: one per CPU, at least 2)",
    )
    p.add_argument("--runsc", default="runsc", help="the runsc binary")
    p.add_argument("--runsc-debug-dir", default="", help="runsc --debug-log directory")
    p.add_argument("--log-level", default="info")
    a = p.parse_args(argv)
    if a.insecure == (a.tls_dir is not None):
        p.error("give exactly one of --tls-dir DIR and --insecure")
    if a.max_actors <= 0 or a.cpu_milli <= 0 or a.memory <= 0:
        p.error("capacity must be positive")
    if a.probe_timeout <= 0:
        p.error("--probe-timeout must be positive")
    if a.max_concurrent_starts < 0:
        p.error("--max-concurrent-starts must be >= 0 (0: one per CPU)")
    if not a.node_dir.is_absolute():
        a.node_dir = a.node_dir.absolute()
    return Settings(
        name=a.name,
        node=a.node,
        node_dir=a.node_dir,
        runtime=a.runtime,
        pool=a.pool,
        labels=tuple(a.label),
        capacity=Capacity(cpu_milli=a.cpu_milli, memory_bytes=a.memory, actors=a.max_actors),
        tunnel_listen=split_host_port(a.tunnel_listen),
        tunnel_advertise=a.tunnel_advertise,
        tls_dir=a.tls_dir,
        insecure=a.insecure,
        trust_domain=a.trust_domain,
        egress_allow=tuple(a.egress_allow),
        egress_proxy=a.egress_proxy,
        probe_timeout=a.probe_timeout,
        max_concurrent_starts=a.max_concurrent_starts or default_concurrent_starts(),
        runsc=a.runsc,
        runsc_debug_dir=a.runsc_debug_dir,
        log_level=a.log_level,
    )
