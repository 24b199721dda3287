"""substrate.client: addresses, credentials, the sync wrapper, transport errors."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from substrate.client import AteClient, SyncAteClient, parse_address
from substrate.client._async import isolated
from substrate.core.agent_ports import StartRequest, StartResult
from substrate.core.ids import ActorRef, Labels
from substrate.core.model import ActorState, SuspendMode, WorkerState
from substrate.errors import (
    AlreadyExists,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
)

from .mtls_stack import Pki, api_stack, make_pki

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(Path(tmp_path_factory.mktemp("pki")))


@pytest.mark.parametrize(
    ("address", "parsed"),
    [
        ("127.0.0.1:7443", ("127.0.0.1", 7443)),
        ("localhost:1", ("localhost", 1)),
        ("[::1]:65535", ("::1", 65535)),
        ("ateapi.internal:50051", ("ateapi.internal", 50051)),
    ],
)
def test_parse_address(address: str, parsed: tuple[str, int]) -> None:
    assert parse_address(address) == parsed


@pytest.mark.parametrize(
    "address", ["", "host", ":80", "host:", "host:0", "host:65536", "host:x", "::1:80", "[::1]"]
)
def test_parse_address_refuses_malformed(address: str) -> None:
    with pytest.raises(InvalidArgument, match="host:port"):
        parse_address(address)


async def test_connect_checks_its_credentials(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="tls_dir"):
        async with AteClient.connect("127.0.0.1:1"):
            pass
    with pytest.raises(InvalidArgument, match="not found"):
        async with AteClient.connect("127.0.0.1:1", tls_dir=tmp_path):
            pass
    with pytest.raises(InvalidArgument, match="takes no TLS files"):
        async with AteClient.connect("127.0.0.1:1", tls_dir=pki.dir, insecure=True):
            pass
    # A "CA" that names no trust domain (here: a leaf) cannot tell whom to pin.
    with pytest.raises(InvalidArgument, match="names no SPIFFE trust domain"):
        async with AteClient.connect("127.0.0.1:1", tls_dir=pki.dir, ca=pki.files("router").cert):
            pass
    async with AteClient.connect("127.0.0.1:1", tls_dir=pki.dir, name="router") as client:
        assert client.tls
        assert str(client.server_id) == "spiffe://ate/ateapi"
    async with AteClient.connect(
        "127.0.0.1:1", tls_dir=pki.dir, server_id="spiffe://ate/router"
    ) as client:
        assert str(client.server_id) == "spiffe://ate/router"
    async with AteClient.connect("127.0.0.1:1", tls_dir=pki.dir, pin_server=False) as client:
        assert client.server_id is None


async def test_refs_are_typed_or_atespace_slash_name(pki: Pki) -> None:
    async with api_stack(pki) as st, st.connect() as ate:
        with pytest.raises(InvalidArgument, match="<atespace>/<name>"):
            await ate.get_actor("no-slash")
        with pytest.raises(InvalidArgument, match="<atespace>/<name>"):
            await ate.get_template("a/b/c")
        with pytest.raises(NotFound):
            await ate.get_actor(ActorRef("lab", "zz"))


async def test_nobody_listening_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with AteClient.connect(f"127.0.0.1:{port}", insecure=True, timeout=5) as ate:
        with pytest.raises(Unavailable, match="cannot reach"):
            await ate.list_atespaces()


async def test_a_node_that_is_down_is_unavailable(pki: Pki) -> None:
    async with api_stack(pki) as st, st.connect() as ate:
        for node in ("node-0", "node-1"):
            st.cluster.agent(node).down = True
        await ate.create_actor("lab/a1", template="lab/counter")
        with pytest.raises(Unavailable):
            await ate.resume_actor("lab/a1")
        assert (await ate.get_actor("lab/a1")).state is ActorState.SUSPENDED


async def test_a_call_past_its_timeout_is_deadline_exceeded(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def slow_start(request: StartRequest) -> StartResult:
        await anyio.sleep(30)
        raise AssertionError("not reached")

    async with api_stack(pki) as st:
        for node in ("node-0", "node-1"):
            monkeypatch.setattr(st.cluster.agent(node), "start", slow_start)
        async with st.connect(timeout=0.3) as ate:
            await ate.create_actor("lab/slow", template="lab/counter")
            with pytest.raises(DeadlineExceeded):
                await ate.resume_actor("lab/slow")


async def test_sync_client_runs_the_same_calls_blocking(pki: Pki) -> None:
    async with api_stack(pki) as st:

        def script() -> list[str]:
            with SyncAteClient.connect(st.address, tls_dir=pki.dir, timeout=10) as ate:
                ate.create_atespace("sync")
                assert [a.name for a in ate.list_atespaces()] == ["lab", "sync"]
                with pytest.raises(AlreadyExists):
                    ate.create_atespace("sync")
                for i in range(3):
                    ate.create_actor(f"lab/s{i}", template="lab/counter", worker_selector={})
                result = ate.resume_actor("lab/s0")
                assert result.resumed
                assert ate.suspend_actor("lab/s0", SuspendMode.SYNC).state is ActorState.SUSPENDED
                ate.update_actor_selector("lab/s1", Labels({"zone": "a"}))
                assert ate.get_actor("lab/s1").worker_selector == Labels({"zone": "a"})
                page, token = ate.list_actors_page("lab", page_size=2)
                assert len(page) == 2
                assert token
                ate.delete_actor("lab/s2", force=True)
                assert ate.get_worker("w-1-1").state is WorkerState.ACTIVE
                assert len(ate.list_workers()) == 4
                assert ate.list_tags("lab") == []
                assert [t.ref.name for t in ate.list_templates("lab")] == ["counter"]
                return [a.ref.name for a in ate.list_actors("lab", page_size=1)]

        names = await anyio.to_thread.run_sync(script)
        assert names == ["s0", "s1"]

        def as_router() -> None:
            with (
                SyncAteClient.connect(st.address, tls_dir=pki.dir, name="router") as router,
                pytest.raises(PermissionDenied),
            ):
                router.delete_actor("lab/s0")

        await anyio.to_thread.run_sync(as_router)


async def test_isolated_confines_a_self_cancelling_call_to_its_own_task() -> None:
    async def like_grpclib() -> None:
        # grpclib's deadline/connection-loss handling: cancel the calling task, then raise
        # its own error instead of the CancelledError.
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        try:
            await asyncio.sleep(1)
        except asyncio.CancelledError:
            raise TimeoutError("deadline exceeded") from None

    me = asyncio.current_task()
    assert me is not None
    with pytest.raises(TimeoutError, match="deadline"):
        await isolated(like_grpclib)
    assert me.cancelling() == 0
    with anyio.CancelScope():  # a scope in this task still works normally
        await anyio.lowlevel.checkpoint()
    assert await isolated(anyio.sleep, 0) is None
