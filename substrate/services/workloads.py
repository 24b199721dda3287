"""ateworker's core: the actors of one worker, each in its own sandbox and network.

:class:`WorkloadManager` implements :class:`~substrate.sandbox.worker_ports.WorkerApi` over
four ports: the :class:`~substrate.sandbox.ports.SandboxRuntime` (runsc or the fake),
the :class:`~substrate.net.ports.HostNetwork` (the actor's namespace and veth), the
egress proxy and the ingress tunnel (atunnel). The order of a start is the seed's
(``000_*`` §7):

1. the actor's network namespace, then its egress redirect — egress is in place before
   the sandbox starts;
2. the bundle's ``config.json`` and the sandbox (cold boot, or restore from the image);
3. the wakeup probe, polled until it answers 200 (a probe that never does fails the
   start and leaves nothing behind);
4. only then the actor is activated in atunnel and the call returns with the epoch.

A checkpoint first stops ingress to the actor and resets every connection into and out
of it (gVisor cannot checkpoint while a TCP connection is open or in TIME_WAIT, and a
failed checkpoint kills the sandbox), then checkpoints; a failure is reported as it is —
the sandbox is gone and everything of the actor is removed.

Calls on one actor are serialized; calls on different actors run concurrently.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Final, Protocol

import anyio
import anyio.abc
import attrs
import structlog

from substrate.core.ids import ActorRef, NodeRef
from substrate.core.model import Capacity, EnvVar, SandboxClass
from substrate.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SubstrateError,
)
from substrate.net.plan import ActorNetworkPlan, netns_prefix, plan_for, veth_prefix
from substrate.net.ports import HostNetwork
from substrate.sandbox.node_layout import NodeLayout
from substrate.sandbox.ports import SandboxRuntime
from substrate.sandbox.spec import SandboxAddress, SandboxSpec, SandboxStats, sandbox_id_for
from substrate.sandbox.worker_ports import (
    WorkerInfo,
    WorkloadCheckpointed,
    WorkloadRequest,
    WorkloadStarted,
)
from substrate.services.probe import wait_ready

log = structlog.get_logger("substrate.ateworker")

DEFAULT_PROBE_TIMEOUT: Final = 30.0
DEFAULT_READY_PATH: Final = "/"


class Ingress(Protocol):
    """The worker's atunnel, as the manager drives it."""

    def activate(
        self,
        actor: ActorRef,
        actor_uid: str,
        address: SandboxAddress,
        *,
        default_port: int | None = None,
    ) -> None:
        """Route requests for ``actor`` to ``address`` (after its probes answered)."""
        ...

    async def abort(self, actor_uid: str) -> int:
        """Refuse new requests for the actor (421) and reset its open connections."""
        ...

    async def deactivate(self, actor_uid: str) -> None:
        """Remove the actor's route and reset its connections; idempotent."""
        ...


class Egress(Protocol):
    """The worker's egress proxy, as the manager drives it."""

    async def open_actor(self, actor_uid: str, host_veth: str) -> int:
        """Redirect the actor's outbound TCP to a listener of its own; the port."""
        ...

    async def abort(self, actor_uid: str) -> int:
        """Reset every open outbound connection of the actor."""
        ...

    async def close_actor(self, actor_uid: str) -> None:
        """Reset its connections, close its listener, remove its redirect; idempotent."""
        ...


@attrs.frozen(slots=True, kw_only=True)
class WorkerConfig:
    """Who the worker is and what it can hold."""

    name: str
    node: NodeRef
    capacity: Capacity
    sandbox_class: SandboxClass = SandboxClass.GVISOR
    pool: str = "default"
    labels: Mapping[str, str] = attrs.field(factory=dict, eq=False)
    tunnel_address: str = ""
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    actor_address: str = ""
    """Where the workload listens from the worker's side ("" = the runtime decides;
    gVisor: 169.254.17.2 behind the actor's host veth)."""
    max_concurrent_starts: int = attrs.field(factory=lambda: default_concurrent_starts())
    """Sandboxes booted or restored at once (the rest wait their turn). Booting is CPU
    work: twenty cold boots at once on two cores each took 3.5-4.5 s (drill 6), longer
    than a router's park budget, so no parked request was served; started a few at a time
    the first are up in a fraction of that and the total is about the same."""

    def __attrs_post_init__(self) -> None:
        if self.max_concurrent_starts < 1:
            raise InvalidArgument(
                f"max_concurrent_starts must be >= 1, got {self.max_concurrent_starts}"
            )


def default_concurrent_starts() -> int:
    """Concurrent sandbox starts by default: one per CPU, at least two."""
    return max(2, os.cpu_count() or 2)


class _Phase:
    STARTING = "starting"
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"


@attrs.define
class _Slot:
    ref: ActorRef
    uid: str
    plan: ActorNetworkPlan
    spec: SandboxSpec
    phase: str = _Phase.STARTING


def next_epoch(path: str) -> int:
    """Read the last epoch from ``path``, write and return the next one (1 if none)."""
    last = 0
    with contextlib.suppress(FileNotFoundError, ValueError), open(path, encoding="ascii") as f:
        last = int(f.read().strip() or "0")
    epoch = max(last, 0) + 1
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"{epoch}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return epoch


def _merge_env(
    image_env: tuple[tuple[str, str], ...], own: tuple[EnvVar, ...]
) -> tuple[EnvVar, ...]:
    names = {e.name for e in own}
    return tuple(EnvVar(name=k, value=v) for k, v in image_env if k not in names) + own


class WorkloadManager:
    """The actors of one worker. Use as ``async with manager:`` (see :meth:`serving`)."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        layout: NodeLayout,
        runtime: SandboxRuntime,
        network: HostNetwork,
        ingress: Ingress | None = None,
        egress: Egress | None = None,
        epoch: int = 1,
    ) -> None:
        self.config = config
        self.layout = layout
        self.runtime = runtime
        self.network = network
        self.ingress = ingress
        self.egress = egress
        self.epoch = epoch
        self._slots: dict[str, _Slot] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._starting = anyio.Semaphore(config.max_concurrent_starts)
        self._tg: anyio.abc.TaskGroup | None = None
        self._runtime_versions: tuple[str, ...] = ()
        self._reaping = 0
        self._settled = anyio.Event()

    # --- life ---------------------------------------------------------------------------

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[WorkloadManager]:
        """Clean up what an earlier run left, serve, and on exit stop every actor."""
        await self.cleanup_leftovers()
        self._runtime_versions = (await self.runtime.runtime_version(),)
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                yield self
            finally:
                self._tg = None
                with anyio.CancelScope(shield=True):
                    for uid in list(self._slots):
                        with contextlib.suppress(SubstrateError, OSError):
                            await self.terminate(uid)

    async def cleanup_leftovers(self) -> None:
        """Remove every namespace and veth this worker's names could have left behind."""
        name = self.config.name
        await self.network.remove_owned(netns_prefix(name), veth_prefix(name))

    def _lock(self, uid: str) -> anyio.Lock:
        lock = self._locks.get(uid)
        if lock is None:
            lock = self._locks[uid] = anyio.Lock()
        return lock

    def _started(self, timings: dict[str, float]) -> WorkloadStarted:
        address = self.config.actor_address
        return WorkloadStarted(
            worker_epoch=self.epoch, pod_ips=(address,) if address else (), timings=timings
        )

    # --- WorkerApi ------------------------------------------------------------------------

    async def info(self) -> WorkerInfo:
        if not self._runtime_versions:
            self._runtime_versions = (await self.runtime.runtime_version(),)
        return WorkerInfo(
            name=self.config.name,
            node=self.config.node,
            epoch=self.epoch,
            sandbox_class=self.config.sandbox_class,
            runtime_versions=self._runtime_versions,
            capacity=self.config.capacity,
            tunnel_address=self.config.tunnel_address,
            pool=self.config.pool,
            labels=self.config.labels,
        )

    async def run(self, request: WorkloadRequest) -> WorkloadStarted:
        return await self._start(request, restore=False)

    async def restore(self, request: WorkloadRequest) -> WorkloadStarted:
        if not request.restore_dir:
            raise InvalidArgument("a restore needs restore_dir")
        return await self._start(request, restore=True)

    async def _start(self, request: WorkloadRequest, *, restore: bool) -> WorkloadStarted:
        if request.worker_epoch and request.worker_epoch != self.epoch:
            # The caller planned for another run of this worker; it compares and retries.
            return self._started({})
        if len(request.containers) != 1:
            raise InvalidArgument(
                f"this worker runs one container per sandbox; the workload has "
                f"{len(request.containers)}"
            )
        uid = request.actor_uid
        async with self._lock(uid):
            slot = self._slots.get(uid)
            if slot is not None and slot.phase == _Phase.RUNNING:
                return self._started({})  # re-entry after a lost reply
            if slot is not None:
                raise FailedPrecondition(f"actor {request.actor} is {slot.phase} on this worker")
            if len(self._slots) >= self.config.capacity.actors:
                raise ResourceExhausted(
                    f"worker {self.config.name} is full ({self.config.capacity.actors} actors)"
                )
            return await self._start_locked(request, restore=restore)

    def _spec(self, request: WorkloadRequest, plan: ActorNetworkPlan) -> SandboxSpec:
        container = request.containers[0]
        args = container.command or request.image_args
        if not args:
            raise InvalidArgument(
                f"container {container.name!r} has no command and its image no entrypoint"
            )
        return SandboxSpec(
            sandbox_id=sandbox_id_for(request.actor_uid),
            bundle_dir=request.bundle_dir,
            netns_path=plan.netns_path,
            args=args,
            env=_merge_env(request.image_env, container.env),
            ports=container.ports,
            wakeup_probe=container.wakeup_probe,
            resources=request.resources,
            address=self.config.actor_address,
            device=plan.host_veth if self.config.actor_address else "",
            sysinfo_dir=request.sysinfo_dir,
        )

    async def _start_locked(self, request: WorkloadRequest, *, restore: bool) -> WorkloadStarted:
        uid = request.actor_uid
        plan = plan_for(self.config.name, uid)
        spec = self._spec(request, plan)
        slot = _Slot(ref=request.actor, uid=uid, plan=plan, spec=spec)
        self._slots[uid] = slot
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        try:
            await self.network.create(plan)
            if self.egress is not None:
                await self.egress.open_actor(uid, plan.host_veth)
            t1 = time.perf_counter()
            timings["network"] = t1 - t0
            async with self._starting:
                t1b = time.perf_counter()
                if t1b - t1 > 0.001:
                    timings["queued"] = t1b - t1
                if restore:
                    await self.runtime.restore(spec, request.restore_dir)
                else:
                    await self.runtime.run(spec)
                t2 = time.perf_counter()
                timings["restore" if restore else "run"] = t2 - t1b
                address = await self.runtime.address(spec.sandbox_id)
                probe = spec.wakeup_probe
                try:
                    await wait_ready(
                        address,
                        probe.port if probe else spec.ports[0],
                        probe.path if probe else DEFAULT_READY_PATH,
                        timeout=self.config.probe_timeout,
                    )
                except DeadlineExceeded as exc:
                    raise FailedPrecondition(f"actor {request.actor}: {exc.description}") from exc
            t3 = time.perf_counter()
            timings["probe"] = t3 - t2
            if self.ingress is not None:
                self.ingress.activate(request.actor, uid, address, default_port=spec.ports[0])
            slot.phase = _Phase.RUNNING
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._teardown(slot)
            raise
        if restore and not request.preserve_restore_dir:
            await anyio.to_thread.run_sync(
                lambda: shutil.rmtree(request.restore_dir, ignore_errors=True)
            )
        timings["total"] = time.perf_counter() - t0
        log.info(
            "workload started",
            actor=str(request.actor),
            uid=uid,
            kind="restore" if restore else "run",
            seconds={k: round(v, 4) for k, v in timings.items()},
        )
        return self._started(timings)

    async def _teardown(self, slot: _Slot, *, terminate_sandbox: bool = True) -> None:
        """Remove everything of the actor; never raises for parts already gone."""
        self._slots.pop(slot.uid, None)
        if self.ingress is not None:
            with contextlib.suppress(SubstrateError, OSError):
                await self.ingress.deactivate(slot.uid)
        if self.egress is not None:
            with contextlib.suppress(SubstrateError, OSError):
                await self.egress.close_actor(slot.uid)
        if terminate_sandbox:
            with contextlib.suppress(SubstrateError, OSError):
                await self.runtime.terminate(slot.spec.sandbox_id)
        with contextlib.suppress(SubstrateError, OSError):
            await self.network.destroy(slot.plan)

    async def checkpoint(
        self, actor_uid: str, checkpoint_dir: str, *, worker_epoch: int = 0
    ) -> WorkloadCheckpointed:
        if worker_epoch and worker_epoch != self.epoch:
            raise FailedPrecondition(
                f"worker {self.config.name} is in epoch {self.epoch}, not {worker_epoch}: "
                f"actor {actor_uid} is not running here"
            )
        if not checkpoint_dir.startswith("/"):
            raise InvalidArgument(f"checkpoint directory {checkpoint_dir!r} must be absolute")
        async with self._lock(actor_uid):
            slot = self._slots.get(actor_uid)
            if slot is None or slot.phase != _Phase.RUNNING:
                raise FailedPrecondition(
                    f"actor {actor_uid} is not running on worker {self.config.name}"
                )
            slot.phase = _Phase.CHECKPOINTING
            t0 = time.perf_counter()
            aborted = 0
            try:
                if self.ingress is not None:
                    aborted += await self.ingress.abort(actor_uid)
                if self.egress is not None:
                    aborted += await self.egress.abort(actor_uid)
                info = await self.runtime.checkpoint(slot.spec.sandbox_id, checkpoint_dir)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._teardown(slot)
                raise
            t1 = time.perf_counter()
            # The image is complete. Stop routing to the actor now; the rest (egress rules,
            # the sandbox process, the namespace) goes after the reply, under the actor's
            # lock, so a start of the same actor waits for it.
            self._slots.pop(actor_uid, None)
            if self.ingress is not None:
                with contextlib.suppress(SubstrateError, OSError):
                    await self.ingress.deactivate(actor_uid)
            await self._reap(slot)
        log.info(
            "workload checkpointed",
            uid=actor_uid,
            aborted_connections=aborted,
            seconds=round(t1 - t0, 4),
            size=info.size_bytes,
        )
        return WorkloadCheckpointed(
            worker_epoch=self.epoch,
            files=info.files,
            runtime_version=info.runtime_version,
            size_bytes=info.size_bytes,
            timings={"checkpoint": t1 - t0},
        )

    async def _reap(self, slot: _Slot) -> None:
        """Remove a checkpointed actor's sandbox leftovers and network, in the background."""

        async def reap() -> None:
            try:
                async with self._lock(slot.uid):
                    if slot.uid not in self._slots:  # else started again: leftovers replaced
                        await self._teardown(slot)
            finally:
                self._reaping -= 1
                if self._reaping == 0:
                    self._settled.set()

        if self._tg is None:
            await self._teardown(slot)  # not serving: nobody to do it later
            return
        if self._reaping == 0:
            self._settled = anyio.Event()
        self._reaping += 1
        self._tg.start_soon(reap)

    async def settled(self) -> None:
        """Wait until every checkpointed actor's leftovers are removed."""
        if self._reaping:
            await self._settled.wait()

    async def terminate(self, actor_uid: str, *, worker_epoch: int = 0) -> None:
        if worker_epoch and worker_epoch != self.epoch:
            return  # that epoch's sandboxes died with the worker's earlier run
        async with self._lock(actor_uid):
            slot = self._slots.get(actor_uid)
            if slot is None:
                # Nothing known; still make sure no sandbox of that id is left.
                with contextlib.suppress(SubstrateError, OSError):
                    await self.runtime.terminate(sandbox_id_for(actor_uid))
                await self.network.destroy(plan_for(self.config.name, actor_uid))
                return
            await self._teardown(slot)

    async def stats(self, actor_uid: str) -> SandboxStats:
        slot = self._slots.get(actor_uid)
        if slot is None:
            raise NotFound(f"actor {actor_uid} is not on worker {self.config.name}")
        if slot.phase != _Phase.RUNNING:
            raise FailedPrecondition(f"actor {actor_uid} is {slot.phase}")
        return await self.runtime.stats(slot.spec.sandbox_id)

    # --- introspection ----------------------------------------------------------------

    def running(self) -> list[str]:
        """Uids of the actors running now."""
        return [uid for uid, s in self._slots.items() if s.phase == _Phase.RUNNING]


__all__ = [
    "DEFAULT_PROBE_TIMEOUT",
    "Egress",
    "Ingress",
    "WorkerConfig",
    "WorkloadManager",
    "next_epoch",
]
