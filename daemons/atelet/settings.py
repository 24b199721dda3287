"""atelet flags, parsed once into a frozen record."""

from __future__ import annotations

import argparse
from pathlib import Path

import attrs

from daemons._common.lifecycle import split_host_port
from daemons._common.sizes import parse_size


@attrs.frozen(slots=True, kw_only=True)
class Settings:
    node: str
    node_dir: Path
    images: Path
    listen: tuple[str, int]
    advertise: str
    ateapi: str
    tls_dir: Path | None
    insecure: bool
    trust_domain: str
    objects: tuple[str, ...]
    heartbeat_every: float
    tag_cache_max_bytes: int
    ips: tuple[str, ...]
    log_level: str

    def redacted(self) -> dict[str, object]:
        return {k: str(v) for k, v in attrs.asdict(self).items()}


def parse(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(
        prog="atelet", description="substrate node agent: prepares restores, uploads snapshots"
    )
    p.add_argument("--node", required=True, help="this node's name")
    p.add_argument("--node-dir", type=Path, required=True, help="node directory (/var/lib/ate)")
    p.add_argument(
        "--images", type=Path, help="local images directory (default: <node-dir>/images)"
    )
    p.add_argument("--listen", default="127.0.0.1:0", help="gRPC address for ateapi")
    p.add_argument("--advertise", default="", help="host:port ateapi dials (default: bound)")
    p.add_argument("--ateapi", required=True, help="host:port of ateapi (registration)")
    p.add_argument("--tls-dir", type=Path, help="directory with atelet.crt, atelet.key, ca.crt")
    p.add_argument("--insecure", action="store_true", help="plaintext (local debugging)")
    p.add_argument("--trust-domain", default="substrate.local")
    p.add_argument(
        "--objects",
        action="append",
        default=[],
        help="known snapshot locations (s3://bucket/prefix, file:///...); credentials and "
        "S3 endpoint come from the usual AWS_* environment variables",
    )
    p.add_argument("--heartbeat-every", type=float, default=3.0, help="seconds")
    p.add_argument(
        "--tag-cache-max-bytes",
        type=parse_size,
        default=0,
        help="size of the tag snapshot cache (e.g. 20Gi); past it the least recently used "
        "snapshots no start is using are removed (default 0: no limit)",
    )
    p.add_argument("--ip", action="append", default=[], help="addresses reported for workers")
    p.add_argument("--log-level", default="info")
    a = p.parse_args(argv)
    if a.insecure == (a.tls_dir is not None):
        p.error("give exactly one of --tls-dir DIR and --insecure")
    if a.heartbeat_every <= 0:
        p.error("--heartbeat-every must be positive")
    node_dir = a.node_dir.absolute()
    return Settings(
        node=a.node,
        node_dir=node_dir,
        images=(a.images or node_dir / "images").absolute(),
        listen=split_host_port(a.listen),
        advertise=a.advertise,
        ateapi=a.ateapi,
        tls_dir=a.tls_dir,
        insecure=a.insecure,
        trust_domain=a.trust_domain,
        objects=tuple(a.objects),
        heartbeat_every=a.heartbeat_every,
        tag_cache_max_bytes=a.tag_cache_max_bytes,
        ips=tuple(a.ip),
        log_level=a.log_level,
    )
