"""The gVisor runtime's side of its child-subreaper helper (:mod:`._subreaper`).

:class:`Subreaper` starts the helper (``python -I -S _subreaper.py``) and runs commands
through it: ``await reaper.run(argv, log_path)`` returns the exit code. The sandboxes those
commands leave behind become the helper's children, and it reaps them the moment they
exit, so ``runsc delete`` never waits for a late pid 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Final, Self

import anyio
import anyio.abc
import attrs
from anyio.streams.buffered import BufferedByteReceiveStream

from substrate.errors import Unavailable

HELPER: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_subreaper.py")
START_TIMEOUT: Final = 10.0
_MAX_LINE: Final = 1 << 20


@attrs.define(eq=False)
class _Call:
    done: anyio.Event = attrs.Factory(anyio.Event)
    rc: int | None = None
    error: str = ""


class Subreaper:
    """A running subreaper helper; an async context manager (closing it ends the helper)."""

    def __init__(self, *, python: str = sys.executable) -> None:
        self._python = python
        self._process: anyio.abc.Process | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._calls: dict[int, _Call] = {}
        self._next = 0
        self._send_lock: anyio.Lock | None = None
        self._dead = ""
        self.pid = 0

    @property
    def alive(self) -> bool:
        return self._process is not None and not self._dead

    async def __aenter__(self) -> Self:
        argv = [self._python, "-I", "-S", HELPER]
        try:
            process = await anyio.open_process(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
        except OSError as exc:
            raise Unavailable(f"cannot start the subreaper helper: {exc}") from exc
        assert process.stdout is not None
        reader = BufferedByteReceiveStream(process.stdout)
        try:
            with anyio.fail_after(START_TIMEOUT):
                hello = json.loads(await reader.receive_until(b"\n", _MAX_LINE))
            if not isinstance(hello, dict) or not hello.get("ready"):
                raise Unavailable(f"the subreaper helper refused: {hello!r}")
        except (
            Unavailable,
            TimeoutError,
            ValueError,
            anyio.EndOfStream,
            anyio.IncompleteRead,
        ) as exc:
            with anyio.CancelScope(shield=True):
                process.kill()
                await process.aclose()
            if isinstance(exc, Unavailable):
                raise
            raise Unavailable(f"the subreaper helper did not start: {exc!r}") from exc
        self.pid = int(hello.get("pid", process.pid))
        self._process = process
        self._send_lock = anyio.Lock()
        stack = contextlib.AsyncExitStack()
        tg = await stack.enter_async_context(anyio.create_task_group())
        tg.start_soon(self._read, reader)
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        process, stack = self._process, self._stack
        assert process is not None
        assert stack is not None
        with anyio.CancelScope(shield=True):
            if process.stdin is not None:
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await process.stdin.aclose()  # EOF: the helper exits when its commands have
            with anyio.move_on_after(5.0):
                await process.wait()
            if process.returncode is None:
                process.kill()
            await process.aclose()
            self._fail("the subreaper helper is closed")
            self._process = None
        return await stack.__aexit__(exc_type, exc, tb)

    async def run(self, argv: Sequence[str], log_path: str) -> int:
        """Run ``argv`` through the helper (stdin /dev/null, output appended to ``log_path``).

        Returns its exit code (negative: the signal that killed it). Raises
        :class:`Unavailable` if the helper is gone, and :class:`OSError` if the command
        could not be started. Cancelling kills the command.
        """
        process = self._process
        if process is None or process.stdin is None or self._dead or self._send_lock is None:
            raise Unavailable(self._dead or "the subreaper helper is not running")
        self._next += 1
        rid = self._next
        call = self._calls[rid] = _Call()
        try:
            await self._send({"id": rid, "argv": list(argv), "log": log_path})
            await call.done.wait()
        except BaseException:
            if not call.done.is_set():
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await self._send({"kill": rid})
            raise
        finally:
            self._calls.pop(rid, None)
        if call.rc is None:
            if call.error.startswith("helper:"):
                raise Unavailable(call.error)
            raise OSError(call.error or "the command did not start")
        return call.rc

    async def _send(self, message: dict[str, Any]) -> None:
        process = self._process
        if process is None or process.stdin is None or self._send_lock is None:
            raise Unavailable("the subreaper helper is not running")
        data = (json.dumps(message) + "\n").encode()
        async with self._send_lock:
            try:
                await process.stdin.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                self._fail(f"the subreaper helper is gone: {exc!r}")
                raise Unavailable(self._dead) from exc

    async def _read(self, reader: BufferedByteReceiveStream) -> None:
        try:
            while True:
                line = await reader.receive_until(b"\n", _MAX_LINE)
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(message, dict):
                    continue
                call = self._calls.get(message.get("id", -1))
                if call is None:
                    continue
                if isinstance(message.get("rc"), int):
                    call.rc = message["rc"]
                else:
                    call.error = str(message.get("error", "no answer"))
                call.done.set()
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError,
                anyio.ClosedResourceError):  # fmt: skip
            pass
        finally:
            self._fail("the subreaper helper exited")

    def _fail(self, why: str) -> None:
        if not self._dead:
            self._dead = why
        for call in self._calls.values():
            if not call.done.is_set():
                call.error = f"helper: {self._dead}"
                call.done.set()


__all__ = ["HELPER", "Subreaper"]
