"""The ateapi workflows over the memory store and fake nodes (seed 000's transitions)."""

from __future__ import annotations

import attrs
import pytest

from substrate.core import lifecycle as lc
from substrate.core.agent_ports import StartRequest, StartResult
from substrate.core.ids import ActorRef, NodeRef, TagRef, WorkerRef
from substrate.core.model import (
    ActorState,
    Capacity,
    Durability,
    RestoreSource,
    SandboxClass,
    StorageStatus,
    SuspendMode,
    Worker,
    WorkerState,
)
from substrate.core.ports import Lease
from substrate.errors import (
    Aborted,
    FailedPrecondition,
    Internal,
    LeaseHeld,
    NotFound,
    ResourceExhausted,
    Unavailable,
)

from .harness import StoreFactory, cluster

pytestmark = pytest.mark.anyio


async def test_create_resume_cold_then_warm_path(make_store: StoreFactory) -> None:
    async with cluster(make_store) as c:
        actor = await c.new_actor("a1")
        assert actor.state is ActorState.SUSPENDED and actor.metadata.version == 1
        r = await c.svc.resume(actor.ref)
        assert r.resumed and r.cold_boot and r.provenance == "cold-boot"
        assert r.actor.state is ActorState.RUNNING
        assert r.actor.status.assignment is not None
        assert r.actor.status.assignment.pod_ips == ("127.0.0.1",)
        assert c.call(r.actor) == 1
        warm = await c.svc.resume(actor.ref)
        assert warm.resumed is False and warm.actor == r.actor
        await c.allocated_matches_bindings()


async def test_async_suspend_keeps_local_copy_then_resumes_in_place_with_state(
    make_store: StoreFactory,
) -> None:
    async with cluster(make_store) as c:
        actor = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        node = actor.status.assignment.node  # type: ignore[union-attr]
        for _ in range(3):
            c.call(actor)
        suspended = await c.svc.suspend(actor.ref)  # ASYNC by default
        assert suspended.state is ActorState.SUSPENDED
        snap = suspended.status.snapshots[-1]
        assert snap.local() is not None and snap.local().completed  # type: ignore[union-attr]
        assert snap.durable().status is StorageStatus.PENDING  # type: ignore[union-attr]
        assert suspended.status.assigned_node == node
        r = await c.svc.resume(actor.ref)
        assert r.source is RestoreSource.LOCAL
        assert r.actor.status.assignment.node == node  # type: ignore[union-attr]
        assert c.call(r.actor) == 4  # memory continued
        await c.allocated_matches_bindings()


async def test_background_upload_makes_the_async_snapshot_durable_and_unpins(
    make_store: StoreFactory,
) -> None:
    async with cluster(make_store) as c:
        actor = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        c.call(actor)
        await c.svc.suspend(actor.ref)
        assert await c.svc.upload_pending_once() == 1
        after = await c.actor("a1")
        durable = after.status.snapshots[-1].durable()
        assert durable is not None and durable.completed
        assert after.status.assigned_node is None
        assert c.nodes.bucket.objects[durable.uri] == 1


async def test_sync_suspend_then_resume_elsewhere_from_durable(make_store: StoreFactory) -> None:
    async with cluster(make_store, workers_per_node=1, slots=1) as c:
        a1 = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        c.call(a1)
        c.call(a1)
        first_node = a1.status.assignment.node  # type: ignore[union-attr]
        s = await c.svc.suspend(a1.ref, SuspendMode.SYNC)
        assert s.status.snapshots[-1].durable().completed  # type: ignore[union-attr]
        assert s.status.assigned_node is None
        # the original node stops taking actors, so the actor has to move
        w = await c.store.get_worker(a1.status.assignment.worker)  # type: ignore[union-attr]
        c.cache.note(
            await c.store.update_worker(
                w.ref,
                expected_version=w.metadata.version,
                expected_uid=w.metadata.uid,
                mutate=lambda x: attrs.evolve(x, state=WorkerState.DRAINING),
            )
        )
        r = await c.svc.resume(a1.ref)
        assert r.source is RestoreSource.DURABLE
        assert r.actor.status.assignment.node != first_node  # type: ignore[union-attr]
        assert c.call(r.actor) == 3


async def test_probe_failure_crashes_releasing_the_worker_then_revert(
    make_store: StoreFactory,
) -> None:
    async with cluster(make_store) as c:
        a = await c.new_actor("a1")
        for agent in c.nodes.nodes.values():
            agent.probe_fails = True
        with pytest.raises(Internal, match="wakeup probe"):
            await c.svc.resume(a.ref)
        crashed = await c.actor("a1")
        assert crashed.state is ActorState.CRASHED
        assert crashed.status.crash is not None and "wakeup probe" in crashed.status.crash.message
        assert crashed.status.assignment is None
        assert await c.store.list_bindings() == []
        await c.allocated_matches_bindings()
        with pytest.raises(FailedPrecondition, match="AssignWorker prerequisite not met"):
            await c.svc.resume(a.ref)
        for agent in c.nodes.nodes.values():
            agent.probe_fails = False
        reverted = await c.svc.revert(a.ref)
        assert reverted.state is ActorState.SUSPENDED and reverted.status.crash is None
        assert (await c.svc.resume(a.ref)).actor.state is ActorState.RUNNING


async def test_revert_returns_to_last_durable_snapshot(make_store: StoreFactory) -> None:
    async with cluster(make_store) as c:
        a = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        c.call(a)
        c.call(a)
        await c.svc.suspend(a.ref, SuspendMode.SYNC)  # durable count 2
        a = (await c.svc.resume(a.ref)).actor
        c.call(a)
        c.call(a)  # 4, not durable
        reverted = await c.svc.revert(a.ref)
        assert reverted.state is ActorState.SUSPENDED
        assert [s.generation for s in reverted.status.snapshots] == [1]
        a = (await c.svc.resume(a.ref)).actor
        assert c.call(a) == 3
        await c.allocated_matches_bindings()


async def test_worker_not_registered_yet_is_unavailable_and_never_crashes(
    make_store: StoreFactory,
) -> None:
    async with cluster(make_store, nodes=1, workers_per_node=1) as c:
        a = await c.new_actor("a1")
        agent = c.agent("node-0")
        agent.workers[WorkerRef(name="w-0-0")].registered = False
        with pytest.raises(Unavailable, match="not registered"):
            await c.svc.resume(a.ref)
        after = await c.actor("a1")
        assert after.state is ActorState.SUSPENDED  # never left RESUMING, never CRASHED
        assert after.status.assignment is None
        assert await c.store.list_bindings() == []
        agent.workers[WorkerRef(name="w-0-0")].registered = True
        assert (await c.svc.resume(a.ref)).actor.state is ActorState.RUNNING


async def test_epoch_change_during_restore_is_unavailable_then_recovers(
    make_store: StoreFactory,
) -> None:
    async with cluster(make_store, nodes=1, workers_per_node=1) as c:
        a = await c.new_actor("a1")
        agent = c.agent("node-0")
        wref = WorkerRef(name="w-0-0")
        agent.restart_worker(wref, register=True)  # epoch 2, ateapi still thinks 1
        with pytest.raises(Unavailable, match="restarted during the restore"):
            await c.svc.resume(a.ref)
        assert (await c.actor("a1")).state is ActorState.RESUMING
        await c.svc.register_worker(attrs.evolve((await c.store.get_worker(wref)), epoch=2))
        r = await c.svc.resume(a.ref)
        assert r.actor.state is ActorState.RUNNING
        assert r.actor.status.assignment.worker_epoch == 2  # type: ignore[union-attr]
        await c.allocated_matches_bindings()


async def test_epoch_rise_crashes_running_actors_of_the_old_epoch(make_store: StoreFactory) -> None:
    async with cluster(make_store, nodes=1, workers_per_node=1) as c:
        a = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        wref = a.status.assignment.worker  # type: ignore[union-attr]
        c.agent("node-0").restart_worker(wref, register=True)
        await c.svc.register_worker(attrs.evolve(await c.store.get_worker(wref), epoch=2))
        after = await c.actor("a1")
        assert after.state is ActorState.CRASHED
        assert "restarted" in after.status.crash.message  # type: ignore[union-attr]
        await c.allocated_matches_bindings()


async def test_lease_conflict_is_aborted(make_store: StoreFactory) -> None:
    async with cluster(make_store) as c:
        a = await c.new_actor("a1")
        lease = await c.store.acquire_lease(a.ref.lease_key, ttl=30)
        with pytest.raises(LeaseHeld) as info:
            await c.svc.resume(a.ref)
        assert isinstance(info.value, Aborted)
        assert info.value.description == "another operation is in progress for this actor"
        await c.store.release_lease(lease)


async def test_full_fleet_is_resource_exhausted(make_store: StoreFactory) -> None:
    async with cluster(make_store, nodes=1, workers_per_node=1, slots=1) as c:
        await c.svc.resume((await c.new_actor("a1")).ref)
        b = await c.new_actor("a2")
        with pytest.raises(ResourceExhausted, match="no worker has room for the actor"):
            await c.svc.resume(b.ref)
        assert (await c.actor("a2")).state is ActorState.SUSPENDED


async def test_a_full_fleet_refuses_a_resume_without_taking_the_lease(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parked routers' retries under saturation: answered from the worker index."""
    async with cluster(make_store, nodes=1, workers_per_node=1, slots=1) as c:
        await c.svc.resume((await c.new_actor("a1")).ref)
        b = await c.new_actor("a2")
        leases: list[str] = []
        acquire = c.store.acquire_lease

        async def counted(key: str, *, ttl: float) -> Lease:
            leases.append(key)
            return await acquire(key, ttl=ttl)

        monkeypatch.setattr(c.store, "acquire_lease", counted)
        for _ in range(3):
            with pytest.raises(ResourceExhausted, match="no worker has room for the actor"):
                await c.svc.resume(b.ref)
        assert leases == []
        after = await c.actor("a2")
        assert after.state is ActorState.SUSPENDED
        assert after.metadata.version == b.metadata.version  # not even touched
        # room again: the same call goes the usual way, under the lease
        await c.svc.suspend((await c.actor("a1")).ref)
        leases.clear()
        assert (await c.svc.resume(b.ref)).actor.state is ActorState.RUNNING
        assert leases == [b.ref.lease_key]


async def test_pinned_node_full_detaches_and_relocates_with_state(make_store: StoreFactory) -> None:
    async with cluster(make_store, nodes=2, workers_per_node=1, slots=1) as c:
        a = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        node = a.status.assignment.node  # type: ignore[union-attr]
        for _ in range(5):
            c.call(a)
        s = await c.svc.suspend(a.ref)  # ASYNC: pinned, durable pending
        assert s.status.assigned_node == node
        # another actor takes the pinned node's only slot
        other = NodeRef(name="node-1" if node.name == "node-0" else "node-0")
        c.agent(other.name).down = False
        b = await c.new_actor("b")
        # force b onto the pinned node by filling the other node first
        filler = await c.new_actor("filler")
        rb = await c.svc.resume(b.ref)
        rf = await c.svc.resume(filler.ref)
        on_pinned = [x for x in (rb.actor, rf.actor) if x.status.assignment.node == node]  # type: ignore[union-attr]
        assert len(on_pinned) == 1
        # free the other node again
        leaver = rb.actor if rb.actor.status.assignment.node != node else rf.actor  # type: ignore[union-attr]
        await c.svc.suspend(leaver.ref, SuspendMode.SYNC)
        r = await c.svc.resume(a.ref)
        assert r.actor.status.assignment.node == other  # type: ignore[union-attr]
        assert r.source is RestoreSource.DURABLE
        assert c.call(r.actor) == 6
        assert "detach" in c.agent(node.name).calls
        await c.allocated_matches_bindings()


async def test_pause_then_resume_in_place_and_pause_then_suspend(make_store: StoreFactory) -> None:
    async with cluster(make_store) as c:
        a = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        node = a.status.assignment.node  # type: ignore[union-attr]
        c.call(a)
        p = await c.svc.pause(a.ref)
        assert p.state is ActorState.PAUSED and p.status.assigned_node == node
        assert p.status.snapshots[-1].durable() is None
        r = await c.svc.resume(a.ref)
        assert r.source is RestoreSource.LOCAL and c.call(r.actor) == 2
        await c.svc.pause(a.ref)
        s = await c.svc.suspend(a.ref, SuspendMode.SYNC)
        assert s.state is ActorState.SUSPENDED
        assert s.status.snapshots[-1].durable().completed  # type: ignore[union-attr]
        assert s.status.assigned_node is None


async def test_sync_suspend_with_bucket_down_keeps_the_actor_running(
    make_store: StoreFactory,
) -> None:
    async with cluster(make_store) as c:
        a = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        c.call(a)
        c.nodes.bucket.down = True
        with pytest.raises(Unavailable, match="object store"):
            await c.svc.suspend(a.ref, SuspendMode.SYNC)
        after = await c.actor("a1")
        assert after.state is ActorState.RUNNING
        assert c.call(after) == 2  # nothing lost, still serving
        s = await c.svc.suspend(a.ref)  # ASYNC works while the bucket is away
        assert s.state is ActorState.SUSPENDED
        assert await c.svc.upload_pending_once() == 0
        c.nodes.bucket.down = False
        assert await c.svc.upload_pending_once() == 1


async def test_checkpoint_failure_crashes_truthfully(make_store: StoreFactory) -> None:
    async with cluster(make_store) as c:
        a = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        c.agent(a.status.assignment.node.name).checkpoint_fails = True  # type: ignore[union-attr]
        with pytest.raises(Internal, match="crashed"):
            await c.svc.suspend(a.ref)
        after = await c.actor("a1")
        assert after.state is ActorState.CRASHED
        assert await c.store.list_bindings() == []


async def test_tags_borrow_and_ownership_on_delete(make_store: StoreFactory) -> None:
    async with cluster(make_store) as c:
        a = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        for _ in range(7):
            c.call(a)
        await c.svc.suspend(a.ref)  # ASYNC: tag creation uploads first
        tag = await c.svc.create_tag(TagRef(atespace="lab", name="seven"), a.ref)
        assert tag.snapshot is not None
        tag_uri = tag.snapshot.durable().uri  # type: ignore[union-attr]
        assert f"/tags/{tag.metadata.uid}/" in tag_uri
        b = await c.svc.create_actor(
            ActorRef(atespace="lab", name="b1"), template=None, source_tag=tag.ref
        )
        assert b.source_tag == tag.ref
        rb = await c.svc.resume(b.ref)
        assert rb.source is RestoreSource.TAG and c.call(rb.actor) == 8
        with pytest.raises(FailedPrecondition, match="still borrowed"):
            await c.svc.delete_tag(tag.ref)
        # b suspends: its own generation; deleting b never deletes the tag's objects
        await c.svc.suspend(b.ref, SuspendMode.SYNC)
        await c.svc.delete(b.ref)
        assert tag_uri in c.nodes.bucket.objects
        with pytest.raises(NotFound):
            await c.actor("b1")
        # a's own objects go with a
        a_uri = (await c.actor("a1")).status.snapshots[-1].durable().uri  # type: ignore[union-attr]
        await c.svc.delete(a.ref)
        assert a_uri not in c.nodes.bucket.objects
        await c.svc.delete_tag(tag.ref)
        assert tag_uri not in c.nodes.bucket.objects


async def test_delete_refuses_running_unless_forced(make_store: StoreFactory) -> None:
    async with cluster(make_store) as c:
        a = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        with pytest.raises(FailedPrecondition, match="not in a deletable state"):
            await c.svc.delete(a.ref)
        await c.svc.delete(a.ref, force=True)
        with pytest.raises(NotFound):
            await c.actor("a1")
        assert c.nodes.find(a.metadata.uid) is None
        assert await c.store.list_bindings() == []


async def test_drain_suspends_running_actors_and_they_move_with_state(
    make_store: StoreFactory,
) -> None:
    async with cluster(make_store, nodes=2, workers_per_node=1, slots=2) as c:
        a = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        c.call(a)
        c.call(a)
        w = a.status.assignment.worker  # type: ignore[union-attr]
        drained = await c.svc.drain_worker(w)
        assert drained.state is WorkerState.DRAINING
        s = await c.actor("a1")
        assert s.state is ActorState.SUSPENDED
        r = await c.svc.resume(a.ref)
        assert r.actor.status.assignment.worker != w  # type: ignore[union-attr]
        assert c.call(r.actor) == 3


async def test_silent_worker_goes_unavailable_and_its_actors_crash_promptly(
    make_store: StoreFactory,
) -> None:
    async with cluster(make_store, nodes=2, workers_per_node=1) as c:
        a = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        w = a.status.assignment.worker  # type: ignore[union-attr]
        for other in c.workers:
            if other.ref != w:
                c.clock.advance(0)
        c.clock.advance(11)
        for other in c.workers:
            if other.ref != w:
                await c.svc.heartbeat(other.ref, 1)
        gone = await c.svc.mark_unavailable()
        assert [g.ref for g in gone] == [w]
        assert (await c.store.get_worker(w)).state is WorkerState.UNAVAILABLE
        crashed = await c.actor("a1")
        assert crashed.state is ActorState.CRASHED
        reverted = await c.svc.revert(a.ref)  # the dead worker is not called
        assert reverted.state is ActorState.SUSPENDED
        r = await c.svc.resume(a.ref)
        assert r.actor.status.assignment.worker != w  # type: ignore[union-attr]


async def test_reconciler_settles_every_transient_state_without_a_lease(
    make_store: StoreFactory,
) -> None:
    async with cluster(make_store) as c:
        # RESUMING left behind by a dead workflow
        a = await c.new_actor("a1")
        w = c.workers[0]
        from substrate.core.model import WorkerAssignment

        asg = WorkerAssignment(worker=w.ref, node=w.node, worker_epoch=w.epoch)
        await c.store.bind_actor(
            a.ref,
            expected_actor_version=a.metadata.version,
            expected_actor_uid=a.metadata.uid,
            worker=w.ref,
            expected_worker_epoch=w.epoch,
            resources=c.template.resources,
            mutate_actor=lambda x: lc.decide(x, lc.BeginResume(assignment=asg), now=0).actor,  # type: ignore[arg-type,return-value]
        )
        # REVERTING and DELETING left behind
        b = (await c.svc.resume((await c.new_actor("b1")).ref)).actor
        await c.store.update_actor(
            b.ref,
            expected_version=b.metadata.version,
            expected_uid=b.metadata.uid,
            mutate=lambda x: lc.decide(x, lc.BeginRevert(), now=0).actor,  # type: ignore[arg-type,return-value]
        )
        d = await c.new_actor("d1")
        await c.store.update_actor(
            d.ref,
            expected_version=d.metadata.version,
            expected_uid=d.metadata.uid,
            mutate=lambda x: lc.decide(x, lc.BeginDelete(), now=0).actor,  # type: ignore[arg-type,return-value]
        )
        assert await c.svc.reconcile_once() == 3
        assert (await c.actor("a1")).state is ActorState.SUSPENDED
        assert (await c.actor("b1")).state is ActorState.SUSPENDED
        with pytest.raises(NotFound):
            await c.actor("d1")
        assert await c.store.list_bindings() == []
        await c.allocated_matches_bindings()


async def test_register_rejects_older_epoch_and_new_shape_replaces_worker(
    make_store: StoreFactory,
) -> None:
    async with cluster(make_store, nodes=1, workers_per_node=1) as c:
        w = c.workers[0]
        with pytest.raises(FailedPrecondition, match="older"):
            await c.svc.register_worker(attrs.evolve(w, epoch=0))
        bigger = Worker(
            ref=w.ref,
            node=w.node,
            sandbox_class=SandboxClass.FAKE,
            epoch=2,
            capacity=Capacity(cpu_milli=2000, memory_bytes=2 << 30, actors=4),
        )
        out = await c.svc.register_worker(bigger)
        assert out.capacity == bigger.capacity and out.state is WorkerState.ACTIVE


_ = Durability


async def test_golden_snapshot_is_made_and_new_actors_borrow_it(make_store: StoreFactory) -> None:
    from substrate.core.ids import GOLDEN_ATESPACE, TemplateRef

    async with cluster(make_store) as c:
        golden = attrs.evolve(
            c.template, ref=TemplateRef(atespace="lab", name="gold"), golden_snapshot=True
        )
        created = await c.svc.create_template(golden)
        assert created.golden_tag is None
        ready = await c.svc.ensure_golden(created.ref)
        assert ready.golden_tag is not None and ready.golden_error == ""
        assert ready.golden_tag.atespace == GOLDEN_ATESPACE
        golden_actor, _ = c.svc.golden_names(ready)
        with pytest.raises(NotFound):
            await c.store.get_actor(golden_actor)  # the tag owns the copy; the actor is gone
        a = await c.svc.create_actor(ActorRef(atespace="lab", name="g1"), template=created.ref)
        assert a.source_tag == ready.golden_tag
        r = await c.svc.resume(a.ref)
        assert r.source is RestoreSource.TAG
        assert await c.svc.ensure_golden(created.ref) == await c.store.get_template(created.ref)


async def test_golden_snapshot_failure_is_reported_on_the_template(
    make_store: StoreFactory,
) -> None:
    from substrate.core.ids import TemplateRef

    async with cluster(make_store) as c:
        for agent in c.nodes.nodes.values():
            agent.probe_fails = True
        golden = attrs.evolve(
            c.template, ref=TemplateRef(atespace="lab", name="gold"), golden_snapshot=True
        )
        created = await c.svc.create_template(golden)
        out = await c.svc.ensure_golden(created.ref)
        assert out.golden_tag is None
        assert "wakeup probe" in out.golden_error


async def test_golden_snapshot_retries_after_the_template_is_updated(
    make_store: StoreFactory,
) -> None:
    from substrate.core.ids import TemplateRef

    async with cluster(make_store) as c:
        for agent in c.nodes.nodes.values():
            agent.probe_fails = True
        golden = attrs.evolve(
            c.template, ref=TemplateRef(atespace="lab", name="gold"), golden_snapshot=True
        )
        created = await c.svc.create_template(golden)
        assert (await c.svc.ensure_golden(created.ref)).golden_error
        for agent in c.nodes.nodes.values():
            agent.probe_fails = False
        updated = await c.svc.update_template(await c.store.get_template(created.ref))
        assert updated.golden_error == ""
        assert (await c.svc.ensure_golden(created.ref)).golden_tag is not None


async def test_silence_while_the_store_was_away_is_not_the_workers(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a store outage every worker gets a full heartbeat timeout to be heard again:
    running actors are not crashed for heartbeats that could not be recorded."""
    async with cluster(make_store, nodes=2, workers_per_node=1) as c:
        a = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        c.clock.advance(30)  # the store is away for 30 s: no heartbeat can be recorded

        async def away() -> list[object]:
            raise Unavailable("store unreachable")

        real = c.svc.store.list_workers
        monkeypatch.setattr(c.svc.store, "list_workers", away)
        with pytest.raises(Unavailable):
            await c.svc.mark_unavailable()
        monkeypatch.setattr(c.svc.store, "list_workers", real)
        assert await c.svc.mark_unavailable() == []
        assert (await c.actor("a1")).state is ActorState.RUNNING
        c.clock.advance(5)
        assert await c.svc.mark_unavailable() == []
        c.clock.advance(6)  # still nobody heard from: now they are silent
        gone = await c.svc.mark_unavailable()
        assert len(gone) == 2
        assert (await c.actor("a1")).state is ActorState.CRASHED
        assert a.status.assignment is not None


async def test_a_sandbox_started_for_a_resume_that_was_rolled_back_is_stopped(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the record moves on while the node starts the sandbox (here the liveness monitor's
    rollback), the resume fails retryably and the orphan sandbox is terminated."""
    async with cluster(make_store, nodes=1, workers_per_node=1) as c:
        a = await c.new_actor("a1")
        node = c.agent(c.workers[0].node.name)
        real_start = node.start

        async def start_then_rolled_back(request: StartRequest) -> StartResult:
            result = await real_start(request)
            current = await c.actor("a1")
            await c.svc._apply(current, lc.AbandonResume(reason="worker stopped answering"))
            return result

        monkeypatch.setattr(node, "start", start_then_rolled_back)
        with pytest.raises(Unavailable, match="changed while it was being restored"):
            await c.svc.resume(a.ref)
        assert node.sandbox(a.metadata.uid) is None, "the orphan sandbox was stopped"
        assert (await c.actor("a1")).state is ActorState.SUSPENDED
        monkeypatch.setattr(node, "start", real_start)
        r = await c.svc.resume(a.ref)
        assert r.actor.state is ActorState.RUNNING
        await c.allocated_matches_bindings()


async def test_a_suspended_actor_leaves_a_node_whose_atelet_stopped_answering(
    make_store: StoreFactory,
) -> None:
    """Its newest snapshot is local on node A and durable too. A's atelet stops answering
    but its workers are not UNAVAILABLE yet: the first resume fails retryably, the next one
    restores the durable copy on another node instead of waiting for the heartbeat timeout."""
    async with cluster(make_store, nodes=2, workers_per_node=1) as c:
        a = (await c.svc.resume((await c.new_actor("a1")).ref)).actor
        c.call(a)
        c.call(a)
        await c.svc.suspend(a.ref, SuspendMode.SYNC)
        node_a = a.status.assignment.node  # type: ignore[union-attr]
        c.agent(node_a.name).down = True
        first: Exception | None = None
        r = None
        for _ in range(6):  # the router's retries (p2c may pick A's worker again once)
            try:
                r = await c.svc.resume(a.ref)
                break
            except Unavailable as exc:
                first = exc
        assert first is not None, "the first attempt went to node A"
        assert r is not None and r.actor.status.assignment is not None
        assert r.actor.status.assignment.node != node_a
        assert r.source is RestoreSource.DURABLE
        assert c.call(r.actor) == 3, "nothing lost"
        assert (await c.store.get_worker(a.status.assignment.worker)).state is (  # type: ignore[union-attr]
            WorkerState.ACTIVE
        ), "without waiting for A's workers to be declared UNAVAILABLE"
