"""How ``ate`` prints records: aligned tables, JSON or YAML (the SDK's plain-data views)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

import yaml

from substrate.client.manifest import format_memory, to_data
from substrate.core.model import Actor, ActorTemplate, Atespace, Tag, Worker

FORMATS: Final = ("table", "json", "yaml")


def age(created: float, now: float) -> str:
    """``5s``, ``3m``, ``2h``, ``4d`` since ``created`` (``-`` if unknown)."""
    if created <= 0:
        return "-"
    seconds = max(0, int(now - created))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def dump(data: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, sort_keys=False)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip("\n")


def _snapshots(actor: Actor) -> str:
    snaps = actor.status.snapshots
    if not snaps:
        return "-"
    newest = max(snaps, key=lambda s: s.generation)
    where = "+".join(x.durability.name.lower() for x in newest.storages if x.completed) or "pending"
    return f"{len(snaps)} (gen {newest.generation}, {where})"


def render(kind: str, records: Sequence[object], fmt: str, *, now: float) -> str:
    """``records`` of ``kind`` (atespaces, templates, actors, tags, workers) as ``fmt``."""
    if fmt != "table":
        return dump(to_data(list(records)), fmt)
    if not records:
        return f"No {kind} found."
    if kind == "atespaces":
        return table(
            ["NAME", "AGE"],
            [
                (a.name, age(a.metadata.create_time, now))
                for a in records
                if isinstance(a, Atespace)
            ],
        )
    if kind == "templates":
        return table(
            ["ATESPACE", "NAME", "IMAGE", "CLASS", "CPU", "MEMORY", "GOLDEN", "AGE"],
            [
                (
                    t.ref.atespace,
                    t.ref.name,
                    ",".join(c.image for c in t.containers),
                    t.sandbox_class.name.lower(),
                    f"{t.resources.cpu_milli}m",
                    format_memory(t.resources.memory_bytes),
                    str(t.golden_tag)
                    if t.golden_tag
                    else ("pending" if t.golden_snapshot else "-"),
                    age(t.metadata.create_time, now),
                )
                for t in records
                if isinstance(t, ActorTemplate)
            ],
        )
    if kind == "actors":
        return table(
            ["ATESPACE", "NAME", "STATE", "WORKER", "TEMPLATE", "SNAPSHOTS", "AGE"],
            [
                (
                    a.ref.atespace,
                    a.ref.name,
                    a.state.name,
                    a.status.assignment.worker.name if a.status.assignment else "-",
                    a.template.name + (f" (tag {a.source_tag.name})" if a.source_tag else ""),
                    _snapshots(a),
                    age(a.metadata.create_time, now),
                )
                for a in records
                if isinstance(a, Actor)
            ],
        )
    if kind == "tags":
        return table(
            ["ATESPACE", "NAME", "ACTOR", "TEMPLATE", "SNAPSHOT", "AGE"],
            [
                (
                    t.ref.atespace,
                    t.ref.name,
                    t.source_actor.name if t.source_actor else "-",
                    t.template.name if t.template else "-",
                    t.snapshot.snapshot_id if t.snapshot else "-",
                    age(t.metadata.create_time, now),
                )
                for t in records
                if isinstance(t, Tag)
            ],
        )
    if kind == "workers":
        return table(
            ["NAME", "NODE", "STATE", "CLASS", "ACTORS", "CPU", "MEMORY", "EPOCH", "TUNNEL"],
            [
                (
                    w.ref.name,
                    w.node.name,
                    w.state.name,
                    w.sandbox_class.name.lower(),
                    f"{w.allocated.actors}/{w.capacity.actors if w.capacity else 0}",
                    f"{w.allocated.cpu_milli}m/{w.capacity.cpu_milli if w.capacity else 0}m",
                    f"{format_memory(w.allocated.memory_bytes)}/"
                    f"{format_memory(w.capacity.memory_bytes) if w.capacity else 0}",
                    w.epoch,
                    w.tunnel_address or "-",
                )
                for w in records
                if isinstance(w, Worker)
            ],
        )
    raise ValueError(f"unknown kind {kind!r}")


__all__ = ["FORMATS", "age", "dump", "render", "table"]
