"""Socket state without reading: what idle-connection checks and log lines rely on."""

from __future__ import annotations

import select
import socket

import pytest
from anyio.abc import SocketStream

from substrate.services.tcp_state import has_input, peer_of, peer_text


def test_has_input_tells_quiet_from_readable_from_closed() -> None:
    a, b = socket.socketpair()
    with a, b:
        assert has_input(a) is False  # idle and open
        b.sendall(b"x")
        assert has_input(a) is True
        assert has_input(a, select.POLLIN) is True
        a.recv(1)
        b.shutdown(socket.SHUT_WR)
        assert has_input(a) is True  # EOF is readable: the peer closed it
    assert has_input(a) is None  # our side closed
    assert has_input(None) is None


def test_peer_text() -> None:
    assert peer_text(("127.0.0.1", 8080)) == "127.0.0.1:8080"
    assert peer_text(("::1", 443, 0, 0)) == "::1:443"
    assert peer_text("/run/sock") == "/run/sock"
    assert peer_text(None) == "?"


@pytest.mark.anyio
async def test_peer_of_reads_the_socket_or_the_stream() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        client = socket.create_connection(listener.getsockname())
        conn, _ = listener.accept()
        with client, conn:
            expected = f"127.0.0.1:{client.getsockname()[1]}"
            stream = await SocketStream.from_socket(conn)
            assert peer_of(stream, conn) == expected
            assert peer_of(stream) == expected  # anyio's attribute lookup
            await stream.aclose()
            assert peer_of(stream, conn) == "?"  # closed: no address
