"""Workflow timing: one canonical log line per workflow, and a hook for metrics."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Protocol

import anyio
import structlog

from substrate.errors import SubstrateError, grpc_code

log = structlog.get_logger("substrate.workflow")


class WorkflowMetrics(Protocol):
    """Receives one call per finished workflow (Prometheus adapters implement this)."""

    def workflow_finished(
        self, name: str, outcome: str, duration: float, steps: dict[str, float]
    ) -> None: ...

    def scheduler_decision(self, outcome: str, duration: float) -> None: ...

    def lease_conflict(self, workflow: str) -> None: ...


class NullMetrics:
    def workflow_finished(
        self, name: str, outcome: str, duration: float, steps: dict[str, float]
    ) -> None:
        return None

    def scheduler_decision(self, outcome: str, duration: float) -> None:
        return None

    def lease_conflict(self, workflow: str) -> None:
        return None


class Steps:
    """Times the named steps of one workflow run."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.timings: dict[str, float] = {}
        self.fields: dict[str, object] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        start = self._clock()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + (self._clock() - start)

    def note(self, **fields: object) -> None:
        self.fields.update(fields)


@asynccontextmanager
async def workflow(
    name: str,
    metrics: WorkflowMetrics,
    clock: Callable[[], float] = time.perf_counter,
    **context: object,
) -> AsyncIterator[Steps]:
    """Run a workflow body; log one line with its outcome and step timings when it ends."""
    steps = Steps(clock)
    start = clock()
    outcome = "ok"
    try:
        yield steps
    except SubstrateError as exc:
        outcome = grpc_code(exc).name.lower()
        steps.note(error=exc.description)
        raise
    except BaseException as exc:
        outcome = "cancelled" if _is_cancel(exc) else "internal"
        steps.note(error=repr(exc))
        raise
    finally:
        duration = clock() - start
        metrics.workflow_finished(name, outcome, duration, dict(steps.timings))
        log.info(
            "workflow",
            workflow=name,
            outcome=outcome,
            duration_ms=round(duration * 1000, 3),
            steps_ms={k: round(v * 1000, 3) for k, v in steps.timings.items()},
            **{k: str(v) for k, v in context.items()},
            **steps.fields,
        )


def _is_cancel(exc: BaseException) -> bool:
    return isinstance(exc, anyio.get_cancelled_exc_class())


__all__ = ["NullMetrics", "Steps", "WorkflowMetrics", "workflow"]
