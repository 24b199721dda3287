"""A TCP proxy that a test can cut and restore, to simulate losing the database."""

from __future__ import annotations

from typing import Any

import anyio
from anyio.abc import SocketAttribute, SocketStream, TaskStatus


class TcpProxy:
    """Forwards 127.0.0.1:<ephemeral> to ``host:port`` until :meth:`cut`."""

    def __init__(self, host: str, port: int) -> None:
        self._host = host
        self._port = port
        self._scopes: set[anyio.CancelScope] = set()
        self.cut_off = False
        self.port = 0

    async def run(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        async with listener, anyio.create_task_group() as tg:
            self.port = listener.extra(SocketAttribute.local_port)
            task_status.started(self.port)
            await listener.serve(self._handle, task_group=tg)

    def cut(self) -> None:
        """Drop every open connection and refuse new ones."""
        self.cut_off = True
        for scope in tuple(self._scopes):
            scope.cancel()

    def restore(self) -> None:
        self.cut_off = False

    async def _handle(self, client: SocketStream) -> None:
        async with client:
            if self.cut_off:
                return
            with anyio.CancelScope() as scope:
                self._scopes.add(scope)
                try:
                    upstream = await anyio.connect_tcp(self._host, self._port)
                    async with upstream, anyio.create_task_group() as tg:
                        tg.start_soon(_pump, client, upstream, tg.cancel_scope)
                        tg.start_soon(_pump, upstream, client, tg.cancel_scope)
                finally:
                    self._scopes.discard(scope)


async def _pump(source: SocketStream, sink: SocketStream, scope: Any) -> None:
    try:
        async for chunk in source:
            await sink.send(chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass
    scope.cancel()
