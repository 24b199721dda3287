"""The one table between substrate errors and grpclib statuses, and the helpers built on it.

The error side is :mod:`substrate.errors` (``GRPC_CODES``, ``grpc_code``, ``from_grpc``); this
module only maps its :class:`~substrate.errors.GrpcCode` numbers onto
:class:`grpclib.const.Status` and wraps the result in :class:`grpclib.exceptions.GRPCError`.

Servers translate with :func:`to_grpc_error` (or the :func:`grpc_errors` context manager);
anything that is not a deliberate substrate error becomes INTERNAL with a generic message, so
no server-side detail leaks. Clients translate back with :func:`from_grpc_error` (or
:func:`substrate_errors`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Final

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from substrate.errors import (
    GRPC_CODES,
    GrpcCode,
    SubstrateError,
    from_grpc,
    grpc_code,
)

INTERNAL_MESSAGE: Final = "internal error"
"""The only message an INTERNAL status ever carries."""

STATUS_BY_CODE: Final[Mapping[GrpcCode, Status]] = MappingProxyType(
    {code: Status(code.value) for code in GrpcCode}
)
"""``GrpcCode`` → grpclib ``Status`` (same numbers, same names)."""

STATUS_BY_ERROR: Final[Mapping[type[SubstrateError], Status]] = MappingProxyType(
    {cls: STATUS_BY_CODE[code] for cls, code in GRPC_CODES.items()}
)
"""Every substrate error class → the grpclib ``Status`` it travels as."""


def grpc_status(error: BaseException) -> Status:
    """The grpclib status for any exception (substrate errors by table, else INTERNAL)."""
    return STATUS_BY_CODE[grpc_code(error)]


def to_grpc_error(error: BaseException, *, expose_internal: bool = False) -> GRPCError:
    """The ``GRPCError`` a server raises for ``error``.

    A ``GRPCError`` passes through unchanged. A substrate error keeps its description as
    the status message, except when it maps to INTERNAL (a bug, by definition): then, as
    for every other exception, the message is the generic :data:`INTERNAL_MESSAGE` —
    unless ``expose_internal`` is set, which services talking only to trusted components
    (atelet → ateapi) use so that a crash message says what failed on the node.
    """
    if isinstance(error, GRPCError):
        return error
    status = grpc_status(error)
    if expose_internal and isinstance(error, SubstrateError) and error.description:
        return GRPCError(status, error.description)
    if status is Status.INTERNAL or not isinstance(error, SubstrateError):
        return GRPCError(Status.INTERNAL, INTERNAL_MESSAGE)
    return GRPCError(status, error.description or None)


def from_grpc_error(error: GRPCError) -> SubstrateError:
    """The substrate error a client raises for a failed call (unknown statuses → Internal)."""
    return from_grpc(int(error.status.value), error.message or "")


@contextmanager
def grpc_errors(*, expose_internal: bool = False) -> Iterator[None]:
    """Server side: re-raise any exception from the block as its ``GRPCError``.

    Only ``Exception`` is translated; cancellation and other ``BaseException`` propagate.
    The original exception stays attached as ``__cause__`` for logging.
    """
    try:
        yield
    except GRPCError:
        raise
    except Exception as exc:
        raise to_grpc_error(exc, expose_internal=expose_internal) from exc


@contextmanager
def substrate_errors() -> Iterator[None]:
    """Client side: re-raise a ``GRPCError`` from the block as its substrate error."""
    try:
        yield
    except GRPCError as exc:
        raise from_grpc_error(exc) from exc


__all__ = [
    "INTERNAL_MESSAGE",
    "STATUS_BY_CODE",
    "STATUS_BY_ERROR",
    "from_grpc_error",
    "grpc_errors",
    "grpc_status",
    "substrate_errors",
    "to_grpc_error",
]
