"""Who may call which RPC: a pure table from the caller's identity to the methods it may call.

============  =====================================================================
caller        may call
============  =====================================================================
ateapi        everything (ateapi's own tools and tests)
client/<n>    every ``substrate.v1.Control`` RPC
router        ``Control/ResumeActor``, ``GetActor``, ``GetWorker``, ``ListWorkers``
atelet/<n>    every ``substrate.v1.WorkerRegistry`` RPC, for workers of node ``<n>`` only
worker/<u>    nothing
anyone        ``grpc.health.v1.Health`` (any authenticated caller)
============  =====================================================================

A caller without an identity (plaintext) is allowed everything only on a server built
``insecure``; otherwise it is UNAUTHENTICATED. A known caller asking for a method outside
its row is PERMISSION_DENIED. The atelet row is *node scoped*: :func:`authorize` allows the
call and names the node; the servicer checks the request's worker against it (it needs the
store to learn a worker's node), see :func:`check_node`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from substrate.core.ids import NodeRef
from substrate.errors import GrpcCode, PermissionDenied, Unauthenticated
from substrate.identity.spiffe import Identity, IdentityKind

CONTROL_SERVICE: Final = "substrate.v1.Control"
REGISTRY_SERVICE: Final = "substrate.v1.WorkerRegistry"
HEALTH_SERVICE: Final = "grpc.health.v1.Health"

CONTROL_METHODS: Final = frozenset(
    {
        "CreateAtespace",
        "GetAtespace",
        "ListAtespaces",
        "DeleteAtespace",
        "CreateActorTemplate",
        "GetActorTemplate",
        "ListActorTemplates",
        "UpdateActorTemplate",
        "DeleteActorTemplate",
        "CreateActor",
        "GetActor",
        "ListActors",
        "UpdateActor",
        "SuspendActor",
        "PauseActor",
        "ResumeActor",
        "RevertActor",
        "DeleteActor",
        "CreateTag",
        "GetTag",
        "ListTags",
        "DeleteTag",
        "ListWorkers",
        "GetWorker",
        "DrainWorker",
    }
)
REGISTRY_METHODS: Final = frozenset({"RegisterWorker", "Heartbeat", "RequestActorSuspend"})
ROUTER_METHODS: Final = frozenset({"ResumeActor", "GetActor", "GetWorker", "ListWorkers"})
"""The router resumes actors and looks up workers' atunnel addresses."""


def method_path(service: str, method: str) -> str:
    """The gRPC ``:path`` of ``service``/``method``: ``/<service>/<method>``."""
    return f"/{service}/{method}"


def split_path(path: str) -> tuple[str, str]:
    """``/<service>/<method>`` → (service, method); ("", "") if malformed."""
    if not path.startswith("/"):
        return "", ""
    service, sep, method = path[1:].partition("/")
    if not sep or not service or not method or "/" in method:
        return "", ""
    return service, method


_TABLE: Final[Mapping[IdentityKind, frozenset[str]]] = {
    IdentityKind.CLIENT: frozenset(method_path(CONTROL_SERVICE, m) for m in CONTROL_METHODS),
    IdentityKind.ROUTER: frozenset(method_path(CONTROL_SERVICE, m) for m in ROUTER_METHODS),
    IdentityKind.ATELET: frozenset(method_path(REGISTRY_SERVICE, m) for m in REGISTRY_METHODS),
    IdentityKind.WORKER: frozenset(),
}
"""Per kind, the exact method paths it may call (ateapi: all; health: everyone)."""


@attrs.frozen(slots=True)
class Decision:
    """The outcome of :func:`authorize`."""

    allowed: bool
    code: GrpcCode = GrpcCode.OK
    """PERMISSION_DENIED or UNAUTHENTICATED when refused."""
    message: str = ""
    node: NodeRef | None = None
    """When allowed for one node's workers only (atelets): that node."""

    def error(self) -> PermissionDenied | Unauthenticated:
        """The substrate error of a refusal."""
        assert not self.allowed
        if self.code is GrpcCode.UNAUTHENTICATED:
            return Unauthenticated(self.message)
        return PermissionDenied(self.message)


ALLOW: Final = Decision(allowed=True)


def allowed_methods(kind: IdentityKind) -> frozenset[str] | None:
    """The method paths ``kind`` may call; None means every method."""
    if kind is IdentityKind.ATEAPI:
        return None
    return _TABLE[kind] | {
        method_path(HEALTH_SERVICE, "Check"),
        method_path(HEALTH_SERVICE, "Watch"),
    }


def authorize(identity: Identity | None, path: str, *, insecure: bool) -> Decision:
    """May ``identity`` call the method at ``path``?

    ``identity`` is None for a caller that presented no certificate: allowed only when the
    server is ``insecure`` (plaintext for local debugging).
    """
    if identity is None:
        if insecure:
            return ALLOW
        return Decision(
            allowed=False,
            code=GrpcCode.UNAUTHENTICATED,
            message="a client certificate is required",
        )
    service, _ = split_path(path)
    if service == HEALTH_SERVICE:
        return ALLOW
    allowed = allowed_methods(identity.kind)
    if allowed is not None and path not in allowed:
        return Decision(
            allowed=False,
            code=GrpcCode.PERMISSION_DENIED,
            message=f"{identity} may not call {path or '(no method)'}",
        )
    if identity.kind is IdentityKind.ATELET:
        return Decision(allowed=True, node=NodeRef(identity.name))
    return ALLOW


def check_node(decision: Decision, node: NodeRef, *, what: str) -> None:
    """Raise :class:`PermissionDenied` if a node-scoped caller acts for another node's worker."""
    if decision.node is not None and decision.node != node:
        raise PermissionDenied(f"the atelet of node {decision.node} may not act for {what}")


__all__ = [
    "ALLOW",
    "CONTROL_METHODS",
    "CONTROL_SERVICE",
    "HEALTH_SERVICE",
    "REGISTRY_METHODS",
    "REGISTRY_SERVICE",
    "ROUTER_METHODS",
    "Decision",
    "allowed_methods",
    "authorize",
    "check_node",
    "method_path",
    "split_path",
]
