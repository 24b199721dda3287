"""Socket state without reading: what idle-connection checks and log lines rely on."""

from __future__ import annotations

import select
import socket

from substrate.services.tcp_state import has_input, peer_text


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
