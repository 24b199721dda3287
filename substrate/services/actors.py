"""ateapi's workflows: create, resume, suspend, pause, revert, delete, tags, workers.

Each workflow is a sequence of idempotent steps over the stored record. State changes go
through :func:`substrate.core.lifecycle.decide` (the table), placements through
:mod:`substrate.sched`, snapshot choices through :mod:`substrate.snapshot`; this module only
sequences them with I/O: the store, the node agents and the object store.
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, suppress
from functools import partial
from types import TracebackType
from typing import Any, Self

import anyio
import attrs
import structlog
from anyio.abc import TaskGroup

from substrate.core import lifecycle as lc
from substrate.core.agent_ports import (
    CheckpointMode,
    CheckpointRequest,
    NodeAgents,
    SnapshotObjects,
    StartRequest,
    UploadRequest,
    WorkloadTarget,
)
from substrate.core.ids import (
    GOLDEN_ATESPACE,
    ActorRef,
    Labels,
    NodeRef,
    TagRef,
    TemplateRef,
    WorkerRef,
    validate_selector,
)
from substrate.core.model import (
    Actor,
    ActorState,
    ActorStatus,
    ActorTemplate,
    Atespace,
    Capacity,
    Durability,
    Fidelity,
    RestoreSource,
    ResumeResult,
    Snapshot,
    SnapshotOwner,
    SnapshotStorage,
    StorageStatus,
    SuspendMode,
    Tag,
    Worker,
    WorkerAssignment,
    WorkerState,
)
from substrate.core.ports import Lease, Store
from substrate.errors import (
    Aborted,
    AlreadyExists,
    Conflict,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    LeaseHeld,
    NotFound,
    ResourceExhausted,
    SubstrateError,
    Unavailable,
)
from substrate.sched import Constraints, FleetIndex, constraints_for
from substrate.services.leases import held_lease
from substrate.services.observe import NullMetrics, Steps, WorkflowMetrics, workflow
from substrate.services.worker_cache import WorkerCache
from substrate.snapshot import (
    ColdBoot,
    Restore,
    actor_snapshot_prefix,
    new_generation,
    newest_usable,
    pin_node,
    select_restore,
    tag_prefix,
)

log = structlog.get_logger("substrate.actors")

_PROBE_RNG = random.Random(0)
"""For :meth:`ActorService._refuse_if_full`, which only asks whether any worker qualifies:
its pick is discarded, so it must not draw from the service's own ``rng``."""

TRANSIENT = (Unavailable, DeadlineExceeded)
"""Errors after which a step may be retried: nothing irreversible is known to have happened."""


@attrs.frozen(slots=True, kw_only=True)
class ServiceConfig:
    lease_ttl: float = 30.0
    assign_attempts: int = 12
    assign_backoff_initial: float = 0.015
    assign_backoff_cap: float = 0.25
    start_timeout: float = 300.0
    checkpoint_timeout: float = 600.0
    heartbeat_timeout: float = 10.0
    reconcile_every: float = 2.0
    upload_retry_every: float = 2.0
    default_storage_location: str = "memory://substrate"
    golden_enabled: bool = True


def _evolve_status(actor: Actor, **changes: Any) -> Actor:
    status: ActorStatus = attrs.evolve(actor.status, **changes)
    return attrs.evolve(actor, status=status)


class ActorService:
    """The control plane's workflows over a :class:`Store` and the nodes' agents."""

    def __init__(
        self,
        *,
        store: Store,
        agents: NodeAgents,
        workers: WorkerCache,
        objects: SnapshotObjects | None = None,
        config: ServiceConfig = ServiceConfig(),
        metrics: WorkflowMetrics | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.store = store
        self.agents = agents
        self.workers = workers
        self.objects = objects
        self.config = config
        self.metrics: WorkflowMetrics = metrics or NullMetrics()
        self.clock = clock
        self.rng = rng or random.Random()
        self.new_id = new_id
        self._tg: TaskGroup | None = None
        self._upload_wakeup = anyio.Event()
        self._golden_locks: dict[TemplateRef, anyio.Lock] = {}
        self._heard_since: float | None = None
        """Since when heartbeats could be recorded without a break (service start, or the
        store's return after an outage): silence before that is not the workers'."""
        self._store_lost = False
        self._unreachable_nodes: dict[NodeRef, float] = {}
        """Nodes whose atelet failed a start recently (when): placement avoids them while
        nothing pins an actor there, until they have had a heartbeat timeout to recover."""

    # --- lifetime ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._heard_since = self.clock()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(exc_type, exc, tb)
        self._tg = None

    @property
    def task_group(self) -> TaskGroup:
        if self._tg is None:
            # Not started yet, or shutting down: retryable for the caller.
            raise Unavailable("ateapi is not running (starting or shutting down)")
        return self._tg

    def _lease(self, ref: ActorRef) -> AbstractAsyncContextManager[Lease]:
        return held_lease(
            self.store, ref.lease_key, ttl=self.config.lease_ttl, task_group=self.task_group
        )

    # --- atespaces and templates ------------------------------------------------------

    async def create_atespace(self, name: str) -> Atespace:
        return await self.store.create_atespace(Atespace(name=name).validate())

    async def delete_atespace(self, name: str) -> None:
        await self.store.delete_atespace(name)

    async def create_template(self, template: ActorTemplate) -> ActorTemplate:
        template.validate()
        try:
            await self.store.get_atespace(template.ref.atespace)
        except NotFound as exc:
            raise FailedPrecondition(f"Atespace {template.ref.atespace} not found") from exc
        created = await self.store.create_template(
            attrs.evolve(template, golden_tag=None, golden_error="")
        )
        if created.golden_snapshot and self.config.golden_enabled and self._tg is not None:
            self._spawn(self.ensure_golden, created.ref)
        return created

    # --- golden snapshots -------------------------------------------------------------

    def golden_names(self, template: ActorTemplate) -> tuple[ActorRef, TagRef]:
        """The golden actor and tag of a template (named after its uid, in ate-golden)."""
        name = f"golden-{template.metadata.uid}".lower()[:63].rstrip("-")
        return ActorRef(atespace=GOLDEN_ATESPACE, name=name), TagRef(
            atespace=GOLDEN_ATESPACE, name=name
        )

    async def ensure_golden(self, ref: TemplateRef) -> ActorTemplate:
        """Cold-boot the template's golden actor, suspend it once awake, tag it.

        The tag becomes the template's ``golden_tag``: new actors of the template borrow its
        snapshot, so their first resume restores memory instead of booting. Idempotent: it
        continues from whatever an earlier, interrupted run left behind.
        """
        lock = self._golden_locks.setdefault(ref, anyio.Lock())
        async with lock:
            return await self._ensure_golden_locked(ref)

    async def _ensure_golden_locked(self, ref: TemplateRef) -> ActorTemplate:
        template = await self.store.get_template(ref)
        if not template.golden_snapshot or template.golden_tag is not None:
            return template
        actor_ref, tag_ref = self.golden_names(template)
        try:
            with suppress(AlreadyExists):
                await self.store.create_atespace(Atespace(name=GOLDEN_ATESPACE))
            try:
                tag = await self.store.get_tag(tag_ref)
            except NotFound:
                try:
                    actor = await self.store.get_actor(actor_ref)
                except NotFound:
                    try:
                        actor = await self.store.create_actor(
                            Actor(ref=actor_ref, template=ref, status=ActorStatus())
                        )
                    except AlreadyExists:
                        actor = await self.store.get_actor(actor_ref)
                if actor.state is ActorState.CRASHED:  # an earlier attempt failed: start over
                    actor = await self.revert(actor_ref)
                if actor.state is not ActorState.SUSPENDED or not actor.status.snapshots:
                    if actor.state is not ActorState.RUNNING:
                        await self.resume(actor_ref)  # returns once every probe answered
                    await self.suspend(actor_ref, SuspendMode.SYNC)
                tag = await self.create_tag(tag_ref, actor_ref)
            with suppress(NotFound):
                await self.delete(actor_ref, force=True)
        except (Aborted, AlreadyExists, Unavailable) as exc:
            # Transient or raced by another replica: the next golden pass continues.
            log.info("golden snapshot deferred", template=str(ref), error=exc.description)
            return await self.store.get_template(ref)
        except SubstrateError as exc:
            error = exc.description or type(exc).__name__
            log.warning("golden snapshot failed", template=str(ref), error=error)
            current = await self.store.get_template(ref)
            return await self.store.update_template(
                ref,
                expected_version=current.metadata.version,
                expected_uid=current.metadata.uid,
                mutate=lambda t: attrs.evolve(t, golden_error=error),
            )
        current = await self.store.get_template(ref)
        log.info("golden snapshot ready", template=str(ref), tag=str(tag.ref))
        return await self.store.update_template(
            ref,
            expected_version=current.metadata.version,
            expected_uid=current.metadata.uid,
            mutate=lambda t: attrs.evolve(t, golden_tag=tag.ref, golden_error=""),
        )

    async def golden_pass(self) -> int:
        """Make every template's missing golden snapshot (one background pass)."""
        made = 0
        if not self.config.golden_enabled:
            return 0
        for atespace in await self.store.list_atespaces():
            for template in await self.store.list_templates(atespace.name):
                if template.golden_snapshot and template.golden_tag is None:
                    if template.golden_error:
                        continue  # reported; an update of the template retries
                    out = await self.ensure_golden(template.ref)
                    made += out.golden_tag is not None
        return made

    async def update_template(self, template: ActorTemplate) -> ActorTemplate:
        template.validate()
        current = await self.store.get_template(template.ref)
        expected = template.metadata.version or current.metadata.version
        uid = template.metadata.uid or current.metadata.uid

        def mutate(old: ActorTemplate) -> ActorTemplate:
            return attrs.evolve(
                template,
                metadata=old.metadata,
                golden_tag=old.golden_tag if template.golden_snapshot else None,
                golden_error="",
            )

        return await self.store.update_template(
            template.ref, expected_version=expected, expected_uid=uid, mutate=mutate
        )

    async def delete_template(self, ref: TemplateRef) -> None:
        await self.store.delete_template(ref)

    # --- create -----------------------------------------------------------------------

    async def create_actor(
        self,
        ref: ActorRef,
        *,
        template: TemplateRef | None,
        source_tag: TagRef | None = None,
        worker_selector: Labels | None = None,
    ) -> Actor:
        """A new SUSPENDED actor; it borrows the source tag's (or golden tag's) snapshot."""
        ref.validate()
        selector = worker_selector or Labels()
        validate_selector(selector, what="actor worker selector")
        await self.store.get_atespace(ref.atespace)
        tag: Tag | None = None
        if source_tag is not None:
            tag = await self._get_tag_for_create(source_tag)
            if template is None:
                if tag.template is None:
                    raise InvalidArgument(f"tag {source_tag} names no template; give one")
                template = tag.template
        if template is None:
            raise InvalidArgument("actor template is required (or a source tag)")
        try:
            tmpl = await self.store.get_template(template)
        except NotFound as exc:
            raise FailedPrecondition(f"ActorTemplate {template} not found") from exc
        if tag is None and tmpl.golden_tag is not None:
            try:
                tag = await self.store.get_tag(tmpl.golden_tag)
            except NotFound:
                tag = None
        snapshots: tuple[Snapshot, ...] = ()
        if tag is not None and tag.snapshot is not None:
            borrowed = attrs.evolve(
                tag.snapshot, generation=1, owner=SnapshotOwner.TAG, source_tag=tag.ref
            )
            snapshots = (borrowed,)
        actor = Actor(
            ref=ref,
            template=template,
            worker_selector=selector,
            source_tag=tag.ref if tag is not None else None,
            status=ActorStatus(
                state=ActorState.SUSPENDED,
                snapshots=snapshots,
                last_assigned_generation=len(snapshots),
            ),
        )
        return await self.store.create_actor(actor)

    async def _get_tag_for_create(self, ref: TagRef) -> Tag:
        try:
            tag = await self.store.get_tag(ref)
        except NotFound as exc:
            raise FailedPrecondition(f"Tag {ref} not found") from exc
        if tag.snapshot is None:
            raise FailedPrecondition(f"Tag {ref} is not ready (no snapshot yet)")
        return tag

    async def update_actor_selector(self, ref: ActorRef, selector: Labels | None) -> Actor:
        sel = selector or Labels()
        validate_selector(sel, what="actor worker selector")
        actor = await self.store.get_actor(ref)
        return await self.store.update_actor(
            ref,
            expected_version=actor.metadata.version,
            expected_uid=actor.metadata.uid,
            mutate=lambda a: attrs.evolve(a, worker_selector=sel),
        )

    # --- resume -----------------------------------------------------------------------

    async def resume(self, ref: ActorRef) -> ResumeResult:
        """Make the actor RUNNING. The warm path is one read with no lease."""
        actor = await self.store.get_actor(ref)
        if actor.state is ActorState.RUNNING:
            return ResumeResult(actor=actor, resumed=False)
        async with workflow("resume", self.metrics, actor=ref) as steps:
            started = time.perf_counter()
            template = None
            if actor.state in (ActorState.SUSPENDED, ActorState.PAUSED):
                template = await self._template_for(actor)
                self._refuse_if_full(actor, template, steps)
            try:
                async with self._lease(ref):
                    result = await self._resume_locked(ref, steps, template)
            except LeaseHeld:
                self.metrics.lease_conflict("resume")
                raise
            return attrs.evolve(result, resume_duration_seconds=time.perf_counter() - started)

    async def _resume_locked(
        self, ref: ActorRef, steps: Steps, template: ActorTemplate | None = None
    ) -> ResumeResult:
        """The resume under the lease. ``template``: the actor's template if the caller
        has just read it (templates are not leased: a read before the lease is as good as
        one after it), else it is read here."""
        with steps.step("load"):
            actor = await self.store.get_actor(ref)
            if actor.state is ActorState.RUNNING:
                return ResumeResult(actor=actor, resumed=False)
            if template is None or template.ref != actor.template:
                template = await self._template_for(actor)
        if actor.state is ActorState.RESUMING:
            actor = await self._revalidate_resuming(actor, steps)
        if actor.state in (ActorState.SUSPENDED, ActorState.PAUSED):
            with steps.step("assign"):
                actor = await self._assign(actor, template, steps)
        elif actor.state is not ActorState.RESUMING:
            raise FailedPrecondition(lc.refusal_message(lc.Command.BEGIN_RESUME, actor))
        assignment = actor.status.assignment
        assert assignment is not None
        worker = self.workers.get(assignment.worker)
        if worker is None:
            worker = await self.store.get_worker(assignment.worker)
        plan = select_restore(actor, template, worker, live_nodes=self.workers.live_nodes())
        target = self._target(actor, assignment)
        request = StartRequest(target=target, template=template)
        source: RestoreSource | None = None
        generation = 0
        age = 0.0
        if isinstance(plan, Restore):
            request = attrs.evolve(
                request, snapshot=plan.snapshot, storage=plan.storage, fidelity=plan.fidelity
            )
            source = plan.source
            generation = plan.snapshot.generation
            age = (
                max(0.0, self.clock() - plan.snapshot.captured_at)
                if plan.snapshot.captured_at
                else 0.0
            )
        steps.note(
            source=source.value if source else "cold-boot",
            generation=generation,
            worker=str(assignment.worker),
        )
        try:
            agent = self.agents.for_node(assignment.node)
            with (
                steps.step("restore" if source else "run"),
                anyio.fail_after(self.config.start_timeout),
            ):
                result = await agent.start(request)
        except TimeoutError as exc:
            await self._abandon_resume(actor, "restore timed out", terminate=True)
            raise DeadlineExceeded(f"resume of {ref} timed out") from exc
        except TRANSIENT as exc:
            # Nothing was lost: the snapshot is intact. Release the worker so the actor is
            # never left RESUMING; the router parks and retries.
            if isinstance(exc, Unavailable):
                self._unreachable_nodes[assignment.node] = self.clock()
            await self._abandon_resume(
                actor, exc.description, terminate=isinstance(exc, DeadlineExceeded)
            )
            raise
        except SubstrateError as exc:
            await self._crash(actor, f"resume failed: {exc.description}")
            raise Internal(f"resume of {ref} failed: {exc.description}") from exc
        self._unreachable_nodes.pop(assignment.node, None)
        if result.worker_epoch != assignment.worker_epoch:
            await self.workers.refresh(assignment.worker)
            raise Unavailable(
                f"worker {assignment.worker} restarted during the restore "
                f"(epoch {assignment.worker_epoch} → {result.worker_epoch}); retry"
            )
        try:
            with steps.step("finalize"):
                actor = await self._update(
                    actor,
                    lambda a: lc.decide(
                        a,
                        lc.FinishResume(worker_epoch=result.worker_epoch, pod_ips=result.pod_ips),
                        now=self.clock(),
                    ),
                )
        except (FailedPrecondition, Aborted, NotFound) as exc:
            # The record moved on while the sandbox started (e.g. the liveness monitor
            # rolled the resume back): nothing may run that no record owns. Stop it.
            with anyio.CancelScope(shield=True), contextlib.suppress(SubstrateError):
                await agent.terminate(request.target)
            raise Unavailable(
                f"actor {ref} changed while it was being restored ({exc.description}); retry"
            ) from exc
        if (
            isinstance(plan, Restore | ColdBoot)
            and plan.drop_node is not None
            and plan.drop_node != assignment.node
        ):
            self._spawn(self._drop_stale_local, actor, plan.drop_node)
        return ResumeResult(
            actor=actor,
            resumed=True,
            source=source,
            generation=generation,
            snapshot_age_seconds=age,
        )

    def _refuse_if_full(self, actor: Actor, template: ActorTemplate, steps: Steps) -> None:
        """Refuse at once, before taking the lease, when no worker anywhere has room.

        Under saturation most ResumeActor calls are parked routers' retries that end "no
        worker has room"; answering those from the worker index skips the lease's two
        writes and the reload. Only a certain refusal is answered here: the check ignores
        the node pin (a pinned actor whose node is full may still be detached and placed
        elsewhere), uses the same index the placement itself would, and books nothing. Any
        room at all, or an index not ready, goes the usual way under the lease.
        """
        if not self.workers.ready:
            return
        index = self.workers.index
        c = self._constraints(actor, template, self.workers.live_nodes()).unpinned()
        t0 = time.perf_counter()
        try:
            index.schedule(c, rng=_PROBE_RNG)
        except ResourceExhausted:
            self.metrics.scheduler_decision("no_room", time.perf_counter() - t0)
            steps.note(refused_before_lease=True)
            raise ResourceExhausted("no worker has room for the actor") from None

    @staticmethod
    def _constraints(
        actor: Actor, template: ActorTemplate, live: frozenset[NodeRef]
    ) -> Constraints:
        """What a worker must offer to take ``actor`` now (its newest usable snapshot's
        runtime and node preference, the template's resources and selectors)."""
        snapshot = newest_usable(actor, live)
        fidelity = None
        if (
            snapshot is not None
            and snapshot.template_uid
            and template.metadata.uid
            and snapshot.template_uid != template.metadata.uid
        ):
            fidelity = Fidelity.VOLUMES
        return constraints_for(
            template=template, actor=actor, snapshot=snapshot, restore_fidelity=fidelity
        )

    async def _revalidate_resuming(self, actor: Actor, steps: Steps) -> Actor:
        """A RESUMING actor found by a new workflow: keep its worker if still valid."""
        a = actor.status.assignment
        worker = self.workers.get(a.worker) if a is not None else None
        if (
            a is not None
            and worker is not None
            and worker.state is WorkerState.ACTIVE
            and worker.epoch == a.worker_epoch
        ):
            return actor
        steps.note(abandoned_stale_assignment=True)
        return await self._abandon_resume(actor, "stale worker assignment", terminate=False)

    def _unreachable_nodes_now(self) -> frozenset[NodeRef]:
        horizon = self.clock() - self.config.heartbeat_timeout
        for node in [n for n, at in self._unreachable_nodes.items() if at < horizon]:
            del self._unreachable_nodes[node]
        return frozenset(self._unreachable_nodes)

    def _elsewhere(
        self, index: FleetIndex, c: Constraints, nodes: frozenset[NodeRef]
    ) -> Worker | None:
        """A worker for ``c`` on one of ``nodes`` (tried in random order), or None."""
        order = sorted(nodes, key=lambda n: n.name)
        self.rng.shuffle(order)
        for node in order:
            try:
                return index.schedule(attrs.evolve(c, required_node=node), rng=self.rng)
            except ResourceExhausted:
                continue
        return None

    async def _assign(self, actor: Actor, template: ActorTemplate, steps: Steps) -> Actor:
        """Pick a worker and bind to it in one store transaction (RESUMING)."""
        cfg = self.config
        detached = False
        for attempt in range(cfg.assign_attempts):
            index = self.workers.require_ready()
            live = self.workers.live_nodes()
            c = self._constraints(actor, template, live)
            if c.required_node is None:
                c = attrs.evolve(c, required_node=pin_node(actor))
            t0 = time.perf_counter()
            avoid = self._unreachable_nodes_now()
            if c.required_node is None and c.preferred_node in avoid:
                # Its atelet did not answer a moment ago: restore from the durable copy
                # elsewhere rather than wait for the node to be declared UNAVAILABLE.
                c = attrs.evolve(c, preferred_node=None)
            try:
                worker = index.schedule(c, rng=self.rng)
                if c.required_node is None and worker.node in avoid:
                    worker = self._elsewhere(index, c, live - avoid) or worker
            except ResourceExhausted:
                self.metrics.scheduler_decision("no_room", time.perf_counter() - t0)
                if c.required_node is not None and not detached:
                    try:
                        index.schedule(c.unpinned(), rng=self.rng)
                    except ResourceExhausted:
                        raise ResourceExhausted("no worker has room for the actor") from None
                    actor = await self._detach(actor, c.required_node, steps)
                    detached = True
                    continue
                raise
            self.metrics.scheduler_decision("placed", time.perf_counter() - t0)
            assignment = WorkerAssignment(
                worker=worker.ref,
                node=worker.node,
                worker_epoch=worker.epoch,
                pod_ips=worker.ips,
                resources=template.resources,
            )

            def mutate(stored: Actor, assignment: WorkerAssignment = assignment) -> Actor:
                decided = lc.decide(stored, lc.BeginResume(assignment=assignment), now=self.clock())
                assert decided.actor is not None
                return decided.actor

            try:
                bound = await self.store.bind_actor(
                    actor.ref,
                    expected_actor_version=actor.metadata.version,
                    expected_actor_uid=actor.metadata.uid,
                    worker=worker.ref,
                    expected_worker_epoch=worker.epoch,
                    resources=template.resources,
                    mutate_actor=mutate,
                )
            except ResourceExhausted:
                await self.workers.refresh(worker.ref)  # lost a race for the last slot
            except Conflict:
                actor = await self.store.get_actor(actor.ref)
                if actor.state not in (ActorState.SUSPENDED, ActorState.PAUSED):
                    raise Aborted(
                        f"actor {actor.ref} is {actor.state.wire_name} and can no longer be resumed"
                    ) from None
            except (Unavailable, FailedPrecondition) as exc:
                if (
                    "epoch" in exc.description
                    or "not ACTIVE" in exc.description
                    or isinstance(exc, FailedPrecondition)
                ):
                    await self.workers.refresh(worker.ref)
                else:
                    raise
            else:
                self.workers.note(bound.worker)
                steps.note(attempts=attempt + 1)
                return bound.actor
            delay = min(cfg.assign_backoff_cap, cfg.assign_backoff_initial * (2**attempt))
            await anyio.sleep(delay * (0.5 + self.rng.random()))
        raise ResourceExhausted("no worker has room for the actor")

    async def _detach(self, actor: Actor, node: NodeRef, steps: Steps) -> Actor:
        """Move the actor's newest local-only state to durable storage and drop the pin."""
        with steps.step("detach"):
            for snap in reversed(actor.status.snapshots):
                local, durable = snap.local(), snap.durable()
                if local is None or local.node != node or not local.completed:
                    continue
                if durable is None:
                    template = await self._template_for(actor)
                    snap = snap.with_storage(self._pending_durable(actor, template, snap, local))
                uploaded = await self.agents.for_node(node).detach(
                    UploadRequest(
                        actor=actor.ref, actor_uid=actor.metadata.uid, node=node, snapshot=snap
                    )
                )
                before = actor
                actor = await self._update(
                    actor, partial(_mark_durable, snap=uploaded, drop_local=True)
                )
                await self._cleanup_dropped(before, actor)
                break
            return await self._update(actor, lambda a: _evolve_status(a, assigned_node=None))

    async def _abandon_resume(self, actor: Actor, reason: str, *, terminate: bool) -> Actor:
        a = actor.status.assignment
        if terminate and a is not None:
            try:
                with anyio.fail_after(10):
                    await self.agents.for_node(a.node).terminate(self._target(actor, a))
            except (SubstrateError, TimeoutError) as exc:
                log.warning(
                    "terminate after abandoned resume failed", actor=str(actor.ref), error=str(exc)
                )
        log.info("resume abandoned", actor=str(actor.ref), reason=reason)
        return await self._apply(actor, lc.AbandonResume(reason=reason))

    async def _drop_stale_local(self, actor: Actor, node: NodeRef) -> None:
        for snap in actor.status.snapshots:
            local = snap.local()
            if local is not None and local.node == node and local.local_name:
                try:
                    await self.agents.for_node(node).drop_local(
                        actor.metadata.uid, local.local_name
                    )
                except SubstrateError as exc:
                    log.info("could not drop a stale local copy", node=str(node), error=str(exc))

    # --- suspend / pause --------------------------------------------------------------

    async def suspend(self, ref: ActorRef, mode: SuspendMode = SuspendMode.ASYNC) -> Actor:
        async with workflow("suspend", self.metrics, actor=ref, mode=mode.name) as steps:
            try:
                async with self._lease(ref):
                    actor = await self._suspend_locked(ref, mode, steps)
            except LeaseHeld:
                self.metrics.lease_conflict("suspend")
                raise
        pending = lc.pending_uploads(actor)
        if mode is SuspendMode.ASYNC and pending:
            self._upload_wakeup.set()
        if mode is SuspendMode.SYNC and pending:
            raise Unavailable(
                f"actor {ref} is suspended with its snapshot kept on node "
                f"{actor.status.assigned_node}; the durable upload is pending and will be retried"
            )
        return actor

    async def _suspend_locked(self, ref: ActorRef, mode: SuspendMode, steps: Steps) -> Actor:
        actor = await self.store.get_actor(ref)
        if actor.state is ActorState.SUSPENDED:
            return actor
        template = await self._template_for(actor)
        if actor.state is ActorState.PAUSED:
            return await self._suspend_paused(actor, template, mode, steps)
        ckpt_mode = (
            CheckpointMode.SUSPEND_SYNC
            if mode is SuspendMode.SYNC
            else CheckpointMode.SUSPEND_ASYNC
        )
        return await self._checkpoint_running(actor, template, ckpt_mode, steps)

    async def pause(self, ref: ActorRef) -> Actor:
        async with workflow("pause", self.metrics, actor=ref) as steps:
            try:
                async with self._lease(ref):
                    actor = await self.store.get_actor(ref)
                    if actor.state is ActorState.PAUSED:
                        return actor
                    template = await self._template_for(actor)
                    return await self._checkpoint_running(
                        actor, template, CheckpointMode.PAUSE, steps
                    )
            except LeaseHeld:
                self.metrics.lease_conflict("pause")
                raise

    async def _checkpoint_running(
        self, actor: Actor, template: ActorTemplate, mode: CheckpointMode, steps: Steps
    ) -> Actor:
        pausing = mode is CheckpointMode.PAUSE
        if actor.state in (ActorState.SUSPENDING, ActorState.PAUSING):
            snap = actor.snapshot(actor.status.in_progress_generation)
            if snap is None:
                raise Internal(f"actor {actor.ref} is writing a generation it does not record")
        else:
            a = actor.status.assignment
            if actor.state is not ActorState.RUNNING or a is None:
                cmd = lc.Command.BEGIN_PAUSE if pausing else lc.Command.BEGIN_SUSPEND
                raise FailedPrecondition(lc.refusal_message(cmd, actor))
            worker = self.workers.get(a.worker)
            snap = new_generation(
                actor,
                snapshot_id=self.new_id(),
                fidelity=Fidelity.MEMORY
                if pausing
                else template.snapshot_config.preferred_fidelity,
                node=a.node,
                template_uid=template.metadata.uid,
                sandbox_class=worker.sandbox_class if worker else template.sandbox_class,
                runtime_version=_runtime_of(worker),
                now=self.clock(),
                location=self._location(template),
            )
            if pausing:
                snap = snap.without(Durability.DURABLE)
            command: lc.LifecycleCommand = (
                lc.BeginPause(snapshot=snap) if pausing else lc.BeginSuspend(snapshot=snap)
            )
            with steps.step("mark"):
                actor = await self._apply(actor, command)
        a = actor.status.assignment
        assert a is not None
        try:
            agent = self.agents.for_node(a.node)
            with steps.step("checkpoint"), anyio.fail_after(self.config.checkpoint_timeout):
                result = await agent.checkpoint(
                    CheckpointRequest(
                        target=self._target(actor, a), template=template, mode=mode, snapshot=snap
                    )
                )
        except TRANSIENT as exc:
            # The node did not checkpoint (or could not be reached): the sandbox still
            # runs, so go back to RUNNING instead of leaving an intent behind.
            cancel: lc.LifecycleCommand = lc.CancelPause() if pausing else lc.CancelSuspend()
            await self._apply(actor, cancel)
            raise Unavailable(f"could not checkpoint {actor.ref}: {exc.description}") from exc
        except TimeoutError as exc:
            await self._crash(actor, "checkpoint timed out")
            raise DeadlineExceeded(f"checkpoint of {actor.ref} timed out") from exc
        except SubstrateError as exc:
            # runsc kills the sandbox when a checkpoint fails: say so truthfully.
            await self._crash(actor, f"checkpoint failed: {exc.description}")
            raise Internal(
                f"checkpoint of {actor.ref} failed; the actor crashed: {exc.description}"
            ) from exc
        steps.note(upload_error=result.upload_error) if result.upload_error else None
        with steps.step("finalize"):
            finish: lc.LifecycleCommand = (
                lc.FinishPause(snapshot=result.snapshot)
                if pausing
                else lc.FinishSuspend(snapshot=result.snapshot)
            )
            actor = await self._apply(actor, finish)
        return actor

    async def _suspend_paused(
        self, actor: Actor, template: ActorTemplate, mode: SuspendMode, steps: Steps
    ) -> Actor:
        """PAUSED → SUSPENDING → SUSPENDED: upload the paused node-local checkpoint."""
        gen = actor.status.last_assigned_generation
        snap = actor.snapshot(gen)
        if snap is None or snap.local() is None:
            raise FailedPrecondition(f"Actor {actor.ref} is PAUSED without a local snapshot")
        paused_local = snap.local()
        assert paused_local is not None
        if snap.durable() is None:
            snap = snap.with_storage(self._pending_durable(actor, template, snap, paused_local))
        with steps.step("mark"):
            actor = await self._apply(actor, lc.BeginSuspend(snapshot=snap))
        final = snap
        if mode is SuspendMode.SYNC:
            local = snap.local()
            assert local is not None
            assert local.node is not None
            try:
                with steps.step("upload"):
                    final = await self.agents.for_node(local.node).upload(
                        UploadRequest(
                            actor=actor.ref,
                            actor_uid=actor.metadata.uid,
                            node=local.node,
                            snapshot=snap,
                        )
                    )
            except SubstrateError as exc:
                steps.note(upload_error=exc.description)
        with steps.step("finalize"):
            return await self._apply(actor, lc.FinishSuspend(snapshot=final))

    # --- revert / delete --------------------------------------------------------------

    async def revert(self, ref: ActorRef) -> Actor:
        async with workflow("revert", self.metrics, actor=ref) as steps:
            try:
                async with self._lease(ref):
                    actor = await self.store.get_actor(ref)
                    if actor.state is not ActorState.REVERTING:
                        with steps.step("mark"):
                            actor = await self._apply(actor, lc.BeginRevert())
                    return await self._finish_revert(actor, steps)
            except LeaseHeld:
                self.metrics.lease_conflict("revert")
                raise

    async def _finish_revert(self, actor: Actor, steps: Steps) -> Actor:
        with steps.step("discard"):
            await self._terminate_if_alive(actor)
        with steps.step("finalize"):
            actor = await self._apply(actor, lc.FinishRevert())
        return actor

    async def delete(self, ref: ActorRef, *, force: bool = False) -> None:
        async with workflow("delete", self.metrics, actor=ref, force=force) as steps:
            try:
                async with self._lease(ref):
                    actor = await self.store.get_actor(ref)
                    if actor.state is not ActorState.DELETING:
                        with steps.step("mark"):
                            actor = await self._apply(actor, lc.BeginDelete(force=force))
                    await self._finish_delete(actor, steps)
            except LeaseHeld:
                self.metrics.lease_conflict("delete")
                raise

    async def _finish_delete(self, actor: Actor, steps: Steps) -> None:
        with steps.step("terminate"):
            await self._terminate_if_alive(actor)
        decision = lc.decide(actor, lc.FinishDelete(), now=self.clock())
        with steps.step("cleanup"):
            await self._run_effects(actor, decision.effects)
        with steps.step("finalize"):
            await self.store.delete_actor(
                actor.ref, expected_version=actor.metadata.version, expected_uid=actor.metadata.uid
            )

    async def _terminate_if_alive(self, actor: Actor) -> None:
        """Stop the actor's sandbox; a worker that is gone took the sandbox with it."""
        a = actor.status.assignment
        if a is None:
            return
        worker = self.workers.get(a.worker)
        if (
            worker is None
            or worker.state is WorkerState.UNAVAILABLE
            or worker.epoch != a.worker_epoch
        ):
            return
        with anyio.fail_after(30):
            await self.agents.for_node(a.node).terminate(self._target(actor, a))

    # --- tags -------------------------------------------------------------------------

    async def create_tag(self, ref: TagRef, actor_ref: ActorRef) -> Tag:
        ref.validate()
        if ref.atespace != actor_ref.atespace:
            raise InvalidArgument("a tag lives in the atespace of its actor")
        async with self._lease(actor_ref):
            actor = await self.store.get_actor(actor_ref)
            if actor.state is not ActorState.SUSPENDED:
                raise FailedPrecondition(
                    f"Actor {actor_ref} must be ACTOR_STATE_SUSPENDED to be tagged "
                    f"(got: {actor.state.wire_name})"
                )
            if not actor.status.snapshots:
                raise FailedPrecondition(f"Actor {actor_ref} has no snapshot to tag")
            snap = actor.status.snapshots[-1]
            durable = snap.durable()
            if durable is None or not durable.completed:
                local = snap.local()
                if local is None or local.node is None or not local.completed or durable is None:
                    raise FailedPrecondition(f"Actor {actor_ref} has no completed snapshot to tag")
                snap = await self.agents.for_node(local.node).upload(
                    UploadRequest(
                        actor=actor.ref,
                        actor_uid=actor.metadata.uid,
                        node=local.node,
                        snapshot=snap,
                    )
                )
                before = actor
                actor = await self._update(
                    actor, partial(_mark_durable, snap=snap, drop_local=False)
                )
                await self._cleanup_dropped(before, actor)
                durable = snap.durable()
                assert durable is not None
            template = await self._template_for(actor)
            tag = await self.store.create_tag(
                Tag(ref=ref, source_actor=actor_ref, template=actor.template)
            )
            location = self._location(template)
            dst = tag_prefix(location, ref.atespace, tag.metadata.uid)
            try:
                if self.objects is None:
                    raise Unavailable("ateapi has no object store configured")
                await self.objects.copy_prefix(durable.uri, dst)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self.store.delete_tag(ref)
                raise
            tag_snap = Snapshot(
                generation=1,
                snapshot_id=tag.metadata.uid,
                owner=SnapshotOwner.TAG,
                template_uid=snap.template_uid,
                sandbox_class=snap.sandbox_class,
                runtime_version=snap.runtime_version,
                captured_at=snap.captured_at,
                source_tag=ref,
                storages=(attrs.evolve(durable, uri=dst, status=StorageStatus.COMPLETED),),
            )
            return await self.store.update_tag(
                ref,
                expected_version=tag.metadata.version,
                expected_uid=tag.metadata.uid,
                mutate=lambda t: attrs.evolve(t, snapshot=tag_snap),
            )

    async def delete_tag(self, ref: TagRef) -> None:
        tag = await self.store.get_tag(ref)
        actors, token = await self.store.list_actors(ref.atespace, page_size=1000)
        while True:
            for a in actors:
                if any(
                    s.owner is SnapshotOwner.TAG and s.source_tag == ref for s in a.status.snapshots
                ):
                    raise FailedPrecondition(f"Tag {ref} is still borrowed by actor {a.ref}")
            if not token:
                break
            actors, token = await self.store.list_actors(
                ref.atespace, page_size=1000, page_token=token
            )
        if tag.snapshot is not None and self.objects is not None:
            d = tag.snapshot.durable()
            if d is not None and d.uri:
                await self.objects.delete_prefix(d.uri)
        await self.store.delete_tag(
            ref, expected_version=tag.metadata.version, expected_uid=tag.metadata.uid
        )

    # --- workers ----------------------------------------------------------------------

    async def register_worker(self, worker: Worker) -> Worker:
        """Register (or re-register) a worker for its current epoch; it becomes ACTIVE.

        An epoch rise means the worker process restarted: every actor placed in an earlier
        epoch lost its sandbox. RUNNING/SUSPENDING/PAUSING ones are crashed; RESUMING ones
        are rolled back to SUSPENDED (their snapshot is intact).
        """
        worker.ref.validate()
        now = self.clock()
        try:
            current = await self.store.get_worker(worker.ref)
        except NotFound:
            created = await self.store.create_worker(
                attrs.evolve(worker, state=WorkerState.ACTIVE, last_heartbeat=now)
            )
            self.workers.note(created)
            return created
        if worker.epoch < current.epoch:
            raise FailedPrecondition(
                f"worker {worker.ref} registered epoch {worker.epoch}, older than {current.epoch}"
            )
        state = (
            WorkerState.DRAINING if current.state is WorkerState.DRAINING else WorkerState.ACTIVE
        )

        def mutate(old: Worker) -> Worker:
            return attrs.evolve(
                old,
                labels=worker.labels,
                epoch=worker.epoch,
                state=state,
                last_heartbeat=now,
                ips=worker.ips if worker.ips else old.ips,
                runtime_versions=worker.runtime_versions,
                spiffe_id=worker.spiffe_id or old.spiffe_id,
                tunnel_address=worker.tunnel_address or old.tunnel_address,
                atelet_address=worker.atelet_address or old.atelet_address,
            )

        if (
            worker.capacity != current.capacity
            or worker.node != current.node
            or worker.pool != current.pool
            or worker.sandbox_class != current.sandbox_class
        ):
            # Immutable fields changed: the worker is a new one under the old name.
            await self._forget_worker(current, "worker re-created with a new shape")
            created = await self.store.create_worker(
                attrs.evolve(worker, state=WorkerState.ACTIVE, last_heartbeat=now)
            )
            self.workers.note(created)
            return created
        updated = await self.store.update_worker(
            worker.ref,
            expected_version=current.metadata.version,
            expected_uid=current.metadata.uid,
            mutate=mutate,
        )
        self.workers.note(updated)
        if worker.epoch > current.epoch:
            await self._handle_lost_sandboxes(
                updated,
                f"worker {worker.ref} restarted (epoch {current.epoch} → {worker.epoch})",
                below_epoch=worker.epoch,
            )
        return updated

    async def heartbeat(
        self, ref: WorkerRef, epoch: int, capacity: Capacity | None = None
    ) -> Worker:
        """Record a heartbeat; a heartbeat for another epoch asks the worker to re-register.

        A ``capacity`` replaces the registered one (None keeps it).
        """
        current = await self.store.get_worker(ref)
        if epoch != current.epoch:
            raise FailedPrecondition(
                f"worker {ref} heartbeat for epoch {epoch}, registered epoch "
                f"{current.epoch}: register again"
            )
        now = self.clock()

        def mutate(old: Worker) -> Worker:
            state = WorkerState.ACTIVE if old.state is WorkerState.UNAVAILABLE else old.state
            cap = old.capacity if capacity is None else capacity
            return attrs.evolve(old, last_heartbeat=now, state=state, capacity=cap)

        updated = await self.store.update_worker(
            ref,
            expected_version=current.metadata.version,
            expected_uid=current.metadata.uid,
            mutate=mutate,
        )
        self.workers.note(updated)
        return updated

    async def drain_worker(self, ref: WorkerRef) -> Worker:
        """DRAINING (no new placements), then suspend (SYNC) every actor running on it."""
        current = await self.store.get_worker(ref)
        updated = await self.store.update_worker(
            ref,
            expected_version=current.metadata.version,
            expected_uid=current.metadata.uid,
            mutate=lambda w: attrs.evolve(w, state=WorkerState.DRAINING),
        )
        self.workers.note(updated)
        for binding in await self.store.list_bindings(ref):
            try:
                await self.suspend(binding.actor, SuspendMode.SYNC)
            except SubstrateError as exc:
                log.warning(
                    "drain could not suspend an actor",
                    actor=str(binding.actor),
                    error=exc.description,
                )
        return await self.store.get_worker(ref)

    async def request_suspend(self, worker: WorkerRef, actor: ActorRef, actor_uid: str) -> Actor:
        """A worker asks to suspend one of its actors (e.g. it is idle)."""
        if actor.atespace == GOLDEN_ATESPACE:
            raise FailedPrecondition("golden actors cannot request a suspend")
        current = await self.store.get_actor(actor)
        a = current.status.assignment
        if current.metadata.uid != actor_uid or a is None or a.worker != worker:
            raise NotFound(f"actor {actor} is not running on worker {worker}")
        return await self.suspend(actor, SuspendMode.ASYNC)

    async def mark_unavailable(self, now: float | None = None) -> list[Worker]:
        """Workers silent for longer than the heartbeat timeout become UNAVAILABLE.

        Their running actors lost their sandboxes: they are crashed at once (not minutes
        later), RESUMING ones are rolled back, so a revert or the next request can proceed.
        """
        now = self.clock() if now is None else now
        try:
            workers = await self.store.list_workers()
        except Unavailable:
            self._store_lost = True
            raise
        if self._store_lost:
            # The store is back. Heartbeats could not be recorded while it was away, so
            # that silence is ours, not the workers': they get a full timeout from now.
            self._store_lost = False
            self._heard_since = now
        heard_since = self._heard_since if self._heard_since is not None else float("-inf")
        out = []
        for w in workers:
            if (
                w.state is WorkerState.UNAVAILABLE
                or now - max(w.last_heartbeat, heard_since) <= self.config.heartbeat_timeout
            ):
                continue
            try:
                updated = await self.store.update_worker(
                    w.ref,
                    expected_version=w.metadata.version,
                    expected_uid=w.metadata.uid,
                    mutate=lambda x: attrs.evolve(x, state=WorkerState.UNAVAILABLE),
                )
            except Conflict:
                continue
            self.workers.note(updated)
            out.append(updated)
            log.warning(
                "worker unavailable", worker=str(w.ref), silent_for=round(now - w.last_heartbeat, 1)
            )
            await self._handle_lost_sandboxes(
                updated, f"worker {w.ref} stopped answering", below_epoch=None
            )
        return out

    async def _handle_lost_sandboxes(
        self, worker: Worker, why: str, *, below_epoch: int | None
    ) -> None:
        for binding in await self.store.list_bindings(worker.ref):
            if below_epoch is not None and binding.worker_epoch >= below_epoch:
                continue
            try:
                actor = await self.store.get_actor(binding.actor)
            except NotFound:
                await self.store.release_actor(binding.actor_uid)
                continue
            if actor.metadata.uid != binding.actor_uid:
                await self.store.release_actor(binding.actor_uid)
                continue
            try:
                if actor.state is ActorState.RESUMING:
                    await self._apply(actor, lc.AbandonResume(reason=why))
                elif actor.state in (ActorState.RUNNING, ActorState.SUSPENDING, ActorState.PAUSING):
                    await self._crash(actor, why)
                elif actor.state in (ActorState.REVERTING, ActorState.DELETING):
                    pass  # the reconciler drives them forward; the sandbox is gone anyway
                else:
                    await self.store.release_actor(binding.actor_uid)
            except SubstrateError as exc:
                log.warning(
                    "could not settle an actor of a lost worker",
                    actor=str(actor.ref),
                    error=exc.description,
                )

    async def _forget_worker(self, worker: Worker, why: str) -> None:
        await self._handle_lost_sandboxes(worker, why, below_epoch=None)
        with suppress(NotFound):
            await self.store.delete_worker(worker.ref)

    # --- background: uploads, reconciler, liveness ------------------------------------

    async def upload_pending_once(self) -> int:
        """Upload every COMPLETED-local/PENDING-durable snapshot whose node is live."""
        done = 0
        live = self.workers.live_nodes()
        token = ""
        while True:
            actors, token = await self.store.list_actors(None, page_size=500, page_token=token)
            for actor in actors:
                for snap in lc.pending_uploads(actor):
                    local = snap.local()
                    if local is None or local.node is None or local.node not in live:
                        continue
                    try:
                        uploaded = await self.agents.for_node(local.node).upload(
                            UploadRequest(
                                actor=actor.ref,
                                actor_uid=actor.metadata.uid,
                                node=local.node,
                                snapshot=snap,
                            )
                        )
                        after = await self._write(
                            actor, partial(_mark_durable, snap=uploaded, drop_local=False)
                        )
                        await self._cleanup_dropped(actor, after)
                        done += 1
                    except SubstrateError as exc:
                        log.info(
                            "snapshot upload still pending",
                            actor=str(actor.ref),
                            error=exc.description,
                        )
            if not token:
                return done

    async def reconcile_once(self) -> int:
        """Drive actors left in a transient state (no live lease) forward or to safety."""
        fixed = 0
        token = ""
        while True:
            actors, token = await self.store.list_actors(None, page_size=500, page_token=token)
            for actor in actors:
                if not actor.state.transient:
                    continue
                try:
                    async with self._lease(actor.ref):
                        fresh = await self.store.get_actor(actor.ref)
                        if fresh.metadata.uid != actor.metadata.uid or not fresh.state.transient:
                            continue
                        await self._reconcile_actor(fresh)
                        fixed += 1
                except LeaseHeld:
                    continue  # a workflow is working on it
                except NotFound:
                    continue
                except SubstrateError as exc:
                    log.warning("reconcile failed", actor=str(actor.ref), error=exc.description)
            if not token:
                return fixed

    async def _reconcile_actor(self, actor: Actor) -> None:
        steps = Steps(time.perf_counter)
        match actor.state:
            case ActorState.RESUMING:
                a = actor.status.assignment
                worker = self.workers.get(a.worker) if a else None
                alive = (
                    worker is not None
                    and worker.state is not WorkerState.UNAVAILABLE
                    and a is not None
                    and worker.epoch == a.worker_epoch
                )
                await self._abandon_resume(actor, "resume interrupted", terminate=alive)
            case ActorState.SUSPENDING | ActorState.PAUSING:
                a = actor.status.assignment
                if a is None:  # suspending a PAUSED actor: finish with what is there
                    snap = actor.snapshot(actor.status.in_progress_generation)
                    if snap is None:
                        await self._crash(actor, "interrupted suspend lost its generation")
                        return
                    await self._apply(actor, lc.FinishSuspend(snapshot=snap))
                    self._upload_wakeup.set()
                    return
                worker = self.workers.get(a.worker)
                if (
                    worker is None
                    or worker.state is WorkerState.UNAVAILABLE
                    or worker.epoch != a.worker_epoch
                ):
                    await self._crash(actor, "the worker went away during the checkpoint")
                    return
                template = await self._template_for(actor)
                mode = (
                    CheckpointMode.PAUSE
                    if actor.state is ActorState.PAUSING
                    else CheckpointMode.SUSPEND_ASYNC
                )
                await self._checkpoint_running(actor, template, mode, steps)
            case ActorState.REVERTING:
                await self._finish_revert(actor, steps)
            case ActorState.DELETING:
                await self._finish_delete(actor, steps)
            case _:
                return

    async def run_background(
        self,
        *,
        reconcile_every: float | None = None,
        liveness_every: float = 1.0,
        upload_every: float | None = None,
    ) -> None:
        """Run the reconciler, the liveness monitor and the uploader until cancelled."""
        reconcile_every = reconcile_every or self.config.reconcile_every
        upload_every = upload_every or self.config.upload_retry_every

        async def loop(
            fn: Callable[[], Awaitable[object]], every: float, wake: bool = False
        ) -> None:
            while True:
                try:
                    await fn()
                except SubstrateError as exc:
                    log.info(
                        "background pass failed",
                        task=getattr(fn, "__name__", "?"),
                        error=exc.description,
                    )
                if wake:
                    with anyio.move_on_after(every):
                        await self._upload_wakeup.wait()
                    self._upload_wakeup = anyio.Event()
                else:
                    await anyio.sleep(every)

        async with anyio.create_task_group() as tg:
            tg.start_soon(loop, self.reconcile_once, reconcile_every)
            tg.start_soon(loop, self.mark_unavailable, liveness_every)
            tg.start_soon(loop, self.upload_pending_once, upload_every, True)
            tg.start_soon(loop, self.golden_pass, reconcile_every * 5)

    # --- helpers ----------------------------------------------------------------------

    def _spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        async def run() -> None:
            try:
                await fn(*args)
            except SubstrateError as exc:
                log.info("background step failed", error=exc.description)

        self.task_group.start_soon(run)

    def _location(self, template: ActorTemplate) -> str:
        """Where the template's snapshots go (the service default if it names none)."""
        return template.snapshot_config.storage_location or self.config.default_storage_location

    def _pending_durable(
        self, actor: Actor, template: ActorTemplate, snap: Snapshot, local: SnapshotStorage
    ) -> SnapshotStorage:
        """A DURABLE, not yet uploaded copy of a node-local generation, at the owner prefix."""
        return SnapshotStorage(
            durability=Durability.DURABLE,
            status=StorageStatus.PENDING,
            fidelity=local.fidelity,
            uri=actor_snapshot_prefix(
                self._location(template), actor.ref.atespace, actor.metadata.uid, snap.snapshot_id
            ),
        )

    def _target(self, actor: Actor, a: WorkerAssignment) -> WorkloadTarget:
        return WorkloadTarget(
            actor=actor.ref,
            actor_uid=actor.metadata.uid,
            worker=a.worker,
            node=a.node,
            worker_epoch=a.worker_epoch,
        )

    async def _template_for(self, actor: Actor) -> ActorTemplate:
        try:
            return await self.store.get_template(actor.template)
        except NotFound as exc:
            raise FailedPrecondition(f"ActorTemplate {actor.template} not found") from exc

    async def _apply(self, actor: Actor, command: lc.LifecycleCommand) -> Actor:
        """Decide ``command`` on the stored record, persist it, run the decision's effects.

        The workflow holds the actor's lease, but background passes (the uploader) may
        update the record without it; a version conflict therefore re-reads and decides
        again on the fresh record (decisions are pure and idempotent), as long as it is the
        same actor (same uid).
        """
        decisions: list[lc.Decision] = []

        def mutate(stored: Actor) -> Actor:
            decision = lc.decide(stored, command, now=self.clock())
            decisions.append(decision)
            assert decision.actor is not None
            return decision.actor

        first = lc.decide(actor, command, now=self.clock())
        if not first.changed:
            return actor
        updated = await self._write(actor, mutate)
        await self._run_effects(updated, decisions[-1].effects)
        return updated

    async def _persist(self, actor: Actor, decision: lc.Decision) -> Actor:
        """Persist a decision made on ``actor`` (re-deciding on a fresher record is the
        caller's job: use :meth:`_apply` for commands)."""
        assert decision.actor is not None
        new = decision.actor
        updated = await self._write(actor, lambda _a: new, retry=False)
        await self._run_effects(updated, decision.effects)
        return updated

    async def _write(
        self, actor: Actor, mutate: Callable[[Actor], Actor], *, retry: bool = True
    ) -> Actor:
        version = actor.metadata.version
        for _ in range(5):
            try:
                return await self.store.update_actor(
                    actor.ref,
                    expected_version=version,
                    expected_uid=actor.metadata.uid,
                    mutate=mutate,
                )
            except Conflict:
                if not retry:
                    raise
                fresh = await self.store.get_actor(actor.ref)
                if fresh.metadata.uid != actor.metadata.uid:
                    raise
                version = fresh.metadata.version
        raise Aborted(f"actor {actor.ref} kept changing; try again")

    async def _update(self, actor: Actor, change: Callable[[Actor], object]) -> Actor:
        """Optimistic update with a pure ``change`` (a Decision or an Actor) of the stored
        record; retried on the fresh record after a concurrent background update."""

        def mutate(stored: Actor) -> Actor:
            out = change(stored)
            if isinstance(out, lc.Decision):
                assert out.actor is not None
                return out.actor
            assert isinstance(out, Actor)
            return out

        return await self._write(actor, mutate)

    async def _cleanup_dropped(self, before: Actor, after: Actor) -> None:
        """Delete what the actor owned of generations an update dropped from its record."""
        kept = {s.generation for s in after.status.snapshots}
        effects: tuple[lc.Effect, ...] = ()
        for snap in before.status.snapshots:
            if snap.generation not in kept:
                effects += lc.owned_cleanup(snap)
        await self._run_effects(after, effects)

    async def _crash(self, actor: Actor, message: str) -> Actor:
        """CRASHED with ``message``; the worker is released first (by the decision's effect)."""
        fresh = await self.store.get_actor(actor.ref)
        if fresh.metadata.uid != actor.metadata.uid:
            return fresh
        if not lc.allowed(fresh.state, lc.Command.CRASH):
            return fresh
        a = fresh.status.assignment
        if a is not None:
            await self.store.release_actor(fresh.metadata.uid)
        log.warning("actor crashed", actor=str(actor.ref), reason=message)
        return await self._apply(fresh, lc.CrashActor(message=message))

    async def _run_effects(self, actor: Actor, effects: tuple[lc.Effect, ...]) -> None:
        for effect in effects:
            match effect:
                case lc.ReleaseWorker(actor_uid=uid):
                    released = await self.store.release_actor(uid)
                    if released is not None:
                        await self.workers.refresh(released.worker)
                case lc.TerminateSandbox():
                    pass  # done by the workflow before it persists the next state
                case lc.DeleteObjects(uri=uri):
                    if self.objects is None:
                        continue
                    try:
                        await self.objects.delete_prefix(uri)
                    except SubstrateError as exc:
                        log.warning(
                            "could not delete snapshot objects", uri=uri, error=exc.description
                        )
                case lc.DropLocalCopy(node=node, local_name=name):
                    if node not in self.workers.live_nodes():
                        continue
                    try:
                        await self.agents.for_node(node).drop_local(actor.metadata.uid, name)
                    except SubstrateError as exc:
                        log.info(
                            "could not drop a local copy", node=str(node), error=exc.description
                        )


def _runtime_of(worker: Worker | None) -> str:
    if worker is None or not worker.runtime_versions:
        return ""
    return sorted(worker.runtime_versions)[0]


def _mark_durable(actor: Actor, snap: Snapshot, *, drop_local: bool) -> Actor:
    """Record that ``snap``'s durable copy is COMPLETED (pure; idempotent).

    When the actor is SUSPENDED and this is its newest generation, older generations are
    dropped from the record and the node pin is lifted: the state is now durable.
    """
    existing = actor.snapshot(snap.generation)
    if existing is None:
        return actor
    durable = snap.durable()
    if durable is None or not durable.completed:
        return actor
    updated = existing.with_storage(durable)
    if drop_local:
        updated = updated.without(Durability.LOCAL)
    snapshots = tuple(
        updated if s.generation == snap.generation else s for s in actor.status.snapshots
    )
    newest = max(s.generation for s in snapshots)
    changes: dict[str, object] = {"snapshots": snapshots}
    if actor.state is ActorState.SUSPENDED and snap.generation == newest:
        changes["snapshots"] = (updated,)
        changes["assigned_node"] = None
    return _evolve_status(actor, **changes)


__all__ = ["ActorService", "ServiceConfig"]
