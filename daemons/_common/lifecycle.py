"""Run a daemon until SIGTERM/SIGINT, then let it drain."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable

import anyio
import structlog

log = structlog.get_logger("substrate.daemon")


async def run_until_signal(
    serve: Callable[[anyio.Event], Awaitable[None]],
) -> None:
    """Call ``serve(stop)``; the first SIGTERM/SIGINT sets ``stop``, a second one exits now."""
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    if stop.is_set():
                        log.warning("second signal; exiting now", signal=signum)
                        tg.cancel_scope.cancel()
                        return
                    log.info("signal received; draining", signal=signal.Signals(signum).name)
                    stop.set()

        tg.start_soon(watch)
        await serve(stop)
        tg.cancel_scope.cancel()


def split_host_port(value: str, *, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``host:port``, ``:port`` or ``[v6]:port`` → (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"bad address {value!r}: want host:port")
    host = host.strip("[]") or default_host
    return host, int(port)
