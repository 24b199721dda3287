"""Workload sources shipped with substrate (package data).

* ``counter.c`` — the small static HTTP/1.1 server of the sandbox conformance suite and the
  demo: ``GET /`` counts, ``/readyz``, ``/whoami``, ``/fill``. Build it into a runnable
  image with :func:`substrate.adapters.gvisor.images.build_counter_image`.
"""

from __future__ import annotations

from importlib import resources
from typing import Final

COUNTER_SOURCE: Final = "counter.c"


def counter_source() -> bytes:
    """The C source of the counter workload."""
    return resources.files(__name__).joinpath(COUNTER_SOURCE).read_bytes()


__all__ = ["COUNTER_SOURCE", "counter_source"]
