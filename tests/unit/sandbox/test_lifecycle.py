"""The sandbox operation table: every (state, operation) pair, exhaustively."""

from __future__ import annotations

import itertools

import pytest

from substrate.errors import FailedPrecondition, NotFound
from substrate.sandbox.lifecycle import ALLOWED, SandboxOp, check_op
from substrate.sandbox.spec import SandboxState

STATES: list[SandboxState | None] = [None, *SandboxState]

EXPECTED: dict[tuple[SandboxState | None, SandboxOp], type[Exception] | None] = {
    (None, SandboxOp.RUN): None,
    (None, SandboxOp.RESTORE): None,
    (None, SandboxOp.CHECKPOINT): NotFound,
    (None, SandboxOp.STATS): NotFound,
    (None, SandboxOp.ADDRESS): NotFound,
    (SandboxState.RUNNING, SandboxOp.CHECKPOINT): None,
    (SandboxState.RUNNING, SandboxOp.STATS): None,
    (SandboxState.RUNNING, SandboxOp.ADDRESS): None,
    (SandboxState.CHECKPOINTED, SandboxOp.RUN): None,
    (SandboxState.CHECKPOINTED, SandboxOp.RESTORE): None,
    (SandboxState.STOPPED, SandboxOp.RUN): None,
    (SandboxState.STOPPED, SandboxOp.RESTORE): None,
}


@pytest.mark.parametrize(
    ("state", "op"),
    list(itertools.product(STATES, SandboxOp)),
    ids=lambda v: getattr(v, "name", "unknown") if v is not None else "unknown",
)
def test_every_pair(state: SandboxState | None, op: SandboxOp) -> None:
    expected = EXPECTED.get((state, op), FailedPrecondition)
    if expected is None:
        check_op("ate-x", state, op)
        assert op in ALLOWED[state]
        return
    with pytest.raises(expected) as caught:
        check_op("ate-x", state, op)
    assert "ate-x" in str(caught.value)
    if state is not None:
        assert state.name in str(caught.value)


def test_not_found_is_not_a_failed_precondition() -> None:
    with pytest.raises(NotFound) as caught:
        check_op("ate-x", None, SandboxOp.CHECKPOINT)
    assert not isinstance(caught.value, FailedPrecondition)


def test_table_covers_every_state() -> None:
    assert set(ALLOWED) == set(STATES)
