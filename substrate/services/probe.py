"""Wakeup probes: an HTTP GET to a sandbox until it answers 200 (anyio shell).

Every probe connection is closed with RST (``SO_LINGER {1, 0}``) as soon as the status
line is read, so the sandbox side never ends up in TIME_WAIT — runsc cannot checkpoint a
sandbox with a TCP endpoint in TIME_WAIT, and a failed checkpoint kills it. The request
is HTTP/1.1 without ``Connection: close``, so the workload has no reason to close first.
"""

from __future__ import annotations

from typing import Final

import anyio
import anyio.abc

from substrate.errors import DeadlineExceeded
from substrate.sandbox.spec import SandboxAddress
from substrate.services.sandbox_sockets import connect_rst

PROBE_INTERVAL: Final = 0.05
"""Seconds between two attempts (the first attempt is immediate)."""
ATTEMPT_TIMEOUT: Final = 2.0
"""Seconds one attempt may take."""


async def http_status(address: SandboxAddress, port: int, path: str) -> int:
    """One GET of ``path`` on the sandbox's ``port``; the status code (OSError if none)."""
    host_port = address.host_port(port)
    sock = await connect_rst(address.host, host_port, device=address.device)
    try:
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {address.host}:{port}\r\nUser-Agent: ate-probe\r\n\r\n"
        )
        sock.sendall(request.encode("latin-1"))
        received = b""
        while b"\r\n" not in received:
            await anyio.wait_readable(sock)
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
        line = received.split(b"\r\n", 1)[0].split()
        if len(line) < 2 or not line[0].startswith(b"HTTP/") or not line[1].isdigit():
            raise OSError(f"not an HTTP answer: {received[:60]!r}")
        return int(line[1])
    finally:
        sock.close()  # SO_LINGER {1, 0}: RST


async def wait_ready(
    address: SandboxAddress,
    port: int,
    path: str,
    *,
    timeout: float,  # noqa: ASYNC109 - the probe's own budget, reported in the error
    interval: float = PROBE_INTERVAL,
) -> float:
    """Probe until a 200 answer; the seconds it took. :class:`DeadlineExceeded` on timeout."""
    start = anyio.current_time()
    last = "no answer"
    with anyio.move_on_after(timeout):
        while True:
            try:
                with anyio.fail_after(ATTEMPT_TIMEOUT):
                    status = await http_status(address, port, path)
            except (OSError, TimeoutError) as exc:
                last = str(exc) or type(exc).__name__
            else:
                if status == 200:
                    return anyio.current_time() - start
                last = f"HTTP {status}"
            await anyio.sleep(interval)
    raise DeadlineExceeded(
        f"wakeup probe GET {path} on port {port} did not answer 200 within {timeout:g} s "
        f"(last: {last})"
    )


__all__ = ["http_status", "wait_ready"]
