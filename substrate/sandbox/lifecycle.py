"""Which runtime operation is allowed in which sandbox state: one table, used by every adapter.

``None`` stands for "the runtime knows no sandbox with that id" (never started here, or
terminated). ``terminate`` and ``state`` are not in the table: terminate is always
allowed (idempotent) and state only needs the sandbox to be known.

================  ========  ==========  =======  ========  ========
state             run       checkpoint  restore  stats     address
================  ========  ==========  =======  ========  ========
unknown (None)    yes       NotFound    yes      NotFound  NotFound
CREATED           FP        FP          FP       FP        FP
RUNNING           FP        yes         FP       yes       yes
CHECKPOINTED      yes       FP          yes      FP        FP
STOPPED           yes       FP          yes      FP        FP
================  ========  ==========  =======  ========  ========

(FP = :class:`FailedPrecondition`.) A run or restore over a CHECKPOINTED or STOPPED
sandbox first removes what is left of it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from substrate.errors import FailedPrecondition, NotFound
from substrate.sandbox.spec import SandboxState


class SandboxOp(enum.Enum):
    """A runtime operation that depends on the sandbox's state."""

    RUN = "run"
    CHECKPOINT = "checkpoint"
    RESTORE = "restore"
    STATS = "stats"
    ADDRESS = "address"


ALLOWED: Final[Mapping[SandboxState | None, frozenset[SandboxOp]]] = MappingProxyType(
    {
        None: frozenset({SandboxOp.RUN, SandboxOp.RESTORE}),
        SandboxState.CREATED: frozenset(),
        SandboxState.RUNNING: frozenset({SandboxOp.CHECKPOINT, SandboxOp.STATS, SandboxOp.ADDRESS}),
        SandboxState.CHECKPOINTED: frozenset({SandboxOp.RUN, SandboxOp.RESTORE}),
        SandboxState.STOPPED: frozenset({SandboxOp.RUN, SandboxOp.RESTORE}),
    }
)
"""The operations allowed in each state (``None``: the sandbox is unknown)."""

_WHY: Final[Mapping[SandboxOp, str]] = MappingProxyType(
    {
        SandboxOp.RUN: "cannot run it again",
        SandboxOp.CHECKPOINT: "only a running sandbox can be checkpointed",
        SandboxOp.RESTORE: "cannot restore over it",
        SandboxOp.STATS: "only a running sandbox has stats",
        SandboxOp.ADDRESS: "only a running sandbox can be reached",
    }
)


def check_op(sandbox_id: str, state: SandboxState | None, op: SandboxOp) -> None:
    """Raise unless ``op`` is allowed on sandbox ``sandbox_id`` in ``state``.

    :class:`NotFound` if the sandbox is unknown and ``op`` needs one;
    :class:`FailedPrecondition` if it is in a state that does not allow ``op``.
    """
    if op in ALLOWED[state]:
        return
    if state is None:
        raise NotFound(f"sandbox {sandbox_id} not found")
    raise FailedPrecondition(f"sandbox {sandbox_id} is {state.name}; {_WHY[op]}")


__all__ = ["ALLOWED", "SandboxOp", "check_op"]
