"""``EgressProxy`` over loopback: a fake host network and a fake ``SO_ORIGINAL_DST``.

The "actor" is a client socket on 127.0.0.1 that connects straight to its listener (the
redirect is what the fake lookup pretends happened); destinations are servers on
127.0.0.9, outside the gateway's /30 (127.0.0.0/30).
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import attrs
import pytest
from anyio.abc import SocketAttribute, SocketStream

from substrate.adapters.memory.network import FakeHostNetwork
from substrate.errors import AlreadyExists, Internal, InvalidArgument, NotFound, Unavailable
from substrate.net.egress_policy import EgressPolicy
from substrate.services.egress import EgressProxy, EgressStats, read_original_dst

pytestmark = pytest.mark.anyio

TABLE = "tegress"
PREFIX = "tv"
TARGET_HOST = "127.0.0.9"
ANYWHERE = EgressPolicy.parse("0.0.0.0/0")


class FakeOriginalDst:
    """Where each client (by its source port) "was going" before the redirect."""

    def __init__(self) -> None:
        self.by_port: dict[int, tuple[str, int] | None] = {}

    def __call__(self, sock: socket.socket) -> tuple[str, int] | None:
        return self.by_port.get(sock.getpeername()[1])


@attrs.define
class Target:
    """A TCP server on 127.0.0.9 with a behaviour per connection."""

    port: int = 0
    seen: int = 0
    open: int = 0
    resets: int = 0


@asynccontextmanager
async def target_server(
    behaviour: Callable[[SocketStream], object], host: str = TARGET_HOST
) -> AsyncIterator[Target]:
    target = Target()
    listener = await anyio.create_tcp_listener(local_host=host, local_port=0)
    target.port = listener.extra(SocketAttribute.local_port)

    async def handle(stream: SocketStream) -> None:
        target.seen += 1
        target.open += 1
        try:
            async with stream:
                await behaviour(stream)  # type: ignore[misc]
        except (anyio.BrokenResourceError, ConnectionResetError):
            target.resets += 1
        finally:
            target.open -= 1

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        try:
            yield target
        finally:
            tg.cancel_scope.cancel()


async def echo(stream: SocketStream) -> None:
    """Echo until the client's EOF, then close (FIN)."""
    while True:
        try:
            data = await stream.receive()
        except anyio.EndOfStream:
            return
        await stream.send(data)


async def greet_and_close(stream: SocketStream) -> None:
    await stream.send(b"hello from the target\n")


@attrs.define
class Upstream:
    port: int = 0
    requests: list[bytes] = attrs.Factory(list)


@asynccontextmanager
async def connect_proxy(
    answer: bytes = b"HTTP/1.1 200 Connection established\r\n\r\n", silent: bool = False
) -> AsyncIterator[Upstream]:
    """A tiny HTTP CONNECT proxy on 127.0.0.1 (with a canned answer)."""
    upstream = Upstream()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    upstream.port = listener.extra(SocketAttribute.local_port)

    async def handle(client: SocketStream) -> None:
        async with client:
            head = b""
            while b"\r\n\r\n" not in head:
                try:
                    head += await client.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
            upstream.requests.append(head)
            if silent:
                await anyio.sleep_forever()
            if not answer.startswith(b"HTTP/1.1 2"):
                await client.send(answer)
                return
            host, port = head.split(b" ")[1].decode().rsplit(":", 1)
            async with await anyio.connect_tcp(host, int(port)) as server:
                await client.send(answer)

                async def pump(src: SocketStream, dst: SocketStream) -> None:
                    try:
                        async for chunk in src:
                            await dst.send(chunk)
                        await dst.send_eof()
                    except (anyio.BrokenResourceError, OSError):
                        pass

                async with anyio.create_task_group() as tg:
                    tg.start_soon(pump, client, server)
                    tg.start_soon(pump, server, client)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        try:
            yield upstream
        finally:
            tg.cancel_scope.cancel()


@attrs.define
class Rig:
    net: FakeHostNetwork
    proxy: EgressProxy
    lookup: FakeOriginalDst

    async def actor_connect(self, port: int, dst: tuple[str, int] | None) -> socket.socket:
        """A blocking client socket, connected to the actor's listener, "going to" ``dst``."""
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.lookup.by_port[sock.getsockname()[1]] = dst
        sock.settimeout(5)
        await anyio.to_thread.run_sync(sock.connect, ("127.0.0.1", port))
        return sock

    async def expect_reset(self, port: int, dst: tuple[str, int] | None) -> None:
        """Connect as the actor; the proxy must reset the connection (maybe before
        ``connect`` even returns: on loopback the RST can beat the connecting thread)."""
        sock = socket.socket()
        with sock:
            sock.bind(("127.0.0.1", 0))
            self.lookup.by_port[sock.getsockname()[1]] = dst
            sock.settimeout(5)

            def run() -> OSError | None:
                try:
                    sock.connect(("127.0.0.1", port))
                    while sock.recv(65536):
                        pass
                except OSError as exc:
                    return exc
                return None

            assert isinstance(await anyio.to_thread.run_sync(run), ConnectionResetError)


@asynccontextmanager
async def rig(policy: EgressPolicy = ANYWHERE, **kwargs: object) -> AsyncIterator[Rig]:
    net = FakeHostNetwork()
    lookup = FakeOriginalDst()
    proxy = EgressProxy(
        net,
        table=TABLE,
        veth_prefix=PREFIX,
        policy=policy,
        gateway="127.0.0.1",
        original_dst=lookup,
        bind_to_device=False,
        **kwargs,  # type: ignore[arg-type]
    )
    with anyio.fail_after(20):
        async with proxy:
            yield Rig(net, proxy, lookup)


async def recv_all(sock: socket.socket) -> bytes:
    """Read until EOF; raises ConnectionResetError on RST."""

    def read() -> bytes:
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data

    return await anyio.to_thread.run_sync(read)


async def assert_reset(sock: socket.socket) -> None:
    def read() -> OSError | None:
        try:
            while sock.recv(65536):
                pass
        except OSError as exc:
            return exc
        return None

    assert isinstance(await anyio.to_thread.run_sync(read), ConnectionResetError)


async def exchange(sock: socket.socket, data: bytes) -> bytes:
    def run() -> bytes:
        sock.sendall(data)
        got = b""
        while len(got) < len(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return got

    return await anyio.to_thread.run_sync(run)


def time_wait_ports() -> set[int]:
    out = subprocess.run(
        ["ss", "-Htan", "state", "time-wait"], capture_output=True, text=True, check=True
    ).stdout
    ports = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[-2].startswith("127.0.0.1:"):
            ports.add(int(fields[-2].rsplit(":", 1)[1]))
    return ports


async def wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    """Poll test state (counters have no events to wait on)."""
    with anyio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.01)


# --- tests ------------------------------------------------------------------------------


async def test_an_allowed_connection_is_spliced_directly() -> None:
    async with target_server(echo) as target, rig() as r:
        port = await r.proxy.open_actor("a1", "tv1")
        client = await r.actor_connect(port, (TARGET_HOST, target.port))
        with client:
            assert await exchange(client, b"ping" * 1000) == b"ping" * 1000
            (conn,) = r.proxy.connections("a1")
            assert conn.original_dst == (TARGET_HOST, target.port)
            assert conn.client == client.getsockname()
        assert target.seen == 1
        await wait_for(lambda: r.proxy.stats.open == 0)
        assert r.proxy.stats == EgressStats(accepted=1)


async def test_a_megabyte_each_way_arrives_intact() -> None:
    payload = bytes(range(256)) * 4096
    async with target_server(echo) as target, rig() as r:
        port = await r.proxy.open_actor("a1", "tv1")
        with await r.actor_connect(port, (TARGET_HOST, target.port)) as client:

            def run() -> bytes:
                client.sendall(payload)
                client.shutdown(socket.SHUT_WR)
                got = b""
                try:
                    while chunk := client.recv(65536):
                        got += chunk
                except ConnectionResetError:
                    pass
                return got

            assert await anyio.to_thread.run_sync(run) == payload


async def test_denied_and_unredirected_connections_are_reset() -> None:
    policy = EgressPolicy.parse(f"{TARGET_HOST}:1")
    async with target_server(echo) as target, rig(policy) as r:
        port = await r.proxy.open_actor("a1", "tv1")
        for dst in [(TARGET_HOST, target.port), None, ("127.0.0.2", 1)]:
            await r.expect_reset(port, dst)
        assert target.seen == 0
        assert r.proxy.stats == EgressStats(denied=3)


async def test_the_actors_own_link_network_is_always_denied() -> None:
    async with target_server(echo, host="127.0.0.2") as inside, rig() as r:
        port = await r.proxy.open_actor("a1", "tv1")
        await r.expect_reset(port, ("127.0.0.2", inside.port))
        assert inside.seen == 0
        assert r.proxy.stats.denied == 1


async def test_actors_have_their_own_policies() -> None:
    async with target_server(echo) as target, rig(EgressPolicy()) as r:
        allowed = EgressPolicy.parse(f"{TARGET_HOST}:{target.port}")
        port_a = await r.proxy.open_actor("a", "tva", allowed)
        port_b = await r.proxy.open_actor("b", "tvb")
        with await r.actor_connect(port_a, (TARGET_HOST, target.port)) as client:
            assert await exchange(client, b"x") == b"x"
        await r.expect_reset(port_b, (TARGET_HOST, target.port))
        # reopening with another policy replaces it and keeps the listener
        assert await r.proxy.open_actor("b", "tvb", allowed) == port_b
        with await r.actor_connect(port_b, (TARGET_HOST, target.port)) as client:
            assert await exchange(client, b"y") == b"y"


async def test_connect_upstream_tunnels_and_forwards_early_bytes() -> None:
    async with (
        target_server(greet_and_close) as target,
        connect_proxy(
            b"HTTP/1.1 200 Connection established\r\nVia: test\r\n\r\nearly|"
        ) as upstream,
    ):
        async with rig(upstream=f"127.0.0.1:{upstream.port}") as r:
            port = await r.proxy.open_actor("a1", "tv1")
            with await r.actor_connect(port, (TARGET_HOST, target.port)) as client:
                assert await recv_all(client) == b"early|hello from the target\n"
        (request,) = upstream.requests
        dst = f"{TARGET_HOST}:{target.port}".encode()
        assert request == b"CONNECT " + dst + b" HTTP/1.1\r\nHost: " + dst + b"\r\n\r\n"
        assert r.proxy.stats.accepted == 1


@pytest.mark.parametrize(
    "answer",
    [b"HTTP/1.1 403 Forbidden\r\n\r\n", b"garbage\r\n\r\n", b"HTTP/1.1 302 Found\r\n\r\n"],
)
async def test_a_refused_connect_resets_the_actor(answer: bytes) -> None:
    async with (
        target_server(echo) as target,
        connect_proxy(answer) as upstream,
        rig(upstream=f"127.0.0.1:{upstream.port}") as r,
    ):
        port = await r.proxy.open_actor("a1", "tv1")
        await r.expect_reset(port, (TARGET_HOST, target.port))
        await wait_for(lambda: r.proxy.stats.failed == 1)
        assert target.seen == 0


async def test_an_unreachable_or_silent_upstream_fails_the_connection() -> None:
    async with target_server(echo) as target:
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
        closed.close()  # nothing listens there
        async with rig() as r:
            port = await r.proxy.open_actor("a1", "tv1")
            await r.expect_reset(port, (TARGET_HOST, dead_port))
            await wait_for(lambda: r.proxy.stats.failed == 1)
        async with (
            connect_proxy(silent=True) as upstream,
            rig(upstream=f"127.0.0.1:{upstream.port}", connect_timeout=0.3) as r,
        ):
            port = await r.proxy.open_actor("a1", "tv1")
            await r.expect_reset(port, (TARGET_HOST, target.port))
            await wait_for(lambda: r.proxy.stats.failed == 1)


async def hold(stream: SocketStream) -> None:
    """Keep the connection open, reading (so a reset is noticed), never answering."""
    async for _ in stream:
        pass


async def test_abort_resets_both_sides_and_the_listener_stays() -> None:
    async with target_server(hold) as held, target_server(echo) as target, rig() as r:
        port = await r.proxy.open_actor("a1", "tv1")
        clients = [await r.actor_connect(port, (TARGET_HOST, held.port)) for _ in range(2)]
        await wait_for(lambda: held.open == 2 and len(r.proxy.connections("a1")) == 2)
        assert await r.proxy.abort("a1") == 2
        for client in clients:
            await assert_reset(client)
            client.close()
        await wait_for(lambda: held.open == 0)
        assert held.resets == 2, "the destination side is reset too"
        assert r.proxy.stats.aborted == 2
        assert r.proxy.stats.open == 0
        assert await r.proxy.abort("a1") == 0
        with await r.actor_connect(port, (TARGET_HOST, target.port)) as client:
            assert await exchange(client, b"still here") == b"still here"
        with pytest.raises(NotFound):
            await r.proxy.abort("nobody")


async def test_abort_also_resets_connections_not_accepted_yet() -> None:
    async with target_server(hold) as held, rig() as r:
        port = await r.proxy.open_actor("a1", "tv1")
        actor = r.proxy._actors["a1"]
        actor.scope.cancel()  # stop accepting: the next connection waits in the backlog
        await anyio.sleep(0.05)
        client = await r.actor_connect(port, (TARGET_HOST, held.port))
        with client:
            assert await r.proxy.abort("a1") == 1
            await assert_reset(client)


async def test_no_time_wait_on_the_actor_side() -> None:
    """Whoever closes first, the actor's socket ends without TIME_WAIT."""
    async with (
        target_server(greet_and_close) as greeter,
        target_server(echo) as target,
        rig() as r,
    ):
        port = await r.proxy.open_actor("a1", "tv1")
        # the destination closes first: the actor sees EOF, then closes passively
        client = await r.actor_connect(port, (TARGET_HOST, greeter.port))
        local = client.getsockname()[1]
        assert await recv_all(client) == b"hello from the target\n"
        client.close()
        # the actor closes first (shutdown): it gets its answer, then an RST
        client = await r.actor_connect(port, (TARGET_HOST, target.port))
        local2 = client.getsockname()[1]

        def half_close() -> bytes:
            client.sendall(b"last words")
            client.shutdown(socket.SHUT_WR)
            got = b""
            try:
                while chunk := client.recv(100):
                    got += chunk
            except ConnectionResetError:
                pass
            return got

        assert await anyio.to_thread.run_sync(half_close) == b"last words"
        await wait_for(lambda: r.proxy.stats.open == 0)
        client.close()
        assert not {local, local2} & time_wait_ports()


async def test_open_actor_rules() -> None:
    async with rig() as r:
        port = await r.proxy.open_actor("a1", "tv1")
        assert await r.proxy.open_actor("a1", "tv1") == port
        assert r.proxy.port("a1") == port
        with pytest.raises(AlreadyExists, match="a1"):
            await r.proxy.open_actor("a2", "tv1")
        with pytest.raises(InvalidArgument, match="does not start with"):
            await r.proxy.open_actor("a2", "xx1")
        with pytest.raises(InvalidArgument, match="actor uid"):
            await r.proxy.open_actor("", "tv2")
        moved = await r.proxy.open_actor("a1", "tv2")  # another veth: a new listener
        assert moved != port
        assert r.proxy.ports() == {"tv2": moved}
        assert r.net.ports(TABLE) == {"tv2": moved}
    idle = EgressProxy(FakeHostNetwork(), table=TABLE, veth_prefix=PREFIX)
    with pytest.raises(Unavailable, match="not running"):
        await idle.open_actor("a1", "tv1")


async def test_the_table_follows_the_actors() -> None:
    net = FakeHostNetwork()
    proxy = EgressProxy(
        net, table=TABLE, veth_prefix=PREFIX, gateway="127.0.0.1", bind_to_device=False
    )
    assert net.ports(TABLE) is None
    async with proxy:
        assert net.ports(TABLE) == {}  # entering installs a table that only drops
        pa = await proxy.open_actor("a", "tva")
        pb = await proxy.open_actor("b", "tvb")
        assert net.ports(TABLE) == {"tva": pa, "tvb": pb}
        assert f'"tva" : {pa}' in net.tables[TABLE].ruleset
        await proxy.close_actor("a")
        await proxy.close_actor("a")  # idempotent
        assert net.ports(TABLE) == {"tvb": pb}
        with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
            probe.connect(("127.0.0.1", pa))
    assert net.ports(TABLE) is None, "leaving removes the table"
    assert net.calls[-1] == ("remove_egress", TABLE)


async def test_close_actor_aborts_its_connections() -> None:
    async with target_server(hold) as held, rig() as r:
        port = await r.proxy.open_actor("a1", "tv1")
        with await r.actor_connect(port, (TARGET_HOST, held.port)) as client:
            await wait_for(lambda: held.open == 1)
            await r.proxy.close_actor("a1")
            await assert_reset(client)
        assert r.proxy.stats.aborted == 1
        assert r.proxy.connections("a1") == ()


async def test_leaving_resets_everything() -> None:
    async with target_server(hold) as held:
        async with rig() as r:
            port = await r.proxy.open_actor("a1", "tv1")
            client = await r.actor_connect(port, (TARGET_HOST, held.port))
            await wait_for(lambda: held.open == 1)
        with client:
            await assert_reset(client)
        await wait_for(lambda: held.open == 0)


async def test_a_failing_table_update_leaves_no_listener() -> None:
    async with rig() as r:
        r.net.fail_next("set_egress", Internal("nft broke"))
        with pytest.raises(Internal, match="nft broke"):
            await r.proxy.open_actor("a1", "tv1")
        assert r.proxy.ports() == {}
        assert r.proxy.port("a1") is None
        assert await r.proxy.open_actor("a1", "tv1") > 0


async def test_run_serves_until_cancelled() -> None:
    net = FakeHostNetwork()
    proxy = EgressProxy(
        net, table=TABLE, veth_prefix=PREFIX, gateway="127.0.0.1", bind_to_device=False
    )
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(proxy.run)
            assert net.ports(TABLE) == {}
            await proxy.open_actor("a1", "tv1")
            tg.cancel_scope.cancel()
    assert net.ports(TABLE) is None


def test_constructor_checks_its_arguments() -> None:
    net = FakeHostNetwork()
    with pytest.raises(InvalidArgument, match="table name"):
        EgressProxy(net, table="bad name", veth_prefix=PREFIX)
    with pytest.raises(InvalidArgument, match="veth prefix"):
        EgressProxy(net, table=TABLE, veth_prefix="")
    with pytest.raises(InvalidArgument, match="upstream"):
        EgressProxy(net, table=TABLE, veth_prefix=PREFIX, upstream="nope")
    with pytest.raises(InvalidArgument, match="gateway"):
        EgressProxy(net, table=TABLE, veth_prefix=PREFIX, gateway="x")


def test_original_dst_of_a_direct_connection_is_none_or_itself() -> None:
    # Without any NAT table on the host the kernel has no entry (None); while some NAT
    # table is loaded (another worker's), conntrack records the unchanged destination.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()):
            accepted, _ = server.accept()
            with accepted:
                assert read_original_dst(accepted) in (None, server.getsockname())


async def test_a_veth_that_does_not_exist_is_not_found() -> None:
    net = FakeHostNetwork()
    async with EgressProxy(net, table=TABLE, veth_prefix=PREFIX, gateway="127.0.0.1") as proxy:
        with pytest.raises(NotFound, match="tvmissing"):
            await proxy.open_actor("a1", "tvmissing")


async def test_a_failing_lookup_denies_and_the_proxy_keeps_serving() -> None:
    async with target_server(echo) as target, rig() as r:

        def broken(sock: socket.socket) -> tuple[str, int] | None:
            raise RuntimeError("lookup broke")

        port = await r.proxy.open_actor("a1", "tv1")
        r.proxy._original_dst = broken
        await r.expect_reset(port, (TARGET_HOST, target.port))
        r.proxy._original_dst = r.lookup
        with await r.actor_connect(port, (TARGET_HOST, target.port)) as client:
            assert await exchange(client, b"fine") == b"fine"
        assert r.proxy.stats.denied == 1
