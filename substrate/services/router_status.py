"""The router's ``/statusz`` page: one snapshot, rendered as JSON or as HTML.

:func:`status_snapshot` gathers build info, flags, ateapi's health, the "Request Parking"
card, the caches and the last requests (query strings already redacted) into plain data;
:func:`render_json` and :func:`render_html` present it. ``/statusz?format=json`` answers
JSON, anything else HTML.
"""

from __future__ import annotations

import html
import json
import platform
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from substrate._version import __version__
from substrate.services.router import Router


def status_snapshot(router: Router) -> dict[str, Any]:
    """Everything ``/statusz`` shows, as JSON-ready data."""
    parking = router.parking_status()
    health = router.health
    cache = router.cache.stats()
    now = time.time()
    return {
        "build": {
            "version": __version__,
            "python": platform.python_version(),
            "started_at": router.started_at,
            "uptime_seconds": round(now - router.started_at, 3),
        },
        "flags": {key: _plain(value) for key, value in router.info.items()},
        "draining": router.draining,
        "ateapi": {
            "address": health.address,
            "healthy": health.healthy,
            "checked_at": health.checked_at,
            "latency_ms": round(health.latency * 1000, 3),
            "error": health.error,
            "workers": health.workers,
        },
        "parking": {
            "enabled": parking.enabled,
            "parked": parking.parked,
            "max_parked": parking.max_parked,
            "max_wait_seconds": parking.max_wait,
            "longest_wait_seconds": round(parking.longest_wait, 6),
            "max_parked_seen": parking.max_parked_seen,
            "waiting": parking.waiting,
            "rejected": parking.rejected,
            "flights": parking.flights,
        },
        "cache": {
            "ttl_seconds": router.cache.ttl,
            "entries": cache.entries,
            "hits": cache.hits,
            "misses": cache.misses,
            "evictions": cache.evictions,
            "workers": len(router.workers),
        },
        "connections": {
            "clients": router.client_count(),
            "active_requests": router.active_requests,
            **router.pool.stats(),
        },
        "counters": dict(router.counters),
        "requests": [
            {
                "at": r.at,
                "method": r.method,
                "target": r.target,
                "actor": r.actor,
                "port": r.port,
                "status": r.status,
                "outcome": r.outcome.value,
                "ms": round(r.seconds * 1000, 3),
                "queued_ms": round(r.queued_seconds * 1000, 3),
                "route_ms": None if r.route_seconds is None else round(r.route_seconds * 1000, 3),
                "resolution": r.resolution,
                "worker": r.worker,
                "provenance": r.provenance,
            }
            for r in reversed(router.recent.snapshot())
        ],
    }


def _plain(value: object) -> object:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def wants_json(target: str) -> bool:
    """Whether the request target asks for JSON (``?format=json``)."""
    _, _, query = target.partition("?")
    return parse_qs(query).get("format", [""])[-1].lower() == "json"


def render_json(snapshot: Mapping[str, Any]) -> str:
    return json.dumps(snapshot, indent=2, sort_keys=False) + "\n"


def _cell(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _table(rows: Mapping[str, object]) -> str:
    body = "".join(f"<tr><th>{_cell(k)}</th><td>{_cell(v)}</td></tr>" for k, v in rows.items())
    return f"<table>{body}</table>"


def _card(title: str, content: str) -> str:
    return f'<section class="card"><h2>{html.escape(title)}</h2>{content}</section>'


def render_html(snapshot: Mapping[str, Any]) -> str:
    """The status page for a browser (everything escaped)."""
    parking = snapshot["parking"]
    ateapi = snapshot["ateapi"]
    health = {None: "unknown", True: "healthy", False: "unreachable"}[ateapi["healthy"]]
    parking_rows = {
        "enabled": "yes" if parking["enabled"] else "no (only Aborted is retried)",
        "parked now / max": f"{parking['parked']} / {parking['max_parked']}",
        "max wait": f"{parking['max_wait_seconds']:g} s",
        "longest wait so far": f"{parking['longest_wait_seconds']:.3f} s",
        "peak parked": parking["max_parked_seen"],
        "shed (lot full)": parking["rejected"],
        "flights": parking["flights"],
    }
    columns = (
        "method",
        "target",
        "actor",
        "port",
        "status",
        "outcome",
        "ms",
        "resolution",
        "worker",
        "provenance",
    )
    head = "".join(f"<th>{c}</th>" for c in ("time", *columns))
    rows = "".join(
        "<tr><td>"
        + _cell(time.strftime("%H:%M:%S", time.gmtime(r["at"])))
        + "</td>"
        + "".join(f"<td>{_cell(r[c])}</td>" for c in columns)
        + "</tr>"
        for r in snapshot["requests"]
    )
    cards = [
        _card("Build", _table(snapshot["build"])),
        _card(
            "ateapi",
            _table({**ateapi, "status": health}),
        ),
        _card("Request Parking", _table(parking_rows)),
        _card("Assignment cache", _table(snapshot["cache"])),
        _card("Connections", _table(snapshot["connections"])),
        _card("Counters", _table(snapshot["counters"])),
        _card("Flags", _table(snapshot["flags"])),
        _card(
            f"Last {len(snapshot['requests'])} requests",
            f"<table><tr>{head}</tr>{rows}</table>",
        ),
    ]
    state = "draining" if snapshot["draining"] else "serving"
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>router statusz</title>"
        "<style>body{font-family:sans-serif;margin:1em}.card{border:1px solid #ccc;"
        "border-radius:6px;padding:.5em 1em;margin:.5em 0}th{text-align:left;padding-right:1em}"
        "td{padding-right:1em}</style></head><body>"
        f"<h1>router ({html.escape(state)})</h1>" + "".join(cards) + "</body></html>\n"
    )


__all__ = ["render_html", "render_json", "status_snapshot", "wants_json"]
