"""The router's pool of mTLS connections to atunnel: reuse, and few handshakes at once.

A real TLS server with a worker's identity stands in for atunnel; it can hold every
handshake (``gate``) so a test decides when dials finish.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import anyio.abc
import h11
import pytest
from anyio.streams.tls import TLSStream

from substrate.core.ids import WorkerRef
from substrate.errors import InvalidArgument
from substrate.identity import CertificateAuthority, Identity, write_bundle
from substrate.identity.files import TlsFiles
from substrate.identity.tls import server_context
from substrate.services.router_upstream import TunnelPool, Upstream, tunnel_client_context

TD = "pool.test"
NOW = datetime.now(UTC)
WORKER = WorkerRef("w-0")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Atunnel:
    """Counts handshakes; answers every request with an empty 200, keep-alive."""

    def __init__(self, files: TlsFiles) -> None:
        self.ssl = server_context(files)
        self.gate = anyio.Event()
        self.gate.set()
        self.handshakes = 0
        self.port = 0

    async def handle(self, tcp: anyio.abc.SocketStream) -> None:
        await self.gate.wait()
        try:
            tls = await TLSStream.wrap(
                tcp, server_side=True, ssl_context=self.ssl, standard_compatible=False
            )
        except Exception:
            return
        self.handshakes += 1
        conn = h11.Connection(h11.SERVER)
        async with tls:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    try:
                        conn.receive_data(await tls.receive())
                    except Exception:
                        return
                    continue
                if isinstance(event, h11.EndOfMessage):
                    out = conn.send(
                        h11.Response(status_code=200, headers=[("Content-Length", "0")])
                    )
                    out += conn.send(h11.EndOfMessage())
                    await tls.send(out)
                    conn.start_next_cycle()
                elif isinstance(event, h11.ConnectionClosed):
                    return


@asynccontextmanager
async def atunnel(tmp_path: Path) -> AsyncIterator[tuple[Atunnel, TunnelPool, str]]:
    ca = CertificateAuthority.create(TD, now=NOW)
    for name, identity in {
        "w-0": Identity.worker("w-0", TD),
        "router": Identity.router(TD),
    }.items():
        write_bundle(tmp_path, name, ca.issue(identity, now=NOW, valid_for=timedelta(days=1)))
    server = Atunnel(TlsFiles.in_dir(tmp_path, "w-0"))
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    pool = TunnelPool(
        tunnel_client_context(TlsFiles.in_dir(tmp_path, "router")),
        trust_domain=TD,
        max_dials_per_worker=1,
    )
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server.handle)
        yield server, pool, f"127.0.0.1:{port}"
        await pool.aclose()
        tg.cancel_scope.cancel()


async def exchange(upstream: Upstream) -> None:
    """One GET / through ``upstream``, read to its end (so the connection is reusable)."""
    await upstream.send(
        upstream.conn.send(h11.Request(method="GET", target="/", headers=[("Host", "a")]))
        + upstream.conn.send(h11.EndOfMessage())
    )
    while not isinstance(await upstream.next_event(), h11.EndOfMessage):
        pass


@pytest.mark.anyio
async def test_a_released_connection_goes_to_a_waiting_request_instead_of_a_handshake(
    tmp_path: Path,
) -> None:
    async with atunnel(tmp_path) as (server, pool, address):
        first = await pool.acquire(WORKER, address, now=0.0)
        await exchange(first)
        server.gate = anyio.Event()  # hold every handshake from now on
        got: dict[str, Upstream] = {}

        async def take(name: str) -> None:
            got[name] = await pool.acquire(WORKER, address, now=0.0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(take, "dialer")  # takes the only dial slot, held at the gate
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(take, "waiter")  # no slot: waits
            await anyio.wait_all_tasks_blocked()
            assert pool.stats()["waiting"] == 1
            assert pool.release(first, now=1.0)
            await anyio.wait_all_tasks_blocked()
            assert got["waiter"] is first  # handed over: no handshake
            assert "dialer" not in got
            server.gate.set()
        assert got["dialer"] is not first
        await anyio.wait_all_tasks_blocked()  # the server's side of the last handshake
        assert server.handshakes == 2
        for upstream in got.values():
            await upstream.aclose()
        stats = pool.stats()
        assert (stats["opened"], stats["handed_over"], stats["waiting"]) == (2, 1, 0)


@pytest.mark.anyio
async def test_a_finished_handshake_lets_the_next_waiter_dial(tmp_path: Path) -> None:
    async with atunnel(tmp_path) as (server, pool, address):
        server.gate = anyio.Event()
        got: list[Upstream] = []

        async def take() -> None:
            got.append(await pool.acquire(WORKER, address, now=0.0))

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(take)
            await anyio.wait_all_tasks_blocked()
            assert pool.stats()["waiting"] == 2  # one dial at a time
            server.gate.set()
        # nobody released anything: each waiter dialled in turn, none was left behind
        assert len({id(u) for u in got}) == 3
        await anyio.wait_all_tasks_blocked()
        assert server.handshakes == 3
        for upstream in got:
            await upstream.aclose()
        assert pool.stats()["waiting"] == 0


@pytest.mark.anyio
async def test_a_cancelled_waiter_leaves_the_queue_and_the_connection_goes_idle(
    tmp_path: Path,
) -> None:
    async with atunnel(tmp_path) as (server, pool, address):
        first = await pool.acquire(WORKER, address, now=0.0)
        await exchange(first)
        server.gate = anyio.Event()

        async def dial() -> None:
            upstream = await pool.acquire(WORKER, address, now=0.0)
            await upstream.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(dial)  # the dialer, held at the gate
            await anyio.wait_all_tasks_blocked()
            with anyio.move_on_after(0.05):
                await pool.acquire(WORKER, address, now=0.0)  # waits, then gives up
            assert pool.stats()["waiting"] == 0
            assert pool.release(first, now=1.0)  # nobody waits: kept idle
            assert pool.stats()["idle"] == 1
            again = await pool.acquire(WORKER, address, now=2.0)
            assert again is first
            await again.aclose()
            server.gate.set()


def test_at_least_one_dial_is_allowed(tmp_path: Path) -> None:
    ca = CertificateAuthority.create(TD, now=NOW)
    write_bundle(tmp_path, "router", ca.issue(Identity.router(TD), now=NOW))
    with pytest.raises(InvalidArgument, match="max_dials_per_worker"):
        TunnelPool(
            tunnel_client_context(TlsFiles.in_dir(tmp_path, "router")),
            trust_domain=TD,
            max_dials_per_worker=0,
        )
