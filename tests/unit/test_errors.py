"""The error tree and its two translation tables."""

from __future__ import annotations

import pytest

from substrate import errors as e


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (e.NotFound("x"), e.GrpcCode.NOT_FOUND),
        (e.AlreadyExists("x"), e.GrpcCode.ALREADY_EXISTS),
        (e.InvalidArgument("x"), e.GrpcCode.INVALID_ARGUMENT),
        (e.FailedPrecondition("x"), e.GrpcCode.FAILED_PRECONDITION),
        (e.IllegalTransition("x"), e.GrpcCode.FAILED_PRECONDITION),
        (e.Aborted("x"), e.GrpcCode.ABORTED),
        (e.Conflict("x"), e.GrpcCode.ABORTED),
        (e.LeaseHeld("x"), e.GrpcCode.ABORTED),
        (e.ResourceExhausted("x"), e.GrpcCode.RESOURCE_EXHAUSTED),
        (e.Unavailable("x"), e.GrpcCode.UNAVAILABLE),
        (e.DeadlineExceeded("x"), e.GrpcCode.DEADLINE_EXCEEDED),
        (e.PermissionDenied("x"), e.GrpcCode.PERMISSION_DENIED),
        (e.Unauthenticated("x"), e.GrpcCode.UNAUTHENTICATED),
        (e.Internal("x"), e.GrpcCode.INTERNAL),
        (ValueError("x"), e.GrpcCode.INTERNAL),
    ],
)
def test_grpc_codes(error: BaseException, code: e.GrpcCode) -> None:
    assert e.grpc_code(error) is code


def test_every_error_class_has_a_code() -> None:
    def walk(cls: type[e.SubstrateError]) -> list[type[e.SubstrateError]]:
        out = [cls]
        for sub in cls.__subclasses__():
            out += walk(sub)
        return out

    # Subclasses elsewhere (e.g. the router's TunnelUnreachable) map through their MRO.
    for cls in walk(e.SubstrateError):
        if cls.__module__ == e.__name__:
            assert cls in e.GRPC_CODES, cls
        else:
            assert e.grpc_code(cls("x")) is not e.GrpcCode.OK


@pytest.mark.parametrize("code", list(e.GrpcCode))
def test_from_grpc_round_trips_known_codes(code: e.GrpcCode) -> None:
    err = e.from_grpc(code, "desc")
    assert err.description == "desc"
    if code in (
        e.GrpcCode.OK,
        e.GrpcCode.UNKNOWN,
        e.GrpcCode.OUT_OF_RANGE,
        e.GrpcCode.UNIMPLEMENTED,
        e.GrpcCode.DATA_LOSS,
        e.GrpcCode.INTERNAL,
    ):
        assert isinstance(err, e.Internal)
    else:
        assert err.code is code


def test_from_grpc_unknown_number_is_internal() -> None:
    assert isinstance(e.from_grpc(99, "?"), e.Internal)


@pytest.mark.parametrize(
    ("error", "status", "body"),
    [
        (e.NotFound("Actor a/b not found"), 404, "actor a/b not found"),
        (e.PermissionDenied("no"), 403, "actor a/b: permission denied"),
        (e.Unauthenticated("no"), 401, "actor a/b: unauthenticated"),
        (e.DeadlineExceeded("slow"), 504, "actor a/b: deadline exceeded"),
        (
            e.ResourceExhausted("no worker has room for the actor"),
            503,
            "actor a/b unavailable: no worker has room for the actor",
        ),
        (e.Unavailable(""), 503, "actor a/b unavailable"),
        (
            e.FailedPrecondition("AssignWorker prerequisite not met"),
            503,
            "actor a/b unavailable: AssignWorker prerequisite not met",
        ),
        (e.Internal("secret detail"), 500, "error resuming actor a/b"),
        (RuntimeError("secret detail"), 500, "error resuming actor a/b"),
        (e.InvalidArgument("bad"), 500, "error resuming actor a/b"),
    ],
)
def test_http_table(error: BaseException, status: int, body: str) -> None:
    assert e.http_response(error, "a/b") == (status, body)
