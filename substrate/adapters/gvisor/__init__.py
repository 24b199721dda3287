"""gVisor adapters: the runsc :class:`~substrate.sandbox.ports.SandboxRuntime` and local images.

* :mod:`~substrate.adapters.gvisor.runtime` — :class:`RunscRuntime` and
  :func:`cleanup_root` (``docs/gvisor-notes.md`` §1c);
* :mod:`~substrate.adapters.gvisor.images` — image directories and tarballs
  (:class:`LocalImages`, :func:`unpack_rootfs`) and :func:`build_counter_image`;
* :mod:`~substrate.adapters.gvisor.procfs` — what the runtime reads from ``/proc``.

Importing needs neither runsc nor gcc; they are looked up when used.
"""

from substrate.adapters.gvisor.images import (
    LocalImages,
    build_counter_image,
    pack_image,
    read_image_config,
    unpack_rootfs,
)
from substrate.adapters.gvisor.runtime import (
    CleanupReport,
    RunscRuntime,
    RunscTimeouts,
    cleanup_root,
)
from substrate.sandbox.images import ImageConfig
from substrate.sandbox.runsc_argv import RunscOptions

__all__ = [
    "CleanupReport",
    "ImageConfig",
    "LocalImages",
    "RunscOptions",
    "RunscRuntime",
    "RunscTimeouts",
    "build_counter_image",
    "cleanup_root",
    "pack_image",
    "read_image_config",
    "unpack_rootfs",
]
