"""The one table from PostgreSQL and driver failures to substrate errors."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import asyncpg

from substrate.core.ports import CONFLICT_MESSAGE
from substrate.errors import (
    AlreadyExists,
    Conflict,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    SubstrateError,
    Unavailable,
)

SQLSTATE_ERRORS: Final[Mapping[str, type[SubstrateError]]] = MappingProxyType(
    {
        "23505": AlreadyExists,  # unique_violation
        "23503": FailedPrecondition,  # foreign_key_violation
        "40001": Conflict,  # serialization_failure
        "40P01": Conflict,  # deadlock_detected
        "55P03": Conflict,  # lock_not_available
        "57014": DeadlineExceeded,  # query_canceled (statement_timeout)
        "57P01": Unavailable,  # admin_shutdown
        "57P02": Unavailable,  # crash_shutdown
        "57P03": Unavailable,  # cannot_connect_now
        "3D000": Unavailable,  # invalid_catalog_name: the database is missing
        "25006": Unavailable,  # read_only_sql_transaction: connected to a standby
    }
)
"""Exact SQLSTATEs; anything not here is looked up by class in :data:`SQLSTATE_CLASSES`."""

SQLSTATE_CLASSES: Final[Mapping[str, type[SubstrateError]]] = MappingProxyType(
    {
        "08": Unavailable,  # connection exception
        "22": InvalidArgument,  # data exception (bad value for a column or jsonb)
        "23": FailedPrecondition,  # other integrity constraint violations
        "28": Unavailable,  # invalid authorization: our credentials, not the caller's
        "53": Unavailable,  # insufficient resources (too many connections, disk full)
    }
)

DRIVER_UNAVAILABLE: Final = (
    asyncpg.InterfaceError,  # includes "connection is closed" and a closed pool
    # The driver's protocol state broke, in practice because the server ended the
    # session under it (e.g. "cannot switch to state 11" after an admin shutdown).
    asyncpg.exceptions.InternalClientError,
    OSError,  # refused, reset, unreachable
    TimeoutError,  # connect or command timeout
    EOFError,
)


def translate(exc: BaseException) -> SubstrateError:
    """The substrate error for a failure of the database or its driver."""
    if isinstance(exc, SubstrateError):
        return exc
    if isinstance(exc, asyncpg.PostgresError):
        state = str(getattr(exc, "sqlstate", "") or "")
        cls = SQLSTATE_ERRORS.get(state) or SQLSTATE_CLASSES.get(state[:2], Internal)
        if cls is Conflict:
            return Conflict(CONFLICT_MESSAGE)
        if cls is Unavailable:
            return Unavailable(f"PostgreSQL is unavailable: {exc} (SQLSTATE {state})")
        return cls(f"PostgreSQL error: {exc} (SQLSTATE {state})")
    if isinstance(exc, DRIVER_UNAVAILABLE):
        return Unavailable(f"PostgreSQL is unreachable: {type(exc).__name__}: {exc}")
    return Internal(f"unexpected store failure: {type(exc).__name__}: {exc}")


TRANSLATED: Final = (asyncpg.PostgresError, *DRIVER_UNAVAILABLE)
"""The exception types :func:`translate` is meant for (everything else propagates)."""
