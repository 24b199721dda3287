"""A pure-Python, deterministic :class:`~substrate.snapshot.ports.BlobStore` for tests and the sim.

Objects live in a dict; every call is one atomic step (after one checkpoint, so tasks
interleave as they would against a real store). Fault switches make outages testable:

* ``down = True``: every call raises :class:`Unavailable`, as for a refused connection;
* ``blackhole = True``: every call hangs until it is cancelled, as for a silent network
  (use ``anyio.fail_after`` or a cancel scope around the call);
* ``fail_when(op, key)``: a predicate; when it returns true the call raises
  :class:`Unavailable` (e.g. fail the third ``put`` to inject a mid-upload failure).

``history`` records every completed mutation as ``(op, key)`` in order (``op`` is
``"put"``, ``"delete"`` or ``"copy"``; for a copy the key is the destination), so tests can
check write order, e.g. that ``manifest.json`` is written last.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread

from substrate.errors import InvalidArgument, NotFound, Unavailable
from substrate.snapshot.ports import normalize_prefix, validate_key

FailWhen = Callable[[str, str], bool]
"""``(op, key) -> bool``; ``op`` is the method name (``put_file`` and ``get_to_file`` too)."""


class InMemoryBlobStore:
    """Implements :class:`~substrate.snapshot.ports.BlobStore` with a dict of bytes."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.down = False
        self.blackhole = False
        self.fail_when: FailWhen | None = None
        self.history: list[tuple[str, str]] = []
        self.calls: dict[str, int] = {}
        """How many times each method was called (including failed calls)."""

    def __repr__(self) -> str:
        return f"InMemoryBlobStore({len(self.objects)} objects)"

    async def _enter(self, op: str, key: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1
        if self.blackhole:
            await anyio.sleep_forever()
        await anyio.lowlevel.checkpoint()
        if self.down:
            raise Unavailable(f"in-memory object store is down ({op} {key!r})")
        if self.fail_when is not None and self.fail_when(op, key):
            raise Unavailable(f"in-memory object store failed {op} {key!r} (injected)")

    def _load(self, key: str) -> bytes:
        try:
            return self.objects[key]
        except KeyError:
            raise NotFound(f"object {key!r} not found") from None

    async def put(self, key: str, data: bytes) -> None:
        validate_key(key)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidArgument("object data must be bytes")
        await self._enter("put", key)
        self.objects[key] = bytes(data)
        self.history.append(("put", key))

    async def put_file(self, key: str, path: Path) -> None:
        validate_key(key)
        data = await anyio.to_thread.run_sync(_read_regular_file, Path(path))
        await self._enter("put_file", key)
        self.objects[key] = data
        self.history.append(("put", key))

    async def get(self, key: str) -> bytes:
        validate_key(key)
        await self._enter("get", key)
        return self._load(key)

    async def get_to_file(self, key: str, path: Path) -> None:
        validate_key(key)
        await self._enter("get_to_file", key)
        data = self._load(key)
        await anyio.to_thread.run_sync(_write_atomically, Path(path), data)

    async def head(self, key: str) -> int:
        validate_key(key)
        await self._enter("head", key)
        return len(self._load(key))

    async def list(self, prefix: str = "") -> list[str]:
        normalized = normalize_prefix(prefix)
        await self._enter("list", normalized)
        return sorted(k for k in self.objects if k.startswith(normalized))

    async def delete(self, key: str) -> None:
        validate_key(key)
        await self._enter("delete", key)
        self.objects.pop(key, None)
        self.history.append(("delete", key))

    async def copy(self, src: str, dst: str) -> None:
        validate_key(src)
        validate_key(dst)
        await self._enter("copy", src)
        self.objects[dst] = self._load(src)
        self.history.append(("copy", dst))


def _read_regular_file(path: Path) -> bytes:
    if not path.is_file():
        raise InvalidArgument(f"local file {str(path)!r} does not exist or is not a regular file")
    return path.read_bytes()


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


__all__ = ["FailWhen", "InMemoryBlobStore"]
