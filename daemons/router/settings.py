"""router flags, parsed once into a frozen record (seed 001's parking flags included)."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path
from typing import Final

import attrs

from daemons._common.lifecycle import split_host_port
from substrate.errors import InvalidArgument
from substrate.net.parking import (
    DEFAULT_BUDGET,
    DEFAULT_MAX_PARKED,
    DEFAULT_RETRY_FACTOR,
    DEFAULT_RETRY_INTERVAL,
    DEFAULT_RETRY_JITTER,
    ParkingConfig,
)
from substrate.net.routing import DEFAULT_CACHE_TTL
from substrate.services.router import RouterConfig

_DURATION_RE: Final = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s|m|h)?\s*$")
_UNITS: Final = {
    None: 1.0,
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_duration(value: str) -> float:
    """``5s``, ``100ms``, ``1.5s``, ``2m`` or a bare number of seconds → seconds."""
    match = _DURATION_RE.match(value)
    if match is None:
        raise argparse.ArgumentTypeError(f"bad duration {value!r}: want e.g. 5s or 100ms")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"bad duration {value!r}")
    return seconds


@attrs.frozen(slots=True, kw_only=True)
class Settings:
    listen: tuple[str, int]
    admin_listen: tuple[str, int] | None
    ateapi_address: str
    tls_dir: Path
    trust_domain: str
    router: RouterConfig
    ateapi_timeout: float
    log_level: str

    def redacted(self) -> dict[str, object]:
        """The flags as they are in force (the drain timeout derived if not given)."""
        parking = self.router.parking
        return {
            "listen": f"{self.listen[0]}:{self.listen[1]}",
            "admin_listen": (
                f"{self.admin_listen[0]}:{self.admin_listen[1]}" if self.admin_listen else ""
            ),
            "ateapi_address": self.ateapi_address,
            "tls_dir": str(self.tls_dir),
            "trust_domain": self.trust_domain,
            "cache_ttl": self.router.cache_ttl,
            "parked_request_budget": parking.budget,
            "parked_request_max": parking.max_parked,
            "parked_request_retry_interval": parking.retry_interval,
            "parked_request_retry_factor": parking.retry_factor,
            "parked_request_retry_jitter": parking.retry_jitter,
            "drain_timeout": self.router.effective_drain_timeout,
            "ateapi_timeout": self.ateapi_timeout,
            "stale_route_after": self.router.stale_route_after,
            "health_interval": self.router.health_interval,
            "connect_timeout": self.router.connect_timeout,
            "log_level": self.log_level,
        }


def parse(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(
        prog="router",
        description="substrate router: HTTP ingress by ate-target-actor, with request parking",
    )
    p.add_argument("--listen", default="127.0.0.1:8080", help="HTTP ingress (host:port)")
    p.add_argument(
        "--admin-listen",
        default="127.0.0.1:4040",
        help="/statusz /metrics /healthz /readyz ('' disables)",
    )
    p.add_argument("--ateapi-address", default="127.0.0.1:7443", help="ateapi gRPC host:port")
    p.add_argument(
        "--tls-dir", type=Path, required=True, help="directory with router.crt, router.key, ca.crt"
    )
    p.add_argument("--trust-domain", default="substrate.local")
    p.add_argument(
        "--cache-ttl",
        type=parse_duration,
        default=DEFAULT_CACHE_TTL,
        help="how long an actor's assignment is used without asking ateapi (default 5s)",
    )
    p.add_argument(
        "--parked-request-budget",
        type=parse_duration,
        default=DEFAULT_BUDGET,
        help="park budget per resume flight, shared by the requests that join it (default 5s)",
    )
    p.add_argument(
        "--parked-request-max",
        type=int,
        default=DEFAULT_MAX_PARKED,
        help="max concurrent parked requests; excess shed with 503; 0 disables (default 1024)",
    )
    p.add_argument(
        "--parked-request-retry-interval",
        type=parse_duration,
        default=DEFAULT_RETRY_INTERVAL,
        help="delay before a parked request's first resume retry (default 100ms)",
    )
    p.add_argument(
        "--parked-request-retry-factor",
        type=float,
        default=DEFAULT_RETRY_FACTOR,
        help="multiplier applied to the retry delay after each attempt, >= 1 (default 1.1)",
    )
    p.add_argument(
        "--parked-request-retry-jitter",
        type=float,
        default=DEFAULT_RETRY_JITTER,
        help="random fraction in [0, 1) added per retry (default 0.1)",
    )
    p.add_argument(
        "--drain-timeout",
        type=parse_duration,
        default=None,
        help="how long SIGTERM waits for parked and in-flight requests; must be >= the "
        "budget (default: budget + 5s)",
    )
    p.add_argument(
        "--ateapi-timeout",
        type=parse_duration,
        default=30.0,
        help="timeout of one ResumeActor/GetWorker call (default 30s)",
    )
    p.add_argument(
        "--stale-route-after",
        type=parse_duration,
        default=1.0,
        help="how long a request for an actor with a last-known RUNNING assignment waits "
        "for ateapi before using that assignment (default 1s)",
    )
    p.add_argument(
        "--health-interval",
        type=parse_duration,
        default=1.0,
        help="how often ateapi is checked (ListWorkers) (default 1s)",
    )
    p.add_argument(
        "--connect-timeout",
        type=parse_duration,
        default=5.0,
        help="timeout to connect to a worker's atunnel (default 5s)",
    )
    p.add_argument("--log-level", default="info")
    a = p.parse_args(argv)
    try:
        parking = ParkingConfig(
            budget=a.parked_request_budget,
            max_parked=a.parked_request_max,
            retry_interval=a.parked_request_retry_interval,
            retry_factor=a.parked_request_retry_factor,
            retry_jitter=a.parked_request_retry_jitter,
        )
        router = RouterConfig(
            parking=parking,
            drain_timeout=a.drain_timeout,
            cache_ttl=a.cache_ttl,
            stale_route_after=a.stale_route_after,
            health_interval=a.health_interval,
            connect_timeout=a.connect_timeout,
            trust_domain=a.trust_domain,
        )
        if not a.ateapi_timeout > 0:
            raise InvalidArgument(f"--ateapi-timeout must be > 0, got {a.ateapi_timeout:g}s")
    except InvalidArgument as exc:
        p.error(exc.description)
    return Settings(
        listen=split_host_port(a.listen),
        admin_listen=split_host_port(a.admin_listen) if a.admin_listen else None,
        ateapi_address=a.ateapi_address,
        tls_dir=a.tls_dir,
        trust_domain=a.trust_domain,
        router=router,
        ateapi_timeout=a.ateapi_timeout,
        log_level=a.log_level,
    )
