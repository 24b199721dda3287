"""atunnel over real mutual TLS on loopback, with fake sandboxes and small test backends."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import ssl
import struct
import tracemalloc
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import anyio
import attrs
import h11
import pytest
from anyio.abc import SocketStream
from anyio.streams.tls import TLSAttribute, TLSStream

from substrate.adapters.memory import FakeSandboxRuntime
from substrate.core.ids import ActorRef
from substrate.errors import FailedPrecondition, InvalidArgument, NotFound
from substrate.identity import (
    CertificateAuthority,
    Identity,
    TlsFiles,
    client_context,
    write_bundle,
)
from substrate.net.tunnel import (
    RouteTable,
    Target,
    forward_request_headers,
    forward_response_headers,
    make_route,
    parse_target,
)
from substrate.sandbox.spec import SandboxAddress, SandboxSpec, sandbox_id_for
from substrate.services.atunnel import Atunnel, atunnel_server_context
from tests.http_client import H11Client

pytestmark = pytest.mark.anyio

TRUST_DOMAIN = "ate"
NOW = datetime.now(UTC)
HOST = "127.0.0.1"
TIMEOUT = 10.0
_GONE = (ssl.SSLError, OSError, anyio.EndOfStream, anyio.BrokenResourceError)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- PKI --------------------------------------------------------------------------------


@attrs.frozen
class Pki:
    dir: Path
    ca: Path

    def files(self, name: str) -> TlsFiles:
        return TlsFiles.in_dir(self.dir, name)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    base = tmp_path_factory.mktemp("atunnel-tls")
    ca = CertificateAuthority.create(TRUST_DOMAIN, now=NOW)
    identities = {
        "worker": Identity.worker("w-0", TRUST_DOMAIN),
        "router": Identity.router(TRUST_DOMAIN),
        "alice": Identity.client("alice", TRUST_DOMAIN),
    }
    for name, identity in identities.items():
        write_bundle(base, name, ca.issue(identity, now=NOW))
    return Pki(dir=base, ca=base / "worker.crt")


def router_context(pki: Pki, name: str = "router") -> ssl.SSLContext:
    ctx = client_context(pki.files(name))
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def certless_context(pki: Pki) -> ssl.SSLContext:
    """Trusts our CA but presents no certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(pki.files("router").ca))
    return ctx


# --- an HTTP/1.1 client over TLS --------------------------------------------------------


async def dial(tunnel: Atunnel, ctx: ssl.SSLContext) -> TLSStream:
    stream = await anyio.connect_tcp(
        HOST, tunnel.port, ssl_context=ctx, tls_standard_compatible=False
    )
    assert isinstance(stream, TLSStream)
    return stream


@asynccontextmanager
async def client(tunnel: Atunnel, pki: Pki, name: str = "router") -> AsyncIterator[H11Client]:
    stream = await dial(tunnel, router_context(pki, name))
    try:
        yield H11Client(stream)
    finally:
        with anyio.CancelScope(shield=True):
            await stream.aclose()


async def read_until_closed(stream: TLSStream) -> bytes:
    data = b""
    with anyio.fail_after(TIMEOUT):
        while True:
            try:
                data += await stream.receive()
            except _GONE:
                return data


async def _receive_forever(stream: TLSStream) -> None:
    while True:
        await stream.receive()


async def assert_reset(stream: TLSStream) -> None:
    """The connection was reset (RST), not closed."""
    with anyio.fail_after(TIMEOUT), pytest.raises(anyio.BrokenResourceError) as info:
        await _receive_forever(stream)
    assert isinstance(info.value.__cause__, ConnectionResetError), info.value.__cause__


# --- backends ---------------------------------------------------------------------------


@attrs.define
class Seen:
    requests: list[tuple[str, list[tuple[bytes, bytes]]]] = attrs.Factory(list)
    body_bytes: int = 0
    endings: list[str] = attrs.Factory(list)
    """How each connection from atunnel ended: "rst" (reset) or "fin" (closed)."""


async def _backend_events(conn: h11.Connection, stream: SocketStream) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        try:
            data = await stream.receive()
        except anyio.EndOfStream:
            data = b""
        conn.receive_data(data)


async def _serve_backend(stream: SocketStream, seen: Seen) -> None:
    """``/inspect`` (records the head), ``/echo`` (streams the body back as it comes) and
    ``/upgrade`` (101, then upper-cases raw bytes)."""
    conn = h11.Connection(h11.SERVER)
    while True:
        request = await _backend_events(conn, stream)
        if not isinstance(request, h11.Request):
            return
        seen.requests.append((request.target.decode(), list(request.headers.raw_items())))
        if request.target == b"/upgrade":
            end = await _backend_events(conn, stream)
            assert isinstance(end, h11.EndOfMessage)
            await stream.send(
                conn.send(
                    h11.InformationalResponse(
                        status_code=101,
                        headers=[("Upgrade", "upper"), ("Connection", "upgrade")],
                    )
                )
                or b""
            )
            leftover, _ = conn.trailing_data
            if leftover:
                await stream.send(leftover.upper())
            while True:
                await stream.send((await stream.receive()).upper())
        if request.target == b"/echo":
            await stream.send(conn.send(h11.Response(status_code=200, headers=[])) or b"")
            while True:
                event = await _backend_events(conn, stream)
                if isinstance(event, h11.Data):
                    seen.body_bytes += len(event.data)
                    await stream.send(conn.send(event) or b"")
                elif isinstance(event, h11.EndOfMessage):
                    await stream.send(conn.send(h11.EndOfMessage()) or b"")
                    break
                else:
                    return
        else:
            while not isinstance(await _backend_events(conn, stream), h11.EndOfMessage):
                pass
            body = b"inspected"
            await stream.send(
                (
                    conn.send(
                        h11.Response(
                            status_code=200,
                            headers=[
                                ("content-length", str(len(body))),
                                ("keep-alive", "timeout=5"),
                                ("x-backend", "yes"),
                            ],
                        )
                    )
                    or b""
                )
                + (conn.send(h11.Data(data=body)) or b"")
                + (conn.send(h11.EndOfMessage()) or b"")
            )
        conn.start_next_cycle()


@asynccontextmanager
async def backend() -> AsyncIterator[tuple[SandboxAddress, Seen]]:
    seen = Seen()
    listener = await anyio.create_tcp_listener(local_host=HOST, local_port=0)

    async def handle(stream: SocketStream) -> None:
        async with stream:
            try:
                await _serve_backend(stream, seen)
            except anyio.BrokenResourceError as exc:
                reset = isinstance(exc.__cause__, ConnectionResetError)
                seen.endings.append("rst" if reset else repr(exc.__cause__))
            except (*_GONE, h11.ProtocolError) as exc:
                seen.endings.append(repr(exc))
            else:
                seen.endings.append("fin")

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        yield SandboxAddress(host=HOST, ports=((80, port),)), seen
        tg.cancel_scope.cancel()


@asynccontextmanager
async def tunnel_for(pki: Pki, **kwargs: object) -> AsyncIterator[Atunnel]:
    ctx = atunnel_server_context(pki.files("worker"))
    async with Atunnel(ctx, host=HOST, port=0, **kwargs) as tunnel:  # type: ignore[arg-type]
        yield tunnel


def spec_for(tmp_path: Path, uid: str, ports: tuple[int, ...] = (80,)) -> SandboxSpec:
    return SandboxSpec(
        sandbox_id=sandbox_id_for(uid),
        bundle_dir=str(tmp_path / "bundle" / uid),
        netns_path=f"/var/run/netns/{uid}",
        args=("/bin/counter",),
        ports=ports,
    )


async def run_actor(
    rt: FakeSandboxRuntime, tunnel: Atunnel, tmp_path: Path, ref: ActorRef, uid: str
) -> SandboxSpec:
    spec = spec_for(tmp_path, uid)
    await rt.run(spec)
    tunnel.activate(ref, uid, await rt.address(spec.sandbox_id))
    return spec


async def wait_for(predicate: Callable[[], bool], what: str) -> None:
    """Poll ``predicate`` (state that another task or the kernel changes) for a while."""
    for _ in range(int(TIMEOUT / 0.005)):
        if predicate():
            return
        await anyio.sleep(0.005)
    raise AssertionError(f"timed out waiting for: {what}")


A = ActorRef("as1", "alpha")
B = ActorRef("as1", "beta")


# --- pure decisions ---------------------------------------------------------------------


def test_parse_target() -> None:
    assert parse_target([(b"Ate-Target-Actor", b" as1/alpha ")]) == Target(A)
    assert parse_target([(b"ate-target-actor", b"as1/alpha"), (b"ate-target-port", b"8080")]) == (
        Target(A, 8080)
    )
    for headers, fragment in [
        ([], "missing ate-target-actor"),
        ([(b"ate-target-actor", b"as1")], "<atespace>/<name>"),
        ([(b"ate-target-actor", b"As1/x")], "invalid"),
        ([(b"ate-target-actor", b"a/b"), (b"ate-target-actor", b"a/b")], "exactly once"),
        ([(b"ate-target-actor", b"a/b"), (b"ate-target-port", b"0")], "1..65535"),
        ([(b"ate-target-actor", b"a/b"), (b"ate-target-port", b"65536")], "1..65535"),
        ([(b"ate-target-actor", b"a/b"), (b"ate-target-port", b"+80")], "1..65535"),
        ([(b"ate-target-actor", "a/ü".encode())], "ASCII"),
    ]:
        with pytest.raises(InvalidArgument, match=fragment):
            parse_target(headers)


def test_header_filtering() -> None:
    headers = [
        (b"Host", b"Example.COM:81"),
        (b"ate-target-actor", b"as1/alpha"),
        (b"ATE-Target-Port", b"80"),
        (b"Connection", b"keep-alive, X-Hop, Upgrade"),
        (b"Keep-Alive", b"timeout=5"),
        (b"X-Hop", b"1"),
        (b"Proxy-Connection", b"keep-alive"),
        (b"TE", b"trailers"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Upgrade", b"websocket"),
        (b"X-Keep", b"yes"),
    ]
    assert forward_request_headers(headers) == [
        (b"Host", b"Example.COM:81"),
        (b"X-Keep", b"yes"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Upgrade", b"websocket"),
        (b"Connection", b"upgrade"),
    ]
    # Without "Connection: upgrade" an Upgrade header is just hop-by-hop.
    assert forward_request_headers([(b"Host", b"h"), (b"Upgrade", b"websocket")]) == [
        (b"Host", b"h")
    ]
    # Host and Content-Length survive a Connection that names them; no Host gets one.
    assert forward_request_headers(
        [(b"Connection", b"host, content-length"), (b"Content-Length", b"3")],
        upstream_host="127.0.0.1:9",
    ) == [(b"Host", b"127.0.0.1:9"), (b"Content-Length", b"3")]
    response = [
        (b"Content-Length", b"2"),
        (b"Connection", b"upgrade"),
        (b"Upgrade", b"upper"),
        (b"ate-target-actor", b"x/y"),
    ]
    assert forward_response_headers(response) == [(b"Content-Length", b"2")]
    assert forward_response_headers(response, switching=True) == [
        (b"Content-Length", b"2"),
        (b"Upgrade", b"upper"),
        (b"Connection", b"upgrade"),
    ]


def test_route_table() -> None:
    table = RouteTable()
    address = SandboxAddress(host=HOST, ports=((80, 1080), (8080, 9080)))
    table.activate(make_route(A, "u1", address, 8080))
    assert table.is_active(A)
    forward = table.resolve(Target(A))
    assert not isinstance(forward, type(None))
    assert getattr(forward, "host_port", None) == 9080
    assert getattr(table.resolve(Target(A, 80)), "host_port", None) == 1080
    assert getattr(table.resolve(Target(A, 81)), "status", None) == 404
    assert getattr(table.resolve(Target(B)), "status", None) == 421
    with pytest.raises(FailedPrecondition):
        table.activate(make_route(A, "u2", address))
    with pytest.raises(NotFound):
        make_route(A, "u1", address, 81)
    with pytest.raises(InvalidArgument):
        make_route(A, "u1", SandboxAddress(host=HOST))
    assert table.quiesce("u1")
    assert not table.is_active(A)
    assert getattr(table.resolve(Target(A)), "status", None) == 421
    table.activate(make_route(A, "u1", address))  # lifts the quiesce
    assert table.is_active(A)
    assert table.remove("u1") is not None
    assert not table.is_active(A)
    assert table.remove("u1") is None
    assert not table.quiesce("u1")


# --- who may talk -----------------------------------------------------------------------


async def test_router_identity_is_served_and_others_are_refused(pki: Pki) -> None:
    async with tunnel_for(pki) as tunnel:
        assert tunnel.port > 0
        async with client(tunnel, pki) as router:
            answer = await router.get("as1/alpha")
            assert answer.status == 421  # let in: the actor simply is not here
            assert router.stream.extra(TLSAttribute.alpn_protocol) == "http/1.1"
        async with client(tunnel, pki, "alice") as alice:
            answer = await alice.get("as1/alpha")
            assert answer.status == 403
            assert "spiffe://ate/client/alice" in answer.body.decode()
            assert answer.headers["connection"] == "close"
            assert await read_until_closed(alice.stream) == b""
        assert tunnel.stats().forbidden == 1


async def test_allowed_identities_are_configurable(pki: Pki) -> None:
    async with tunnel_for(pki, allowed=[Identity.client("alice", TRUST_DOMAIN)]) as tunnel:
        async with client(tunnel, pki, "alice") as alice:
            assert (await alice.get("as1/alpha")).status == 421
        async with client(tunnel, pki) as router:
            assert (await router.get("as1/alpha")).status == 403


async def test_client_without_certificate_is_refused(pki: Pki) -> None:
    async with tunnel_for(pki) as tunnel:
        answered = b""
        with anyio.fail_after(TIMEOUT):
            try:
                stream = await dial(tunnel, certless_context(pki))
                await stream.send(
                    b"GET / HTTP/1.1\r\nhost: x\r\nate-target-actor: as1/alpha\r\n\r\n"
                )
                answered = await read_until_closed(stream)
            except _GONE:
                pass
        assert answered == b"", "a client without a certificate never gets an HTTP answer"
        await wait_for(lambda: tunnel.stats().handshake_failures == 1, "handshake failure")
        assert tunnel.stats().connections == 0


# --- refusals ---------------------------------------------------------------------------


async def test_not_active_is_421_and_bad_headers_are_400(pki: Pki) -> None:
    async with tunnel_for(pki) as tunnel, backend() as (address, seen), client(tunnel, pki) as c:
        tunnel.activate(A, "uid-a", address)
        answer = await c.get("as1/beta")
        assert answer.status == 421
        assert answer.headers["x-ate-assignment-stale"] == "true"
        assert b"as1/beta is not active" in answer.body
        answer = await c.request("GET", "/", [("host", "x")])
        assert answer.status == 400
        assert b"missing ate-target-actor header" in answer.body
        assert (await c.get("not-a-ref")).status == 400
        answer = await c.get("as1/alpha", ate_target_port="http")
        assert answer.status == 400
        assert b"ate-target-port" in answer.body
        answer = await c.get("as1/alpha", ate_target_port="8080")
        assert answer.status == 404
        assert b"no port 8080" in answer.body
        # A refused request with a body is drained; the connection stays usable.
        answer = await c.request("POST", "/", [("host", "x")], body=b"x" * 100_000)
        assert answer.status == 400
        assert (await c.get("as1/alpha", "/inspect")).status == 200
        assert len(seen.requests) == 1
        stats = tunnel.stats()
        assert (stats.misdirected, stats.bad_requests, stats.not_found) == (1, 4, 1)


async def test_malformed_requests_and_head_refusals(pki: Pki) -> None:
    async with tunnel_for(pki) as tunnel:
        stream = await dial(tunnel, router_context(pki))
        await stream.send(b"NOT HTTP\r\n\r\n")
        answer = await read_until_closed(stream)
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert b"bad request" in answer
        await stream.aclose()
        # A refused HEAD has no body, and the connection stays usable.
        stream = await dial(tunnel, router_context(pki))
        await stream.send(
            b"HEAD / HTTP/1.1\r\nhost: x\r\nate-target-actor: as1/alpha\r\n\r\n"
            b"GET / HTTP/1.1\r\nhost: x\r\nate-target-actor: as1/alpha\r\n"
            b"connection: close\r\n\r\n"
        )
        answer = await read_until_closed(stream)
        await stream.aclose()
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 421 ")
        assert rest.startswith(b"HTTP/1.1 421 ")
        assert rest.endswith(b"actor as1/alpha is not active on this worker\n")


async def test_unreachable_actor_is_502(pki: Pki) -> None:
    async with tunnel_for(pki) as tunnel, backend() as (address, _seen):
        pass  # the backend is gone: its port refuses connections
    async with tunnel_for(pki) as tunnel, client(tunnel, pki) as c:
        tunnel.activate(A, "uid-a", address)
        answer = await c.get("as1/alpha")
        assert answer.status == 502
        assert b"cannot connect to actor as1/alpha port 80" in answer.body
        assert tunnel.stats().bad_gateway == 1
        assert tunnel.open_connections("uid-a") == 0


# --- forwarding -------------------------------------------------------------------------


async def test_routing_headers_are_stripped_and_host_kept(pki: Pki) -> None:
    async with tunnel_for(pki) as tunnel, backend() as (address, seen), client(tunnel, pki) as c:
        tunnel.activate(A, "uid-a", address)
        answer = await c.request(
            "GET",
            "/inspect?q=1",
            [
                ("Host", "Alpha.AS1.Example:8443"),
                ("ate-target-actor", "as1/alpha"),
                ("ate-target-port", "80"),
                ("Connection", "keep-alive, X-Hop"),
                ("X-Hop", "drop me"),
                ("Keep-Alive", "timeout=1"),
                ("X-Custom", "kept"),
            ],
        )
        assert answer.status == 200
        assert answer.body == b"inspected"
        assert answer.headers["x-backend"] == "yes"
        assert "keep-alive" not in answer.headers  # hop-by-hop on the way back too
        target, headers = seen.requests[0]
        assert target == "/inspect?q=1"
        assert headers == [(b"Host", b"Alpha.AS1.Example:8443"), (b"X-Custom", b"kept")]
        # The connection to the actor ended with RST, never FIN.
        await wait_for(lambda: seen.endings == ["rst"], "reset")


async def test_keep_alive_routes_each_request_by_its_own_header(pki: Pki, tmp_path: Path) -> None:
    async with tunnel_for(pki) as tunnel, FakeSandboxRuntime() as rt, client(tunnel, pki) as c:
        spec_a = await run_actor(rt, tunnel, tmp_path, A, "uid-a")
        spec_b = await run_actor(rt, tunnel, tmp_path, B, "uid-b")
        first = await c.get("as1/alpha")
        second = await c.get("as1/beta")
        third = await c.get("as1/alpha")
        assert first.status == second.status == third.status == 200
        assert first.body.startswith(b"count=1 ")
        assert second.body.startswith(b"count=1 ")
        assert third.body.startswith(b"count=2 ")
        assert first.body.split()[1] != second.body.split()[1], "two workloads"
        assert tunnel.stats().connections == 1
        # Every connection to an actor was reset after its exchange: none is open and
        # none is in TIME_WAIT, so both actors can be checkpointed.
        await wait_for(
            lambda: (
                rt.open_connections(spec_a.sandbox_id) == 0
                and rt.open_connections(spec_b.sandbox_id) == 0
            ),
            "connections reset",
        )
        await rt.checkpoint(spec_a.sandbox_id, str(tmp_path / "img-a"))
        await rt.checkpoint(spec_b.sandbox_id, str(tmp_path / "img-b"))


async def test_large_bodies_stream_both_ways(pki: Pki) -> None:
    total = 20 * 1024 * 1024
    block = bytes(range(256)) * 256  # 64 KiB
    async with tunnel_for(pki) as tunnel, backend() as (address, seen), client(tunnel, pki) as c:
        tunnel.activate(A, "uid-a", address)
        sent = hashlib.sha256()
        got = hashlib.sha256()
        received = 0
        received_when_sent = -1
        status = 0

        async def upload() -> None:
            nonlocal received_when_sent
            await c.send(
                h11.Request(
                    method="POST",
                    target="/echo",
                    headers=[
                        ("host", "x"),
                        ("ate-target-actor", "as1/alpha"),
                        ("transfer-encoding", "chunked"),
                    ],
                )
            )
            for i in range(total // len(block)):
                chunk = block[i % 256 :] + block[: i % 256]
                sent.update(chunk)
                await c.send(h11.Data(data=chunk))
            received_when_sent = received
            await c.send(h11.EndOfMessage())

        async def download() -> None:
            nonlocal received, status
            while True:
                event = await c.event()
                if isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    received += len(event.data)
                    got.update(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    return

        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(upload)
                    tg.start_soon(download)
            _current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert status == 200
        assert received == seen.body_bytes == total
        assert got.digest() == sent.digest()
        # Streaming, not store-and-forward: most of the echo was back before the upload
        # ended, and nobody (atunnel, client or backend) held more than a few chunks.
        assert received_when_sent > total // 2, received_when_sent
        assert peak < 8 * 1024 * 1024, f"peak traced memory {peak} bytes"


async def test_connect_tunnel_to_a_sandbox(pki: Pki, tmp_path: Path) -> None:
    async with tunnel_for(pki) as tunnel, FakeSandboxRuntime() as rt:
        spec = await run_actor(rt, tunnel, tmp_path, A, "uid-a")
        stream = await dial(tunnel, router_context(pki))
        try:
            outer = H11Client(stream)
            await outer.send(
                h11.Request(
                    method="CONNECT",
                    target="10.0.0.1:443",
                    headers=[
                        ("host", "10.0.0.1:443"),
                        ("ate-target-actor", "as1/alpha"),
                        ("ate-target-port", "80"),
                    ],
                )
            )
            await outer.send(h11.EndOfMessage())
            with anyio.fail_after(TIMEOUT):
                head = await outer.event()
            assert isinstance(head, h11.Response)
            assert head.status_code == 200
            assert head.reason == b"Connection established"
            assert outer.conn.our_state is h11.SWITCHED_PROTOCOL
            inner = H11Client(stream)  # raw bytes from here: speak HTTP to the workload
            assert (await inner.get("ignored/ignored")).body.startswith(b"count=1 ")
            assert (await inner.get("ignored/ignored")).body.startswith(b"count=2 ")
            assert rt.open_connections(spec.sandbox_id) == 1
            assert tunnel.open_connections("uid-a") == 1
        finally:
            await stream.aclose()
        await wait_for(lambda: tunnel.open_connections("uid-a") == 0, "tunnel closed")
        await wait_for(lambda: rt.open_connections(spec.sandbox_id) == 0, "actor side reset")
        assert tunnel.stats().connects == 1
        await rt.checkpoint(spec.sandbox_id, str(tmp_path / "img"))  # no TIME_WAIT left


async def test_upgrade_passthrough(pki: Pki) -> None:
    async with tunnel_for(pki) as tunnel, backend() as (address, seen), client(tunnel, pki) as c:
        tunnel.activate(A, "uid-a", address)
        await c.send(
            h11.Request(
                method="GET",
                target="/upgrade",
                headers=[
                    ("host", "ws.example"),
                    ("ate-target-actor", "as1/alpha"),
                    ("connection", "Upgrade"),
                    ("upgrade", "upper"),
                    ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ],
            )
        )
        await c.send(h11.EndOfMessage())
        with anyio.fail_after(TIMEOUT):
            switched = await c.event()
        assert isinstance(switched, h11.InformationalResponse)
        assert switched.status_code == 101
        assert (b"upgrade", b"upper") in list(switched.headers)
        leftover, _ = c.conn.trailing_data
        assert leftover == b""
        with anyio.fail_after(TIMEOUT):
            await c.stream.send(b"hello, ")
            echoed = await c.stream.receive()
            await c.stream.send(b"raw world")
            while len(echoed) < len(b"hello, raw world"):
                echoed += await c.stream.receive()
        assert echoed == b"HELLO, RAW WORLD"
        _target, headers = seen.requests[0]
        lowered = [(k.lower(), v) for k, v in headers]
        assert (b"upgrade", b"upper") in lowered
        assert (b"connection", b"upgrade") in lowered
        assert (b"sec-websocket-key", b"dGhlIHNhbXBsZSBub25jZQ==") in lowered
        assert tunnel.stats().upgrades == 1
        # abort() ends an upgraded connection too, with RST on both sides.
        assert await tunnel.abort("uid-a") == 1
        await assert_reset(c.stream)
        await wait_for(lambda: seen.endings == ["rst"], "reset")


async def test_abort_resets_both_sides_and_blocks_until_activate(pki: Pki, tmp_path: Path) -> None:
    async with tunnel_for(pki) as tunnel, FakeSandboxRuntime() as rt:
        spec = await run_actor(rt, tunnel, tmp_path, A, "uid-a")
        stream = await dial(tunnel, router_context(pki))
        outer = H11Client(stream)
        await outer.send(
            h11.Request(
                method="CONNECT",
                target="x",
                headers=[("host", "x"), ("ate-target-actor", "as1/alpha")],
            )
        )
        await outer.send(h11.EndOfMessage())
        with anyio.fail_after(TIMEOUT):
            head = await outer.event()
        assert isinstance(head, h11.Response)
        assert head.status_code == 200
        assert (await H11Client(stream).get("x/y")).body.startswith(b"count=1 ")
        assert rt.open_connections(spec.sandbox_id) == 1

        assert await tunnel.abort("uid-a") == 1
        assert tunnel.open_connections("uid-a") == 0
        assert not tunnel.is_active(A)
        await wait_for(lambda: rt.open_connections(spec.sandbox_id) == 0, "actor side reset")
        await assert_reset(stream)
        await stream.aclose()
        assert tunnel.stats().resets == 1

        async with client(tunnel, pki) as c:
            answer = await c.get("as1/alpha")
            assert answer.status == 421
            assert answer.headers["x-ate-assignment-stale"] == "true"
            # The checkpoint finds no connection, open or in TIME_WAIT.
            await rt.checkpoint(spec.sandbox_id, str(tmp_path / "img"))
            await rt.restore(spec, str(tmp_path / "img"))
            tunnel.activate(A, "uid-a", await rt.address(spec.sandbox_id))
            assert tunnel.is_active(A)
            answer = await c.get("as1/alpha")
            assert answer.status == 200
            assert answer.body.startswith(b"count=2 "), "the restored memory answers"


async def test_abort_resets_a_request_in_flight(pki: Pki) -> None:
    async with tunnel_for(pki) as tunnel, backend() as (address, seen), client(tunnel, pki) as c:
        tunnel.activate(A, "uid-a", address)
        # An upload that never ends: the echo is streaming when abort() strikes.
        await c.send(
            h11.Request(
                method="POST",
                target="/echo",
                headers=[
                    ("host", "x"),
                    ("ate-target-actor", "as1/alpha"),
                    ("transfer-encoding", "chunked"),
                ],
            )
        )
        await c.send(h11.Data(data=b"partial"))
        with anyio.fail_after(TIMEOUT):
            head = await c.event()
            assert isinstance(head, h11.Response)
            data = await c.event()
        assert isinstance(data, h11.Data)
        assert data.data == b"partial"
        assert await tunnel.abort("uid-a") == 1
        await assert_reset(c.stream)
        assert seen.endings == ["rst"]
        assert seen.body_bytes == len(b"partial")


async def test_deactivate_resets_and_refuses(pki: Pki, tmp_path: Path) -> None:
    async with tunnel_for(pki) as tunnel, FakeSandboxRuntime() as rt:
        spec = await run_actor(rt, tunnel, tmp_path, A, "uid-a")
        async with client(tunnel, pki) as c:
            assert (await c.get("as1/alpha")).status == 200
            stream = await dial(tunnel, router_context(pki))
            await stream.send(
                b"CONNECT x HTTP/1.1\r\nhost: x\r\nate-target-actor: as1/alpha\r\n\r\n"
            )
            with anyio.fail_after(TIMEOUT):
                assert (await stream.receive()).startswith(b"HTTP/1.1 200 ")
            await wait_for(lambda: rt.open_connections(spec.sandbox_id) == 1, "tunnel open")
            await tunnel.deactivate("uid-a")
            assert tunnel.route("uid-a") is None
            assert tunnel.open_connections("uid-a") == 0
            await wait_for(lambda: rt.open_connections(spec.sandbox_id) == 0, "actor side reset")
            await assert_reset(stream)
            await stream.aclose()
            answer = await c.get("as1/alpha")
            assert answer.status == 421
            assert answer.headers["x-ate-assignment-stale"] == "true"
            await tunnel.deactivate("uid-a")  # idempotent
            assert tunnel.stats().resets == 1


async def test_abort_under_load_leaves_nothing_open(pki: Pki, tmp_path: Path) -> None:
    """Requests racing abort(): each one is served, reset or refused, and afterwards the
    actor has no connection left, so its checkpoint succeeds."""
    async with tunnel_for(pki) as tunnel, FakeSandboxRuntime() as rt:
        spec = await run_actor(rt, tunnel, tmp_path, A, "uid-a")
        outcomes: dict[str, int] = {"served": 0, "refused": 0, "reset": 0}
        aborted = anyio.Event()

        async def hammer() -> None:
            while True:
                try:
                    async with client(tunnel, pki) as c:
                        while True:
                            answer = await c.get("as1/alpha")
                            if answer.status == 421:
                                outcomes["refused"] += 1
                                if aborted.is_set():
                                    return
                            else:
                                assert answer.status == 200, answer
                                outcomes["served"] += 1
                except _GONE:
                    outcomes["reset"] += 1

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(hammer)
                while outcomes["served"] < 50:  # noqa: ASYNC110 - let the load build up
                    await anyio.sleep(0.005)
                await tunnel.abort("uid-a")
                aborted.set()
                assert tunnel.open_connections("uid-a") == 0
        assert outcomes["refused"] >= 8
        await wait_for(lambda: rt.open_connections(spec.sandbox_id) == 0, "all reset")
        await rt.checkpoint(spec.sandbox_id, str(tmp_path / "img"))


# --- kept-alive connections to actors ---------------------------------------------------


async def test_kept_alive_connection_is_reused_and_abort_resets_it(
    pki: Pki, tmp_path: Path
) -> None:
    """A clean exchange leaves its connection idle for the next request; abort() resets the
    idle one too, so the checkpoint finds nothing open."""
    async with tunnel_for(pki) as tunnel, FakeSandboxRuntime() as rt, client(tunnel, pki) as c:
        spec = await run_actor(rt, tunnel, tmp_path, A, "uid-a")
        for n in (1, 2, 3):
            answer = await c.get("as1/alpha")
            assert answer.status == 200
            assert answer.body.startswith(f"count={n} ".encode())
        # (the exchange ends, and its connection goes idle, right after the answer)
        await wait_for(lambda: tunnel.stats().idle_links == 1, "the connection idle")
        stats = tunnel.stats()
        assert (stats.requests, stats.reused) == (3, 2)
        assert rt.open_connections(spec.sandbox_id) == 1, "one connection carried all three"
        assert tunnel.open_connections("uid-a") == 1, "the idle one is tracked"

        assert await tunnel.abort("uid-a") == 1
        assert tunnel.open_connections("uid-a") == 0
        assert tunnel.stats().idle_resets == 1
        await wait_for(lambda: rt.open_connections(spec.sandbox_id) == 0, "idle one reset")
        await rt.checkpoint(spec.sandbox_id, str(tmp_path / "img"))
        # The client connection that carried the requests was not touched.
        assert (await c.get("as1/alpha")).status == 421


async def test_deactivate_resets_idle_connections(pki: Pki, tmp_path: Path) -> None:
    async with tunnel_for(pki) as tunnel, FakeSandboxRuntime() as rt, client(tunnel, pki) as c:
        spec = await run_actor(rt, tunnel, tmp_path, A, "uid-a")
        assert (await c.get("as1/alpha")).status == 200
        await wait_for(lambda: tunnel.stats().idle_links == 1, "the connection idle")
        assert rt.open_connections(spec.sandbox_id) == 1
        await tunnel.deactivate("uid-a")
        assert tunnel.open_connections("uid-a") == 0
        await wait_for(lambda: rt.open_connections(spec.sandbox_id) == 0, "idle one reset")
        await rt.checkpoint(spec.sandbox_id, str(tmp_path / "img"))


async def test_idle_connections_expire_with_rst(pki: Pki, tmp_path: Path) -> None:
    async with (
        tunnel_for(pki, backend_idle_timeout=0.2) as tunnel,
        backend() as (address, seen),
        client(tunnel, pki) as c,
    ):
        tunnel.activate(A, "uid-a", address)
        assert (await c.get("as1/alpha", "/inspect")).status == 200
        assert tunnel.open_connections("uid-a") == 1
        await wait_for(lambda: seen.endings == ["rst"], "expired and reset")
        assert tunnel.open_connections("uid-a") == 0
        assert tunnel.stats().idle_expired == 1


async def test_reuse_can_be_turned_off(pki: Pki, tmp_path: Path) -> None:
    async with (
        tunnel_for(pki, backend_idle_timeout=0) as tunnel,
        FakeSandboxRuntime() as rt,
        client(tunnel, pki) as c,
    ):
        spec = await run_actor(rt, tunnel, tmp_path, A, "uid-a")
        assert (await c.get("as1/alpha")).status == 200
        await wait_for(lambda: tunnel.open_connections("uid-a") == 0, "reset after the exchange")
        await wait_for(lambda: rt.open_connections(spec.sandbox_id) == 0, "reset at once")
        assert (await c.get("as1/alpha")).status == 200
        assert tunnel.stats().reused == 0


async def test_connections_that_did_not_end_cleanly_are_not_kept(pki: Pki) -> None:
    """An upgrade, and an answer with Connection: close, never leave an idle connection."""

    async def handle(stream: SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        async with stream:
            while not isinstance(await _backend_events(conn, stream), h11.EndOfMessage):
                pass
            headers = [("content-length", "2"), ("connection", "close")]
            await stream.send(
                (conn.send(h11.Response(status_code=200, headers=headers)) or b"")
                + (conn.send(h11.Data(data=b"ok")) or b"")
                + (conn.send(h11.EndOfMessage()) or b"")
            )
            with contextlib.suppress(*_GONE):
                await stream.receive()

    listener = await anyio.create_tcp_listener(local_host=HOST, local_port=0)
    async with listener, anyio.create_task_group() as tg, tunnel_for(pki) as tunnel:
        tg.start_soon(listener.serve, handle)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        tunnel.activate(A, "uid-a", SandboxAddress(host=HOST, ports=((80, port),)))
        async with client(tunnel, pki) as c:
            answer = await c.get("as1/alpha")
            assert (answer.status, answer.body) == (200, b"ok")
            assert "connection" not in answer.headers, "hop-by-hop: the router's stays alive"
            await wait_for(lambda: tunnel.open_connections("uid-a") == 0, "reset, not kept")
            assert (await c.get("as1/alpha")).status == 200
        assert tunnel.stats().reused == 0
        tg.cancel_scope.cancel()


async def test_a_kept_alive_connection_broken_under_a_request(pki: Pki) -> None:
    """The actor drops a kept-alive connection when the next request arrives: a request
    without a body is sent again on a new connection; one with a body is not (502)."""
    served: list[str] = []

    async def handle(stream: SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        async with stream:
            for n in (1, 2):
                request = await _backend_events(conn, stream)
                if not isinstance(request, h11.Request):
                    return
                while not isinstance(await _backend_events(conn, stream), h11.EndOfMessage):
                    pass
                if n == 2:  # the first request of a connection only: drop it with RST
                    stream.extra(anyio.abc.SocketAttribute.raw_socket).setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    return
                served.append(request.method.decode())
                head = h11.Response(status_code=200, headers=[("content-length", "2")])
                await stream.send(
                    (conn.send(head) or b"")
                    + (conn.send(h11.Data(data=b"ok")) or b"")
                    + (conn.send(h11.EndOfMessage()) or b"")
                )
                conn.start_next_cycle()

    listener = await anyio.create_tcp_listener(local_host=HOST, local_port=0)
    async with listener, anyio.create_task_group() as tg, tunnel_for(pki) as tunnel:
        tg.start_soon(listener.serve, handle)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        tunnel.activate(A, "uid-a", SandboxAddress(host=HOST, ports=((80, port),)))
        async with client(tunnel, pki) as c:
            assert (await c.get("as1/alpha")).status == 200
            assert (await c.get("as1/alpha")).status == 200, "sent again on a new connection"
            stats = tunnel.stats()
            assert (stats.reused, stats.retries, stats.requests) == (1, 1, 2)
            headers = [("host", "x"), ("ate-target-actor", "as1/alpha")]
            answer = await c.request("POST", "/", headers, body=b"not replayed")
            assert answer.status == 502
        assert served == ["GET", "GET"]
        tg.cancel_scope.cancel()
