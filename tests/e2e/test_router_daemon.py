"""The router daemon as a real process: flags, admin pages, and draining on SIGTERM.

ateapi (a scripted grpclib servicer over mTLS) and a worker's atunnel (real, with a
FakeSandboxRuntime workload) run in the test process; the router is ``python -m
daemons.router``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from urllib.request import urlopen

import anyio
import pytest

from daemons.router import settings as router_settings
from substrate.adapters.memory import FakeSandboxRuntime
from substrate.cli.daemon_args import router_argv
from substrate.cli.stack import free_port
from substrate.core.ids import ActorRef
from substrate.core.model import ResumeResult
from substrate.errors import ResourceExhausted
from substrate.services.atunnel import Atunnel, atunnel_server_context
from tests.services.test_router_stack import (
    HOST,
    TRUST_DOMAIN,
    FakeAteapi,
    Stack,
    get,
    make_pki,
    serve_ateapi,
)

ROOT = Path(__file__).resolve().parents[2]
A = ActorRef("team-a", "alpha")
NO_ROOM = "no worker has room for the actor"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- flags ------------------------------------------------------------------------------------


def test_defaults_follow_seed_001() -> None:
    s = router_settings.parse(["--tls-dir=/tmp/x"])
    parking = s.router.parking
    assert (parking.budget, parking.max_parked) == (5.0, 1024)
    assert (parking.retry_interval, parking.retry_factor, parking.retry_jitter) == (0.1, 1.1, 0.1)
    assert s.router.effective_drain_timeout == 10.0  # derived: budget + 5 s
    assert s.router.cache_ttl == 5.0
    assert s.redacted()["drain_timeout"] == 10.0


def test_durations_and_explicit_values() -> None:
    s = router_settings.parse(
        [
            "--tls-dir=/tmp/x",
            "--parked-request-budget=2.5s",
            "--parked-request-retry-interval=250ms",
            "--parked-request-max=0",
            "--drain-timeout=1m",
            "--cache-ttl=0",
        ]
    )
    assert s.router.parking.budget == 2.5
    assert s.router.parking.retry_interval == 0.25
    assert not s.router.parking.enabled
    assert s.router.effective_drain_timeout == 60.0
    assert s.router.cache_ttl == 0.0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--parked-request-retry-factor=0.9"], "retry_factor must be >= 1"),
        (["--parked-request-retry-jitter=1"], "retry_jitter must be in [0, 1)"),
        (["--parked-request-retry-jitter=-0.1"], "retry_jitter must be in [0, 1)"),
        (["--parked-request-budget=0s"], "budget must be greater than 0"),
        (["--parked-request-max=-1"], "max_parked must be an integer >= 0"),
        (["--drain-timeout=4s"], "drain timeout must be >= the park budget (5s)"),
        (["--parked-request-budget=8s", "--drain-timeout=7s"], "park budget (8s)"),
        (["--parked-request-budget=5x"], "bad duration"),
        (["--cache-ttl=-1s"], "bad duration"),
        (["--ateapi-timeout=0"], "--ateapi-timeout must be > 0"),
    ],
)
def test_bad_flags_are_refused(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        router_settings.parse(["--tls-dir=/tmp/x", *flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_process_refuses_bad_flags_before_serving(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "daemons.router",
            f"--tls-dir={tmp_path}",
            "--parked-request-budget=5s",
            "--drain-timeout=1s",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "drain timeout must be >= the park budget" in done.stderr


# --- the process ------------------------------------------------------------------------------


def fetch(url: str) -> str:
    with urlopen(url, timeout=2) as r:
        return str(r.read().decode())


def wait_http(url: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            return fetch(url)
        except OSError as exc:
            last = str(exc)
            time.sleep(0.05)
    raise AssertionError(f"{url} never answered: {last}")


def refuses(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return False
    except OSError:
        return True


@contextmanager
def router_process(
    tmp: Path, tls_dir: Path, ateapi: str, *flags: str
) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    port, admin = free_port(), free_port()
    log = open(tmp / "router.log", "ab")  # noqa: SIM115 (closed below, after the process)
    argv = router_argv(
        listen=f"{HOST}:{port}",
        admin_listen=f"{HOST}:{admin}",
        ateapi_address=ateapi,
        tls_dir=tls_dir,
        trust_domain=TRUST_DOMAIN,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", *argv, *flags],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        yield proc, port, admin
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        log.close()


@pytest.mark.e2e
@pytest.mark.anyio
async def test_sigterm_drains_a_parked_request_then_exits(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "tls")
    fake = FakeAteapi()
    capacity = anyio.Event()
    async with AsyncExitStack() as es:
        serving = await es.enter_async_context(serve_ateapi(pki, fake))
        runtime = await es.enter_async_context(FakeSandboxRuntime())
        tunnel = await es.enter_async_context(
            Atunnel(
                atunnel_server_context(pki.files("w-0")),
                host=HOST,
                port=0,
                trust_domain=TRUST_DOMAIN,
            )
        )
        stack = Stack(
            pki=pki,
            ateapi=fake,
            ateapi_serving=serving,
            tunnels={"w-0": tunnel},
            runtime=runtime,
            tmp=tmp_path,
        )
        stack.register("w-0")
        resume = stack.resume_onto()

        async def when_there_is_room(actor: ActorRef) -> ResumeResult:
            if not capacity.is_set():
                raise ResourceExhausted(NO_ROOM)
            return await resume(actor)

        fake.on_resume = when_there_is_room
        with router_process(
            tmp_path,
            pki.dir,
            serving.address,
            "--parked-request-budget=4s",
            "--parked-request-retry-interval=50ms",
            "--drain-timeout=8s",
        ) as (proc, port, admin):
            await anyio.to_thread.run_sync(wait_http, f"http://{HOST}:{admin}/readyz")
            async with anyio.create_task_group() as tg:
                answers = []

                async def request() -> None:
                    answers.append(await get(port, A))

                tg.start_soon(request)
                # parked: ateapi keeps saying there is no room
                with anyio.fail_after(10):
                    while len(fake.resume_calls) < 3:  # noqa: ASYNC110
                        await anyio.sleep(0.02)
                status = json.loads(
                    await anyio.to_thread.run_sync(
                        fetch, f"http://{HOST}:{admin}/statusz?format=json"
                    )
                )
                assert status["parking"]["parked"] == 1
                assert status["parking"]["max_parked"] == 1024
                assert status["parking"]["max_wait_seconds"] == 4.0
                assert status["flags"]["drain_timeout"] == 8.0
                assert status["ateapi"]["healthy"] is True
                page = await anyio.to_thread.run_sync(fetch, f"http://{HOST}:{admin}/statusz")
                assert "Request Parking" in page
                proc.send_signal(signal.SIGTERM)
                # it stops accepting at once...
                with anyio.fail_after(5):
                    while not await anyio.to_thread.run_sync(refuses, port):  # noqa: ASYNC110
                        await anyio.sleep(0.05)
                assert proc.poll() is None
                # ... but the parked request keeps its budget and is served
                await anyio.sleep(0.3)
                capacity.set()
            assert [a.status for a in answers] == [200]
            assert answers[0].text.startswith("count=1")
            assert answers[0].headers["x-ate-restored-from"] == "local"
            code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=10))
            assert code == 0
    logged = (tmp_path / "router.log").read_text()
    assert '"event": "router.request"' in logged
    assert '"status": 200' in logged
    assert "router.drained" in logged


@pytest.mark.e2e
@pytest.mark.anyio
async def test_metrics_over_http(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "tls")
    fake = FakeAteapi()
    async with serve_ateapi(pki, fake) as serving:
        with router_process(tmp_path, pki.dir, serving.address) as (proc, port, admin):
            await anyio.to_thread.run_sync(wait_http, f"http://{HOST}:{admin}/readyz")
            assert (await get(port, None)).status == 404
            text = await anyio.to_thread.run_sync(fetch, f"http://{HOST}:{admin}/metrics")
            for name in (
                "atenet_router_parking_active",
                "atenet_router_parking_wait_duration_seconds_bucket",
                "atenet_router_parking_rejected_total",
                'atenet_router_route_duration_seconds_count{outcome="not_found"} 1.0',
            ):
                assert name in text
            proc.send_signal(signal.SIGTERM)
            code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=15))
            assert code == 0
