"""One error tree for substrate, and the two tables that translate it at the edges.

Every error raised by substrate code is a :class:`SubstrateError`. Each subclass carries
the gRPC status code it maps to (:data:`GRPC_CODES`), and the router turns a resume
failure into an HTTP status and body with :func:`http_response`. These are the only two
translation tables; adapters translate their libraries' errors into this tree.
"""

from __future__ import annotations

import enum
from typing import Final


class GrpcCode(enum.IntEnum):
    """The canonical gRPC status codes (numbers as in ``google.rpc.Code``)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class SubstrateError(Exception):
    """Root of every error substrate raises on purpose.

    ``description`` is the human-readable text that travels as the gRPC status message.
    """

    def __init__(self, description: str = "") -> None:
        super().__init__(description)
        self.description = description

    @property
    def code(self) -> GrpcCode:
        return grpc_code(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.description!r})"


class NotFound(SubstrateError):
    """The named resource does not exist."""


class AlreadyExists(SubstrateError):
    """A resource with that name already exists."""


class InvalidArgument(SubstrateError):
    """The request is malformed; retrying the same request cannot succeed."""


class FailedPrecondition(SubstrateError):
    """The resource is not in a state that allows the operation (e.g. wrong actor state)."""


class IllegalTransition(FailedPrecondition):
    """A lifecycle command was given in a state the lifecycle table does not allow."""


class Aborted(SubstrateError):
    """A concurrent operation won: a lease is held or a version precondition failed."""


class Conflict(Aborted):
    """An optimistic-concurrency precondition (version or uid) did not hold."""


class LeaseHeld(Aborted):
    """Another workflow holds the actor's lease."""


class ResourceExhausted(SubstrateError):
    """No capacity right now (e.g. no worker has room for the actor)."""


class Unavailable(SubstrateError):
    """A dependency (store, atelet, worker, object store) is not reachable or not ready."""


class DeadlineExceeded(SubstrateError):
    """The operation did not finish within its deadline."""


class PermissionDenied(SubstrateError):
    """The caller is authenticated but not allowed to do this."""


class Unauthenticated(SubstrateError):
    """The caller did not present a valid identity."""


class Internal(SubstrateError):
    """A bug or an unexpected failure; details are logged, not returned."""


class Canceled(SubstrateError):
    """The caller went away or the operation was cancelled."""


GRPC_CODES: Final[dict[type[SubstrateError], GrpcCode]] = {
    SubstrateError: GrpcCode.INTERNAL,
    NotFound: GrpcCode.NOT_FOUND,
    AlreadyExists: GrpcCode.ALREADY_EXISTS,
    InvalidArgument: GrpcCode.INVALID_ARGUMENT,
    FailedPrecondition: GrpcCode.FAILED_PRECONDITION,
    IllegalTransition: GrpcCode.FAILED_PRECONDITION,
    Aborted: GrpcCode.ABORTED,
    Conflict: GrpcCode.ABORTED,
    LeaseHeld: GrpcCode.ABORTED,
    ResourceExhausted: GrpcCode.RESOURCE_EXHAUSTED,
    Unavailable: GrpcCode.UNAVAILABLE,
    DeadlineExceeded: GrpcCode.DEADLINE_EXCEEDED,
    PermissionDenied: GrpcCode.PERMISSION_DENIED,
    Unauthenticated: GrpcCode.UNAUTHENTICATED,
    Internal: GrpcCode.INTERNAL,
    Canceled: GrpcCode.CANCELLED,
}
"""The single table from error class to gRPC status code."""

_FROM_CODE: Final[dict[GrpcCode, type[SubstrateError]]] = {
    GrpcCode.NOT_FOUND: NotFound,
    GrpcCode.ALREADY_EXISTS: AlreadyExists,
    GrpcCode.INVALID_ARGUMENT: InvalidArgument,
    GrpcCode.FAILED_PRECONDITION: FailedPrecondition,
    GrpcCode.ABORTED: Aborted,
    GrpcCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    GrpcCode.UNAVAILABLE: Unavailable,
    GrpcCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    GrpcCode.PERMISSION_DENIED: PermissionDenied,
    GrpcCode.UNAUTHENTICATED: Unauthenticated,
    GrpcCode.CANCELLED: Canceled,
}


def grpc_code(error: BaseException) -> GrpcCode:
    """The gRPC code for any exception: substrate errors by table, anything else INTERNAL."""
    if isinstance(error, SubstrateError):
        for cls in type(error).__mro__:
            if issubclass(cls, SubstrateError) and cls in GRPC_CODES:
                return GRPC_CODES[cls]
    return GrpcCode.INTERNAL


def from_grpc(code: int, description: str = "") -> SubstrateError:
    """Rebuild a substrate error from a status received over the wire."""
    try:
        cls = _FROM_CODE.get(GrpcCode(code), Internal)
    except ValueError:
        cls = Internal
    return cls(description)


# --- HTTP -------------------------------------------------------------------------------

HTTP_STATUS: Final[dict[GrpcCode, int]] = {
    GrpcCode.NOT_FOUND: 404,
    GrpcCode.PERMISSION_DENIED: 403,
    GrpcCode.UNAUTHENTICATED: 401,
    GrpcCode.DEADLINE_EXCEEDED: 504,
    GrpcCode.RESOURCE_EXHAUSTED: 503,
    GrpcCode.FAILED_PRECONDITION: 503,
    GrpcCode.UNAVAILABLE: 503,
    GrpcCode.ABORTED: 503,
}
"""The single table from a resume failure's code to the HTTP status the router returns.

Codes not listed answer 500 with a generic body, so server-side detail does not leak.
"""


def http_response(error: BaseException, actor: str) -> tuple[int, str]:
    """HTTP status and text body for a failed resolution of ``actor`` (``atespace/name``).

    Follows seeds 000/001: NotFound 404, PermissionDenied 403, Unauthenticated 401,
    DeadlineExceeded 504; no room / unavailable / transient state 503 with the body
    ``actor <atespace>/<name> unavailable: <description>``; anything else 500 with
    ``error resuming actor <atespace>/<name>``.
    """
    code = grpc_code(error)
    status = HTTP_STATUS.get(code, 500)
    description = error.description if isinstance(error, SubstrateError) else ""
    match status:
        case 404:
            body = f"actor {actor} not found"
        case 403:
            body = f"actor {actor}: permission denied"
        case 401:
            body = f"actor {actor}: unauthenticated"
        case 504:
            body = f"actor {actor}: deadline exceeded"
        case 503:
            body = f"actor {actor} unavailable"
            if description:
                body = f"{body}: {description}"
        case _:
            body = f"error resuming actor {actor}"
    return status, body


__all__ = [
    "GRPC_CODES",
    "HTTP_STATUS",
    "Aborted",
    "AlreadyExists",
    "Canceled",
    "Conflict",
    "DeadlineExceeded",
    "FailedPrecondition",
    "GrpcCode",
    "IllegalTransition",
    "Internal",
    "InvalidArgument",
    "LeaseHeld",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "SubstrateError",
    "Unauthenticated",
    "Unavailable",
    "from_grpc",
    "grpc_code",
    "http_response",
]
