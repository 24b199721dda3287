"""Drill 3: the object store away — connections refused, then packets "dropped".

The S3 server (moto) sits behind a TCP proxy; the drill switches the proxy to ``refuse``
(nothing listens, open connections reset) and, in a second pass with fresh actors, to
``blackhole`` (connections accepted, no byte moves until the store is back). In each pass,
set up while the store answers:

* ``<m>-run``: RUNNING, one request a second throughout (the running stream);
* ``<m>-sync``: RUNNING, counter at 2 — suspended with ``mode=sync`` during the outage;
* ``<m>-async``: RUNNING, counter at 2 — suspended in the default (async) mode during it;
* ``<m>-bucket``: counter at 3, suspended SYNC on node-1, then its worker selector moved to
  node-2, so its only usable copy is the one in the bucket.

Expectations (design §7 and the issue): the running actor is served; the SYNC suspend
fails (the *suspend*, not the actor) and the actor stays RUNNING or SUSPENDED with its
local copy kept — never CRASHED — and loses nothing (its next request counts on); the
async suspend succeeds with the durable copy PENDING, uploaded after the store returns;
the bucket-only actor answers 503 within the park budget (never a 500, never a hang,
never CRASHED) and resumes with its state, without a revert, once the store is back.
"""

from __future__ import annotations

import time
from typing import Final

import anyio

from benchmarks.drills.cluster import Cluster
from benchmarks.drills.common import (
    DrillConfig,
    DrillResult,
    Progress,
    call_count,
    count_of,
    crashed,
    create_actors,
    drill_stack,
    durable_state,
    list_actors,
    ref,
    setup_template,
    wait_for,
    wait_settled,
    worker_of,
    write_timeline,
)
from benchmarks.drills.streams import Streams, request
from benchmarks.drills.timeline import Sample, Timeline, failed, fmt_s, status_counts
from substrate.core.model import ActorState, SuspendMode
from substrate.errors import SubstrateError

LEAD: Final = 3.0
AFTER_LIMIT: Final = 90.0

ORIGINAL: Final = {
    "refuse": {
        "running": "200 in 0.06 s",
        "sync": "the call fails after 4.28 s; the actor is CRASHED, 2 calls lost after a revert",
        "async": "0.31 s, snapshot PENDING on the node; upload after the return not recorded",
        "bucket": "500 after 4.11 s, the actor CRASHED",
        "bucket_after": "503 on 22 of 22 requests until a revert, then 200",
    },
    "blackhole": {
        "running": "not recorded (200, 2 of 2 with 200 MiB)",
        "sync": "the call fails after 126.3 s (103.05 s with 200 MiB); the actor is CRASHED",
        "async": "not recorded (0.70 s with 200 MiB)",
        "bucket": "504 after 10.05 s, the actor stays RESUMING",
        "bucket_after": "200 in 0.63 s with no command (one run); 503 until a revert (another)",
    },
}


async def _pass(
    cfg: DrillConfig, result: DrillResult, cluster: Cluster, mode: str, progress: Progress
) -> None:
    assert cluster.s3_proxy is not None
    m = mode[0]
    c = await cluster.client()
    limit = cfg.budget + cfg.slack
    run_a, sync_a, async_a, bucket_a = (ref(f"{m}-{x}") for x in ("run", "sync", "async", "bucket"))
    await create_actors(c, [f"{m}-run", f"{m}-sync", f"{m}-async"])
    await create_actors(c, [f"{m}-bucket"], selector={"node": "node-1"})
    for a in (run_a, sync_a, sync_a, async_a, async_a, bucket_a, bucket_a, bucket_a):
        await call_count(cluster, a)
    await c.suspend_actor(bucket_a, SuspendMode.SYNC)
    await c.update_actor_selector(bucket_a, {"node": "node-2"})
    tl = Timeline(f"3-bucket-{mode}")
    async with anyio.create_task_group() as tg:
        streams = Streams(tl, cluster.router_url, tg, timeout=cfg.client_timeout)
        streams.running(run_a)
        await anyio.sleep(LEAD)
        progress(f"bucket away ({mode}) for {cfg.bucket_away:g} s")
        t_fault = tl.mark(f"bucket {mode}")
        await anyio.to_thread.run_sync(cluster.s3_proxy.set_mode, mode)

        # a SYNC suspend while the bucket is away
        sync_error = ""
        started = time.monotonic()
        try:
            await c.suspend_actor(sync_a, SuspendMode.SYNC)
        except SubstrateError as exc:
            sync_error = f"{exc.code.name}: {exc.description}"
        sync_s = time.monotonic() - started
        sync_state = await c.get_actor(sync_a)
        tl.mark(f"sync suspend returned ({sync_s:.2f} s)")
        # the default (async) suspend
        started = time.monotonic()
        async_error = ""
        try:
            after_async = await c.suspend_actor(async_a, SuspendMode.ASYNC)
        except SubstrateError as exc:
            async_error = f"{exc.code.name}: {exc.description}"
            after_async = await c.get_actor(async_a)
        async_s = time.monotonic() - started
        # the actor whose only copy is in the bucket
        bucket_during = await request(tl, "bucket-only", cluster.router_url, bucket_a)
        bucket_state_during = (await c.get_actor(bucket_a)).state
        # the SYNC-suspended actor loses nothing
        sync_next = await request(tl, "sync-actor", cluster.router_url, sync_a)
        left = t_fault + cfg.bucket_away - tl.now()
        await anyio.sleep(max(0.0, left))
        t_heal = tl.mark("bucket back")
        await anyio.to_thread.run_sync(cluster.s3_proxy.set_mode, "pass")
        progress("bucket back")

        async def uploaded() -> str | None:
            a = await c.get_actor(async_a)
            return "done" if durable_state(a) == "COMPLETED" else None

        upload_s: float | None
        try:
            _, upload_s = await wait_for("the pending upload", uploaded, timeout=AFTER_LIMIT)
        except TimeoutError:
            upload_s = None
        # the bucket-only actor resumes, with no revert
        first_ok: Sample | None = None
        bucket_after: list[Sample] = []
        deadline = time.monotonic() + AFTER_LIMIT
        while time.monotonic() < deadline:
            s = await request(tl, "bucket-only", cluster.router_url, bucket_a)
            bucket_after.append(s)
            if s.ok:
                first_ok = s
                break
            await anyio.sleep(1.0)
        async_next = await request(tl, "async-actor", cluster.router_url, async_a)
        await anyio.sleep(2.0)
        streams.stop()
    result.files += write_timeline(cfg, tl)

    # --- checks --------------------------------------------------------------------
    name = f"[{mode}]"
    run = tl.stream("running")
    result.expect(
        f"{name} the running actor is served",
        not failed(run),
        f"{len(run) - len(failed(run))} of {len(run)} answered 200; {status_counts(failed(run))}",
    )
    kept = sync_state.state is ActorState.RUNNING or (
        sync_state.state is ActorState.SUSPENDED and durable_state(sync_state) != "COMPLETED"
    )
    result.expect(
        f"{name} a SYNC suspend fails the suspend, not the actor",
        bool(sync_error) and kept,
        f"{sync_s:.2f} s, {sync_error or 'it succeeded'}; the actor is {sync_state.state.name}"
        f" (durable copy {durable_state(sync_state)})",
    )
    result.expect(
        f"{name} the SYNC-suspended actor loses nothing",
        sync_next.ok and count_of(sync_next.body) == 3,
        f"next request {sync_next.status} in {sync_next.latency:.2f} s: {sync_next.body[:60]}",
    )
    result.expect(
        f"{name} an ASYNC suspend succeeds with the snapshot PENDING",
        not async_error
        and after_async.state is ActorState.SUSPENDED
        and durable_state(after_async) == "PENDING",
        f"{async_s:.2f} s, {async_error or after_async.state.name}, durable copy "
        f"{durable_state(after_async)}",
    )
    result.expect(
        f"{name} the pending snapshot is uploaded after the store returns",
        upload_s is not None,
        f"COMPLETED {fmt_s(upload_s)} after the store was back",
    )
    result.expect(
        f"{name} the async-suspended actor loses nothing",
        async_next.ok and count_of(async_next.body) == 3,
        f"{async_next.status} {async_next.body[:60]} {async_next.note}",
    )
    result.expect(
        f"{name} the bucket-only actor gets a 503 within the park budget, not a crash",
        bucket_during.status == 503
        and bucket_during.latency <= limit
        and bucket_state_during is not ActorState.CRASHED,
        f"{bucket_during.status} after {bucket_during.latency:.2f} s "
        f"({bucket_during.body[:100]!r}); then {bucket_state_during.name}",
    )
    result.expect(
        f"{name} it resumes with its state once the store is back, without a revert",
        first_ok is not None and count_of(first_ok.body) == 4,
        (
            f"200 {first_ok.answered - t_heal:.1f} s after the store was back "
            f"({len(bucket_after)} request(s), {first_ok.note}): {first_ok.body[:40]}"
            if first_ok is not None
            else f"no 200 in {AFTER_LIMIT:g} s: {status_counts(bucket_after)}"
        ),
    )
    # --- figures -------------------------------------------------------------------
    o = ORIGINAL[mode]
    result.figure(
        f"{name} running actor",
        f"{len(run) - len(failed(run))} of {len(run)} served, median "
        f"{fmt_s(sorted(s.latency for s in run)[len(run) // 2] if run else None, 3)}",
        o["running"],
    )
    result.figure(
        f"{name} suspend --mode sync",
        f"fails after {sync_s:.2f} s; actor {sync_state.state.name}, next request "
        f"{sync_next.status} with nothing lost",
        o["sync"],
    )
    result.figure(
        f"{name} suspend (async)",
        f"{async_s:.2f} s, durable {durable_state(after_async)}; uploaded "
        f"{fmt_s(upload_s, 1)} after the store was back",
        o["async"],
    )
    result.figure(
        f"{name} bucket-only actor while away",
        f"{bucket_during.status} after {bucket_during.latency:.2f} s, {bucket_state_during.name}",
        o["bucket"],
    )
    result.figure(
        f"{name} bucket-only actor after the return",
        (
            f"200 {first_ok.answered - t_heal:.1f} s after, no command, count kept"
            if first_ok
            else "not served"
        ),
        o["bucket_after"],
    )
    result.notes.append(
        f"[{mode}] workers: run {worker_of(await c.get_actor(run_a))}, "
        f"bucket-only ended on {worker_of(await c.get_actor(bucket_a))}"
    )


async def drill_bucket(cfg: DrillConfig, progress: Progress) -> DrillResult:
    result = DrillResult(
        3, "bucket", f"object store away (refused, dropped; {cfg.bucket_away:g} s)"
    )
    options = cfg.cluster_options(nodes=2, max_actors=16)
    async with drill_stack(cfg, result, "3-bucket", options, progress) as cluster:
        c = await cluster.client()
        await setup_template(c, cluster)
        for mode in ("refuse", "blackhole"):
            await _pass(cfg, result, cluster, mode, progress)
        left, _ = await wait_settled(c, timeout=20)
        result.expect("no actor is left in a transient state", not left, ", ".join(left))
        broken = crashed(await list_actors(c))
        result.expect("no actor CRASHED", not broken, "; ".join(broken)[:400])
    return result


__all__ = ["drill_bucket"]
