"""Prometheus metrics for ateapi's workflows (implements WorkflowMetrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class PrometheusWorkflowMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.workflow = Histogram(
            "substrate_ateapi_workflow_duration_seconds",
            "Workflow latency by workflow and outcome.",
            ["workflow", "outcome"],
            registry=self.registry,
            buckets=BUCKETS,
        )
        self.step = Histogram(
            "substrate_ateapi_workflow_step_duration_seconds",
            "Workflow step latency by workflow, step and outcome.",
            ["workflow", "step", "outcome"],
            registry=self.registry,
            buckets=BUCKETS,
        )
        self.decisions = Histogram(
            "substrate_ateapi_scheduler_decision_seconds",
            "Scheduler decisions by outcome (placed | no_room).",
            ["outcome"],
            registry=self.registry,
            buckets=(1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2),
        )
        self.lease_conflicts = Counter(
            "substrate_ateapi_lease_conflicts_total",
            "Workflows refused because another held the actor's lease.",
            ["workflow"],
            registry=self.registry,
        )

    def workflow_finished(
        self, name: str, outcome: str, duration: float, steps: dict[str, float]
    ) -> None:
        self.workflow.labels(name, outcome).observe(duration)
        for step, seconds in steps.items():
            self.step.labels(name, step, outcome).observe(seconds)

    def scheduler_decision(self, outcome: str, duration: float) -> None:
        self.decisions.labels(outcome).observe(duration)

    def lease_conflict(self, workflow: str) -> None:
        self.lease_conflicts.labels(workflow).inc()


__all__ = ["PrometheusWorkflowMetrics"]
