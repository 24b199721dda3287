"""The status table: every substrate error class ⇄ its grpclib status, and the helpers."""

from __future__ import annotations

import asyncio

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.testing import ChannelFor

from substrate import errors
from substrate.api import pb
from substrate.api.status import (
    INTERNAL_MESSAGE,
    STATUS_BY_CODE,
    STATUS_BY_ERROR,
    from_grpc_error,
    grpc_errors,
    grpc_status,
    substrate_errors,
    to_grpc_error,
)

# (error class, status it travels as, class a client gets back)
ROWS = [
    (errors.SubstrateError, Status.INTERNAL, errors.Internal),
    (errors.NotFound, Status.NOT_FOUND, errors.NotFound),
    (errors.AlreadyExists, Status.ALREADY_EXISTS, errors.AlreadyExists),
    (errors.InvalidArgument, Status.INVALID_ARGUMENT, errors.InvalidArgument),
    (errors.FailedPrecondition, Status.FAILED_PRECONDITION, errors.FailedPrecondition),
    (errors.IllegalTransition, Status.FAILED_PRECONDITION, errors.FailedPrecondition),
    (errors.Aborted, Status.ABORTED, errors.Aborted),
    (errors.Conflict, Status.ABORTED, errors.Aborted),
    (errors.LeaseHeld, Status.ABORTED, errors.Aborted),
    (errors.ResourceExhausted, Status.RESOURCE_EXHAUSTED, errors.ResourceExhausted),
    (errors.Unavailable, Status.UNAVAILABLE, errors.Unavailable),
    (errors.DeadlineExceeded, Status.DEADLINE_EXCEEDED, errors.DeadlineExceeded),
    (errors.PermissionDenied, Status.PERMISSION_DENIED, errors.PermissionDenied),
    (errors.Unauthenticated, Status.UNAUTHENTICATED, errors.Unauthenticated),
    (errors.Internal, Status.INTERNAL, errors.Internal),
    (errors.Canceled, Status.CANCELLED, errors.Canceled),
]


def test_rows_cover_every_error_class() -> None:
    assert {cls for cls, _, _ in ROWS} == set(errors.GRPC_CODES)
    assert {cls: status for cls, status, _ in ROWS} == dict(STATUS_BY_ERROR)


def test_codes_and_statuses_agree_by_name_and_number() -> None:
    assert set(STATUS_BY_CODE) == set(errors.GrpcCode)
    for code, status in STATUS_BY_CODE.items():
        assert (status.name, status.value) == (code.name, code.value)
    assert set(STATUS_BY_CODE.values()) == set(Status)


@pytest.mark.parametrize(("cls", "status", "back"), ROWS, ids=lambda v: getattr(v, "__name__", v))
def test_row(cls: type[errors.SubstrateError], status: Status, back: type) -> None:
    err = cls("the description")
    assert grpc_status(err) is status
    wire = to_grpc_error(err)
    assert wire.status is status
    if status is Status.INTERNAL:
        assert wire.message == INTERNAL_MESSAGE
    else:
        assert wire.message == "the description"
    rebuilt = from_grpc_error(wire)
    assert type(rebuilt) is back
    assert rebuilt.code == errors.GRPC_CODES[back]
    if status is not Status.INTERNAL:
        assert rebuilt.description == "the description"


def test_unknown_exceptions_are_internal_and_do_not_leak() -> None:
    for exc in (ValueError("password=hunter2"), KeyError("secret"), RuntimeError()):
        wire = to_grpc_error(exc)
        assert wire.status is Status.INTERNAL
        assert wire.message == INTERNAL_MESSAGE
        assert "hunter2" not in str(wire.message)


def test_empty_description_travels_as_no_message() -> None:
    wire = to_grpc_error(errors.NotFound())
    assert wire.status is Status.NOT_FOUND
    assert wire.message is None
    back = from_grpc_error(wire)
    assert isinstance(back, errors.NotFound)
    assert back.description == ""


def test_grpc_error_passes_through() -> None:
    original = GRPCError(Status.UNIMPLEMENTED, "nope")
    assert to_grpc_error(original) is original


@pytest.mark.parametrize(
    "status",
    [
        Status.UNKNOWN,
        Status.OUT_OF_RANGE,
        Status.UNIMPLEMENTED,
        Status.INTERNAL,
        Status.DATA_LOSS,
        Status.OK,
    ],
)
def test_statuses_without_a_class_become_internal(status: Status) -> None:
    back = from_grpc_error(GRPCError(status, "x"))
    assert type(back) is errors.Internal


def test_context_managers() -> None:
    with pytest.raises(GRPCError) as info, grpc_errors():
        raise errors.LeaseHeld("lease held by another workflow")
    assert info.value.status is Status.ABORTED
    assert isinstance(info.value.__cause__, errors.LeaseHeld)

    with pytest.raises(GRPCError) as info, grpc_errors():
        raise ZeroDivisionError("detail")
    assert (info.value.status, info.value.message) == (Status.INTERNAL, INTERNAL_MESSAGE)

    with pytest.raises(errors.ResourceExhausted) as caught, substrate_errors():
        raise GRPCError(Status.RESOURCE_EXHAUSTED, "no worker has room for the actor")
    assert caught.value.description == "no worker has room for the actor"


class _Control(pb.ControlBase):
    async def get_actor(self, get_actor_request: pb.GetActorRequest) -> pb.Actor:
        with grpc_errors():
            ref = get_actor_request.ref
            if ref.name == "boom":
                raise RuntimeError("stack trace with secrets")
            raise errors.NotFound(f"actor {ref.atespace}/{ref.name} not found")


def test_over_grpclib_channel() -> None:
    """A servicer raising substrate errors, seen by a stub client as substrate errors."""

    async def main() -> None:
        async with ChannelFor([_Control()]) as channel:
            stub = pb.ControlStub(channel)
            with pytest.raises(errors.NotFound) as nf, substrate_errors():
                await stub.get_actor(pb.GetActorRequest(ref=pb.ObjectRef("a", "x")))
            assert nf.value.description == "actor a/x not found"
            with pytest.raises(errors.Internal) as internal, substrate_errors():
                await stub.get_actor(pb.GetActorRequest(ref=pb.ObjectRef("a", "boom")))
            assert internal.value.description == INTERNAL_MESSAGE
            with pytest.raises(errors.Internal), substrate_errors():
                await stub.list_actors(pb.ListActorsRequest())  # UNIMPLEMENTED

    asyncio.run(main())
