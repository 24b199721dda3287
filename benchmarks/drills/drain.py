"""Drill 5: a drained worker.

Two nodes, one worker each. ``d-run`` (one request a second throughout, the ``running``
stream) and ``d-quiet`` (counter at 2, no traffic) run on node-1's worker; ``d-other``
runs on node-2's. After ``drain_after`` seconds the drill drains node-1's worker
(``DrainWorker``, what ``ate drain worker`` sends) and keeps the stream going as long
again.

Expectations (design §7): the drain suspends the worker's running actors (SYNC) instead of
crashing them; each answers its next request from the other worker with its state — the
stream's counter goes on without a gap and every request is answered within the park
budget; the drained worker takes no new actor; ``d-other`` is not disturbed.
"""

from __future__ import annotations

import itertools
import time
from typing import Final

import anyio

from benchmarks.drills.cluster import Cluster
from benchmarks.drills.common import (
    DrillConfig,
    DrillResult,
    Progress,
    count_of,
    crashed,
    create_actors,
    drill_stack,
    durable_state,
    list_actors,
    place_running,
    ref,
    setup_template,
    wait_settled,
    worker_of,
    write_timeline,
)
from benchmarks.drills.streams import Streams, request
from benchmarks.drills.timeline import Timeline, failed, fmt_s, status_counts, within
from substrate.core.model import ActorState, WorkerState

LEAD: Final = 3.0

ORIGINAL: Final = {
    "running": "46 of 62 requests failed (503 from 0.4 s, AssignWorker prerequisite not met); "
    "CRASHED within 7 s; one revert needed; 6 calls lost",
    "quiet": "a running actor with no traffic: CRASHED, revert, the calls since the last "
    "durable snapshot lost",
    "suspended": "suspended actors: 200 on the first request, 0.49-1.19 s, on the other node",
    "drain": "kubectl drain returned in 1.2-2.2 s",
}


async def drill_drain(cfg: DrillConfig, progress: Progress) -> DrillResult:
    result = DrillResult(5, "drain", "a drained worker")
    options = cfg.cluster_options(nodes=2, max_actors=16)
    async with drill_stack(cfg, result, "5-drain", options, progress) as cluster:
        await _run(cfg, result, cluster, progress)
    return result


async def _run(cfg: DrillConfig, result: DrillResult, cluster: Cluster, progress: Progress) -> None:
    c = await cluster.client()
    await setup_template(c, cluster)
    drained = cluster.workers_of("node-1")[0]
    other = cluster.workers_of("node-2")[0]
    await place_running(c, cluster, ["d-run", "d-quiet"], "node-1", calls=2)
    await place_running(c, cluster, ["d-other"], "node-2", calls=2)
    limit = cfg.budget + cfg.slack
    tl = Timeline("5-drain")
    async with anyio.create_task_group() as tg:
        streams = Streams(tl, cluster.router_url, tg, timeout=cfg.client_timeout)
        streams.running(ref("d-run"))
        await anyio.sleep(LEAD + cfg.drain_after)
        progress(f"draining {drained}")
        t_drain = tl.mark("drain")
        t0 = time.monotonic()
        drained_worker = await c.drain_worker(drained)
        drain_s = time.monotonic() - t0
        tl.mark(f"drain returned ({drain_s:.2f} s)")
        after_drain = {a: await c.get_actor(ref(a)) for a in ("d-run", "d-quiet", "d-other")}
        quiet = await request(tl, "quiet", cluster.router_url, ref("d-quiet"))
        other_next = await request(tl, "other", cluster.router_url, ref("d-other"))
        await create_actors(c, ["d-new"])
        fresh = await request(tl, "new", cluster.router_url, ref("d-new"))
        await anyio.sleep(cfg.drain_after)
        streams.stop()
    result.files += write_timeline(cfg, tl)

    run = tl.stream("running")
    result.expect(
        "the drain suspends the running actors (not CRASHED)",
        after_drain["d-quiet"].state is ActorState.SUSPENDED
        and after_drain["d-run"].state is not ActorState.CRASHED,
        f"d-run {after_drain['d-run'].state.name}, d-quiet {after_drain['d-quiet'].state.name} "
        f"(durable copy {durable_state(after_drain['d-quiet'])}); drain took {drain_s:.2f} s",
    )
    q_now = await c.get_actor(ref("d-quiet"))
    result.expect(
        "a drained actor answers its next request from another worker, with its state",
        quiet.ok and count_of(quiet.body) == 3 and worker_of(q_now) == other,
        f"{quiet.status} in {quiet.latency:.2f} s: {quiet.body[:40]} on {worker_of(q_now)} "
        f"({quiet.note})",
    )
    counts = [count_of(s.body) for s in run if s.ok]
    ordered = sorted(k for k in counts if k is not None)
    gaps = [b for a, b in itertools.pairwise(ordered) if b != a + 1]
    result.expect(
        "the actor under traffic keeps its count across the drain (nothing lost)",
        not gaps and len(ordered) == len(run),
        f"counts {ordered[0] if ordered else '—'}…{ordered[-1] if ordered else '—'}, "
        f"gaps at {gaps[:5]}"
        if gaps
        else f"{len(ordered)} consecutive counts",
    )
    result.expect(
        "every request is answered 200 within the park budget",
        not failed(run) and all(s.latency <= limit for s in run),
        f"{len(failed(run))} of {len(run)} failed ({status_counts(failed(run))}); longest "
        f"{max((s.latency for s in run), default=0):.2f} s",
    )
    r_now = await c.get_actor(ref("d-run"))
    result.expect(
        "the actor under traffic now runs on the other worker",
        worker_of(r_now) == other,
        f"on {worker_of(r_now) or r_now.state.name}",
    )
    n_now = await c.get_actor(ref("d-new"))
    result.expect(
        "the drained worker takes no new actor",
        fresh.ok and worker_of(n_now) == other,
        f"a new actor went to {worker_of(n_now)} ({fresh.status})",
    )
    result.expect(
        "the other worker's actor is not disturbed",
        other_next.ok
        and after_drain["d-other"].state is ActorState.RUNNING
        and count_of(other_next.body) == 3,
        f"{other_next.status} {other_next.body[:30]}",
    )
    workers = {w.ref.name: w for w in await c.list_workers()}
    w = workers.get(drained)
    result.expect(
        "the drained worker is DRAINING and empty",
        w is not None and w.state is WorkerState.DRAINING and w.allocated.actors == 0,
        f"{w.state.name if w else '?'} with {w.allocated.actors if w else '?'} actor(s); the "
        f"drain call answered {drained_worker.state.name}",
    )
    left, _ = await wait_settled(c, timeout=15)
    result.expect("no actor is left in a transient state", not left, ", ".join(left))
    broken = crashed(await list_actors(c))
    result.expect("no actor CRASHED", not broken, "; ".join(broken)[:400])

    during = within(run, t_drain, t_drain + drain_s + cfg.budget)
    result.figure(
        "actor under traffic during the drain",
        f"{len(failed(run))} of {len(run)} failed; {len(during)} sent in the drain's "
        f"window, longest {max((s.latency for s in during), default=0):.2f} s; nothing lost",
        ORIGINAL["running"],
    )
    result.figure(
        "running actor with no traffic",
        f"SUSPENDED by the drain; next request 200 in {quiet.latency:.2f} s on the other "
        "worker, count kept",
        ORIGINAL["quiet"],
    )
    result.figure("the drain call", fmt_s(drain_s), ORIGINAL["drain"])


__all__ = ["drill_drain"]
