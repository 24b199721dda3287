"""Factories and hypothesis strategies shared by the scheduler tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction

from hypothesis import strategies as st

from substrate.core.ids import Labels, NodeRef, WorkerRef
from substrate.core.model import (
    Capacity,
    Metadata,
    Resources,
    SandboxClass,
    Worker,
    WorkerState,
)
from substrate.sched import Constraints

GIB = 1 << 30
NODES = ("node-a", "node-b", "node-c")
LABEL_KEYS = ("zone", "tier")
LABEL_VALUES = ("x", "y")
RUNTIMES = ("rt1", "rt2")
DEFAULT_CAP = Capacity(cpu_milli=8000, memory_bytes=16 * GIB, actors=8)
NOTHING = Capacity()


def worker(
    name: str = "w-0",
    *,
    node: str = "node-a",
    sandbox_class: SandboxClass = SandboxClass.GVISOR,
    state: WorkerState = WorkerState.ACTIVE,
    labels: Mapping[str, str] | None = None,
    capacity: Capacity | None = DEFAULT_CAP,
    allocated: Capacity = NOTHING,
    runtimes: Iterable[str] = (),
    version: int = 1,
) -> Worker:
    return Worker(
        ref=WorkerRef(name),
        metadata=Metadata(uid=f"uid-{name}", version=version),
        node=NodeRef(node),
        sandbox_class=sandbox_class,
        state=state,
        labels=Labels(labels or {}),
        capacity=capacity,
        allocated=allocated,
        runtime_versions=frozenset(runtimes),
    )


def constraints(
    *,
    sandbox_class: SandboxClass = SandboxClass.GVISOR,
    template_selector: Mapping[str, str] | None = None,
    actor_selector: Mapping[str, str] | None = None,
    required_node: str | None = None,
    preferred_node: str | None = None,
    runtime_version: str = "",
    cpu_milli: int = 500,
    memory_bytes: int = GIB,
) -> Constraints:
    return Constraints(
        sandbox_class=sandbox_class,
        template_selector=Labels(template_selector or {}),
        actor_selector=Labels(actor_selector or {}),
        required_node=NodeRef(required_node) if required_node else None,
        preferred_node=NodeRef(preferred_node) if preferred_node else None,
        runtime_version=runtime_version,
        resources=Resources(cpu_milli=cpu_milli, memory_bytes=memory_bytes),
    )


# --- strategies -------------------------------------------------------------------------

label_maps = st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(LABEL_VALUES), max_size=2)

sandbox_classes = st.sampled_from(
    (SandboxClass.GVISOR, SandboxClass.GVISOR, SandboxClass.GVISOR, SandboxClass.MICROVM)
)
worker_states = st.sampled_from(
    (WorkerState.ACTIVE,) * 4 + (WorkerState.DRAINING, WorkerState.UNAVAILABLE)
)


CAPACITY_CHOICES = (
    Capacity(cpu_milli=16000, memory_bytes=32 * GIB, actors=16),
    Capacity(cpu_milli=12000, memory_bytes=24 * GIB, actors=12),
    Capacity(cpu_milli=4000, memory_bytes=8 * GIB, actors=4),
    Capacity(cpu_milli=8000, memory_bytes=4 * GIB, actors=6),
    Capacity(cpu_milli=2000, memory_bytes=2 * GIB, actors=1),
    Capacity(cpu_milli=8000, memory_bytes=16 * GIB, actors=0),
    Capacity(cpu_milli=0, memory_bytes=0, actors=3),
    None,
)
RUNTIME_CHOICES: tuple[frozenset[str], ...] = (
    frozenset(),
    frozenset({"rt1"}),
    frozenset({"rt2"}),
    frozenset(RUNTIMES),
)
capacities = st.sampled_from(CAPACITY_CHOICES)
fractions = st.sampled_from((0, 0, 1, 2, 4))  # quarters of the capacity allocated


@st.composite
def allocations_within(draw: st.DrawFn, cap: Capacity) -> Capacity:
    """An allocation within ``cap``: whole quarters of each dimension."""
    return Capacity(
        cpu_milli=cap.cpu_milli * draw(fractions) // 4,
        memory_bytes=cap.memory_bytes * draw(fractions) // 4,
        actors=cap.actors * draw(fractions) // 4,
    )


@st.composite
def workers(draw: st.DrawFn, name: str | None = None, version: int = 1) -> Worker:
    cap = draw(capacities)
    alloc = Capacity() if cap is None else draw(allocations_within(cap))
    return worker(
        name if name is not None else f"w-{draw(st.integers(0, 10_000))}",
        node=draw(st.sampled_from(NODES)),
        sandbox_class=draw(sandbox_classes),
        state=draw(worker_states),
        labels=draw(label_maps),
        capacity=cap,
        allocated=alloc,
        runtimes=draw(st.sampled_from(RUNTIME_CHOICES)),
        version=version,
    )


@st.composite
def fleets(draw: st.DrawFn, min_size: int = 0, max_size: int = 14) -> list[Worker]:
    n = draw(st.integers(min_size, max_size))
    return [draw(workers(name=f"w-{i}")) for i in range(n)]


selectors = st.sampled_from(
    ({},) * 6 + ({"zone": "x"}, {"tier": "y"}, {"zone": "x", "tier": "x"}, {"zone": "y"})
)


@st.composite
def any_constraints(draw: st.DrawFn) -> Constraints:
    """Constraints biased towards the common case (few gates) so that candidates exist."""
    return constraints(
        sandbox_class=draw(sandbox_classes),
        template_selector=draw(selectors),
        actor_selector=draw(selectors),
        required_node=draw(st.sampled_from((None, None, None, NODES[0]))),
        preferred_node=draw(st.sampled_from((None, *NODES))),
        runtime_version=draw(st.sampled_from(("", "", "", "rt1"))),
        cpu_milli=draw(st.sampled_from((0, 500, 1000, 3000))),
        memory_bytes=draw(st.sampled_from((0, GIB, 3 * GIB))),
    )


# --- an independent load-order oracle ----------------------------------------------------

INF = Fraction(10**30)


def _share(num: int, den: int) -> Fraction:
    if den == 0:
        return INF if num else Fraction(0)
    return Fraction(num, den)


def oracle_key(w: Worker) -> tuple[Fraction, Fraction, int, str]:
    """The documented load order, computed with exact fractions."""
    cap = w.capacity
    if cap is None:
        return (INF, INF, w.allocated.actors, w.ref.name)
    slots = INF if cap.actors == 0 else Fraction(w.allocated.actors, cap.actors)
    dominant = max(
        _share(w.allocated.cpu_milli, cap.cpu_milli),
        _share(w.allocated.memory_bytes, cap.memory_bytes),
    )
    return (slots, dominant, w.allocated.actors, w.ref.name)


@st.composite
def loaded_workers(draw: st.DrawFn, name: str) -> Worker:
    cap = Capacity(
        cpu_milli=draw(st.integers(1, 10**6)),
        memory_bytes=draw(st.integers(1, 1 << 40)),
        actors=draw(st.integers(1, 300)),
    )
    alloc = Capacity(
        cpu_milli=draw(st.integers(0, cap.cpu_milli)),
        memory_bytes=draw(st.integers(0, cap.memory_bytes)),
        actors=draw(st.integers(0, cap.actors)),
    )
    return worker(name, capacity=cap, allocated=alloc)
