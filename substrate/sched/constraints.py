"""What a worker must satisfy to take an actor: the filter half of scheduling.

A worker is a *candidate* for an actor when :func:`applies` (the static gates: state,
sandbox class, selectors, runtime, pinned node) and :func:`has_room` (the capacity gate)
both hold. Both are pure functions of a :class:`~substrate.core.model.Worker` record and
a :class:`Constraints` record; nothing here reads the clock, the environment or a random
source.
"""

from __future__ import annotations

from typing import Final

import attrs

from substrate.core.ids import Labels, NodeRef
from substrate.core.model import (
    Actor,
    ActorTemplate,
    Fidelity,
    Resources,
    SandboxClass,
    Snapshot,
    Worker,
    WorkerState,
)

NO_ROOM: Final = "no worker has room for the actor"
"""The description of the :class:`~substrate.errors.ResourceExhausted` a failed decision raises."""


@attrs.frozen(slots=True, kw_only=True)
class Constraints:
    """Everything the scheduler needs to know about one placement.

    ``sandbox_class``
        The class of the worker that wrote the snapshot being restored, or the template's
        class when the actor has no snapshot. Only workers of exactly this class qualify.
    ``template_selector`` / ``actor_selector``
        Equality selectors; a worker must match *both* (an empty selector matches all).
    ``required_node``
        The node the actor is pinned to (``ActorStatus.assigned_node``), or ``None``.
    ``runtime_version``
        The runtime that wrote a MEMORY snapshot being restored at MEMORY fidelity; ``""``
        for any other restore or a cold boot. A worker must be able to restore it.
    ``resources``
        The template's cpu and memory limits; the actor also needs one actor slot.
    ``preferred_node``
        The node holding the actor's local snapshot copy, or ``None``. Not a gate: workers
        there are tried first and the rest of the fleet only when none of them qualifies.
    """

    sandbox_class: SandboxClass
    template_selector: Labels = Labels()
    actor_selector: Labels = Labels()
    required_node: NodeRef | None = None
    runtime_version: str = ""
    resources: Resources = Resources()
    preferred_node: NodeRef | None = None

    def selector_items(self) -> tuple[tuple[str, str], ...]:
        """The ``(key, value)`` pairs of both selectors, de-duplicated, in a stable order.

        A worker matches both selectors iff it carries every pair returned here. If the two
        selectors require different values for one key the result holds both pairs and no
        worker can match.
        """
        t, a = self.template_selector.items, self.actor_selector.items
        if not a and len(t) <= 1:
            return t
        if not t and len(a) <= 1:
            return a
        return tuple(sorted(set(t) | set(a)))

    def unpinned(self) -> Constraints:
        """The same constraints without the node pin (used after detaching from a full node)."""
        return attrs.evolve(self, required_node=None)


def applies(worker: Worker, c: Constraints) -> bool:
    """True if ``worker`` passes every static gate of ``c`` (capacity is not considered).

    The gates: the worker is ACTIVE; its sandbox class equals ``c.sandbox_class``; the
    template selector AND the actor selector match its labels (:meth:`Labels.matches`); it
    can restore ``c.runtime_version`` (:meth:`Worker.can_restore`); and, when
    ``c.required_node`` is set, it runs on that node. ``c.preferred_node`` is not a gate.
    """
    return (
        worker.state is WorkerState.ACTIVE
        and worker.sandbox_class is c.sandbox_class
        and (c.required_node is None or worker.node == c.required_node)
        and worker.can_restore(c.runtime_version)
        and c.template_selector.matches(worker.labels)
        and c.actor_selector.matches(worker.labels)
    )


def has_room(worker: Worker, resources: Resources) -> bool:
    """True if ``worker`` can book ``resources`` plus one actor slot without over-booking.

    An unreported capacity (``worker.capacity is None``) means no room, and so does a
    capacity with zero actor slots. Otherwise the allocation after booking must stay within
    the capacity in cpu, memory and actor slots.
    """
    cap = worker.capacity
    if cap is None or cap.actors == 0:
        return False
    alloc = worker.allocated
    return (
        alloc.actors < cap.actors
        and alloc.cpu_milli + resources.cpu_milli <= cap.cpu_milli
        and alloc.memory_bytes + resources.memory_bytes <= cap.memory_bytes
    )


def has_free_slot(worker: Worker) -> bool:
    """True if ``worker`` reported a capacity with at least one unallocated actor slot.

    A necessary condition for :func:`has_room` with any resources; the fleet index keeps only
    ACTIVE workers with a free slot in its buckets.
    """
    cap = worker.capacity
    return cap is not None and worker.allocated.actors < cap.actors


def fits(worker: Worker, c: Constraints) -> bool:
    """``applies(worker, c) and has_room(worker, c.resources)``: the worker is a candidate."""
    return has_room(worker, c.resources) and applies(worker, c)


def constraints_for(
    *,
    template: ActorTemplate,
    actor: Actor,
    snapshot: Snapshot | None = None,
    restore_fidelity: Fidelity | None = None,
) -> Constraints:
    """Build the constraints for resuming ``actor`` of ``template`` (seed 000, step 3).

    ``snapshot`` is the generation that will be restored (``None`` for a cold boot) and
    ``restore_fidelity`` the fidelity it will be restored at; ``None`` means the snapshot's
    own fidelity, i.e. the highest fidelity among its copies. The runtime gate applies only
    to a MEMORY restore. The preferred node is the node of a COMPLETED local copy, if any;
    the required node is the actor's ``assigned_node``.
    """
    if snapshot is None:
        return Constraints(
            sandbox_class=template.sandbox_class,
            template_selector=template.worker_selector,
            actor_selector=actor.worker_selector,
            required_node=actor.status.assigned_node,
            resources=template.resources,
        )
    fidelity = restore_fidelity
    if fidelity is None:
        fidelity = max((s.fidelity for s in snapshot.storages), default=Fidelity.VOLUMES)
    local = snapshot.local()
    preferred = local.node if local is not None and local.completed else None
    return Constraints(
        sandbox_class=snapshot.sandbox_class,
        template_selector=template.worker_selector,
        actor_selector=actor.worker_selector,
        required_node=actor.status.assigned_node,
        runtime_version=snapshot.runtime_version if fidelity is Fidelity.MEMORY else "",
        resources=template.resources,
        preferred_node=preferred,
    )


__all__ = [
    "NO_ROOM",
    "Constraints",
    "applies",
    "constraints_for",
    "fits",
    "has_free_slot",
    "has_room",
]
