"""Garbage-collector settings for the long-running daemons.

CPython's cyclic collector runs a young-generation pass every 700 net container
allocations and, now and then, a full pass over every tracked object — including the
hundreds of thousands the imports created (protobuf descriptors, gRPC, structlog,
Prometheus). Under a burst of 2,800 connections the router spent 1.7 s of its loop in 672
collections, with full passes of up to 0.47 s during which no request moved (drill 6).

:func:`tune` freezes what exists after start-up (imports, configuration: it lives as long
as the process, so there is nothing to collect in it) and makes young passes less
frequent. Request-scoped objects are freed by reference counting; the collector is only
needed for the cycles that exceptions and tasks leave, which the larger thresholds still
collect.
"""

from __future__ import annotations

import gc
from typing import Final

THRESHOLDS: Final = (20_000, 20, 20)
"""``gc.set_threshold`` values: young pass every 20,000 net allocations (default 700)."""


def tune() -> None:
    """Collect once, freeze the survivors, raise the thresholds. Call after imports and
    configuration, before serving."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


__all__ = ["THRESHOLDS", "tune"]
