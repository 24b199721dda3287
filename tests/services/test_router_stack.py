"""Support for the router tests: a real router between a fake ateapi and real atunnels.

* ateapi is a grpclib ``Control`` servicer with a scripted ResumeActor (and GetWorker /
  ListWorkers from a worker table), served over mutual TLS behind the real authorizer, so
  the router's identity must be allowed each call it makes;
* each worker is a real :class:`~substrate.services.atunnel.Atunnel` (mTLS, presenting
  ``Identity.worker(<name>)``) with :class:`~substrate.adapters.memory.FakeSandboxRuntime`
  workloads or small inspecting backends behind it;
* the router is the real :class:`~substrate.services.router.Router` on a free port, and
  :class:`Http` is a small keep-alive HTTP/1.1 client over a plain socket.

The few tests at the bottom check the stack itself.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import attrs
import h11
import pytest
from anyio.abc import SocketStream
from grpclib.events import RecvRequest, listen
from grpclib.server import Server

from substrate.adapters.memory import FakeSandboxRuntime
from substrate.adapters.observability.router_metrics import PrometheusRouterMetrics
from substrate.api import convert, pb
from substrate.api.server import Authorizer, RequestCodec, Serving, started
from substrate.api.status import grpc_errors
from substrate.client import AteClient
from substrate.core.ids import ActorRef, NodeRef, TemplateRef, WorkerRef
from substrate.core.model import (
    Actor,
    ActorState,
    ActorStatus,
    RestoreSource,
    ResumeResult,
    Worker,
    WorkerAssignment,
    WorkerState,
)
from substrate.errors import Aborted, NotFound, PermissionDenied, SubstrateError
from substrate.identity import (
    CertificateAuthority,
    Identity,
    TlsFiles,
    server_context,
    write_bundle,
)
from substrate.identity.ca import CA_VALIDITY
from substrate.net.parking import ParkingConfig
from substrate.sandbox.spec import SandboxAddress, SandboxSpec, sandbox_id_for
from substrate.services.atunnel import Atunnel, atunnel_server_context
from substrate.services.router import Router, RouterConfig
from substrate.services.router_upstream import TunnelPool, tunnel_client_context
from tests.http_client import H11Client, Reply

TRUST_DOMAIN = "ate"
HOST = "127.0.0.1"
TIMEOUT = 10.0
NOW = datetime.now(UTC)
WORKERS = ("w-0", "w-1")


# --- PKI ----------------------------------------------------------------------------------


@attrs.frozen
class Pki:
    dir: Path

    def files(self, name: str) -> TlsFiles:
        return TlsFiles.in_dir(self.dir, name)


def make_pki(base: Path) -> Pki:
    ca = CertificateAuthority.create(TRUST_DOMAIN, now=NOW)
    identities = {
        "ateapi": Identity.ateapi(TRUST_DOMAIN),
        "router": Identity.router(TRUST_DOMAIN),
        "client": Identity.client("alice", TRUST_DOMAIN),
        "impostor": Identity.worker("w-9", TRUST_DOMAIN),
        **{name: Identity.worker(name, TRUST_DOMAIN) for name in WORKERS},
    }
    for name, identity in identities.items():
        write_bundle(base, name, ca.issue(identity, now=NOW, valid_for=CA_VALIDITY))
    return Pki(dir=base)


# --- a scripted ateapi ---------------------------------------------------------------------


def running(
    actor: ActorRef,
    worker: str = "w-0",
    *,
    resumed: bool = True,
    source: RestoreSource | None = RestoreSource.LOCAL,
    generation: int = 3,
    age: float = 12.5,
    duration: float = 0.25,
    state: ActorState = ActorState.RUNNING,
) -> ResumeResult:
    """A ResumeActor answer: ``actor`` RUNNING on ``worker``."""
    return ResumeResult(
        actor=Actor(
            ref=actor,
            template=TemplateRef(actor.atespace, "tpl"),
            status=ActorStatus(
                state=state,
                assignment=WorkerAssignment(
                    worker=WorkerRef(worker), node=NodeRef("node-0"), worker_epoch=1
                ),
            ),
        ),
        resumed=resumed,
        source=source if resumed else None,
        generation=generation if resumed else 0,
        snapshot_age_seconds=age if resumed else 0.0,
        resume_duration_seconds=duration if resumed else 0.0,
    )


Resume = Callable[[ActorRef], Awaitable[ResumeResult]]


class FakeAteapi(pb.ControlBase):
    """ResumeActor answers with ``on_resume`` (set by each test); workers from a table."""

    def __init__(self) -> None:
        self.on_resume: Resume | None = None
        self.workers: dict[str, Worker] = {}
        self.resume_calls: list[tuple[ActorRef, float]] = []
        self.get_worker_calls: list[str] = []
        self.list_workers_calls = 0
        self.resumes_finished = 0

    async def resume_actor(self, request: pb.ResumeActorRequest) -> pb.ResumeActorResponse:
        with grpc_errors():
            ref = convert.actor_ref_from_proto(request.ref)
            self.resume_calls.append((ref, anyio.current_time()))
            assert self.on_resume is not None, "the test did not script ResumeActor"
            result = await self.on_resume(ref)
            self.resumes_finished += 1
            return convert.resume_result_to_proto(result)

    async def get_worker(self, request: pb.GetWorkerRequest) -> pb.Worker:
        with grpc_errors():
            self.get_worker_calls.append(request.name)
            worker = self.workers.get(request.name)
            if worker is None:
                raise NotFound(f"worker {request.name} not found")
            return convert.worker_to_proto(worker)

    async def list_workers(self, request: pb.ListWorkersRequest) -> pb.ListWorkersResponse:
        with grpc_errors():
            self.list_workers_calls += 1
            return pb.ListWorkersResponse(
                workers=[convert.worker_to_proto(w) for w in self.workers.values()]
            )

    def calls_for(self, actor: ActorRef) -> int:
        return sum(1 for ref, _ in self.resume_calls if ref == actor)


class Hang:
    """A scripted answer that never comes."""


Answer = ResumeResult | SubstrateError | Hang | Callable[[ActorRef], Awaitable[ResumeResult]]


def scripted(*answers: Answer, then: Answer | None = None, delay: float = 0.0) -> Resume:
    """ResumeActor answering ``answers`` in turn, then ``then`` forever (after ``delay``)."""
    queue = list(answers)

    async def resume(actor: ActorRef) -> ResumeResult:
        if delay:
            await anyio.sleep(delay)
        answer = queue.pop(0) if queue else then
        assert answer is not None, "ResumeActor called more often than scripted"
        if isinstance(answer, Hang):
            await anyio.sleep_forever()
            raise AssertionError("unreachable")
        if isinstance(answer, SubstrateError):
            raise type(answer)(answer.description)
        if isinstance(answer, ResumeResult):
            return answer
        return await answer(actor)

    return resume


@asynccontextmanager
async def serve_ateapi(pki: Pki, fake: FakeAteapi) -> AsyncIterator[Serving]:
    server = Server([fake], codec=RequestCodec())
    listen(server, RecvRequest, Authorizer(trust_domain=TRUST_DOMAIN, insecure=False))
    async with started(server, HOST, 0, ssl=server_context(pki.files("ateapi"))) as serving:
        yield serving


# --- inspecting backends ---------------------------------------------------------------------


@attrs.define
class Seen:
    """What a backend received: (port, target, raw headers) per request."""

    requests: list[tuple[int, str, list[tuple[bytes, bytes]]]] = attrs.Factory(list)


async def _events(conn: h11.Connection, stream: SocketStream) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        try:
            data = await stream.receive()
        except anyio.EndOfStream:
            data = b""
        conn.receive_data(data)


async def _respond(
    conn: h11.Connection,
    stream: SocketStream,
    status: int,
    body: bytes,
    headers: Sequence[tuple[str, str]] = (),
) -> None:
    all_headers = [("content-length", str(len(body))), *headers]
    data = conn.send(h11.Response(status_code=status, headers=all_headers)) or b""
    data += conn.send(h11.Data(data=body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    await stream.send(data)


async def _serve_backend(stream: SocketStream, port: int, seen: Seen) -> None:
    """``/echo`` streams the body back as it comes; ``/upgrade`` answers 101 then upper-cases
    bytes; ``/app421`` is the application's own 421; anything else says which port and
    what it got."""
    conn = h11.Connection(h11.SERVER)
    while True:
        request = await _events(conn, stream)
        if not isinstance(request, h11.Request):
            return
        target = request.target.decode()
        seen.requests.append((port, target, list(request.headers.raw_items())))
        if target == "/echo":
            await stream.send(conn.send(h11.Response(status_code=200, headers=[])) or b"")
            while True:
                event = await _events(conn, stream)
                if isinstance(event, h11.Data):
                    await stream.send(conn.send(event) or b"")
                elif isinstance(event, h11.EndOfMessage):
                    await stream.send(conn.send(h11.EndOfMessage()) or b"")
                    break
                else:
                    return
        elif target == "/upgrade":
            end = await _events(conn, stream)
            assert isinstance(end, h11.EndOfMessage)
            switch = h11.InformationalResponse(
                status_code=101, headers=[("Upgrade", "upper"), ("Connection", "upgrade")]
            )
            await stream.send(conn.send(switch) or b"")
            leftover, _ = conn.trailing_data
            if leftover:
                await stream.send(leftover.upper())
            while True:
                await stream.send((await stream.receive()).upper())
        else:
            size = 0
            while True:
                event = await _events(conn, stream)
                if isinstance(event, h11.Data):
                    size += len(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    return
            if target == "/app421":
                await _respond(conn, stream, 421, b"the app says no")
            else:
                await _respond(
                    conn, stream, 200, f"port={port} target={target} body={size}".encode()
                )
        conn.start_next_cycle()


@asynccontextmanager
async def backend(ports: Sequence[int] = (80, 8080)) -> AsyncIterator[tuple[SandboxAddress, Seen]]:
    """An inspecting workload listening for each sandbox port in ``ports``."""
    seen = Seen()
    async with AsyncExitStack() as stack:
        listeners = [
            (
                sandbox_port,
                await stack.enter_async_context(
                    await anyio.create_tcp_listener(local_host=HOST, local_port=0)
                ),
            )
            for sandbox_port in ports
        ]
        async with anyio.create_task_group() as tg:
            for sandbox_port, listener in listeners:

                async def handle(stream: SocketStream, sandbox_port: int = sandbox_port) -> None:
                    async with stream:
                        try:
                            await _serve_backend(stream, sandbox_port, seen)
                        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                            pass
                        except h11.ProtocolError:
                            pass

                tg.start_soon(listener.serve, handle)
            pairs = tuple(
                (sandbox_port, listener.extra(anyio.abc.SocketAttribute.local_port))
                for sandbox_port, listener in listeners
            )
            yield SandboxAddress(host=HOST, ports=pairs), seen
            tg.cancel_scope.cancel()


# --- the whole stack ---------------------------------------------------------------------------


_uids = itertools.count(1)


@attrs.define(eq=False)
class Stack:
    pki: Pki
    ateapi: FakeAteapi
    ateapi_serving: Serving
    tunnels: dict[str, Atunnel]
    runtime: FakeSandboxRuntime
    tmp: Path
    router: Router | None = None
    port: int = 0
    metrics: PrometheusRouterMetrics | None = None
    proxy: TcpProxy | None = None

    @property
    def r(self) -> Router:
        assert self.router is not None
        return self.router

    async def run_actor(self, actor: ActorRef, worker: str = "w-0") -> str:
        """Start a FakeSandboxRuntime workload for ``actor`` and activate it on ``worker``."""
        uid = f"u{next(_uids)}"
        spec = SandboxSpec(
            sandbox_id=sandbox_id_for(uid),
            bundle_dir=str(self.tmp / "bundles" / uid),
            netns_path=f"/var/run/netns/{uid}",
            args=("/bin/counter",),
            ports=(80,),
        )
        await self.runtime.run(spec)
        self.tunnels[worker].activate(actor, uid, await self.runtime.address(spec.sandbox_id))
        return uid

    def activate(self, actor: ActorRef, address: SandboxAddress, worker: str = "w-0") -> str:
        uid = f"u{next(_uids)}"
        self.tunnels[worker].activate(actor, uid, address)
        return uid

    async def deactivate(self, actor: ActorRef, worker: str = "w-0") -> None:
        tunnel = self.tunnels[worker]
        for route in tunnel.routes():
            if route.actor == actor:
                await tunnel.deactivate(route.actor_uid)

    def resume_onto(self, worker: str = "w-0", **kwargs: Any) -> Resume:
        """ResumeActor that starts a counter workload on ``worker`` (if the actor is not
        active there) and says so."""

        async def resume(actor: ActorRef) -> ResumeResult:
            if not self.tunnels[worker].is_active(actor):
                await self.run_actor(actor, worker)
                return running(actor, worker, **kwargs)
            return running(actor, worker, resumed=False)

        return resume

    def register(self, name: str, address: str | None = None) -> None:
        tunnel = self.tunnels.get(name)
        self.ateapi.workers[name] = Worker(
            ref=WorkerRef(name),
            node=NodeRef("node-0"),
            state=WorkerState.ACTIVE,
            tunnel_address=address or f"{HOST}:{tunnel.port if tunnel else 1}",
        )

    def http(self) -> Http:
        return Http(self.port)

    async def stop_ateapi(self) -> None:
        """ateapi goes away: its address refuses connections, open ones are cut."""
        assert self.proxy is not None
        await self.proxy.stop()


class TcpProxy:
    """A TCP relay in front of ateapi that a test can cut (TLS passes through it)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._scope = anyio.CancelScope()
        self._listener: anyio.abc.SocketListener | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        multi = await anyio.create_tcp_listener(local_host=HOST, local_port=0)
        listener = multi.listeners[0]
        assert isinstance(listener, anyio.abc.SocketListener)
        self._listener = listener
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        with self._scope:
            async with listener, anyio.create_task_group() as tg:
                task_status.started()
                while True:
                    client = await listener.accept()
                    tg.start_soon(self._relay, client)

    async def _relay(self, client: SocketStream) -> None:
        async with client, await anyio.connect_tcp(HOST, self.target_port) as server:

            async def pipe(src: SocketStream, dst: SocketStream) -> None:
                try:
                    while True:
                        await dst.send(await src.receive())
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    pass
                tg.cancel_scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(pipe, client, server)
                tg.start_soon(pipe, server, client)

    async def stop(self) -> None:
        self._scope.cancel()
        if self._listener is not None:
            await self._listener.aclose()
        await anyio.sleep(0.01)


def router_config(**parking: Any) -> RouterConfig:
    """Small budgets and quick retries, so that parking tests take a fraction of a second."""
    knobs: dict[str, Any] = {"budget": 1.0, "retry_interval": 0.02, "retry_factor": 1.1}
    knobs.update(parking)
    return RouterConfig(
        parking=ParkingConfig(**knobs),
        health_interval=60.0,
        stale_route_after=0.3,
        linger=0.2,
        trust_domain=TRUST_DOMAIN,
    )


@asynccontextmanager
async def stack(
    tmp: Path, config: RouterConfig | None = None, *, ateapi_timeout: float = 5.0
) -> AsyncIterator[Stack]:
    pki = make_pki(tmp / "tls")
    fake = FakeAteapi()
    async with AsyncExitStack() as es:
        serving = await es.enter_async_context(serve_ateapi(pki, fake))
        runtime = await es.enter_async_context(FakeSandboxRuntime())
        tunnels = {}
        for name in WORKERS:
            tunnels[name] = await es.enter_async_context(
                Atunnel(
                    atunnel_server_context(pki.files(name)),
                    host=HOST,
                    port=0,
                    trust_domain=TRUST_DOMAIN,
                    drain_timeout=0.5,
                )
            )
        s = Stack(
            pki=pki,
            ateapi=fake,
            ateapi_serving=serving,
            tunnels=tunnels,
            runtime=runtime,
            tmp=tmp,
        )
        for name in WORKERS:
            s.register(name)
        proxy_tg = await es.enter_async_context(anyio.create_task_group())
        s.proxy = TcpProxy(serving.port)
        await proxy_tg.start(s.proxy.run)
        es.callback(proxy_tg.cancel_scope.cancel)
        client = await es.enter_async_context(
            AteClient.connect(
                f"{HOST}:{s.proxy.port}",
                tls_dir=pki.dir,
                name="router",
                timeout=ateapi_timeout,
                server_id=Identity.ateapi(TRUST_DOMAIN),
                check_hostname=False,
            )
        )
        cfg = config or router_config()
        pool = TunnelPool(
            tunnel_client_context(pki.files("router")),
            trust_domain=TRUST_DOMAIN,
            connect_timeout=cfg.connect_timeout,
        )
        s.metrics = PrometheusRouterMetrics()
        s.router = await es.enter_async_context(
            Router(
                client,
                pool,
                cfg,
                metrics=s.metrics,
                info={"cache_ttl": cfg.cache_ttl},
                ateapi_address=serving.address,
            )
        )
        s.port = await s.router.listen(HOST, 0)
        await wait_for(lambda: s.r.health.healthy is not None, "the first ateapi check")
        yield s


# --- an HTTP/1.1 client ---------------------------------------------------------------------------


class Http(H11Client):
    """Keep-alive HTTP/1.1 over one plain TCP connection to the router."""

    def __init__(self, port: int) -> None:
        super().__init__(None)  # type: ignore[arg-type]  # connected in __aenter__ (or by hand)
        self.port = port

    async def __aenter__(self) -> Http:
        self.stream = await anyio.connect_tcp(HOST, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.stream is not None:
            with anyio.CancelScope(shield=True):
                await self.stream.aclose()


async def get(port: int, actor: ActorRef | str | None, path: str = "/", **extra: str) -> Reply:
    """One request on a connection of its own."""
    async with Http(port) as http:
        return await http.get(actor, path, **extra)


async def wait_for(predicate: Callable[[], bool], what: str, seconds: float = TIMEOUT) -> None:
    """Poll ``predicate`` (state other tasks change) for a while."""
    with anyio.move_on_after(seconds):
        while not predicate():  # noqa: ASYNC110 (state changed by other tasks and the kernel)
            await anyio.sleep(0.005)
        return
    raise AssertionError(f"timed out waiting for: {what}")


async def closed_port() -> int:
    """A local port nothing listens on (any more)."""
    async with await anyio.create_tcp_listener(local_host=HOST, local_port=0) as listener:
        return int(listener.extra(anyio.abc.SocketAttribute.local_port))


def metric(s: Stack, name: str, **labels: str) -> float:
    assert s.metrics is not None
    value = s.metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else float(value)


# --- the stack's own checks ----------------------------------------------------------------

pytestmark = pytest.mark.anyio
A = ActorRef("team-a", "alpha")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_the_fake_ateapi_enforces_the_router_row(tmp_path: Path) -> None:
    """The router identity may call exactly what the router uses (the authz table)."""
    async with stack(tmp_path) as s:
        s.ateapi.on_resume = scripted(then=running(A))
        async with AteClient.connect(
            s.ateapi_serving.address,
            tls_dir=s.pki.dir,
            name="router",
            server_id=Identity.ateapi(TRUST_DOMAIN),
            check_hostname=False,
        ) as client:
            assert (await client.resume_actor(A)).actor.ref == A
            assert (await client.get_worker("w-0")).tunnel_address.startswith(HOST)
            assert {w.ref.name for w in await client.list_workers()} == set(WORKERS)
            with pytest.raises(PermissionDenied):
                await client.list_actors_page()


async def test_scripted_answers_run_in_order() -> None:
    resume = scripted(Aborted("busy"), running(A), then=running(A, resumed=False))
    with pytest.raises(Aborted, match="busy"):
        await resume(A)
    assert (await resume(A)).resumed
    assert not (await resume(A)).resumed
