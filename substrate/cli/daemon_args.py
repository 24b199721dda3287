"""The daemons' command lines, written in one place.

Each function turns one daemon's settings into its argv for ``python -m`` (the module
first, then ``--flag=value`` items), as :func:`substrate.cli.stack.spawn` takes it. The
flags are those of ``daemons/<name>/settings.py``. A setting left at ``None`` (or empty)
is not passed, so the daemon's own default applies; the defaults are noted in parentheses.
Numbers are written exactly, without a needless ``.0`` (``1.0`` → ``1``, ``0.5`` → ``0.5``).

``ate up`` (:mod:`substrate.cli.stack`), the end-to-end tests' stack and the drills'
cluster all start the daemons with these.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

PathLike = str | os.PathLike[str]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _argv(module: str, flags: Sequence[tuple[str, str | float | PathLike | None]]) -> list[str]:
    out = [module]
    for flag, value in flags:
        if value is None or value == "":
            continue
        if isinstance(value, int | float):
            text = _number(value)
        else:
            text = os.fspath(value)
        out.append(f"--{flag}={text}")
    return out


def ateapi_argv(
    *,
    tls_dir: PathLike,
    listen: str | None = None,
    admin_listen: str | None = None,
    trust_domain: str | None = None,
    store: str | None = None,
    objects: str = "",
    heartbeat_timeout: float | None = None,
    reconcile_every: float | None = None,
) -> list[str]:
    """``daemons.ateapi``: listen (127.0.0.1:7443), admin_listen (127.0.0.1:9091),
    trust_domain (substrate.local), store (memory://), objects (none), heartbeat_timeout
    (10 s), reconcile_every (2 s)."""
    return _argv(
        "daemons.ateapi",
        [
            ("listen", listen),
            ("admin-listen", admin_listen),
            ("tls-dir", tls_dir),
            ("trust-domain", trust_domain),
            ("store", store),
            ("objects", objects),
            ("heartbeat-timeout", heartbeat_timeout),
            ("reconcile-every", reconcile_every),
        ],
    )


def atelet_argv(
    *,
    node: str,
    node_dir: PathLike,
    ateapi: str,
    tls_dir: PathLike,
    images: PathLike | None = None,
    listen: str | None = None,
    trust_domain: str | None = None,
    objects: Sequence[str] = (),
    heartbeat_every: float | None = None,
    tag_cache_max_bytes: int | None = None,
) -> list[str]:
    """``daemons.atelet``: images (<node-dir>/images), listen (127.0.0.1:0), trust_domain
    (substrate.local), objects (the known snapshot locations, one flag each; none),
    heartbeat_every (3 s), tag_cache_max_bytes (0: no limit)."""
    return _argv(
        "daemons.atelet",
        [
            ("node", node),
            ("node-dir", node_dir),
            ("images", images),
            ("listen", listen),
            ("ateapi", ateapi),
            ("tls-dir", tls_dir),
            ("trust-domain", trust_domain),
            *(("objects", location) for location in objects),
            ("heartbeat-every", heartbeat_every),
            ("tag-cache-max-bytes", tag_cache_max_bytes),
        ],
    )


def worker_argv(
    *,
    name: str,
    node: str,
    node_dir: PathLike,
    tls_dir: PathLike,
    runtime: str | None = None,
    tunnel_listen: str | None = None,
    trust_domain: str | None = None,
    max_actors: int | None = None,
    memory: str | None = None,
    probe_timeout: float | None = None,
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """``daemons.ateworker``: runtime (gvisor), tunnel_listen (127.0.0.1:0), trust_domain
    (substrate.local), max_actors (16), memory (4Gi), probe_timeout (30 s), labels (one
    ``--label=key=value`` each; none)."""
    return _argv(
        "daemons.ateworker",
        [
            ("name", name),
            ("node", node),
            ("node-dir", node_dir),
            ("runtime", runtime),
            ("tunnel-listen", tunnel_listen),
            ("tls-dir", tls_dir),
            ("trust-domain", trust_domain),
            ("max-actors", max_actors),
            ("memory", memory),
            ("probe-timeout", probe_timeout),
            *(("label", f"{key}={value}") for key, value in (labels or {}).items()),
        ],
    )


def router_argv(
    *,
    tls_dir: PathLike,
    listen: str | None = None,
    admin_listen: str | None = None,
    ateapi_address: str | None = None,
    trust_domain: str | None = None,
    parked_request_budget: float | None = None,
    parked_request_max: int | None = None,
) -> list[str]:
    """``daemons.router``: listen (127.0.0.1:8080), admin_listen (127.0.0.1:4040),
    ateapi_address (127.0.0.1:7443), trust_domain (substrate.local),
    parked_request_budget (seconds; 5 s), parked_request_max (1024)."""
    budget = None if parked_request_budget is None else f"{_number(parked_request_budget)}s"
    return _argv(
        "daemons.router",
        [
            ("listen", listen),
            ("admin-listen", admin_listen),
            ("ateapi-address", ateapi_address),
            ("tls-dir", tls_dir),
            ("trust-domain", trust_domain),
            ("parked-request-budget", budget),
            ("parked-request-max", parked_request_max),
        ],
    )


__all__ = ["ateapi_argv", "atelet_argv", "router_argv", "worker_argv"]
