"""substrate's wire API: the ``substrate.v1`` protobuf types, their conversion, the status table.

* :mod:`substrate.api.pb`: the generated betterproto messages, enums, ``*Stub`` clients and
  ``*Base`` servers (from ``proto/substrate/v1``; regenerate with ``make gen-proto``).
* :mod:`substrate.api.convert`: model ⇄ wire conversion and request parsing.
* :mod:`substrate.api.status`: substrate errors ⇄ grpclib statuses.

Wire messages never enter ``substrate.core``; convert at the edge.
"""

from substrate.api import convert, pb, status
from substrate.api.convert import (
    ActorSuspendRequestArgs,
    CreateActorArgs,
    CreateTagArgs,
    DeleteActorArgs,
    HeartbeatArgs,
    ListActorsArgs,
    ResumeResult,
    SuspendActorArgs,
    UpdateActorArgs,
)
from substrate.api.status import (
    from_grpc_error,
    grpc_errors,
    grpc_status,
    substrate_errors,
    to_grpc_error,
)

__all__ = [
    "ActorSuspendRequestArgs",
    "CreateActorArgs",
    "CreateTagArgs",
    "DeleteActorArgs",
    "HeartbeatArgs",
    "ListActorsArgs",
    "ResumeResult",
    "SuspendActorArgs",
    "UpdateActorArgs",
    "convert",
    "from_grpc_error",
    "grpc_errors",
    "grpc_status",
    "pb",
    "status",
    "substrate_errors",
    "to_grpc_error",
]
