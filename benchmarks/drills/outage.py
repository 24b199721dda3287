"""Drills 1 and 2: PostgreSQL away, ateapi away — with the seed's three streams.

Both run the same way on a fresh two-node stack:

1. set up: the running actor ``e-run`` (awake), a pool of never-resumed SUSPENDED actors
   for the ``suspended`` stream (one every ``suspended_every`` seconds) and another for
   the recovery probe; ``ate proxy`` in front of ``e-run``;
2. start the three streams, wait ``LEAD`` seconds, inject the fault, keep it for the
   configured duration, heal it; the recovery probe starts the moment healing starts;
3. mark when the dependency is ready again (``pg_ctl start -w`` returned / ateapi's
   ``/readyz`` answers 200), keep the streams going ``TAIL`` seconds more;
4. afterwards: every actor settles (no -ING state) within a few reconcile periods, none is
   CRASHED, and every RUNNING actor answers 200.

Expectations (design §7): the running actor is served throughout (the router keeps using
its last-known route, which atunnel still accepts); a new resume fails with a clear 503
(``actor … unavailable: …``) within the park budget, never hangs; resumes work again
within 2 s of the dependency being ready; no actor is left in RESUMING.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Final

import anyio

from benchmarks.drills.cluster import Cluster, ClusterOptions
from benchmarks.drills.common import (
    DrillConfig,
    DrillResult,
    Progress,
    call_count,
    crashed,
    create_actors,
    drill_stack,
    list_actors,
    ref,
    setup_template,
    wait_settled,
    write_timeline,
)
from benchmarks.drills.streams import RecoveryProbe, Streams, ate_proxy, request
from benchmarks.drills.timeline import (
    Timeline,
    failed,
    fmt_s,
    median,
    status_counts,
    within,
)
from substrate.core.model import ActorState

LEAD: Final = 5.0
TAIL: Final = 12.0
RECOVERY_GOAL: Final = 2.0
PROBE_ACTORS: Final = 12


async def _outage(
    cfg: DrillConfig,
    result: DrillResult,
    cluster: Cluster,
    *,
    what: str,
    away: float,
    inject: Callable[[], Awaitable[None]],
    heal: Callable[[], Awaitable[None]],
    progress: Progress,
) -> Timeline:
    """Streams, fault, heal; the checks shared by drills 1 and 2. The timeline."""
    c = await cluster.client()
    await setup_template(c, cluster)
    run_actor = ref("e-run")
    await create_actors(c, ["e-run"])
    await call_count(cluster, run_actor)
    span = LEAD + away + TAIL + 5
    pool = [f"e-s-{i:03d}" for i in range(math.ceil(span / cfg.suspended_every) + 2)]
    suspended = await create_actors(c, pool)
    probes = await create_actors(c, [f"e-p-{i:02d}" for i in range(PROBE_ACTORS)])
    tl = Timeline(f"{result.number}-{result.key}")
    probe = RecoveryProbe(tl, cluster.router_url, probes, timeout=cfg.client_timeout)
    log = cluster.logs / "ate-proxy.log"
    with ate_proxy(cluster.state_dir, run_actor, log) as proxy:
        async with anyio.create_task_group() as tg:
            streams = Streams(tl, cluster.router_url, tg, timeout=cfg.client_timeout)
            streams.running(run_actor)
            streams.proxy(proxy.url, run_actor)
            streams.suspended(suspended, every=cfg.suspended_every)
            await anyio.sleep(LEAD)
            progress(f"{what} away for {away:g} s")
            tl.mark("fault")
            await inject()
            await anyio.sleep(away)
            tl.mark("heal")
            probe_done = anyio.Event()

            async def probing() -> None:
                await probe.run(away + 60)
                probe_done.set()

            tg.start_soon(probing)
            await heal()
            tl.mark("ready")
            progress(f"{what} ready again; probing resumes")
            with anyio.move_on_after(30):
                await probe_done.wait()
            await anyio.sleep(TAIL)
            streams.stop()
    result.files += write_timeline(cfg, tl)
    return tl


async def _after(
    cfg: DrillConfig, result: DrillResult, cluster: Cluster, tl: Timeline, *, what: str
) -> None:
    """The checks on the timeline and on the actors afterwards."""
    t_fault = tl.event("fault") or 0.0
    t_heal = tl.event("heal") or 0.0
    t_ready = tl.event("ready") or t_heal
    limit = cfg.budget + cfg.slack
    running = tl.stream("running")
    proxied = tl.stream("proxy")
    suspended = tl.stream("suspended")
    probe = tl.stream("probe")

    run_during = within(running, t_fault, t_ready)
    result.expect(
        "the running actor is served throughout",
        not failed(running),
        f"{len(run_during) - len(failed(run_during))} of {len(run_during)} served while "
        f"{what} was away; failures overall: {status_counts(failed(running))}",
    )
    result.expect(
        "through `ate proxy` too",
        not failed(proxied),
        f"{len(proxied) - len(failed(proxied))} of {len(proxied)} served; failures: "
        f"{status_counts(failed(proxied))}",
    )
    sus_during = within(suspended, t_fault, t_ready)
    bad_sus = failed(sus_during)
    unclear = [
        s for s in bad_sus if s.status != 503 or "unavailable" not in s.body or s.latency > limit
    ]
    result.expect(
        "a new resume fails with a clear 503 within the park budget",
        not unclear,
        f"{len(bad_sus)} of {len(sus_during)} failed while away: "
        f"{status_counts(bad_sus)}, median {fmt_s(median([s.latency for s in bad_sus]))}; "
        f"e.g. {bad_sus[0].body[:120]!r}"
        if bad_sus
        else f"none of {len(sus_during)} failed",
    )
    if unclear:
        result.notes.append(
            "unclear or late failures: "
            + "; ".join(
                f"t={s.sent:.1f} {s.status} {s.latency:.2f}s {s.body[:80]}" for s in unclear[:5]
            )
        )
    hangs = [s for s in tl.samples if s.latency > limit]
    result.expect(
        f"no request waits past the park budget ({cfg.budget:g} s + {cfg.slack:g} s)",
        not hangs,
        f"longest {max((s.latency for s in tl.samples), default=0):.2f} s"
        + (
            f"; {len(hangs)} past it, e.g. {hangs[0].stream} t={hangs[0].sent:.1f}" if hangs else ""
        ),
    )
    first_ok = next((s for s in probe if s.ok), None)
    answered = None if first_ok is None else first_ok.answered - t_ready
    # When the successful resume began (ateapi placed the actor): its answer minus the
    # resume's own duration (X-Ate-Resume-Duration-Seconds), i.e. without the sandbox boot.
    recovered = None
    if first_ok is not None:
        took = first_ok.resume_seconds
        recovered = max(0.0, first_ok.answered - (took or 0.0) - t_ready)
    failed_probes = "; ".join(f"{s.status} {s.body[:90]}" for s in probe if not s.ok)
    result.expect(
        f"resumes work again within {RECOVERY_GOAL:g} s of {what} being ready",
        recovered is not None and recovered <= RECOVERY_GOAL,
        f"the first successful resume began {fmt_s(recovered)} after ready and answered "
        f"{fmt_s(answered)} after it ({len(probe)} probe request(s)"
        + (f"; failed first: {failed_probes}" if failed_probes else "")
        + ")",
    )
    late = [s for s in suspended if s.sent >= t_ready + RECOVERY_GOAL and not s.ok]
    result.expect(
        "every new resume sent 2 s after ready or later succeeds",
        not late,
        status_counts(late) if late else "all 200",
    )
    # afterwards: settled, nothing crashed, every running actor answers
    async with cluster.connect() as c:
        left, took = await wait_settled(c, timeout=max(10.0, cluster.options.reconcile_every * 4))
        result.expect(
            "no actor is left in a transient state",
            not left,
            f"settled {took:.1f} s after the streams stopped" if not left else ", ".join(left),
        )
        actors = await list_actors(c)
        broken = crashed(actors)
        result.expect("no actor CRASHED", not broken, "; ".join(broken)[:400])
        awake = [str(a.ref) for a in actors if a.state is ActorState.RUNNING]
    answers = [await request(tl, "after", cluster.router_url, a, timeout=15) for a in awake]
    bad = [f"{s.actor} {s.status}" for s in answers if not s.ok]
    result.expect(
        "every RUNNING actor answers afterwards",
        not bad,
        f"{len(answers)} asked; " + ", ".join(bad),
    )
    # figures
    after_ready = [s.sent - t_ready for s in failed(suspended) if s.sent >= t_ready]
    last_failed = max(after_ready, default=None)
    result.figure(
        "running actor while away",
        f"{len(run_during) - len(failed(run_during))} of {len(run_during)} served",
        ORIGINAL[what]["running"],
    )
    result.figure(
        "new resumes while away",
        f"{len(bad_sus)} of {len(sus_during)} failed ({status_counts(bad_sus)}, "
        f"median {fmt_s(median([s.latency for s in bad_sus]))})",
        ORIGINAL[what]["resumes"],
    )
    result.figure(
        f"resumes work again after {what} ready",
        f"{fmt_s(recovered, 1)} (first one answered {fmt_s(answered, 1)} after ready)",
        ORIGINAL[what]["recovered"],
    )
    result.figure(
        "last failed resume sent after ready",
        "none after ready" if last_failed is None else fmt_s(last_failed, 1),
        ORIGINAL[what]["last_failed"],
    )
    result.figure(
        "requests through the proxy that failed",
        f"{len(failed(proxied))} of {len(proxied)}",
        ORIGINAL[what]["proxy"],
    )
    result.figure(
        "longest wait of a request",
        fmt_s(max((s.latency for s in tl.samples), default=0.0)),
        ORIGINAL[what]["longest"],
    )
    result.figure(
        "actors left in RESUMING afterwards",
        str(sum(1 for x in left if x.endswith("RESUMING"))),
        ORIGINAL[what]["stuck"],
    )


ORIGINAL: Final[dict[str, dict[str, str]]] = {
    "PostgreSQL": {
        "running": "0 of 63 served; 66 of 158 failed, each at the 9 s client timeout, then 500",
        "resumes": "19 failed (503 after 5 s, or 500 error resuming actor)",
        "recovered": "23-29 s (7 outages; worker-cache retry backed off to 30 s)",
        "last_failed": "23-29 s",
        "proxy": "64 failed",
        "longest": "9 s (the client timeout)",
        "stuck": "1-3 per outage",
    },
    "ateapi": {
        "running": "0 of 60 served; 60 of 166 failed, 503 after a median 3.01 s",
        "resumes": "12 failed, 503 within 5 s",
        "recovered": "about 5 s after the scale-up (last failure 5 s after)",
        "last_failed": "5 s",
        "proxy": "58 failed",
        "longest": "5.02 s (the park budget)",
        "stuck": "none added",
    },
}


def _options(cfg: DrillConfig, **changes: object) -> ClusterOptions:
    return cfg.cluster_options(nodes=2, max_actors=64, **changes)


async def drill_postgres(cfg: DrillConfig, progress: Progress) -> DrillResult:
    """Drill 1: the private PostgreSQL stopped (or cut by a proxy), then back."""
    result = DrillResult(1, "postgres", f"PostgreSQL away ({cfg.pg_fault}, {cfg.pg_away:g} s)")
    options = _options(cfg, pg_proxy=cfg.pg_fault != "stop")
    async with drill_stack(cfg, result, "1-postgres", options, progress) as cluster:
        pg = cluster.pg
        assert pg is not None

        async def inject() -> None:
            if cluster.pg_proxy is not None:
                await anyio.to_thread.run_sync(cluster.pg_proxy.set_mode, cfg.pg_fault)
            else:
                await anyio.to_thread.run_sync(pg.stop)

        async def heal() -> None:
            if cluster.pg_proxy is not None:
                await anyio.to_thread.run_sync(cluster.pg_proxy.set_mode, "pass")
            else:
                took = await anyio.to_thread.run_sync(pg.start)
                result.notes.append(f"pg_ctl start took {took:.2f} s")

        tl = await _outage(
            cfg,
            result,
            cluster,
            what="PostgreSQL",
            away=cfg.pg_away,
            inject=inject,
            heal=heal,
            progress=progress,
        )
        await _after(cfg, result, cluster, tl, what="PostgreSQL")
    return result


async def drill_ateapi(cfg: DrillConfig, progress: Progress) -> DrillResult:
    """Drill 2: ateapi stopped (SIGTERM, like a scale-down), then started again."""
    result = DrillResult(2, "ateapi", f"ateapi away ({cfg.api_away:g} s)")
    async with drill_stack(cfg, result, "2-ateapi", _options(cfg), progress) as cluster:

        async def inject() -> None:
            forced = await cluster.stop_ateapi()
            if forced:
                result.notes.append("ateapi needed SIGKILL to stop")

        async def heal() -> None:
            took = await cluster.start_ateapi()
            result.notes.append(f"ateapi answered /readyz {took:.2f} s after its start")

        tl = await _outage(
            cfg,
            result,
            cluster,
            what="ateapi",
            away=cfg.api_away,
            inject=inject,
            heal=heal,
            progress=progress,
        )
        await _after(cfg, result, cluster, tl, what="ateapi")
    return result


__all__ = ["drill_ateapi", "drill_postgres"]
