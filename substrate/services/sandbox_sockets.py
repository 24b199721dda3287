"""Sockets to and from sandboxes: they close with RST, never FIN (anyio shell).

runsc cannot checkpoint a sandbox while any of its TCP endpoints is connected or in
TIME_WAIT, and a failed checkpoint kills it. So every socket the worker holds towards a
sandbox — atunnel's forwards, the wakeup probe, the egress proxy's accepted connections —
has ``SO_LINGER {1, 0}``: closing it resets the connection and the sandbox side never
lingers.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from typing import Final

import anyio

LINGER_RST: Final = struct.pack("ii", 1, 0)
"""``struct linger {l_onoff = 1, l_linger = 0}``: close() sends RST."""


def set_rst_on_close(sock: socket.socket) -> None:
    """Make ``close()`` of ``sock`` reset the connection instead of a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RST)


async def connect_rst(host: str, port: int, *, device: str = "") -> socket.socket:
    """A non-blocking TCP connection to ``host:port``, RST-on-close from birth.

    With ``device`` the socket is bound to that interface first (``SO_BINDTODEVICE``):
    every actor has the same address, behind its own host veth. The caller bounds the time
    it may take. Raises ``OSError`` if the connection fails; a half-made one is reset.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        set_rst_on_close(sock)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if device:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
        sock.setblocking(False)
        err = sock.connect_ex((host, port))
        if err in (errno.EINPROGRESS, errno.EAGAIN):
            await anyio.wait_writable(sock)
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise OSError(err, f"connect to {host}:{port} failed: {os.strerror(err)}")
        return sock
    except BaseException:
        sock.close()
        raise


__all__ = ["LINGER_RST", "connect_rst", "set_rst_on_close"]
