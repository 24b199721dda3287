"""mTLS identities over real sockets: who may call what, and what a refused caller sees."""

from __future__ import annotations

import ssl
from functools import partial
from pathlib import Path

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from substrate.api import pb
from substrate.api.server import build_server
from substrate.api.servicers import Caller, RegistryServicer, acting_as
from substrate.api.status import substrate_errors
from substrate.client import AteClient
from substrate.client._async import isolated
from substrate.core.model import ActorState, WorkerState
from substrate.errors import (
    FailedPrecondition,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from substrate.identity import Identity, client_context, server_context

from .mtls_stack import Pki, Stack, api_stack, make_pki, raw_channel

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(Path(tmp_path_factory.mktemp("pki")))


def registration(name: str, node: str, epoch: int = 1) -> pb.RegisterWorkerRequest:
    return pb.RegisterWorkerRequest(
        name=name,
        node=node,
        ips=["127.0.0.1"],
        sandbox_class=pb.SandboxClass(3),  # FAKE
        runtime_versions=["fake-1"],
        epoch=epoch,
        capacity=pb.Capacity(cpu_milli=1000, memory_bytes=1 << 30, actors=2),
    )


async def running_actor(st: Stack, name: str) -> tuple[str, str, str]:
    """Create and resume ``lab/<name>``; return (worker, node, uid)."""
    async with st.connect() as ate:
        await ate.create_actor(f"lab/{name}", template="lab/counter")
        actor = (await ate.resume_actor(f"lab/{name}")).actor
    a = actor.status.assignment
    assert a is not None
    return a.worker.name, a.node.name, actor.metadata.uid


# --- the authorization table, end to end -------------------------------------------------


async def test_router_may_resume_and_get_but_nothing_else(pki: Pki) -> None:
    async with api_stack(pki) as st:
        async with st.connect() as ate:
            await ate.create_actor("lab/a1", template="lab/counter")
        async with st.connect("router") as router:
            result = await router.resume_actor("lab/a1")
            assert result.actor.state is ActorState.RUNNING
            assert (await router.get_actor("lab/a1")).state is ActorState.RUNNING
            with pytest.raises(NotFound):
                await router.get_actor("lab/ghost")
            with pytest.raises(PermissionDenied, match="router may not call"):
                await router.create_actor("lab/a2", template="lab/counter")
            with pytest.raises(PermissionDenied):
                await router.suspend_actor("lab/a1")
            with pytest.raises(PermissionDenied):
                await router.list_actors_page()
        async with raw_channel(st.address, pki.files("router")) as channel:
            with pytest.raises(GRPCError) as refused:
                await pb.WorkerRegistryStub(channel).heartbeat(
                    pb.HeartbeatRequest(name="w-0-0", epoch=1)
                )
            assert refused.value.status is Status.PERMISSION_DENIED


async def test_atelet_acts_only_for_the_workers_of_its_node(pki: Pki) -> None:
    async with api_stack(pki) as st, raw_channel(st.address, pki.files("atelet-0")) as channel:
        registry = pb.WorkerRegistryStub(channel)
        beat = await registry.heartbeat(pb.HeartbeatRequest(name="w-0-0", epoch=1))
        assert beat.worker.name == "w-0-0"
        assert beat.worker.node == "node-0"
        with pytest.raises(PermissionDenied, match="node-1"), substrate_errors():
            await registry.heartbeat(pb.HeartbeatRequest(name="w-1-0", epoch=1))
        with pytest.raises(FailedPrecondition, match="epoch"), substrate_errors():
            await registry.heartbeat(pb.HeartbeatRequest(name="w-0-0", epoch=7))
        with pytest.raises(NotFound), substrate_errors():
            await registry.heartbeat(pb.HeartbeatRequest(name="w-9-9", epoch=1))

        # A heartbeat may carry a new capacity.
        beat = await registry.heartbeat(
            pb.HeartbeatRequest(
                name="w-0-1", epoch=1, capacity=pb.Capacity(cpu_milli=500, actors=1)
            )
        )
        assert beat.worker.capacity.cpu_milli == 500

        new = await registry.register_worker(registration("w-0-9", "node-0"))
        assert new.worker.state == pb.WorkerState(1)  # ACTIVE
        with pytest.raises(PermissionDenied), substrate_errors():
            await registry.register_worker(registration("w-1-9", "node-1"))
        # Nor may it take over another node's worker by registering it as its own.
        with pytest.raises(PermissionDenied, match="w-1-0"), substrate_errors():
            await registry.register_worker(registration("w-1-0", "node-0", epoch=2))
        assert (await st.cluster.store.get_worker(st.cluster.workers[2].ref)).epoch == 1

        with pytest.raises(PermissionDenied), substrate_errors():
            await pb.ControlStub(channel).list_atespaces(pb.ListAtespacesRequest())


async def test_atelet_requests_a_suspend_for_its_own_node_only(pki: Pki) -> None:
    async with api_stack(pki) as st:
        worker, node, uid = await running_actor(st, "idle")
        own = "atelet-0" if node == "node-0" else "atelet-1"
        other = "atelet-1" if own == "atelet-0" else "atelet-0"
        request = pb.RequestActorSuspendRequest(
            worker=worker,
            worker_epoch=1,
            actor=pb.ObjectRef(atespace="lab", name="idle"),
            actor_uid=uid,
        )
        async with raw_channel(st.address, pki.files(other)) as channel:
            with pytest.raises(PermissionDenied), substrate_errors():
                await pb.WorkerRegistryStub(channel).request_actor_suspend(request)
        async with raw_channel(st.address, pki.files(own)) as channel:
            registry = pb.WorkerRegistryStub(channel)
            stale = pb.RequestActorSuspendRequest().from_dict(request.to_dict())
            stale.worker_epoch = 5
            with pytest.raises(FailedPrecondition, match="epoch"), substrate_errors():
                await registry.request_actor_suspend(stale)
            await registry.request_actor_suspend(request)
        assert (await st.cluster.actor("idle")).state is ActorState.SUSPENDED


async def test_worker_and_client_identities_may_not_use_the_registry(pki: Pki) -> None:
    async with api_stack(pki) as st:
        for name in ("worker", "client"):
            async with raw_channel(st.address, pki.files(name)) as channel:
                with pytest.raises(PermissionDenied), substrate_errors():
                    await pb.WorkerRegistryStub(channel).heartbeat(
                        pb.HeartbeatRequest(name="w-0-0", epoch=1)
                    )
        async with st.connect("worker") as worker:
            with pytest.raises(PermissionDenied, match="worker/w-0-0"):
                await worker.get_actor("lab/a1")


async def test_ateapi_identity_may_call_everything(pki: Pki) -> None:
    async with api_stack(pki) as st:
        async with st.connect("ateapi") as ate:
            assert [a.name for a in await ate.list_atespaces()] == ["lab"]
        async with raw_channel(st.address, pki.files("ateapi")) as channel:
            reply = await pb.WorkerRegistryStub(channel).register_worker(
                registration("w-1-5", "node-1")
            )
            assert reply.worker.node == "node-1"


async def test_health_answers_any_authenticated_caller(pki: Pki) -> None:
    async with api_stack(pki) as st:
        for name in ("router", "worker", "atelet-1"):
            async with raw_channel(st.address, pki.files(name)) as channel:
                reply = await HealthStub(channel).Check(HealthCheckRequest())
                assert reply.status == HealthCheckResponse.SERVING


async def test_a_certificate_outside_the_servers_trust_domain_is_unauthenticated(
    pki: Pki,
) -> None:
    async with api_stack(pki, trust_domain="elsewhere") as st, st.connect() as ate:
        with pytest.raises(Unauthenticated, match="trust domain"):
            await ate.list_atespaces()


# --- refused at the TLS layer --------------------------------------------------------------


async def test_client_certificate_from_another_ca_is_refused(pki: Pki) -> None:
    async with api_stack(pki) as st:
        async with AteClient.connect(st.address, tls_dir=pki.foreign_dir, timeout=5) as ate:
            with pytest.raises(Unavailable, match="refused our certificate"):
                await ate.list_atespaces()
        actors, _ = await st.cluster.store.list_actors("lab")
        assert actors == []


async def test_client_without_a_certificate_loses_the_connection(pki: Pki) -> None:
    files = pki.files("client")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(files.ca))
    ctx.set_alpn_protocols(["h2"])
    async with api_stack(pki) as st, raw_channel(st.address, None, context=ctx) as channel:
        # What grpclib raises: the server drops the TLS session; AteClient maps it to
        # Unavailable (see the foreign CA test).
        # (in a task of its own: grpclib cancels the calling task on a lost connection)
        call = partial(pb.ControlStub(channel).list_atespaces, timeout=5)
        with pytest.raises(StreamTerminatedError):
            await isolated(call, pb.ListAtespacesRequest())


async def test_plaintext_client_against_the_tls_server_fails(pki: Pki) -> None:
    async with (
        api_stack(pki) as st,
        AteClient.connect(st.address, insecure=True, timeout=5) as ate,
    ):
        with pytest.raises(Unavailable, match="lost"):
            await ate.list_atespaces()


async def test_server_certificate_from_an_untrusted_ca_is_unauthenticated(pki: Pki) -> None:
    # Our own client credentials, but trusting only the other CA.
    async with (
        api_stack(pki) as st,
        AteClient.connect(
            st.address,
            tls_dir=pki.dir,
            ca=pki.foreign_dir / "other-ca.crt",
            pin_server=False,
            timeout=5,
        ) as ate,
    ):
        with pytest.raises(Unauthenticated, match="certificate"):
            await ate.list_atespaces()


async def test_a_pinned_server_identity_that_does_not_match_stops_the_call(pki: Pki) -> None:
    async with api_stack(pki) as st:
        async with st.connect() as ate:
            assert ate.server_id == Identity.ateapi("ate").spiffe_id  # pinned by default
        async with AteClient.connect(
            st.address, tls_dir=pki.dir, server_id=Identity.router("ate"), timeout=5
        ) as ate:
            with pytest.raises(Unauthenticated, match="expected spiffe://ate/router"):
                await ate.create_actor("lab/never", template="lab/counter")
        with pytest.raises(NotFound):
            await st.cluster.actor("never")


async def test_tls_client_against_a_plaintext_server_fails(pki: Pki) -> None:
    async with (
        api_stack(pki, insecure=True) as st,
        AteClient.connect(st.address, tls_dir=pki.dir, timeout=5) as ate,
    ):
        with pytest.raises(Unavailable):
            await ate.list_atespaces()


async def test_insecure_server_serves_plaintext_callers_everything(pki: Pki) -> None:
    async with api_stack(pki, insecure=True) as st:
        async with AteClient.connect(st.address, insecure=True) as ate:
            await ate.create_actor("lab/a1", template="lab/counter")
            assert (await ate.resume_actor("lab/a1")).resumed
        async with raw_channel(st.address, None) as channel:
            beat = await pb.WorkerRegistryStub(channel).heartbeat(
                pb.HeartbeatRequest(name="w-1-1", epoch=1)
            )
            assert beat.worker.state == pb.WorkerState(1)


async def test_refused_callers_do_not_mark_workers(pki: Pki) -> None:
    async with api_stack(pki) as st:
        async with raw_channel(st.address, pki.files("router")) as channel:
            with pytest.raises(GRPCError):
                await pb.ControlStub(channel).drain_worker(pb.DrainWorkerRequest(name="w-0-0"))
        assert (await st.cluster.store.get_worker(st.cluster.workers[0].ref)).state is (
            WorkerState.ACTIVE
        )


# --- wiring ------------------------------------------------------------------------------


async def test_build_server_refuses_ambiguous_transport(pki: Pki) -> None:
    async with api_stack(pki) as st:
        svc = st.cluster.svc
        with pytest.raises(ValueError, match="insecure=True"):
            build_server(svc, ssl=None)
        with pytest.raises(ValueError, match="do not pass"):
            build_server(svc, ssl=server_context(pki.files("ateapi")), insecure=True)
        with pytest.raises(ValueError, match="client context"):
            build_server(svc, ssl=client_context(pki.files("client")))
        lax = server_context(pki.files("ateapi"))
        lax.verify_mode = ssl.CERT_OPTIONAL
        with pytest.raises(ValueError, match="client certificates"):
            build_server(svc, ssl=lax)


async def test_servicer_without_a_recorded_caller_fails_closed(pki: Pki) -> None:
    async with api_stack(pki) as st:
        registry = RegistryServicer(st.cluster.svc)
        with pytest.raises(GRPCError) as refused:
            await registry.heartbeat(pb.HeartbeatRequest(name="w-0-0", epoch=1))
        assert refused.value.status is Status.UNAUTHENTICATED
        with acting_as(Caller(identity=None)):
            beat = await registry.heartbeat(pb.HeartbeatRequest(name="w-0-0", epoch=1))
        assert beat.worker.name == "w-0-0"
