"""substrate.sandbox: the sandbox runtime port and its pure helpers.

* :mod:`~substrate.sandbox.spec` — what a runtime runs (:class:`SandboxSpec`) and reports;
* :mod:`~substrate.sandbox.ports` — the :class:`SandboxRuntime` protocol;
* :mod:`~substrate.sandbox.lifecycle` — which operation each sandbox state allows;
* :mod:`~substrate.sandbox.oci` — the bundle's ``config.json``;
* :mod:`~substrate.sandbox.runsc_argv` — the ``runsc`` command lines.
"""

from substrate.sandbox.lifecycle import SandboxOp, check_op
from substrate.sandbox.ports import (
    CHECKPOINT_FAILED_MESSAGE,
    RUNTIME_CLOSED_MESSAGE,
    SandboxRuntime,
)
from substrate.sandbox.spec import (
    CheckpointInfo,
    SandboxAddress,
    SandboxSpec,
    SandboxState,
    SandboxStats,
    netns_path_for,
    sandbox_id_for,
    validate_sandbox_id,
)

__all__ = [
    "CHECKPOINT_FAILED_MESSAGE",
    "RUNTIME_CLOSED_MESSAGE",
    "CheckpointInfo",
    "SandboxAddress",
    "SandboxOp",
    "SandboxRuntime",
    "SandboxSpec",
    "SandboxState",
    "SandboxStats",
    "check_op",
    "netns_path_for",
    "sandbox_id_for",
    "validate_sandbox_id",
]
