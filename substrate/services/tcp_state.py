"""What a connected socket looks like right now, without reading from it.

Shared by the router (its client connections, its pool of connections to atunnel) and
atunnel (its kept-alive connections to actors).
"""

from __future__ import annotations

import select
import socket
from typing import Final

from anyio.abc import SocketAttribute, SocketStream

ANY_INPUT: Final = select.POLLIN | select.POLLPRI
"""Data, urgent data, or the peer's FIN (EOF also makes a socket readable)."""


def has_input(sock: socket.socket | None, events: int = ANY_INPUT) -> bool | None:
    """Whether ``sock`` has ``events`` pending now (poll with no wait); None if it is
    closed or cannot be polled.

    An idle kept-alive HTTP/1.1 connection is usable when this is ``False``: if it is
    readable, the peer closed it (or sent bytes nobody asked for).
    """
    fd = -1 if sock is None else sock.fileno()
    if fd == -1:
        return None
    poller = select.poll()
    poller.register(fd, events)
    try:
        return bool(poller.poll(0))
    except OSError:
        return None


def peer_text(address: object) -> str:
    """``host:port`` of a peer address for logs (a Unix path as it is; None: ``?``)."""
    if address is None:
        return "?"
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return str(address)


def peer_of(stream: SocketStream, sock: socket.socket | None = None) -> str:
    """``host:port`` of ``stream``'s peer, for logs; from ``sock`` (the socket under it)
    when given, which saves anyio's attribute lookup. ``?`` for a peer that vanished."""
    try:
        address = (
            sock.getpeername() if sock is not None else stream.extra(SocketAttribute.remote_address)
        )
    except Exception:  # a peer that vanished has no address
        address = None
    return peer_text(address)


__all__ = ["ANY_INPUT", "has_input", "peer_of", "peer_text"]
