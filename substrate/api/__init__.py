"""substrate's wire API: the ``substrate.v1`` protobuf types, their conversion, the status table.

* :mod:`substrate.api.pb`: the generated betterproto messages, enums, ``*Stub`` clients and
  ``*Base`` servers (from ``proto/substrate/v1``; regenerate with ``make gen-proto``).
* :mod:`substrate.api.convert`: model ⇄ wire conversion and request parsing.
* :mod:`substrate.api.status`: substrate errors ⇄ grpclib statuses.
* :mod:`substrate.api.authz`: which caller identity may call which RPC (a pure table).
* :mod:`substrate.api.servicers` / :mod:`substrate.api.server`: ateapi's gRPC servicers and
  server (import them directly; they pull in the service layer).
* :mod:`substrate.api.atelet`: the ateapi ⇄ atelet contract, both sides: ``AteletServicer``
  and ``serve_atelet`` (a node agent served over mTLS, callable by ateapi only), and
  ``GrpcNodeAgent`` / ``GrpcNodeAgents`` (ateapi's client; import directly, like the server).

Wire messages never enter ``substrate.core``; convert at the edge.
"""

from substrate.api import authz, convert, pb, status
from substrate.api.convert import (
    ActorSuspendRequestArgs,
    CreateActorArgs,
    CreateTagArgs,
    DeleteActorArgs,
    DropSnapshotArgs,
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
    "DropSnapshotArgs",
    "HeartbeatArgs",
    "ListActorsArgs",
    "ResumeResult",
    "SuspendActorArgs",
    "UpdateActorArgs",
    "authz",
    "convert",
    "from_grpc_error",
    "grpc_errors",
    "grpc_status",
    "pb",
    "status",
    "substrate_errors",
    "to_grpc_error",
]
