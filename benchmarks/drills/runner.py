"""Run drills one after another and render the summary (ours beside the original's)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Final

from benchmarks.drills.bucket import drill_bucket
from benchmarks.drills.burst import drill_burst
from benchmarks.drills.common import DrillConfig, DrillResult, Progress
from benchmarks.drills.drain import drill_drain
from benchmarks.drills.node import drill_node
from benchmarks.drills.outage import drill_ateapi, drill_postgres

Drill = Callable[[DrillConfig, Progress], Awaitable[DrillResult]]

DRILLS: Final[dict[int, tuple[str, Drill]]] = {
    1: ("postgres", drill_postgres),
    2: ("ateapi", drill_ateapi),
    3: ("bucket", drill_bucket),
    4: ("node", drill_node),
    5: ("drain", drill_drain),
    6: ("burst", drill_burst),
}
STACK_DIRS: Final = {
    1: "1-postgres",
    2: "2-ateapi",
    3: "3-bucket",
    4: "4-node",
    5: "5-drain",
    6: "6-burst",
}


async def run_drill(number: int, cfg: DrillConfig, progress: Progress) -> DrillResult:
    """Run drill ``number``; its stack's state directory goes unless kept or failed."""
    key, fn = DRILLS[number]
    started = time.monotonic()
    try:
        result = await fn(cfg, lambda text: progress(f"[{number} {key}] {text}"))
    except Exception as exc:  # a drill that could not even start its stack
        result = DrillResult(number, key, key, error=f"{type(exc).__name__}: {exc}")
        result.seconds = time.monotonic() - started
    stack = cfg.out / "stacks" / STACK_DIRS[number]
    if result.passed and not cfg.keep:
        shutil.rmtree(stack, ignore_errors=True)
    elif not result.passed:
        result.notes.append(f"logs kept in {stack / 'logs'}")
    (cfg.out / "reports").mkdir(parents=True, exist_ok=True)
    report = cfg.out / "reports" / f"{number}-{key}.txt"
    text = result.report()
    if result.logs:
        text += "\n\n--- log tails ---\n" + result.logs
    report.write_text(text + "\n")
    return result


async def run_drills(
    numbers: Sequence[int], cfg: DrillConfig, progress: Progress
) -> list[DrillResult]:
    return [await run_drill(n, cfg, progress) for n in numbers]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def summary_markdown(results: Sequence[DrillResult]) -> str:
    """The drills' table: checks, then every figure beside the original's."""
    lines = [
        "| # | drill | runtime | checks | result | time |",
        "|---|---|---|---:|---|---:|",
    ]
    for r in results:
        passed = sum(1 for c in r.checks if c.ok)
        verdict = "pass" if r.passed else ("error" if r.error else "**FAIL**")
        lines.append(
            f"| {r.number} | {_cell(r.title)} | {r.runtime or '—'} | {passed}/{len(r.checks)} "
            f"| {verdict} | {r.seconds:.0f} s |"
        )
    lines += ["", "| # | figure | ours | original |", "|---|---|---|---|"]
    for r in results:
        for f in r.figures:
            lines.append(
                f"| {r.number} | {_cell(f.what)} | {_cell(f.ours)} | {_cell(f.original)} |"
            )
    failing = [(r, c) for r in results for c in r.failures()]
    errors = [r for r in results if r.error]
    if failing or errors:
        lines += ["", "Expectations not met:", ""]
        for r, c in failing:
            lines.append(f"* drill {r.number}, {c.name}: {_cell(c.detail)}")
        for r in errors:
            lines.append(f"* drill {r.number} did not finish: {_cell(r.error)}")
    return "\n".join(lines) + "\n"


def write_summary(cfg: DrillConfig, results: Sequence[DrillResult]) -> Path:
    path = cfg.out / "summary.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(summary_markdown(results))
    return path


def cleanup_out(cfg: DrillConfig) -> None:
    """Remove the stacks directory if every stack in it was removed."""
    stacks = cfg.out / "stacks"
    if stacks.is_dir() and not any(stacks.iterdir()):
        stacks.rmdir()


__all__ = ["DRILLS", "run_drill", "run_drills", "summary_markdown", "write_summary"]
