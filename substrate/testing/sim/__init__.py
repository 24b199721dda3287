"""A deterministic, seeded simulation harness that drives the real scheduler and parking lot."""

from substrate.testing.sim.cluster import SimConfig, SimReport, simulate
from substrate.testing.sim.world import SimWorld

__all__ = ["SimConfig", "SimReport", "SimWorld", "simulate"]
