"""Batch-accepting listeners: every pending connection per wakeup, a clean close, and the
kernel's idea of how long a request waited (``queued_seconds``)."""

from __future__ import annotations

import functools
import socket
import time

import anyio
import anyio.abc
import anyio.lowlevel
import pytest
from anyio.abc import SocketStream

from substrate.services.listeners import MAX_BATCH, Listeners, accept_each, queued_seconds


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _connect(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port))
    client.setblocking(True)
    return client


@pytest.mark.anyio
async def test_each_connection_is_handed_over_with_its_socket() -> None:
    listeners = await Listeners.bind("127.0.0.1", 0, name="t")
    port = listeners.port
    seen: list[tuple[bytes, int]] = []
    done = anyio.Event()

    async def handle(stream: SocketStream, sock: socket.socket) -> None:
        async with stream:
            seen.append((await stream.receive(), sock.getsockname()[1]))
            await stream.send(b"ok")
        if len(seen) == 3:
            done.set()

    async with anyio.create_task_group() as tg:
        listeners.serve(tg, handle)
        clients = [_connect(port) for _ in range(3)]
        for i, client in enumerate(clients):
            client.sendall(b"hello %d" % i)
        with anyio.fail_after(5):
            await done.wait()
        replies = [await anyio.to_thread.run_sync(client.recv, 16) for client in clients]
        await listeners.aclose()
    for client in clients:
        client.close()
    assert sorted(data for data, _ in seen) == [b"hello 0", b"hello 1", b"hello 2"]
    assert {local for _, local in seen} == {port}
    assert replies == [b"ok"] * 3


@pytest.mark.anyio
async def test_one_wakeup_takes_every_pending_connection_up_to_the_batch() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1024)
    server.setblocking(False)
    port = server.getsockname()[1]
    clients = [_connect(port) for _ in range(MAX_BATCH + 10)]
    batches: list[int] = []
    taken: list[socket.socket] = []

    def accepted(conn: socket.socket, _peer: object) -> None:
        assert not conn.getblocking()
        taken.append(conn)

    async def count_batches() -> None:
        # every accept of one wakeup runs without yielding: sample between loop turns
        last = 0
        while len(taken) < len(clients):
            await anyio.lowlevel.checkpoint()
            if len(taken) != last:
                batches.append(len(taken) - last)
                last = len(taken)

    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(accept_each, server, accepted, label="t"))
        with anyio.fail_after(5):
            await count_batches()
        anyio.notify_closing(server)
        server.close()
    for sock in (*taken, *clients):
        sock.close()
    assert batches[0] == MAX_BATCH
    assert sum(batches) == len(clients)


@pytest.mark.anyio
@pytest.mark.parametrize("turns", range(5))
async def test_closing_while_a_connection_is_being_taken_leaves_no_stale_watch(
    turns: int,
) -> None:
    """Regression: a connection that woke the accept loop just before ``aclose`` made the
    loop watch the socket again while anyio's listener close yielded once; the socket was
    then closed under that watch, and the next socket to get its descriptor number could
    not be waited on ("[Errno 2] No such file or directory" from the router's next dial)."""
    listeners = await Listeners.bind("127.0.0.1", 0, name="t")
    handled: list[SocketStream] = []

    async def handle(stream: SocketStream, _sock: socket.socket) -> None:
        handled.append(stream)

    async with anyio.create_task_group() as tg:
        listeners.serve(tg, handle)
        await anyio.sleep(0.01)  # the accept loop is waiting for readiness
        client = _connect(listeners.port)
        for _ in range(turns):
            await anyio.lowlevel.checkpoint()
        await listeners.aclose()
        # the lowest free descriptors now: one of them is the listener's old number
        pairs = [socket.socketpair() for _ in range(4)]
        with anyio.fail_after(5):
            for left, right in pairs:
                left.setblocking(False)
                await anyio.wait_writable(left)
                right.send(b"x")
                await anyio.wait_readable(left)
        for left, right in pairs:
            left.close()
            right.close()
        client.close()
        tg.cancel_scope.cancel()
    for stream in handled:
        await stream.aclose()


@pytest.mark.anyio
async def test_aclose_ends_the_accept_loops_and_refuses_new_connections() -> None:
    listeners = await Listeners.bind("127.0.0.1", 0, name="t")
    port = listeners.port

    async def handle(stream: SocketStream, _sock: socket.socket) -> None:
        await stream.aclose()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            listeners.serve(tg, handle)
            await anyio.sleep(0.01)
            await listeners.aclose()
            await listeners.aclose()  # a second close is a no-op
        # the task group ended by itself: no accept loop was left running
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_queued_seconds_is_how_long_ago_the_request_arrived() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    client = _connect(server.getsockname()[1])
    conn, _ = server.accept()
    try:
        client.sendall(b"GET / HTTP/1.1\r\n\r\n")
        time.sleep(0.3)
        waited = queued_seconds(conn)
        assert 0.25 <= waited <= 1.0
        assert conn.recv(64).startswith(b"GET")
        client.sendall(b"again")
        time.sleep(0.02)
        assert queued_seconds(conn) < 0.25  # the clock is the latest bytes, not the first
    finally:
        client.close()
        conn.close()
        server.close()


def test_queued_seconds_is_zero_for_what_is_not_a_tcp_socket() -> None:
    left, right = socket.socketpair()
    try:
        assert queued_seconds(left) == 0.0
    finally:
        left.close()
        right.close()
