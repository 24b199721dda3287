"""The egress proxy for real: actor namespaces, the nftables redirect, ``SO_ORIGINAL_DST``.

Two actor namespaces (this test's own names) share the actor address 169.254.17.2, as
every actor of a worker does. Destinations are servers this test runs on 169.254.18.1,
a /32 it puts on the first actor's host veth (the gVisor notes' recipe): the allowed
one echoes, the denied one would answer too if a connection ever reached it. No packet
leaves this machine; everything is removed afterwards, and the test checks that.
"""

from __future__ import annotations

import functools
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
import attrs
import pytest
from anyio.abc import SocketAttribute, SocketStream

from substrate.adapters.linux import LinuxHostNetwork
from substrate.net.egress_policy import EgressPolicy
from substrate.net.plan import ActorNetworkPlan
from substrate.services.egress import EgressProxy, EgressStats
from tests.adapters.linux.nsutil import cleanup, leftovers, nft_tables, run, socket_in_netns
from tests.privileges import needs_nft

pytestmark = [pytest.mark.anyio, needs_nft]

TARGET = "169.254.18.1"


@attrs.frozen
class Names:
    netns_prefix: str
    veth_prefix: str
    table: str

    def plan(self, key: str) -> ActorNetworkPlan:
        return ActorNetworkPlan(netns=self.netns_prefix + key, host_veth=self.veth_prefix + key)


@pytest.fixture
def names() -> Iterator[Names]:
    tag = secrets.token_hex(2)
    found = Names(f"tnet-{tag}-", f"tne{tag}", f"tnet_{tag}_egress")
    try:
        yield found
    finally:
        cleanup(found.netns_prefix, found.veth_prefix, found.table)
    assert leftovers(found.netns_prefix, found.veth_prefix, found.table) == []


@attrs.define
class Server:
    port: int = 0
    seen: int = 0


async def _echo(server: Server, stream: SocketStream) -> None:
    server.seen += 1
    async with stream:
        try:
            async for chunk in stream:
                await stream.send(chunk)
        except anyio.BrokenResourceError:
            pass


async def _listen_freebind() -> anyio.abc.SocketListener:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_IP, 15, 1)  # IP_FREEBIND: the /32 is added later
    sock.bind((TARGET, 0))
    sock.listen()
    return await anyio.abc.SocketListener.from_socket(sock)


@asynccontextmanager
async def echo_servers() -> AsyncIterator[tuple[Server, Server]]:
    """Two echo servers on 169.254.18.1: one the policy allows, one it denies."""
    allowed, denied = Server(), Server()
    first, second = await _listen_freebind(), await _listen_freebind()
    async with first, second, anyio.create_task_group() as tg:
        for server, listener in ((allowed, first), (denied, second)):
            server.port = listener.extra(SocketAttribute.local_port)
            tg.start_soon(listener.serve, functools.partial(_echo, server))
        try:
            yield allowed, denied
        finally:
            tg.cancel_scope.cancel()


def connect_from(plan: ActorNetworkPlan, port: int, host: str = TARGET) -> socket.socket:
    sock = socket_in_netns(plan.netns_path)
    sock.settimeout(5)
    sock.connect((host, port))
    return sock


def roundtrip(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def expect_reset(plan: ActorNetworkPlan, port: int, host: str = TARGET) -> None:
    sock = socket_in_netns(plan.netns_path)
    with sock:
        sock.settimeout(5)
        try:
            sock.connect((host, port))
            while sock.recv(4096):
                pass
        except ConnectionResetError:
            return
    raise AssertionError(f"{host}:{port} was not reset")


def rst_close(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    sock.close()


async def test_redirect_policy_and_abort_in_real_namespaces(names: Names) -> None:
    async with echo_servers() as (allowed, denied):
        await _scenario(names, allowed, denied)


async def _scenario(names: Names, allowed: Server, denied: Server) -> None:
    net = LinuxHostNetwork()
    a, b = names.plan("a"), names.plan("b")
    policy = EgressPolicy.parse([f"{TARGET}:{allowed.port}"])
    proxy = EgressProxy(net, table=names.table, veth_prefix=names.veth_prefix, policy=policy)
    with anyio.fail_after(30):
        await net.create(a)
        await net.create(b)
        run("ip", "addr", "add", f"{TARGET}/32", "dev", a.host_veth)
        async with proxy:
            assert names.table in nft_tables()
            await proxy.open_actor("actor-a", a.host_veth)
            await proxy.open_actor("actor-b", b.host_veth)

            # allowed: redirected to the proxy, which reads SO_ORIGINAL_DST and splices
            sock = await anyio.to_thread.run_sync(connect_from, a, allowed.port)
            try:
                assert await anyio.to_thread.run_sync(roundtrip, sock, b"ping") == b"ping"
                (conn,) = proxy.connections("actor-a")
                assert conn.original_dst == (TARGET, allowed.port)
                assert conn.client == (a.actor_address, sock.getsockname()[1])
            finally:
                rst_close(sock)

            # the second actor, same address, its own veth: replies go back out of it
            sock = await anyio.to_thread.run_sync(connect_from, b, allowed.port)
            try:
                assert await anyio.to_thread.run_sync(roundtrip, sock, b"pong") == b"pong"
                (conn,) = proxy.connections("actor-b")
                assert conn.original_dst == (TARGET, allowed.port)
            finally:
                rst_close(sock)

            # denied by the policy, and the gateway itself: reset by the proxy
            await anyio.to_thread.run_sync(expect_reset, a, denied.port)
            await anyio.to_thread.run_sync(expect_reset, b, 22, a.gateway_address)
            assert denied.seen == 0, "the denied server must never see a connection"

            # abort resets an open connection
            held = await anyio.to_thread.run_sync(connect_from, a, allowed.port)
            with held:
                assert await anyio.to_thread.run_sync(roundtrip, held, b"hold") == b"hold"
                assert await proxy.abort("actor-a") == 1

                def read_reset() -> None:
                    with pytest.raises(ConnectionResetError):
                        held.recv(4096)

                await anyio.to_thread.run_sync(read_reset)

            assert allowed.seen == 3
            stats = proxy.stats
            assert stats == EgressStats(accepted=3, denied=2, aborted=1, failed=0, open=0)

            # a closed actor's veth gets nothing: the table drops its connections
            await proxy.close_actor("actor-b")

            def dropped() -> None:
                sock = socket_in_netns(b.netns_path)
                sock.settimeout(0.5)
                with sock, pytest.raises(TimeoutError):
                    sock.connect((TARGET, allowed.port))

            await anyio.to_thread.run_sync(dropped)
        assert names.table not in nft_tables()
        await net.destroy(a)
        await net.destroy(b)
