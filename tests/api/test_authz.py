"""The authorization table (pure): every RPC has a row, every kind its methods."""

from __future__ import annotations

import pytest

from substrate.api import pb
from substrate.api.authz import (
    CONTROL_METHODS,
    CONTROL_SERVICE,
    REGISTRY_METHODS,
    REGISTRY_SERVICE,
    ROUTER_METHODS,
    allowed_methods,
    authorize,
    check_node,
    method_path,
    split_path,
)
from substrate.core.ids import NodeRef
from substrate.errors import GrpcCode, PermissionDenied, Unauthenticated
from substrate.identity import Identity, IdentityKind

CONTROL = sorted(method_path(CONTROL_SERVICE, m) for m in CONTROL_METHODS)
REGISTRY = sorted(method_path(REGISTRY_SERVICE, m) for m in REGISTRY_METHODS)
HEALTH = "/grpc.health.v1.Health/Check"


def test_the_table_names_exactly_the_served_methods() -> None:
    assert set(CONTROL) == set(pb.ControlBase().__mapping__())
    assert set(REGISTRY) == set(pb.WorkerRegistryBase().__mapping__())
    assert ROUTER_METHODS <= CONTROL_METHODS


CALLERS = {
    "ateapi": Identity.ateapi(),
    "client": Identity.client("alice"),
    "router": Identity.router(),
    "atelet": Identity.atelet("node-0"),
    "worker": Identity.worker("w-1"),
}
EXPECTED = {
    "ateapi": set(CONTROL) | set(REGISTRY),
    "client": set(CONTROL),
    "router": {
        method_path(CONTROL_SERVICE, "ResumeActor"),
        method_path(CONTROL_SERVICE, "GetActor"),
        method_path(CONTROL_SERVICE, "GetWorker"),
        method_path(CONTROL_SERVICE, "ListWorkers"),
    },
    "atelet": set(REGISTRY),
    "worker": set(),
}


@pytest.mark.parametrize("caller", sorted(CALLERS))
@pytest.mark.parametrize("path", [*CONTROL, *REGISTRY, HEALTH])
def test_each_caller_may_call_exactly_its_row(caller: str, path: str) -> None:
    decision = authorize(CALLERS[caller], path, insecure=False)
    if path == HEALTH:
        assert decision.allowed
        return
    assert decision.allowed is (path in EXPECTED[caller])
    if not decision.allowed:
        assert decision.code is GrpcCode.PERMISSION_DENIED
        assert str(CALLERS[caller]) in decision.message
        assert isinstance(decision.error(), PermissionDenied)
    # Only atelets are node scoped, and on an insecure server nothing changes for them.
    assert decision.node == (NodeRef("node-0") if caller == "atelet" and decision.allowed else None)
    assert authorize(CALLERS[caller], path, insecure=True) == decision


def test_no_identity_is_allowed_only_on_an_insecure_server() -> None:
    for path in (*CONTROL, *REGISTRY, HEALTH):
        assert authorize(None, path, insecure=True).allowed
        refused = authorize(None, path, insecure=False)
        assert not refused.allowed
        assert refused.code is GrpcCode.UNAUTHENTICATED
        assert isinstance(refused.error(), Unauthenticated)


def test_unknown_or_malformed_methods_are_refused_to_all_but_ateapi() -> None:
    for path in ("/substrate.v1.Control/Nope", "/substrate.v1.Atelet/Run", "", "nope", "/a/b/c"):
        assert not authorize(CALLERS["client"], path, insecure=False).allowed
        assert authorize(CALLERS["ateapi"], path, insecure=False).allowed
    assert allowed_methods(IdentityKind.ATEAPI) is None


def test_split_path() -> None:
    assert split_path("/substrate.v1.Control/GetActor") == ("substrate.v1.Control", "GetActor")
    for bad in ("", "x", "/x", "/x/", "//y", "/a/b/c", "a/b"):
        assert split_path(bad) == ("", "")


def test_check_node_scopes_atelets() -> None:
    atelet = authorize(CALLERS["atelet"], REGISTRY[0], insecure=False)
    check_node(atelet, NodeRef("node-0"), what="w")
    with pytest.raises(PermissionDenied, match="node-0 may not act for w-1-0"):
        check_node(atelet, NodeRef("node-1"), what="w-1-0")
    unscoped = authorize(CALLERS["ateapi"], REGISTRY[0], insecure=False)
    check_node(unscoped, NodeRef("node-1"), what="w")
