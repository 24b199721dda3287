"""Random concurrent workflows with injected failures, checked after every step."""

from __future__ import annotations

from contextlib import ExitStack, suppress

import anyio
from anyio.from_thread import start_blocking_portal
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from substrate.core.ids import ActorRef
from substrate.core.model import ActorState, SuspendMode
from substrate.errors import NotFound, SubstrateError

from .harness import Cluster, cluster

OPS = ("resume", "suspend", "suspend_sync", "pause", "revert", "delete", "force_delete")
NAMES = [f"a{i}" for i in range(5)]
HOLDING = {ActorState.RESUMING, ActorState.RUNNING, ActorState.PAUSING}


class Workflows(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.portal = self.stack.enter_context(start_blocking_portal("asyncio"))
        self.c: Cluster = self.stack.enter_context(
            self.portal.wrap_async_context_manager(cluster(nodes=2, workers_per_node=2, slots=2))
        )

    def teardown(self) -> None:
        self.stack.close()

    @rule(name=st.sampled_from(NAMES))
    def create(self, name: str) -> None:
        with suppress(SubstrateError):  # it may exist already
            self.portal.call(self.c.new_actor, name)

    @rule(
        batch=st.lists(
            st.tuples(st.sampled_from(OPS), st.sampled_from(NAMES)), min_size=1, max_size=5
        )
    )
    def concurrent(self, batch: list[tuple[str, str]]) -> None:
        async def one(op: str, name: str) -> None:
            ref = ActorRef(atespace="lab", name=name)
            svc = self.c.svc
            try:
                match op:
                    case "resume":
                        await svc.resume(ref)
                    case "suspend":
                        await svc.suspend(ref)
                    case "suspend_sync":
                        await svc.suspend(ref, SuspendMode.SYNC)
                    case "pause":
                        await svc.pause(ref)
                    case "revert":
                        await svc.revert(ref)
                    case "delete":
                        await svc.delete(ref)
                    case "force_delete":
                        await svc.delete(ref, force=True)
            except SubstrateError:
                pass

        async def run() -> None:
            async with anyio.create_task_group() as tg:
                for op, name in batch:
                    tg.start_soon(one, op, name)

        self.portal.call(run)

    @rule(
        node=st.sampled_from(["node-0", "node-1"]),
        fault=st.sampled_from(["probe", "bucket", "checkpoint", "unregistered", "clear"]),
    )
    def fault(self, node: str, fault: str) -> None:
        agent = self.c.agent(node)
        match fault:
            case "probe":
                agent.probe_fails = True
            case "bucket":
                self.c.nodes.bucket.down = True
            case "checkpoint":
                agent.checkpoint_fails = True
            case "unregistered":
                for w in agent.workers.values():
                    w.registered = False
            case "clear":
                self._clear()

    def _clear(self) -> None:
        self.c.nodes.bucket.down = False
        for agent in self.c.nodes.nodes.values():
            agent.probe_fails = False
            agent.checkpoint_fails = False
            for w in agent.workers.values():
                w.registered = True

    @rule()
    def reconcile(self) -> None:
        self._clear()
        self.portal.call(self.c.svc.reconcile_once)
        for name in NAMES:
            try:
                actor = self.portal.call(self.c.actor, name)
            except NotFound:
                continue
            assert not actor.state.transient, (actor.ref, actor.state)

    @invariant()
    def bookings_are_consistent(self) -> None:
        async def check() -> None:
            c = self.c
            bindings = await c.store.list_bindings()
            by_uid = {b.actor_uid: b for b in bindings}
            assert len(by_uid) == len(bindings), "an actor is bound twice"
            await c.allocated_matches_bindings()
            for w in await c.store.list_workers():
                assert w.capacity is not None and w.capacity.covers(w.allocated)
            for name in NAMES:
                try:
                    actor = await c.actor(name)
                except NotFound:
                    continue
                binding = by_uid.get(actor.metadata.uid)
                a = actor.status.assignment
                if actor.state in HOLDING:
                    assert a is not None and binding is not None, actor
                    assert binding.worker == a.worker
                if binding is not None:
                    assert a is not None and a.worker == binding.worker, (actor, binding)
            assert await c.store.list_leases() == [], "a lease outlived its workflow"

        self.portal.call(check)

    @invariant()
    def running_actors_have_a_sandbox(self) -> None:
        async def check() -> None:
            for name in NAMES:
                try:
                    actor = await self.c.actor(name)
                except NotFound:
                    continue
                if actor.state is ActorState.RUNNING:
                    assert self.c.nodes.find(actor.metadata.uid) is not None, actor

        self.portal.call(check)


Workflows.TestCase.settings = settings(max_examples=40, stateful_step_count=15, deadline=None)
TestWorkflows = Workflows.TestCase
