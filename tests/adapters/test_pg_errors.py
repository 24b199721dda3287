"""The one SQLSTATE/driver → substrate error table of the Postgres adapter."""

from __future__ import annotations

import asyncpg
import asyncpg.exceptions as pgx
import pytest

from substrate.adapters.postgres.errors import translate
from substrate.core.ports import CONFLICT_MESSAGE
from substrate.errors import (
    AlreadyExists,
    Conflict,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    SubstrateError,
    Unavailable,
)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (pgx.UniqueViolationError("dup"), AlreadyExists),
        (pgx.ForeignKeyViolationError("fk"), FailedPrecondition),
        (pgx.CheckViolationError("check"), FailedPrecondition),
        (pgx.NotNullViolationError("null"), FailedPrecondition),
        (pgx.SerializationError("serialize"), Conflict),
        (pgx.DeadlockDetectedError("deadlock"), Conflict),
        (pgx.LockNotAvailableError("nowait"), Conflict),
        (pgx.QueryCanceledError("statement timeout"), DeadlineExceeded),
        (pgx.AdminShutdownError("terminated"), Unavailable),
        (pgx.CrashShutdownError("crash"), Unavailable),
        (pgx.CannotConnectNowError("starting"), Unavailable),
        (pgx.ConnectionDoesNotExistError("gone"), Unavailable),
        (pgx.ConnectionFailureError("failed"), Unavailable),
        (pgx.TooManyConnectionsError("too many"), Unavailable),
        (pgx.InvalidPasswordError("password"), Unavailable),
        (pgx.InvalidCatalogNameError("no db"), Unavailable),
        (pgx.ReadOnlySQLTransactionError("standby"), Unavailable),
        (pgx.DivisionByZeroError("div"), InvalidArgument),
        (pgx.UntranslatableCharacterError("nul"), InvalidArgument),
        (pgx.UndefinedTableError("no table"), Internal),
        (pgx.InternalClientError("cannot switch to state 11"), Unavailable),
        (asyncpg.InterfaceError("connection is closed"), Unavailable),
        (ConnectionRefusedError(111, "refused"), Unavailable),
        (ConnectionResetError(104, "reset"), Unavailable),
        (TimeoutError(), Unavailable),
        (ValueError("unexpected"), Internal),
    ],
    ids=lambda v: type(v).__name__,
)
def test_translate(error: BaseException, expected: type[SubstrateError]) -> None:
    translated = translate(error)
    assert type(translated) is expected
    if expected is Conflict:
        assert translated.description == CONFLICT_MESSAGE


def test_translated_errors_keep_the_sqlstate() -> None:
    assert "23503" in translate(pgx.ForeignKeyViolationError("fk")).description
    assert "57P01" in translate(pgx.AdminShutdownError("bye")).description


def test_substrate_errors_pass_through() -> None:
    error = NotFound("actor as1/a1 not found")
    assert translate(error) is error
