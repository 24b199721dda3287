"""Metrics adapters (Prometheus)."""

from substrate.adapters.observability.prometheus import PrometheusWorkflowMetrics

__all__ = ["PrometheusWorkflowMetrics"]
