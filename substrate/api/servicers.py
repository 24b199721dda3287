"""ateapi's gRPC servicers: ``substrate.v1.Control`` and ``substrate.v1.WorkerRegistry``.

Every RPC parses its request with ``convert.parse_*`` (INVALID_ARGUMENT on bad input),
runs the :class:`~substrate.services.actors.ActorService` workflow (reads go straight to its
store), and converts the result back with :mod:`substrate.api.convert`. Errors leave through
:func:`~substrate.api.status.grpc_errors`: a substrate error becomes its status with its
description, anything else INTERNAL with a generic message (the cause is logged here).

Authorization happens before a servicer runs (see :mod:`substrate.api.server`), which
records the caller's :class:`~substrate.api.authz.Decision` in a context variable. The
registry's node-scoped checks read it back (:func:`current_caller`); a servicer called
without a recorded caller refuses, so a wiring mistake fails closed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import attrs
import structlog
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from substrate.api import convert, pb
from substrate.api.authz import ALLOW, Decision, check_node
from substrate.api.status import grpc_errors
from substrate.core.ids import WorkerRef
from substrate.core.model import Worker
from substrate.errors import FailedPrecondition, NotFound, Unauthenticated
from substrate.identity.spiffe import Identity
from substrate.services.actors import ActorService

log = structlog.get_logger("substrate.api")


@attrs.frozen(slots=True)
class Caller:
    """Who is calling (None: plaintext on an insecure server) and what they were allowed."""

    identity: Identity | None
    decision: Decision = ALLOW


_CALLER: ContextVar[Caller | None] = ContextVar("substrate_api_caller", default=None)


def current_caller() -> Caller:
    """The caller of the RPC being served; :class:`Unauthenticated` if none was recorded."""
    caller = _CALLER.get()
    if caller is None:
        raise Unauthenticated("no authenticated caller for this call")
    return caller


@contextmanager
def acting_as(caller: Caller) -> Iterator[Caller]:
    """Record ``caller`` for the calls made inside the block (the server's listener uses it;
    so can in-process callers and tests)."""
    token = _CALLER.set(caller)
    try:
        yield caller
    finally:
        _CALLER.reset(token)


@contextmanager
def _rpc(name: str) -> Iterator[None]:
    """``grpc_errors()``, logging the cause of every INTERNAL answer."""
    try:
        with grpc_errors():
            yield
    except GRPCError as exc:
        if exc.status is Status.INTERNAL and exc.__cause__ is not None:
            log.error("rpc failed", rpc=name, exc_info=exc.__cause__)
        raise


class ControlServicer(pb.ControlBase):
    """The public control API over an :class:`ActorService`."""

    def __init__(self, service: ActorService) -> None:
        self.service = service

    # --- atespaces --------------------------------------------------------------------

    async def create_atespace(self, request: pb.CreateAtespaceRequest) -> pb.Atespace:
        with _rpc("CreateAtespace"):
            atespace = convert.parse_create_atespace(request)
            created = await self.service.create_atespace(atespace.name)
            return convert.atespace_to_proto(created)

    async def get_atespace(self, request: pb.GetAtespaceRequest) -> pb.Atespace:
        with _rpc("GetAtespace"):
            name = convert.parse_get_atespace(request)
            return convert.atespace_to_proto(await self.service.store.get_atespace(name))

    async def list_atespaces(self, request: pb.ListAtespacesRequest) -> pb.ListAtespacesResponse:
        with _rpc("ListAtespaces"):
            atespaces = await self.service.store.list_atespaces()
            return pb.ListAtespacesResponse(
                atespaces=[convert.atespace_to_proto(a) for a in atespaces]
            )

    async def delete_atespace(self, request: pb.DeleteAtespaceRequest) -> pb.DeleteAtespaceResponse:
        with _rpc("DeleteAtespace"):
            await self.service.delete_atespace(convert.parse_delete_atespace(request))
            return pb.DeleteAtespaceResponse()

    # --- templates --------------------------------------------------------------------

    async def create_actor_template(
        self, request: pb.CreateActorTemplateRequest
    ) -> pb.ActorTemplate:
        with _rpc("CreateActorTemplate"):
            template = convert.parse_create_actor_template(request)
            created = await self.service.create_template(template)
            return convert.actor_template_to_proto(created)

    async def get_actor_template(self, request: pb.GetActorTemplateRequest) -> pb.ActorTemplate:
        with _rpc("GetActorTemplate"):
            ref = convert.parse_get_actor_template(request)
            return convert.actor_template_to_proto(await self.service.store.get_template(ref))

    async def list_actor_templates(
        self, request: pb.ListActorTemplatesRequest
    ) -> pb.ListActorTemplatesResponse:
        with _rpc("ListActorTemplates"):
            atespace = convert.parse_list_actor_templates(request)
            templates = await self.service.store.list_templates(atespace)
            return pb.ListActorTemplatesResponse(
                templates=[convert.actor_template_to_proto(t) for t in templates]
            )

    async def update_actor_template(
        self, request: pb.UpdateActorTemplateRequest
    ) -> pb.ActorTemplate:
        with _rpc("UpdateActorTemplate"):
            template = convert.parse_update_actor_template(request)
            updated = await self.service.update_template(template)
            return convert.actor_template_to_proto(updated)

    async def delete_actor_template(
        self, request: pb.DeleteActorTemplateRequest
    ) -> pb.DeleteActorTemplateResponse:
        with _rpc("DeleteActorTemplate"):
            await self.service.delete_template(convert.parse_delete_actor_template(request))
            return pb.DeleteActorTemplateResponse()

    # --- actors -----------------------------------------------------------------------

    async def create_actor(self, request: pb.CreateActorRequest) -> pb.Actor:
        with _rpc("CreateActor"):
            args = convert.parse_create_actor(request)
            actor = await self.service.create_actor(
                args.ref,
                template=args.template,
                source_tag=args.source_tag,
                worker_selector=args.worker_selector,
            )
            return convert.actor_to_proto(actor)

    async def get_actor(self, request: pb.GetActorRequest) -> pb.Actor:
        with _rpc("GetActor"):
            ref = convert.parse_get_actor(request)
            return convert.actor_to_proto(await self.service.store.get_actor(ref))

    async def list_actors(self, request: pb.ListActorsRequest) -> pb.ListActorsResponse:
        with _rpc("ListActors"):
            args = convert.parse_list_actors(request)
            actors, token = await self.service.store.list_actors(
                args.atespace, page_size=args.page_size, page_token=args.page_token
            )
            return pb.ListActorsResponse(
                actors=[convert.actor_to_proto(a) for a in actors], next_page_token=token
            )

    async def update_actor(self, request: pb.UpdateActorRequest) -> pb.Actor:
        with _rpc("UpdateActor"):
            args = convert.parse_update_actor(request)
            actor = await self.service.update_actor_selector(args.ref, args.worker_selector)
            return convert.actor_to_proto(actor)

    async def suspend_actor(self, request: pb.SuspendActorRequest) -> pb.SuspendActorResponse:
        with _rpc("SuspendActor"):
            args = convert.parse_suspend_actor(request)
            actor = await self.service.suspend(args.ref, args.mode)
            return pb.SuspendActorResponse(actor=convert.actor_to_proto(actor))

    async def pause_actor(self, request: pb.PauseActorRequest) -> pb.PauseActorResponse:
        with _rpc("PauseActor"):
            actor = await self.service.pause(convert.parse_pause_actor(request))
            return pb.PauseActorResponse(actor=convert.actor_to_proto(actor))

    async def resume_actor(self, request: pb.ResumeActorRequest) -> pb.ResumeActorResponse:
        with _rpc("ResumeActor"):
            result = await self.service.resume(convert.parse_resume_actor(request))
            return convert.resume_result_to_proto(result)

    async def revert_actor(self, request: pb.RevertActorRequest) -> pb.RevertActorResponse:
        with _rpc("RevertActor"):
            actor = await self.service.revert(convert.parse_revert_actor(request))
            return pb.RevertActorResponse(actor=convert.actor_to_proto(actor))

    async def delete_actor(self, request: pb.DeleteActorRequest) -> pb.DeleteActorResponse:
        with _rpc("DeleteActor"):
            args = convert.parse_delete_actor(request)
            await self.service.delete(args.ref, force=args.force)
            return pb.DeleteActorResponse()

    # --- tags -------------------------------------------------------------------------

    async def create_tag(self, request: pb.CreateTagRequest) -> pb.Tag:
        with _rpc("CreateTag"):
            args = convert.parse_create_tag(request)
            return convert.tag_to_proto(await self.service.create_tag(args.ref, args.actor))

    async def get_tag(self, request: pb.GetTagRequest) -> pb.Tag:
        with _rpc("GetTag"):
            ref = convert.parse_get_tag(request)
            return convert.tag_to_proto(await self.service.store.get_tag(ref))

    async def list_tags(self, request: pb.ListTagsRequest) -> pb.ListTagsResponse:
        with _rpc("ListTags"):
            tags = await self.service.store.list_tags(convert.parse_list_tags(request))
            return pb.ListTagsResponse(tags=[convert.tag_to_proto(t) for t in tags])

    async def delete_tag(self, request: pb.DeleteTagRequest) -> pb.DeleteTagResponse:
        with _rpc("DeleteTag"):
            await self.service.delete_tag(convert.parse_delete_tag(request))
            return pb.DeleteTagResponse()

    # --- workers ----------------------------------------------------------------------

    async def list_workers(self, request: pb.ListWorkersRequest) -> pb.ListWorkersResponse:
        with _rpc("ListWorkers"):
            pool = convert.parse_list_workers(request)
            workers = await self.service.store.list_workers()
            return pb.ListWorkersResponse(
                workers=[
                    convert.worker_to_proto(w) for w in workers if pool is None or w.pool == pool
                ]
            )

    async def get_worker(self, request: pb.GetWorkerRequest) -> pb.Worker:
        with _rpc("GetWorker"):
            ref = convert.parse_get_worker(request)
            return convert.worker_to_proto(await self.service.store.get_worker(ref))

    async def drain_worker(self, request: pb.DrainWorkerRequest) -> pb.Worker:
        with _rpc("DrainWorker"):
            ref = convert.parse_drain_worker(request)
            return convert.worker_to_proto(await self.service.drain_worker(ref))


class RegistryServicer(pb.WorkerRegistryBase):
    """The worker registry (atelets only), node-scoped per caller."""

    def __init__(self, service: ActorService) -> None:
        self.service = service

    async def _stored_worker(self, ref: WorkerRef) -> Worker | None:
        try:
            return await self.service.store.get_worker(ref)
        except NotFound:
            return None

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerResponse:
        with _rpc("RegisterWorker"):
            decision = current_caller().decision
            worker = convert.parse_register_worker(request)
            check_node(decision, worker.node, what=f"a worker on node {worker.node}")
            if decision.node is not None:
                stored = await self._stored_worker(worker.ref)
                if stored is not None:
                    # No atelet may take over (and so forget) a worker of another node.
                    check_node(
                        decision, stored.node, what=f"worker {worker.ref} of node {stored.node}"
                    )
            registered = await self.service.register_worker(worker)
            return pb.RegisterWorkerResponse(worker=convert.worker_to_proto(registered))

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        with _rpc("Heartbeat"):
            decision = current_caller().decision
            args = convert.parse_heartbeat(request)
            if decision.node is not None:
                stored = await self.service.store.get_worker(args.worker)
                check_node(
                    decision, stored.node, what=f"worker {args.worker} of node {stored.node}"
                )
            worker = await self.service.heartbeat(args.worker, args.epoch, args.capacity)
            return pb.HeartbeatResponse(worker=convert.worker_to_proto(worker))

    async def request_actor_suspend(
        self, request: pb.RequestActorSuspendRequest
    ) -> pb.RequestActorSuspendResponse:
        with _rpc("RequestActorSuspend"):
            decision = current_caller().decision
            args = convert.parse_request_actor_suspend(request)
            stored = await self.service.store.get_worker(args.worker)
            check_node(decision, stored.node, what=f"worker {args.worker} of node {stored.node}")
            if stored.epoch != args.worker_epoch:
                raise FailedPrecondition(
                    f"worker {args.worker} asked with epoch {args.worker_epoch}, registered "
                    f"epoch {stored.epoch}: register again"
                )
            await self.service.request_suspend(args.worker, args.actor, args.actor_uid)
            return pb.RequestActorSuspendResponse()


__all__ = [
    "Caller",
    "ControlServicer",
    "RegistryServicer",
    "acting_as",
    "current_caller",
]
