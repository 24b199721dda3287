"""The seed's three request streams, and the probes that time a recovery.

* ``running``: one request a second to one RUNNING actor, through the router.
* ``suspended``: every ``every`` seconds (5 by default) the first request to another
  SUSPENDED actor, so each needs a full resume.
* ``proxy``: one request a second to the running actor through ``ate proxy`` (a local
  port of the ``ate`` CLI, started as a process: :class:`AteProxy`).

Each tick starts its request in a task of its own, as a client with a timer would: a slow
answer never delays the next request. A request gets ``client_timeout`` seconds; no
answer by then is status 0 (the seed's ``000``).

:class:`RecoveryProbe` times how soon resumes work again after a fault is healed: it
keeps exactly one request to a never-resumed actor in flight (a new actor for each try)
until one answers 200. The router parks each try and retries it every few hundred
milliseconds, so the first 200 arrives within a fraction of a second of the moment
resumes work again.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import attrs

from benchmarks.drills.faults import free_port
from benchmarks.drills.timeline import Sample, Timeline
from substrate.client.http import call_actor
from substrate.errors import SubstrateError

ROOT: Final = Path(__file__).resolve().parents[2]
CLIENT_TIMEOUT: Final = 15.0


async def request(
    tl: Timeline,
    stream: str,
    url: str,
    actor: str,
    *,
    timeout: float = CLIENT_TIMEOUT,  # noqa: ASYNC109
    path: str = "/",
) -> Sample:
    """One GET through ``url`` (the router, or an ``ate proxy`` port), recorded."""
    sent = tl.now()
    started = time.perf_counter()
    try:
        answer = await call_actor(url, actor, path, timeout=timeout)
    except SubstrateError as exc:
        sample = Sample(
            stream=stream,
            actor=actor,
            sent=sent,
            status=0,
            latency=time.perf_counter() - started,
            body=f"{exc.code.name}: {exc.description}",
        )
    else:
        note = answer.restored_from or ""
        if note:
            note = f"restored-from={note} resume={answer.header('x-ate-resume-duration-seconds')}"
        sample = Sample(
            stream=stream,
            actor=actor,
            sent=sent,
            status=answer.status,
            latency=answer.elapsed,
            body=answer.text.strip().splitlines()[0] if answer.text.strip() else "",
            note=note,
        )
    tl.add(sample)
    return sample


@attrs.define
class Streams:
    """Runs the streams in a task group until :meth:`stop`."""

    tl: Timeline
    router: str
    tg: anyio.abc.TaskGroup
    timeout: float = CLIENT_TIMEOUT
    stopped: anyio.Event = attrs.Factory(anyio.Event)

    def stop(self) -> None:
        self.stopped.set()

    def running(self, actor: str, *, every: float = 1.0, name: str = "running") -> None:
        self.tg.start_soon(self._tick, name, self.router, lambda: actor, every)

    def proxy(self, url: str, actor: str, *, every: float = 1.0) -> None:
        self.tg.start_soon(self._tick, "proxy", url, lambda: actor, every)

    def suspended(self, actors: list[str], *, every: float = 5.0) -> None:
        pool = iter(actors)

        def next_actor() -> str | None:
            return next(pool, None)

        self.tg.start_soon(self._tick, "suspended", self.router, next_actor, every)

    async def _tick(
        self, name: str, url: str, target: Callable[[], str | None], every: float
    ) -> None:
        start = time.monotonic()
        n = 0
        while not self.stopped.is_set():
            actor = target()
            if actor is None:
                return  # the pool ran dry
            self.tg.start_soon(self._one, name, url, actor)
            n += 1
            with anyio.move_on_after(max(0.0, start + n * every - time.monotonic())):
                await self.stopped.wait()

    async def _one(self, name: str, url: str, actor: str) -> None:
        await request(self.tl, name, url, actor, timeout=self.timeout)


@attrs.define
class RecoveryProbe:
    """One request at a time, each to a fresh SUSPENDED actor, until one answers 200."""

    tl: Timeline
    router: str
    actors: list[str]
    timeout: float = CLIENT_TIMEOUT
    first_ok: Sample | None = None
    tries: int = 0

    async def run(self, limit: float) -> Sample | None:
        """Probe for at most ``limit`` seconds; the first 200 (None if none came)."""
        with anyio.move_on_after(limit):
            for actor in self.actors:
                self.tries += 1
                sample = await request(self.tl, "probe", self.router, actor, timeout=self.timeout)
                if sample.ok:
                    self.first_ok = sample
                    return sample
                await anyio.sleep(0.05)
        return None


class AteProxy:
    """``ate proxy <actor> --port P`` as a process, for the proxy stream."""

    def __init__(self, state_dir: Path, actor: str, log: Path) -> None:
        self.state_dir = state_dir
        self.actor = actor
        self.port = free_port()
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "substrate.cli",
                    "--state-dir",
                    str(self.state_dir),
                    "proxy",
                    self.actor,
                    "--port",
                    str(self.port),
                ],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ate proxy exited: {self.log.read_text()[-2000:]}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError(f"ate proxy did not listen on {self.port}")

    def stop(self) -> None:
        p = self.process
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.process = None


@contextlib.contextmanager
def ate_proxy(state_dir: Path, actor: str, log: Path) -> Iterator[AteProxy]:
    proxy = AteProxy(state_dir, actor, log)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


__all__ = ["AteProxy", "RecoveryProbe", "Streams", "ate_proxy", "request"]
