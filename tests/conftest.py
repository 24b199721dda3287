"""Suite-wide settings: hypothesis profiles and CI's "no skips allowed" rule."""

from __future__ import annotations

import os
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
