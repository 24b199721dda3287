"""The faults the drills inject: a TCP proxy that can pass, refuse or blackhole, and a
private PostgreSQL instance that can be stopped and started again.

**The TCP proxy** runs as its own process (``python -m benchmarks.drills.faults proxy
LISTEN_PORT TARGET_HOST:TARGET_PORT``), so its relaying never competes with the drill's
clients for one event loop. It reads one command a line on stdin and answers ``ok <mode>``
on stdout; it exits when stdin closes. Modes:

* ``pass``: every connection is relayed to the target.
* ``refuse``: the listening socket is closed (a new connection gets ECONNREFUSED) and every
  open connection is reset (RST) — a server that went away.
* ``blackhole``: the port still accepts, but no byte moves in either direction, on new or
  open connections; what the peers sent is held (kernel buffers fill, the senders block),
  not lost, and delivered when the mode goes back to ``pass`` — packets dropped and
  retransmitted later, as far as a TCP client can tell. (A dropped SYN cannot be imitated
  without a firewall: here the handshake completes and the first read waits.)

**PrivatePostgres** is a PostgreSQL cluster made with ``initdb`` in its own directory and
run with ``pg_ctl`` on a free port of 127.0.0.1 (as the ``postgres`` user when run as root,
since PostgreSQL refuses root), so a drill can stop the very server ateapi uses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from substrate.cli.stack import free_port

MODES: Final = ("pass", "refuse", "blackhole")
PG_BIN_DIRS: Final = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin")
_CHUNK: Final = 65536


# --- the proxy process -------------------------------------------------------------------


class _Proxy:
    """The relay inside the proxy process (plain asyncio, one loop)."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.port = port
        self.target = target
        self.mode = "pass"
        self.gate = asyncio.Event()
        self.gate.set()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def listen(self) -> None:
        if self.server is None:
            self.server = await asyncio.start_server(
                self._handle, "127.0.0.1", self.port, reuse_address=True, backlog=4096
            )

    async def unlisten(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    async def set_mode(self, mode: str) -> None:
        self.mode = mode
        if mode == "pass":
            await self.listen()
            self.gate.set()
        elif mode == "blackhole":
            self.gate.clear()
            await self.listen()
        else:  # refuse: nothing listens, every open connection is reset
            self.gate.clear()
            await self.unlisten()
            for writer in list(self.writers):
                _reset(writer)
            self.writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            await self.gate.wait()
            if self.mode != "pass":
                return
            try:
                up_reader, upstream = await asyncio.open_connection(*self.target)
            except OSError:
                _reset(writer)
                return
            self.writers.add(upstream)
            await asyncio.gather(
                self._pump(reader, upstream), self._pump(up_reader, writer), return_exceptions=True
            )
        finally:
            for w in (writer, upstream):
                if w is not None:
                    self.writers.discard(w)
                    with contextlib.suppress(Exception):
                        w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(_CHUNK)
            await self.gate.wait()  # blackhole: hold the bytes until the mode is pass again
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
    transport = writer.transport
    transport.abort()


async def _proxy_main(port: int, target: tuple[str, int], mode: str) -> None:
    proxy = _Proxy(port, target)
    await proxy.set_mode(mode)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(f"ok {mode}", flush=True)
    while True:
        line = await reader.readline()
        if not line:
            return  # the drill went away: so do we
        command = line.decode().strip()
        if command in MODES:
            await proxy.set_mode(command)
            print(f"ok {command}", flush=True)
        elif command:
            print(f"error unknown mode {command!r}", flush=True)


class TcpProxy:
    """Controls one proxy process: ``127.0.0.1:<port>`` in front of ``target``."""

    def __init__(self, target: str, *, log: Path, port: int = 0, name: str = "proxy") -> None:
        host, _, tport = target.rpartition(":")
        self.target = (host, int(tport))
        self.port = port or free_port()
        self.name = name
        self.log = log
        self.mode = "pass"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        root = Path(__file__).resolve().parents[2]
        with open(self.log, "ab") as err:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.drills.faults",
                    "proxy",
                    str(self.port),
                    f"{self.target[0]}:{self.target[1]}",
                ],
                cwd=root,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env={**os.environ, "PYTHONPATH": str(root)},
            )
        self._expect("pass")

    def _expect(self, mode: str) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode().strip()
        if line != f"ok {mode}":
            raise RuntimeError(f"{self.name}: the proxy answered {line!r} (log {self.log})")
        self.mode = mode

    def set_mode(self, mode: str) -> None:
        """Switch to ``pass``, ``refuse`` or ``blackhole`` (returns once in force)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        assert self.process is not None
        assert self.process.stdin is not None
        self.process.stdin.write(f"{mode}\n".encode())
        self.process.stdin.flush()
        self._expect(mode)

    def stop(self) -> None:
        p = self.process
        if p is None:
            return
        with contextlib.suppress(OSError):
            if p.stdin is not None:
                p.stdin.close()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p.stdout is not None:
            p.stdout.close()
        self.process = None


# --- a private PostgreSQL --------------------------------------------------------------


def pg_bin_dir() -> Path | None:
    """The directory of ``initdb``/``pg_ctl`` (Debian's), or None."""
    for d in PG_BIN_DIRS:
        if (Path(d) / "pg_ctl").is_file():
            return Path(d)
    found = shutil.which("pg_ctl")
    return Path(found).parent if found else None


class PrivatePostgres:
    """One PostgreSQL cluster of the drill's own, in a directory of its own."""

    def __init__(self, *, port: int = 0, bin_dir: Path | None = None) -> None:
        found = bin_dir or pg_bin_dir()
        if found is None:
            raise RuntimeError("PostgreSQL's initdb/pg_ctl not found (apt-get install postgresql)")
        self.bin = found
        self.port = port or free_port()
        # Its own directory outside the drill's (which may not be searchable by `postgres`).
        self.root = Path(tempfile.mkdtemp(prefix="drill-pg-"))
        os.chmod(self.root, 0o755)
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.as_user: str | None = None
        if os.geteuid() == 0:
            self.as_user = "postgres"
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[bytes]:
        full = [str(self.bin / argv[0]), *argv[1:]]
        if self.as_user is not None:
            full = ["runuser", "-u", self.as_user, "--", *full]
        return subprocess.run(
            full, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False
        )

    def init(self) -> None:
        done = self._run(
            "initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E",
            "UTF8",
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.decode(errors='replace')[-2000:]}")

    def start(self) -> float:
        """Start and wait until it accepts connections; the seconds it took."""
        started = time.monotonic()
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        done = self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "-t", "60",
            "start",
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(
                f"pg_ctl start failed: {done.stdout.decode(errors='replace')[-1000:]} "
                f"{self.log_tail()}"
            )
        return time.monotonic() - started

    def stop(self, mode: str = "fast") -> float:
        """``pg_ctl stop -m fast`` (clients disconnected, like a pod scaled to zero)."""
        started = time.monotonic()
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
        return time.monotonic() - started

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def running(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def destroy(self) -> None:
        """Stop it (immediately) and remove its directory."""
        if self.running():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.drills.faults")
    sub = p.add_subparsers(dest="cmd", required=True)
    proxy = sub.add_parser("proxy", help="a TCP proxy controlled by lines on stdin")
    proxy.add_argument("port", type=int)
    proxy.add_argument("target", help="host:port")
    proxy.add_argument("--mode", choices=MODES, default="pass")
    a = p.parse_args(argv)
    host, _, port = a.target.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_proxy_main(a.port, (host, int(port)), a.mode))


if __name__ == "__main__":
    main()
