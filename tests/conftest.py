"""Suite-wide settings: hypothesis profiles and CI's "no skips allowed" rule."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Generator

import pytest
from hypothesis import HealthCheck, settings

from tests.pg import PgHandle, pg_session

settings.register_profile(
    "ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """With SUBSTRATE_STRICT_SKIPS=1 (set by .ci/run), a skipped test is a failed test.

    Suites that need PostgreSQL, root, runsc or network namespaces skip with a printed
    reason on machines without them; CI must run them for real.
    """
    report = yield
    if (
        os.environ.get("SUBSTRATE_STRICT_SKIPS") == "1"
        and report.skipped
        and not hasattr(report, "wasxfail")
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which requires every suite to run: {reason}"
    return report


@pytest.fixture(scope="session")
def pg_server() -> Generator[PgHandle, None, None]:
    """The PostgreSQL server (``PG_DSN`` or 127.0.0.1:5432); skips if unreachable."""
    with pg_session() as handle:
        yield handle


def _host_leftovers() -> set[str]:
    """Network namespaces, links, nft tables and runsc processes on this host, by name/pid."""
    found: set[str] = set()
    if os.geteuid() != 0:
        return found
    for argv, kind in (
        (["ip", "netns", "list"], "netns"),
        (["ip", "-o", "link", "show"], "link"),
        (["nft", "list", "tables"], "nft"),
    ):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        for line in out.splitlines():
            words = line.split()
            if not words:
                continue
            if kind == "netns":
                found.add(f"netns {words[0]}")
            elif kind == "link" and len(words) > 1:
                found.add(f"link {words[1].rstrip(':').split('@')[0]}")
            elif kind == "nft" and len(words) >= 3:
                found.add(f"nft {words[1]} {words[2]}")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0]
        except OSError:
            continue
        if os.path.basename(argv0).startswith(b"runsc"):
            found.add(f"process {pid} {argv0.decode(errors='replace')}")
    return found


@pytest.fixture(scope="session", autouse=True)
def nothing_left_on_the_host() -> Generator[None, None, None]:
    """After the whole suite: no netns, veth, nft table or runsc process it created remains."""
    before = _host_leftovers()
    yield
    left = sorted(_host_leftovers() - before)
    assert not left, f"the test suite left these behind: {left}"
