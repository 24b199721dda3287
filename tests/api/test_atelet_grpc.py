"""ateapi ⇄ atelet over real gRPC and mTLS: workflows, errors, authorization, failures."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import anyio
import attrs
import pytest
from anyio.abc import Process
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from substrate.adapters.memory.clock import ManualClock
from substrate.adapters.memory.store import MemoryStore
from substrate.api import convert, pb
from substrate.api.atelet import (
    GrpcNodeAgent,
    GrpcNodeAgents,
    authorize_atelet_call,
    build_atelet_server,
    serve_atelet,
)
from substrate.api.status import substrate_errors
from substrate.client._async import isolated
from substrate.core.agent_ports import StartRequest, UploadRequest, WorkloadTarget
from substrate.core.ids import ActorRef, NodeRef, WorkerRef
from substrate.core.model import (
    ActorState,
    Durability,
    RestoreSource,
    SnapshotStorage,
    StorageStatus,
    SuspendMode,
)
from substrate.errors import (
    FailedPrecondition,
    GrpcCode,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from substrate.identity import Identity, client_context, server_context
from substrate.services.worker_cache import WorkerCache
from substrate.testing.fake_node import FakeBucket, FakeNodeAgent

from .atelet_stack import GrpcCluster, grpc_cluster, worker_record
from .mtls_stack import TRUST_DOMAIN, Pki, make_pki, raw_channel

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(Path(tmp_path_factory.mktemp("pki")))


async def running(c: GrpcCluster, name: str) -> tuple[ActorRef, NodeRef, WorkerRef, str]:
    """Create and resume ``lab/<name>``; return (ref, node, worker, uid)."""
    actor = await c.new_actor(name)
    result = await c.svc.resume(actor.ref)
    a = result.actor.status.assignment
    assert a is not None
    return actor.ref, a.node, a.worker, result.actor.metadata.uid


# --- workflows through the wire ----------------------------------------------------------


async def test_cold_resume_boots_the_actor_on_its_node(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        actor = await c.new_actor("a1")
        result = await c.svc.resume(actor.ref)
        assert result.resumed
        assert result.cold_boot
        running_actor = result.actor
        assert running_actor.state is ActorState.RUNNING
        a = running_actor.status.assignment
        assert a is not None
        assert a.pod_ips == ("127.0.0.1",)
        assert c.call(running_actor) == 1
        assert c.fake(a.node).calls == ["start"]
        # The sandbox exists on exactly the node the store says.
        assert c.fake(a.node).sandbox(running_actor.metadata.uid) is not None


async def test_async_suspend_then_resume_in_place_continues_the_counter(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        ref, node, _, uid = await running(c, "a1")
        assert c.call(await c.actor("a1")) == 1
        assert c.call(await c.actor("a1")) == 2
        suspended = await c.svc.suspend(ref, SuspendMode.ASYNC)
        assert suspended.state is ActorState.SUSPENDED
        snap = suspended.status.snapshots[-1]
        local = snap.local()
        assert local is not None
        assert local.status is StorageStatus.COMPLETED
        assert local.node == node
        assert c.fake(node).local == {local.local_name: 2}
        assert c.fake(node).sandbox(uid) is None
        assert "checkpoint:SUSPEND_ASYNC" in c.fake(node).calls

        resumed = await c.svc.resume(ref)
        assert resumed.source is RestoreSource.LOCAL
        assert resumed.generation == snap.generation
        a = resumed.actor.status.assignment
        assert a is not None
        assert a.node == node
        assert c.call(resumed.actor) == 3


async def test_the_uploader_makes_an_async_snapshot_durable(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        ref, node, _, _ = await running(c, "a1")
        c.call(await c.actor("a1"))
        await c.svc.suspend(ref, SuspendMode.ASYNC)
        assert await c.svc.upload_pending_once() == 1
        actor = await c.actor("a1")
        durable = actor.status.snapshots[-1].durable()
        assert durable is not None
        assert durable.completed
        assert c.bucket.objects[durable.uri] == 1
        assert actor.status.assigned_node is None
        assert "upload" in c.fake(node).calls


async def test_sync_suspend_uploads_before_answering(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        ref, node, _, _ = await running(c, "a1")
        c.call(await c.actor("a1"))
        suspended = await c.svc.suspend(ref, SuspendMode.SYNC)
        assert suspended.state is ActorState.SUSPENDED
        durable = suspended.status.snapshots[-1].durable()
        assert durable is not None
        assert durable.completed
        assert c.bucket.objects[durable.uri] == 1
        assert "checkpoint:SUSPEND_SYNC" in c.fake(node).calls


async def test_sync_suspend_with_the_bucket_down_keeps_the_actor_running(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        ref, _, _, _ = await running(c, "a1")
        assert c.call(await c.actor("a1")) == 1
        c.bucket.down = True
        with pytest.raises(Unavailable, match="object store unreachable"):
            await c.svc.suspend(ref, SuspendMode.SYNC)
        actor = await c.actor("a1")
        assert actor.state is ActorState.RUNNING
        assert c.call(actor) == 2  # the sandbox was never touched


async def test_a_failed_checkpoint_crashes_the_actor(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        ref, node, _, uid = await running(c, "a1")
        c.fake(node).checkpoint_fails = True
        with pytest.raises(Internal, match="the actor crashed"):
            await c.svc.suspend(ref, SuspendMode.ASYNC)
        actor = await c.actor("a1")
        assert actor.state is ActorState.CRASHED
        assert actor.status.crash is not None
        assert actor.status.crash.message.startswith("checkpoint failed")
        assert c.fake(node).sandbox(uid) is None
        assert await c.store.list_bindings() == []


async def test_an_unregistered_worker_is_unavailable_and_the_actor_stays_suspended(
    pki: Pki,
) -> None:
    async with grpc_cluster(pki) as c:
        for fake in c.all_fakes():
            for process in fake.workers.values():
                process.registered = False
        actor = await c.new_actor("a1")
        with pytest.raises(Unavailable, match="not registered"):
            await c.svc.resume(actor.ref)
        after = await c.actor("a1")
        assert after.state is ActorState.SUSPENDED
        assert after.status.assignment is None
        assert await c.store.list_bindings() == []
        for fake in c.all_fakes():
            for process in fake.workers.values():
                process.registered = True
        result = await c.svc.resume(actor.ref)
        assert result.actor.state is ActorState.RUNNING


async def test_pause_then_detach_moves_the_snapshot_to_the_bucket(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        ref, node, _, uid = await running(c, "a1")
        c.call(await c.actor("a1"))
        c.call(await c.actor("a1"))
        paused = await c.svc.pause(ref)
        assert paused.state is ActorState.PAUSED
        assert "checkpoint:PAUSE" in c.fake(node).calls
        snap = paused.status.snapshots[-1]
        local = snap.local()
        assert local is not None
        assert snap.durable() is None
        destination = SnapshotStorage(
            durability=Durability.DURABLE,
            status=StorageStatus.PENDING,
            fidelity=local.fidelity,
            uri=f"memory://bucket/detached/{snap.snapshot_id}",
        )
        request = UploadRequest(
            actor=ref, actor_uid=uid, node=node, snapshot=snap.with_storage(destination)
        )
        detached = await c.agents.for_node(node).detach(request)
        assert detached.local() is None
        durable = detached.durable()
        assert durable is not None
        assert durable.completed
        assert c.bucket.objects[destination.uri] == 2
        assert local.local_name not in c.fake(node).local
        # Again: the snapshot is durable already, the local copy gone; nothing changes.
        again = await c.agents.for_node(node).detach(attrs.evolve(request, snapshot=detached))
        assert again == detached


async def test_drop_local_deletes_a_node_local_copy(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        ref, node, _, uid = await running(c, "a1")
        suspended = await c.svc.suspend(ref, SuspendMode.ASYNC)
        local = suspended.status.snapshots[-1].local()
        assert local is not None
        assert local.local_name in c.fake(node).local
        agent = c.agents.for_node(node)
        await agent.drop_local(uid, local.local_name)
        assert local.local_name not in c.fake(node).local
        await agent.drop_local(uid, local.local_name)  # idempotent
        with pytest.raises(InvalidArgument, match="single directory name"):
            await agent.drop_local(uid, "..")
        with pytest.raises(InvalidArgument, match="local snapshot name is required"):
            await agent.drop_local(uid, "")


async def test_deleting_an_actor_drops_its_local_copy_through_the_atelet(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        ref, node, _, _ = await running(c, "a1")
        await c.svc.suspend(ref, SuspendMode.ASYNC)
        assert c.fake(node).local
        await c.svc.delete(ref)
        assert c.fake(node).local == {}
        assert "drop_local" in c.fake(node).calls


async def test_revert_terminates_the_sandbox(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        ref, _, _, uid = await running(c, "a1")
        await c.svc.suspend(ref, SuspendMode.SYNC)
        await c.svc.resume(ref)  # durable now: any node may take it
        assert any(f.sandbox(uid) is not None for f in c.all_fakes())
        reverted = await c.svc.revert(ref)
        assert reverted.state is ActorState.SUSPENDED
        assert all(f.sandbox(uid) is None for f in c.all_fakes())
        assert any("terminate" in f.calls for f in c.all_fakes())


async def test_node_errors_cross_the_wire_as_their_classes(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        node = NodeRef("node-0")
        agent = c.agents.for_node(node)
        target = WorkloadTarget(
            actor=ActorRef("lab", "x"),
            actor_uid="uid-x",
            worker=WorkerRef("w-9-9"),
            node=node,
            worker_epoch=1,
        )
        with pytest.raises(NotFound, match="w-9-9 is not on node node-0"):
            await agent.start(StartRequest(target=target, template=c.template))
        ref, node, worker, uid = await running(c, "a1")
        await c.svc.suspend(ref, SuspendMode.ASYNC)
        snap = (await c.actor("a1")).status.snapshots[-1]
        local = snap.local()
        assert local is not None
        c.fake(node).local.clear()  # the directory vanished
        target = attrs.evolve(target, worker=worker, node=node, actor=ref, actor_uid=uid)
        with pytest.raises(FailedPrecondition, match="not on node"):
            await c.agents.for_node(node).start(
                StartRequest(target=target, template=c.template, snapshot=snap, storage=local)
            )


# --- addressing -------------------------------------------------------------------------


async def test_an_unknown_node_is_unavailable(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        with pytest.raises(Unavailable, match="no atelet address known for node node-9"):
            c.agents.for_node(NodeRef("node-9"))


async def test_one_channel_per_node_replaced_when_the_address_changes(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        node = NodeRef("node-0")
        first = c.agents.for_node(node)
        assert c.agents.for_node(node) is first
        assert c.agents.for_node(NodeRef("node-1")) is not first
        refs = [w.ref for w in c.workers if w.node == node]
        moved = FakeNodeAgent(node, c.bucket, refs)
        ctx = server_context(pki.files("atelet-0"))
        async with serve_atelet(moved, ssl=ctx, trust_domain=TRUST_DOMAIN) as srv:
            c.clock.advance(1.0)
            for ref in refs:
                await c.svc.register_worker(worker_record(ref, node, srv.address))
            second = c.agents.for_node(node)
            assert second is not first
            assert second.address == srv.address
            target = WorkloadTarget(
                actor=ActorRef("lab", "x"), actor_uid="u", worker=refs[0], node=node, worker_epoch=1
            )
            await second.terminate(target)
            assert moved.calls == ["terminate"]
            assert "terminate" not in c.fake(node).calls
            # A worker re-registering without an address keeps the one it had.
            c.clock.advance(1.0)
            kept = await c.svc.register_worker(worker_record(refs[0], node, ""))
            assert kept.atelet_address == srv.address
            await c.agents.close()  # before the server stops, as ateapi's shutdown does
            with pytest.raises(Unavailable, match="closed"):
                c.agents.for_node(node)


async def test_an_atelet_that_is_down_leaves_the_actor_suspended(pki: Pki) -> None:
    async with grpc_cluster(pki, nodes=1) as c:
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{s.getsockname()[1]}"
        for w in c.workers:
            await c.svc.register_worker(worker_record(w.ref, w.node, dead))
        actor = await c.new_actor("a1")
        with pytest.raises(Unavailable, match="cannot reach the atelet of node node-0"):
            await c.svc.resume(actor.ref)
        after = await c.actor("a1")
        assert after.state is ActorState.SUSPENDED
        assert await c.store.list_bindings() == []


async def _start_process(pki: Pki) -> tuple[Process, int]:
    process = await anyio.open_process(
        [
            sys.executable,
            "-m",
            "tests.api.atelet_process",
            str(pki.dir),
            "atelet-0",
            "node-0",
            "w-0-0",
        ],
        cwd=ROOT,
    )
    assert process.stdout is not None
    line = b""
    with anyio.fail_after(60):
        while not line.endswith(b"\n"):
            line += await process.stdout.receive()
    return process, int(line)


async def test_a_killed_atelet_is_unavailable(pki: Pki) -> None:
    process, port = await _start_process(pki)
    node = NodeRef("node-0")
    agent = GrpcNodeAgent.connect(
        node,
        f"127.0.0.1:{port}",
        ssl=client_context(pki.files("ateapi")),
        trust_domain=TRUST_DOMAIN,
    )
    target = WorkloadTarget(
        actor=ActorRef("lab", "x"),
        actor_uid="u",
        worker=WorkerRef("w-0-0"),
        node=node,
        worker_epoch=1,
    )
    try:
        await agent.terminate(target)  # connected and answered
        process.kill()
        await process.wait()
        with pytest.raises(Unavailable, match="atelet of node node-0"):
            await agent.terminate(target)  # the connection is gone
        with pytest.raises(Unavailable, match="cannot reach the atelet of node node-0"):
            await agent.terminate(target)  # nothing listens any more
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.aclose()
        await agent.close()


# --- who may call an atelet --------------------------------------------------------------


async def test_a_router_may_not_drive_an_atelet(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        address = c.servers[NodeRef("node-0")].address
        request = convert.terminate_request_to_proto(
            WorkloadTarget(
                actor=ActorRef("lab", "x"),
                actor_uid="u",
                worker=WorkerRef("w-0-0"),
                node=NodeRef("node-0"),
                worker_epoch=1,
            )
        )
        for bundle in ("router", "client", "atelet-1", "worker"):
            async with raw_channel(address, pki.files(bundle)) as channel:
                with pytest.raises(PermissionDenied, match="only ateapi"), substrate_errors():
                    await isolated(pb.AteletStub(channel).terminate, request)
        async with raw_channel(address, pki.files("ateapi")) as channel:
            with substrate_errors():
                await isolated(pb.AteletStub(channel).terminate, request)
        assert c.fake("node-0").calls == ["terminate"]


async def test_health_is_open_to_any_authenticated_caller(pki: Pki) -> None:
    async with grpc_cluster(pki, nodes=1) as c:
        address = c.servers[NodeRef("node-0")].address
        async with raw_channel(address, pki.files("router")) as channel:
            reply = await isolated(HealthStub(channel).Check, HealthCheckRequest())
        assert reply is not None
        assert reply.status == HealthCheckResponse.SERVING


async def test_ateapi_agents_with_a_refused_identity_see_unavailable(pki: Pki) -> None:
    async with grpc_cluster(pki, ateapi_bundle="router") as c:
        actor = await c.new_actor("a1")
        with pytest.raises(Unavailable, match="refused Run from ateapi"):
            await c.svc.resume(actor.ref)
        assert (await c.actor("a1")).state is ActorState.SUSPENDED
        assert all(f.calls == [] for f in c.all_fakes())


async def test_another_trust_domain_is_unauthenticated(pki: Pki) -> None:
    fake = FakeNodeAgent(NodeRef("node-0"), FakeBucket(), [WorkerRef("w-0-0")])
    ctx = server_context(pki.files("atelet-0"))
    async with (
        serve_atelet(fake, ssl=ctx, trust_domain="elsewhere") as srv,
        raw_channel(srv.address, pki.files("ateapi")) as channel,
    ):
        request = convert.drop_snapshot_request_to_proto("u", "snap1")
        with pytest.raises(Unauthenticated, match="trust domain"), substrate_errors():
            await isolated(pb.AteletStub(channel).drop_snapshot, request)
    assert fake.calls == []


async def test_a_server_that_is_not_the_nodes_atelet_is_refused(pki: Pki) -> None:
    async with grpc_cluster(pki) as c:
        # node-1's atelet answers at an address ateapi believes is node-0's.
        impostor = GrpcNodeAgent.connect(
            NodeRef("node-0"),
            c.servers[NodeRef("node-1")].address,
            ssl=client_context(pki.files("ateapi")),
            trust_domain=TRUST_DOMAIN,
        )
        try:
            with pytest.raises(Unavailable, match="is not the node's atelet"):
                await impostor.drop_local("u", "snap1")
        finally:
            await impostor.close()
        assert c.fake("node-1").calls == []


async def test_plaintext_when_both_sides_are_insecure(pki: Pki) -> None:
    async with grpc_cluster(pki, insecure=True) as c:
        ref, _, _, _ = await running(c, "a1")
        assert c.call(await c.actor("a1")) == 1
        suspended = await c.svc.suspend(ref, SuspendMode.SYNC)
        assert suspended.state is ActorState.SUSPENDED


def test_authorization_table() -> None:
    path = "/substrate.v1.Atelet/Checkpoint"
    health = "/grpc.health.v1.Health/Check"
    ateapi = Identity.ateapi(TRUST_DOMAIN)
    assert authorize_atelet_call(ateapi, path, insecure=False).allowed
    assert authorize_atelet_call(None, path, insecure=True).allowed
    anonymous = authorize_atelet_call(None, path, insecure=False)
    assert anonymous.code is GrpcCode.UNAUTHENTICATED
    for other in (
        Identity.router(TRUST_DOMAIN),
        Identity.client("alice", TRUST_DOMAIN),
        Identity.atelet("node-0", TRUST_DOMAIN),
        Identity.worker("w-0-0", TRUST_DOMAIN),
    ):
        decision = authorize_atelet_call(other, path, insecure=False)
        assert not decision.allowed
        assert decision.code is GrpcCode.PERMISSION_DENIED
        assert authorize_atelet_call(other, health, insecure=False).allowed


async def test_tls_settings_are_checked(pki: Pki) -> None:
    fake = FakeNodeAgent(NodeRef("node-0"), FakeBucket(), [])
    server_ctx = server_context(pki.files("atelet-0"))
    client_ctx = client_context(pki.files("ateapi"))
    with pytest.raises(ValueError, match="TLS context is required"):
        build_atelet_server(fake, ssl=None)
    with pytest.raises(ValueError, match="client context"):
        build_atelet_server(fake, ssl=client_ctx)
    with pytest.raises(ValueError, match="do not pass"):
        build_atelet_server(fake, ssl=server_ctx, insecure=True)
    cache = WorkerCache(MemoryStore(clock=ManualClock(0.0)))  # constructors only
    with pytest.raises(ValueError, match="TLS context is required"):
        GrpcNodeAgents(cache, ssl=None, trust_domain=TRUST_DOMAIN)
    with pytest.raises(ValueError, match="not a client context"):
        GrpcNodeAgents(cache, ssl=server_ctx, trust_domain=TRUST_DOMAIN)
    with pytest.raises(InvalidArgument, match="trust domain"):
        GrpcNodeAgents(cache, ssl=client_ctx, trust_domain="Not Valid")
