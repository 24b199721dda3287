"""Run ``burstload.c``: N requests at once through the router, as N independent clients.

The C client is built with ``gcc`` (a system dependency of the stack already: the counter
image is built with it) into ``<out>/bin`` the first time, and again when its source
changes. :func:`burst` streams its answers as they arrive, so a caller can track what is
still in flight (the burst drill's idle suspender needs that).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import anyio
import attrs

SOURCE: Final = Path(__file__).with_name("burstload.c")


@attrs.frozen
class Answer:
    index: int
    """The request's position in the ``actors`` list given to :func:`burst`."""
    actor: str
    started: float
    """When the client called connect(), seconds after the first connect()."""
    seconds: float
    """From connect() to the answer's last byte (or the failure)."""
    status: int
    """HTTP status; 0 when no answer came (refused, reset, the client's limit)."""
    body: str
    """The first line of the answer's body, or why there was no answer."""


def build(out: Path) -> Path:
    """The compiled client under ``out/bin`` (built when missing or its source changed)."""
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:12]
    binary = out / "bin" / f"burstload-{digest}"
    if binary.exists():
        return binary
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("the burst drill needs gcc to build its client (make system-deps)")
    binary.parent.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_suffix(".tmp")
    done = subprocess.run(
        [cc, "-O2", "-Wall", "-o", str(tmp), str(SOURCE)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"building {SOURCE.name} failed:\n{done.stderr}")
    tmp.rename(binary)
    return binary


def parse_line(line: str, actors: Sequence[str]) -> Answer:
    index, started, seconds, status, body = ([*line.split("\t", 4), ""])[:5]
    i = int(index)
    return Answer(
        index=i,
        actor=actors[i],
        started=float(started),
        seconds=float(seconds),
        status=int(status),
        body=body,
    )


async def burst(
    binary: Path,
    router_url: str,
    actors: Sequence[str],
    *,
    limit: float,
    on_answer: Callable[[Answer], None],
) -> list[Answer]:
    """Send one GET per entry of ``actors`` at once; every answer (in arrival order)."""
    parts = urlsplit(router_url)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"router URL {router_url!r} needs a host and a port")
    answers: list[Answer] = []
    async with await anyio.open_process(
        [str(binary), parts.hostname, str(parts.port), f"{limit:g}"]
    ) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        await proc.stdin.send("".join(f"{a}\n" for a in actors).encode())
        await proc.stdin.aclose()
        pending = b""
        async for chunk in proc.stdout:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                answer = parse_line(raw.decode("utf-8", "replace"), actors)
                answers.append(answer)
                on_answer(answer)
        errors = b"".join([chunk async for chunk in proc.stderr])
        code = await proc.wait()
    if code != 0:
        raise RuntimeError(f"burstload exited {code}: {errors.decode(errors='replace')}")
    if len(answers) != len(actors):
        raise RuntimeError(f"burstload reported {len(answers)} of {len(actors)} requests")
    return answers


__all__ = ["Answer", "build", "burst", "parse_line"]
