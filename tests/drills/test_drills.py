"""Issue 7's failure drills, short variants (``benchmarks/drills``; ``make drills`` runs the
full durations): each drill starts its own stack with a private PostgreSQL and an S3
server behind a proxy, injects its fault and checks its expectations.

A check that fails because of a known product shortfall is listed in
:data:`KNOWN_SHORTFALLS` with the reason and a signature (text its failure detail must
contain, so another failure of the same check is not excused). The test then reports
XFAIL naming the shortfalls, as long as every other check passes. A *strict* entry whose
check passes fails the test (the product was fixed: remove the entry) — an
xfail(strict=True) per check rather than per drill; entries for races are not strict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import attrs
import pytest

from benchmarks.drills.common import DrillConfig, DrillResult
from benchmarks.drills.faults import pg_bin_dir
from benchmarks.drills.runner import run_drill

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.drill,
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(pg_bin_dir() is None, reason="needs PostgreSQL's initdb and pg_ctl"),
]


@attrs.frozen
class Shortfall:
    reason: str
    signature: str | tuple[str, ...] = ""
    """Text the failed check's detail must contain (one of them, for a tuple)."""
    strict: bool = True

    def matches(self, detail: str) -> bool:
        wanted = (self.signature,) if isinstance(self.signature, str) else self.signature
        return any(text in detail for text in wanted)


KNOWN_SHORTFALLS: Final[dict[int, dict[str, Shortfall]]] = {}
"""None open: drill 6's client-side bound on served answers, excused here until session 4,
became a figure once the drill measured each request's verdict in the router (see
:mod:`benchmarks.drills.burst`); every drill must now pass every check."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> DrillConfig:
    return DrillConfig.short(tmp_path_factory.mktemp("drills"))


def judge(result: DrillResult) -> None:
    print(result.report())
    known = KNOWN_SHORTFALLS.get(result.number, {})
    excused = {
        c.name: known[c.name]
        for c in result.failures()
        if c.name in known and known[c.name].matches(c.detail)
    }
    unexpected = [c.name for c in result.failures() if c.name not in excused]
    detail = f"{result.report()}\n\n--- log tails ---\n{result.logs[-20000:]}"
    assert not result.error, detail
    assert not unexpected, f"unexpected failures {unexpected}\n{detail}"
    fixed = sorted(
        c.name for c in result.checks if c.ok and c.name in known and known[c.name].strict
    )
    assert not fixed, f"known shortfalls now pass; remove them from KNOWN_SHORTFALLS: {fixed}"
    if excused:
        pytest.xfail("; ".join(f"{name}: {s.reason}" for name, s in sorted(excused.items())))


async def run(number: int, cfg: DrillConfig) -> None:
    result = await run_drill(number, cfg, print)
    print(f"runtime: {result.runtime}")
    judge(result)


async def test_drill_1_postgres_away(cfg: DrillConfig) -> None:
    await run(1, cfg)


async def test_drill_2_ateapi_away(cfg: DrillConfig) -> None:
    await run(2, cfg)


async def test_drill_3_object_store_away(cfg: DrillConfig) -> None:
    await run(3, cfg)


async def test_drill_4_nodes_stopped(cfg: DrillConfig) -> None:
    await run(4, cfg)


async def test_drill_5_drained_worker(cfg: DrillConfig) -> None:
    await run(5, cfg)


async def test_drill_6_burst(cfg: DrillConfig) -> None:
    await run(6, cfg)


def test_short_config_is_short(tmp_path: Path) -> None:
    """The short variant keeps every drill but shortens the outages (CI time)."""
    cfg = DrillConfig.short(tmp_path)
    assert cfg.pg_away < 20 and cfg.api_away < 20 and cfg.node_down < 30
    assert cfg.burst_requests == 2800
