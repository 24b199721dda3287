"""Prometheus metrics for the router (implements ``substrate.services.router.RouterMetrics``).

Names are seed 001's OpenTelemetry instruments (meter ``atenet-router``) as an OpenTelemetry
Prometheus exporter spells them: dots become underscores, histograms get their unit,
counters ``_total``:

=====================================================  ==========================================
``atenet_router_parking_active``                       requests parked now (up/down counter)
``atenet_router_parking_wait_duration_seconds``        time parked, once per admitted request,
                                                       label ``outcome`` (served | budget_exhausted
                                                       | canceled | timeout | error)
``atenet_router_parking_rejected_total``               requests shed because the lot was full
``atenet_router_route_duration_seconds``               whole request, label ``outcome`` (ok |
                                                       not_found | bad_request | unavailable |
                                                       timeout | cancelled | error)
``atenet_router_request_queued_duration_seconds``      time a request waited in the kernel (accept
                                                       queue, socket buffer) before the router read
                                                       it; included in the route duration. Ours,
                                                       not the seed's: it grows when the router
                                                       itself is the bottleneck
``atenet_router_resume_calls_total``                   ResumeActor calls by gRPC ``code``
``atenet_router_resume_call_duration_seconds``         their latency
``atenet_router_stale_assignments_total``              atunnel 421 + stale: evicted and retried
``atenet_router_last_known_routes_total``              routed on a last-known assignment because
                                                       ateapi could not answer (static stability)
``atenet_router_deadline_rejections_total``            answered 503 + Retry-After at once because
                                                       the request's deadline could not be met
=====================================================  ==========================================
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from substrate.net.parking import Outcome
from substrate.net.routing import RouteOutcome

ROUTE_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
"""1 ms … 30 s, as the original's ``route.duration``."""
PARK_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0)


class PrometheusRouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.active = Gauge(
            "atenet_router_parking_active",
            "Requests currently parked.",
            registry=self.registry,
        )
        self.wait = Histogram(
            "atenet_router_parking_wait_duration_seconds",
            "Time a request spent parked, by how the park ended.",
            ["outcome"],
            registry=self.registry,
            buckets=PARK_BUCKETS,
        )
        self.rejected = Counter(
            "atenet_router_parking_rejected",
            "Requests shed because the parking lot was full.",
            registry=self.registry,
        )
        self.route = Histogram(
            "atenet_router_route_duration_seconds",
            "Time from a request's head to the end of its answer, by outcome.",
            ["outcome"],
            registry=self.registry,
            buckets=ROUTE_BUCKETS,
        )
        self.queued = Histogram(
            "atenet_router_request_queued_duration_seconds",
            "Time a request waited in the kernel before the router read it.",
            registry=self.registry,
            buckets=ROUTE_BUCKETS,
        )
        self.resume_calls = Counter(
            "atenet_router_resume_calls",
            "ResumeActor calls to ateapi by gRPC code.",
            ["code"],
            registry=self.registry,
        )
        self.resume_latency = Histogram(
            "atenet_router_resume_call_duration_seconds",
            "ResumeActor call latency.",
            registry=self.registry,
            buckets=ROUTE_BUCKETS,
        )
        self.stale = Counter(
            "atenet_router_stale_assignments",
            "atunnel answers 421 with X-Ate-Assignment-Stale (evicted, re-resolved).",
            registry=self.registry,
        )
        self.last_known = Counter(
            "atenet_router_last_known_routes",
            "Resolutions served from a last-known assignment while ateapi could not answer.",
            registry=self.registry,
        )
        self.deadline = Counter(
            "atenet_router_deadline_rejections",
            "Requests answered 503 at once because their deadline could not be met.",
            registry=self.registry,
        )
        for outcome in Outcome:
            self.wait.labels(outcome.value)
        for route_outcome in RouteOutcome:
            self.route.labels(route_outcome.value)

    # --- ParkingMetrics ---------------------------------------------------------------

    def parking_active(self, delta: int) -> None:
        self.active.inc(delta)

    def parking_wait(self, seconds: float, outcome: Outcome) -> None:
        self.wait.labels(outcome.value).observe(seconds)

    def parking_rejected(self) -> None:
        self.rejected.inc()

    # --- RouterMetrics ----------------------------------------------------------------

    def route_finished(self, outcome: RouteOutcome, seconds: float) -> None:
        self.route.labels(outcome.value).observe(seconds)

    def request_queued(self, seconds: float) -> None:
        self.queued.observe(seconds)

    def resume_call(self, code: str, seconds: float) -> None:
        self.resume_calls.labels(code).inc()
        self.resume_latency.observe(seconds)

    def stale_assignment(self) -> None:
        self.stale.inc()

    def last_known_route(self) -> None:
        self.last_known.inc()

    def deadline_rejected(self) -> None:
        self.deadline.inc()


__all__ = ["PrometheusRouterMetrics"]
