"""What clients saw during a drill, request by request, and the files that show it.

A :class:`Timeline` holds every request of every stream (:class:`Sample`: when it was
sent, seconds since the drill's zero, its status code — 0 when no answer came, like
curl's ``000`` — its latency and the first line of its body) and the drill's events
(``fault``, ``heal``, ``ready`` …). :meth:`Timeline.write` produces:

* ``<name>.tsv``: one line per request and per event, in time order (the seed's format:
  start time, stream, actor, status, seconds, body);
* ``<name>.strip.txt``: one row per stream, one character per second since zero
  (``.`` all answered 200, ``x`` a failure, ``-`` nothing sent), with the events marked
  under it — the seed's figure 8.4 as text.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs


@attrs.frozen(slots=True, kw_only=True)
class Sample:
    stream: str
    actor: str
    sent: float
    """Seconds since the timeline's zero."""
    status: int
    """HTTP status; 0 = no answer (timeout, refused, reset)."""
    latency: float
    body: str = ""
    note: str = ""
    """E.g. the restore provenance, or the worker that served."""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def answered(self) -> float:
        return self.sent + self.latency

    @property
    def resume_seconds(self) -> float | None:
        """The router's ``X-Ate-Resume-Duration-Seconds`` when the request resumed the actor."""
        for part in self.note.split():
            if part.startswith("resume="):
                try:
                    return float(part.removeprefix("resume="))
                except ValueError:
                    return None
        return None


@attrs.define
class Timeline:
    name: str
    zero: float = attrs.field(factory=time.monotonic)
    wall_zero: float = attrs.field(factory=time.time)
    samples: list[Sample] = attrs.Factory(list)
    events: list[tuple[float, str]] = attrs.Factory(list)

    def now(self) -> float:
        return time.monotonic() - self.zero

    def mark(self, label: str) -> float:
        t = self.now()
        self.events.append((t, label))
        return t

    def event(self, label: str) -> float | None:
        """The time of the first event called ``label``."""
        return next((t for t, name in self.events if name == label), None)

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)

    def stream(self, name: str) -> list[Sample]:
        return sorted((s for s in self.samples if s.stream == name), key=lambda s: s.sent)

    # --- files ------------------------------------------------------------------------

    def write(self, directory: Path) -> list[Path]:
        directory.mkdir(parents=True, exist_ok=True)
        tsv = directory / f"{self.name}.tsv"
        rows: list[tuple[float, str]] = []
        for s in self.samples:
            body = " ".join(s.body.split())[:160]
            rows.append(
                (
                    s.sent,
                    f"{self.wall_zero + s.sent:.3f}\t{s.sent:8.3f}\t{s.stream}\t{s.actor}\t"
                    f"{s.status:03d}\t{s.latency:.6f}\t{body}\t{s.note}",
                )
            )
        for t, label in self.events:
            rows.append((t, f"{self.wall_zero + t:.3f}\t{t:8.3f}\tevent\t{label}\t\t\t\t"))
        rows.sort(key=lambda r: r[0])
        header = "wall_time\tt\tstream\tactor\tstatus\tseconds\tbody\tnote\n"
        tsv.write_text(header + "".join(line + "\n" for _, line in rows))
        strip = directory / f"{self.name}.strip.txt"
        strip.write_text(self.strip())
        return [tsv, strip]

    def strip(self) -> str:
        """One character per second per stream; events marked below."""
        if not self.samples:
            return ""
        end = math.ceil(max(s.sent for s in self.samples)) + 1
        names = sorted({s.stream for s in self.samples})
        width = max(len(n) for n in names)
        lines = [f"{'':{width}}  one column per second since zero; . = 200, x = failed"]
        for name in names:
            cells = ["-"] * end
            for s in self.stream(name):
                i = int(s.sent)
                if not s.ok:
                    cells[i] = "x"
                elif cells[i] == "-":
                    cells[i] = "."
            failed = sum(1 for s in self.stream(name) if not s.ok)
            lines.append(
                f"{name:{width}}  {''.join(cells)}  {failed} failed of {len(self.stream(name))}"
            )
        for t, label in self.events:
            i = int(t)
            if i <= end:
                lines.append(f"{'':{width}}  {' ' * i}^ {label} at {t:.1f} s")
        return "\n".join(lines) + "\n"


# --- figures --------------------------------------------------------------------------


def failed(samples: Iterable[Sample]) -> list[Sample]:
    return [s for s in samples if not s.ok]


def within(samples: Iterable[Sample], start: float, end: float) -> list[Sample]:
    """Samples sent in [start, end)."""
    return [s for s in samples if start <= s.sent < end]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[k]


def fmt_s(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f} s"


def status_counts(samples: Iterable[Sample]) -> str:
    counts: dict[int, int] = {}
    for s in samples:
        counts[s.status] = counts.get(s.status, 0) + 1
    return ", ".join(f"{n}x{code:03d}" for code, n in sorted(counts.items())) or "none"


def stream_summary(tl: Timeline, name: str, start: float, end: float) -> dict[str, object]:
    """The figures of one stream around a fault from ``start`` to ``end`` (heal)."""
    all_ = tl.stream(name)
    during = within(all_, start, end)
    bad = failed(all_)
    return {
        "stream": name,
        "requests": len(all_),
        "failed": len(bad),
        "during": len(during),
        "served_during": len(during) - len(failed(during)),
        "first_failure": (bad[0].sent - start) if bad else None,
        "last_failure_after_heal": (bad[-1].sent - end) if bad else None,
        "codes_failed": status_counts(bad),
        "median_failed_latency": median([s.latency for s in bad]),
        "max_latency": max((s.latency for s in all_), default=math.nan),
        "median_ok_latency": median([s.latency for s in all_ if s.ok]),
    }


__all__ = [
    "Sample",
    "Timeline",
    "failed",
    "fmt_s",
    "median",
    "pct",
    "status_counts",
    "stream_summary",
    "within",
]
