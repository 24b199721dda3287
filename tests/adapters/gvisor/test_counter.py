"""The counter workload (substrate/images/counter.c), run natively: its HTTP behaviour."""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrate.cli.stack import free_port
from tests.adapters.gvisor.test_images import CAN_BUILD
from tests.contracts.gvisor_factory import counter_image

pytestmark = pytest.mark.skipif(not CAN_BUILD, reason="needs gcc with static glibc and busybox")

COUNT_RE = re.compile(rb"count=(\d+) boot=([0-9a-f]{16})$")


def start_counter(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    binary = counter_image() / "rootfs" / "bin" / "counter"
    return subprocess.Popen(
        [str(binary), *args],
        env={"PATH": "/bin", **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_listening(port: int) -> None:
    deadline = time.monotonic() + 5
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@pytest.fixture
def server() -> Iterator[int]:
    port = free_port()
    process = start_counter("--port", str(port), env={"FILL_MIB": "4"})
    try:
        wait_listening(port)
        yield port
    finally:
        process.kill()
        process.wait()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return sock


def read_response(sock: socket.socket, buffer: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One response from ``sock`` (leftover bytes stay in ``buffer``)."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a full response: {bytes(buffer)!r}"
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    assert lines[0].startswith("HTTP/1.1 ")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk
        rest += chunk
    buffer[:] = rest[length:]
    return status, headers, rest[:length]


def request(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    with connect(port) as sock:
        sock.sendall(raw)
        return read_response(sock, bytearray())


def closed_by_server(sock: socket.socket) -> bool:
    return sock.recv(1) == b""


def test_counts_on_a_keep_alive_connection(server: int) -> None:
    with connect(server) as sock:
        buffer = bytearray()
        bodies = []
        for _ in range(3):
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = read_response(sock, buffer)
            assert status == 200
            assert "connection" not in headers
            bodies.append(body)
    matches = [COUNT_RE.match(b) for b in bodies]
    assert all(matches), bodies
    assert [int(m.group(1)) for m in matches if m] == [1, 2, 3]
    assert len({m.group(2) for m in matches if m}) == 1
    assert request(server, b"GET /?x=1 HTTP/1.1\r\n\r\n")[2].startswith(b"count=4 ")


def test_pipelined_requests_are_answered_in_order(server: int) -> None:
    with connect(server) as sock:
        sock.sendall(
            b"GET /readyz HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n"
            b"GET /missing HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nConnection: close\r\n\r\n"
        )
        buffer = bytearray()
        answers = [read_response(sock, buffer) for _ in range(4)]
        assert closed_by_server(sock)
    assert [a[0] for a in answers] == [200, 200, 404, 200]
    assert answers[0][2] == b"ok"
    assert answers[1][2].startswith(b"count=1 ")
    assert answers[3][2].startswith(b"count=2 ")
    assert answers[3][1]["connection"] == "close"


def test_http_1_0_is_answered_then_closed(server: int) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        status, headers, _ = read_response(sock, bytearray())
        assert status == 200
        assert headers["connection"] == "close"
        assert closed_by_server(sock)


def test_other_methods_are_405_and_the_body_is_skipped(server: int) -> None:
    with connect(server) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\n\r\n")
        buffer = bytearray()
        status, headers, _ = read_response(sock, buffer)
        assert status == 405
        assert headers["allow"] == "GET"
        assert read_response(sock, buffer)[2].startswith(b"count=1 "), "the POST did not count"


@pytest.mark.parametrize(
    "raw",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET / HTTP/2.0\r\n\r\n",
        b"GET nopath HTTP/1.1\r\n\r\n",
        b"get / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"\x00\x01\x02",
    ],
)
def test_garbage_is_400_then_closed(server: int, raw: bytes) -> None:
    with connect(server) as sock:
        sock.sendall(raw)
        status, headers, _ = read_response(sock, bytearray())
        assert status == 400
        assert headers["connection"] == "close"
        assert closed_by_server(sock)
    assert request(server, b"GET / HTTP/1.1\r\n\r\n")[2].startswith(b"count=1 ")


def test_an_oversized_head_is_400(server: int) -> None:
    raw = b"GET / HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 9000 + b"\r\n\r\n"
    with connect(server) as sock:
        sock.sendall(raw)
        assert read_response(sock, bytearray())[0] == 400


def test_a_half_closed_client_still_gets_its_answer(server: int) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        status, _, body = read_response(sock, bytearray())
        assert status == 200
        assert body.startswith(b"count=1 ")
        assert closed_by_server(sock)


def test_many_connections_at_once(server: int) -> None:
    socks = [connect(server) for _ in range(60)]
    try:
        for sock in socks:
            sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        counts = sorted(int(read_response(s, bytearray())[2].split()[0][6:]) for s in socks)
    finally:
        for sock in socks:
            sock.close()
    assert counts == list(range(1, 61))


def test_fill_and_whoami(server: int) -> None:
    deadline = time.monotonic() + 10
    while request(server, b"GET /fill HTTP/1.1\r\n\r\n")[2] != b"filled=4":
        assert time.monotonic() < deadline, "the fill never finished"
        time.sleep(0.02)
    if not os.path.exists("/run/ate/uid"):  # on the host there is no actor info
        assert request(server, b"GET /whoami HTTP/1.1\r\n\r\n")[0] == 404


def test_ports_from_flags_and_env() -> None:
    a, b = free_port(), free_port()
    process = start_counter(f"--port={a}", "-p", str(b))
    try:
        wait_listening(a)
        wait_listening(b)
        assert request(a, b"GET / HTTP/1.1\r\n\r\n")[2].startswith(b"count=1 ")
        assert request(b, b"GET / HTTP/1.1\r\n\r\n")[2].startswith(b"count=2 "), "one counter"
    finally:
        process.kill()
        process.wait()
    c = free_port()
    process = start_counter(env={"PORTS": f"{c}, {free_port()}"})
    try:
        wait_listening(c)
        assert request(c, b"GET /readyz HTTP/1.1\r\n\r\n")[2] == b"ok"
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("args", [("--port", "0"), ("--port", "x"), ("--bogus",)])
def test_bad_arguments_exit_2(args: tuple[str, ...]) -> None:
    process = start_counter(*args)
    assert process.wait(timeout=5) == 2


def test_source_builds_warning_free(tmp_path: Path) -> None:
    source = tmp_path / "counter.c"
    source.write_bytes(
        (Path(__file__).parents[3] / "substrate" / "images" / "counter.c").read_bytes()
    )
    done = subprocess.run(
        [
            "gcc",
            "-static",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            str(tmp_path / "c"),
            str(source),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
