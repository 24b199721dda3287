"""ateapi flags, parsed once into a frozen record."""

from __future__ import annotations

import argparse
from pathlib import Path

import attrs

from daemons._common.lifecycle import split_host_port


@attrs.frozen(slots=True, kw_only=True)
class Settings:
    listen: tuple[str, int]
    admin_listen: tuple[str, int] | None
    store: str
    objects: str
    tls_dir: Path | None
    insecure: bool
    trust_domain: str
    heartbeat_timeout: float
    reconcile_every: float
    lease_ttl: float
    default_storage_location: str
    golden: bool
    log_level: str

    def redacted(self) -> dict[str, object]:
        out = attrs.asdict(self)
        store = str(out["store"])
        if "@" in store:  # postgresql://user:password@host/db
            scheme, _, rest = store.partition("://")
            out["store"] = f"{scheme}://***@{rest.rpartition('@')[2]}"
        return {k: str(v) for k, v in out.items()}


def parse(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(
        prog="ateapi", description="substrate control plane: actors, workers, scheduling"
    )
    p.add_argument("--listen", default="127.0.0.1:7443", help="gRPC address (host:port)")
    p.add_argument(
        "--admin-listen", default="127.0.0.1:9091", help="/readyz and /metrics ('' disables)"
    )
    p.add_argument("--store", default="memory://", help="memory:// or postgresql://user@host/db")
    p.add_argument(
        "--objects", default="", help="object store for tag copies and deletions (file://...)"
    )
    p.add_argument("--tls-dir", type=Path, help="directory with ateapi.crt, ateapi.key, ca.crt")
    p.add_argument("--insecure", action="store_true", help="serve plaintext (local debugging)")
    p.add_argument("--trust-domain", default="substrate.local")
    p.add_argument("--heartbeat-timeout", type=float, default=10.0, help="seconds")
    p.add_argument("--reconcile-every", type=float, default=2.0, help="seconds")
    p.add_argument("--lease-ttl", type=float, default=30.0, help="seconds")
    p.add_argument(
        "--default-storage-location",
        default="",
        help="snapshot location for templates that name none (default: --objects)",
    )
    p.add_argument("--no-golden", action="store_true", help="do not make golden snapshots")
    p.add_argument("--log-level", default="info")
    a = p.parse_args(argv)
    if a.insecure == (a.tls_dir is not None):
        p.error("give exactly one of --tls-dir DIR and --insecure")
    if a.heartbeat_timeout <= 0 or a.reconcile_every <= 0 or a.lease_ttl <= 0:
        p.error("timeouts must be positive")
    return Settings(
        listen=split_host_port(a.listen),
        admin_listen=split_host_port(a.admin_listen) if a.admin_listen else None,
        store=a.store,
        objects=a.objects,
        tls_dir=a.tls_dir,
        insecure=a.insecure,
        trust_domain=a.trust_domain,
        heartbeat_timeout=a.heartbeat_timeout,
        reconcile_every=a.reconcile_every,
        lease_ttl=a.lease_ttl,
        default_storage_location=a.default_storage_location or a.objects or "memory://substrate",
        golden=not a.no_golden,
        log_level=a.log_level,
    )
