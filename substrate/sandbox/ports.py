"""The sandbox runtime port: run, checkpoint, restore, terminate one actor's sandbox.

A worker owns one :class:`SandboxRuntime` and drives every sandbox of its actors through
it. The runtime knows nothing about actors, probes or networks: it boots a process from
an OCI bundle inside a network namespace that already exists, turns it into an image
directory, and back. Which operation is allowed in which state is the table in
:mod:`substrate.sandbox.lifecycle`; every adapter enforces it the same way.

Errors (all from :mod:`substrate.errors`):

* :class:`NotFound` — the runtime knows no sandbox with that id (or no image is there);
* :class:`FailedPrecondition` — the sandbox is in a state that does not allow the call
  (checkpoint of a sandbox that is not running, run or restore over a running one), or
  the image was written by another runtime version;
* :class:`Internal` — the runtime itself failed (a failed checkpoint, a corrupt image);
* :class:`Unavailable` — the runtime cannot be used right now (closed, binary missing);
  nothing was done.

**Open connections.** gVisor (runsc) cannot checkpoint a sandbox while any of its TCP
connections is open or in TIME_WAIT, and a failed checkpoint kills the sandbox. The
caller must therefore abort (RST) every ingress and egress connection of the sandbox
right before :meth:`SandboxRuntime.checkpoint`, and close its own probe connections with
RST too (``SO_LINGER {1, 0}``), so the sandbox side never closes first.
"""

from __future__ import annotations

from typing import Final, Protocol

from substrate.sandbox.spec import (
    CheckpointInfo,
    SandboxAddress,
    SandboxSpec,
    SandboxState,
    SandboxStats,
)

CHECKPOINT_FAILED_MESSAGE: Final = "checkpoint failed; the sandbox is gone"
"""The start of the :class:`Internal` description of every failed checkpoint."""

RUNTIME_CLOSED_MESSAGE: Final = "sandbox runtime is not running"
"""Description of the :class:`Unavailable` raised by a runtime that is not open."""


class SandboxRuntime(Protocol):
    """One worker's sandbox runtime (gVisor's runsc, or the in-process fake).

    Calls on different sandbox ids may run concurrently; the caller serializes the
    calls on one sandbox id.
    """

    async def runtime_version(self) -> str:
        """The version an image written by this runtime needs to be restored.

        A MEMORY restore must use a runtime whose version equals the one recorded in
        the image's :class:`CheckpointInfo`.
        """
        ...

    async def run(self, spec: SandboxSpec) -> None:
        """Cold-boot ``spec.sandbox_id`` from ``spec.bundle_dir`` in ``spec.netns_path``.

        Returns once the sandbox process has started: it is RUNNING, but whether the
        workload answers yet is for the caller's wakeup probe to find out.

        Raises :class:`FailedPrecondition` if a sandbox with that id is CREATED or
        RUNNING (a CHECKPOINTED or STOPPED leftover is removed first);
        :class:`InvalidArgument` for a spec the runtime cannot run; :class:`Internal`
        if the runtime fails to start it (no sandbox is left running).
        """
        ...

    async def checkpoint(self, sandbox_id: str, image_dir: str) -> CheckpointInfo:
        """Write the running sandbox's image into ``image_dir``; the sandbox is gone after.

        ``image_dir`` is created if missing; image files already in it are replaced.
        On success the sandbox is CHECKPOINTED. The sandbox does not survive a failure
        either: it is STOPPED and ``image_dir`` may hold an unusable partial image.

        Raises :class:`NotFound` if the sandbox is unknown; :class:`FailedPrecondition`
        if it is not RUNNING (nothing happens then); :class:`Internal` starting with
        :data:`CHECKPOINT_FAILED_MESSAGE` if the checkpoint failed — for instance
        because a TCP connection of the sandbox was still open or in TIME_WAIT.
        """
        ...

    async def restore(self, spec: SandboxSpec, image_dir: str) -> None:
        """Restore the image in ``image_dir`` as ``spec.sandbox_id``, into ``spec.netns_path``.

        The spec may name another namespace, bundle copy or address than at checkpoint
        (another worker, a fresh namespace); the image may come from another runtime
        instance of the same version. An image can be restored any number of times.
        Returns once the process runs again (RUNNING), with the memory of the image.

        Raises :class:`FailedPrecondition` if a sandbox with that id is CREATED or
        RUNNING (a CHECKPOINTED or STOPPED leftover is removed first), or if the image
        was written by another runtime version; :class:`NotFound` if ``image_dir`` holds
        no image; :class:`Internal` if the runtime cannot restore it (a corrupt or
        partial image, such as the one a failed checkpoint leaves) — the sandbox is
        then not running.
        """
        ...

    async def terminate(self, sandbox_id: str) -> None:
        """Kill the sandbox if it runs and forget it; idempotent.

        Afterwards :meth:`state` raises :class:`NotFound`. Terminating an unknown or
        already terminated sandbox does nothing. Image directories are not touched.
        """
        ...

    async def state(self, sandbox_id: str) -> SandboxState:
        """The sandbox's state; :class:`NotFound` if the runtime does not know it."""
        ...

    async def stats(self, sandbox_id: str) -> SandboxStats:
        """Resource use of the running sandbox.

        Raises :class:`NotFound` if the sandbox is unknown; :class:`FailedPrecondition`
        if it is not RUNNING.
        """
        ...

    async def address(self, sandbox_id: str) -> SandboxAddress:
        """Where the caller connects to reach the running sandbox's ports.

        Raises :class:`NotFound` if the sandbox is unknown; :class:`FailedPrecondition`
        if it is not RUNNING. The address may change across a restore.
        """
        ...


__all__ = ["CHECKPOINT_FAILED_MESSAGE", "RUNTIME_CLOSED_MESSAGE", "SandboxRuntime"]
