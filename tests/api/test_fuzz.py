"""Fuzzing the request fields over mTLS: bad input is a client error, never INTERNAL/UNKNOWN.

One server (harness cluster, mTLS) runs for the module in a blocking portal; hypothesis
drives synchronous calls into it. State accumulates across examples on purpose: names drawn
from a small pool hit existing atespaces, templates and actors, so the fuzz reaches the
workflows as well as the parsers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import betterproto
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from substrate.api import pb
from substrate.client import parse_address
from substrate.core.ids import ActorRef, TemplateRef
from substrate.identity import client_context

from .mtls_stack import Pki, Stack, api_stack, close_channel, make_pki, raw_channel

NEVER = {Status.INTERNAL, Status.UNKNOWN}
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=80)
VALID_NAMES = st.sampled_from(["a1", "a-2", "b3", "counter", "web", "t1"])
NAMES = st.one_of(
    VALID_NAMES,
    st.sampled_from(["lab", "team", "", "Lab", "ate-golden", "w-0-0", "a.b", "-a", "a-"]),
    st.sampled_from(["x" * 63, "x" * 64, "ä", "a/b", " ", "\x00"]),
    TEXT,
)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
SMALL_ENUM = st.one_of(st.integers(0, 4), INT32)
REFS = st.one_of(
    st.builds(pb.ObjectRef),
    st.builds(pb.ObjectRef, atespace=st.sampled_from(["lab", "lab", "team", ""]), name=VALID_NAMES),
    st.builds(pb.ObjectRef, atespace=NAMES, name=NAMES),
)
LABELS = st.one_of(
    st.just({}),
    st.dictionaries(
        st.sampled_from(["zone", "app.kubernetes.io/name", "tier"]),
        st.sampled_from(["", "a", "b-1"]),
        max_size=3,
    ),
    st.dictionaries(
        st.one_of(st.sampled_from(["zone", "a/b/c", "/x", "k" * 64, "-k", "k_", "Zone.x/y"]), TEXT),
        st.one_of(st.sampled_from(["", "b", "v" * 64, "-v"]), TEXT),
        max_size=12,
    ),
)


@attrs.frozen
class Served:
    portal: BlockingPortal
    control: pb.ControlStub
    raw: Channel

    def status(self, call: Callable[..., Any], request: betterproto.Message) -> Status:
        try:
            self.portal.call(call, request)
        except GRPCError as exc:
            return exc.status
        return Status.OK


class RawCodec(CodecBase):
    """Sends and receives bytes as they are (to feed the server undecodable messages)."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


async def _raw_channel(address: str, pki: Pki) -> Channel:
    host, port = parse_address(address)
    return Channel(host, port, ssl=client_context(pki.files("client")), codec=RawCodec())


async def _seed(stack: Stack) -> None:
    """Actors for the fuzz to find: two SUSPENDED, one RUNNING, one PAUSED."""
    svc = stack.cluster.svc
    await svc.create_atespace("team")
    for name in ("a1", "a-2", "b3", "web"):
        await svc.create_actor(ActorRef("lab", name), template=TemplateRef("lab", "counter"))
    await svc.resume(ActorRef("lab", "b3"))
    await svc.resume(ActorRef("lab", "web"))
    await svc.pause(ActorRef("lab", "web"))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    pki = make_pki(Path(tmp_path_factory.mktemp("pki")))
    with (
        start_blocking_portal("asyncio") as portal,
        portal.wrap_async_context_manager(api_stack(pki)) as stack,
        portal.wrap_async_context_manager(
            raw_channel(stack.address, pki.files("client"))
        ) as channel,
    ):
        portal.call(_seed, stack)
        raw = portal.call(_raw_channel, stack.address, pki)
        try:
            yield Served(portal=portal, control=pb.ControlStub(channel, timeout=20), raw=raw)
        finally:
            portal.call(close_channel, raw)  # on the loop's thread: grpclib is not thread-safe


@FUZZ
@given(
    ref=REFS,
    template=st.one_of(
        st.builds(pb.ObjectRef, atespace=st.sampled_from(["", "lab"]), name=VALID_NAMES), REFS
    ),
    source_tag=st.one_of(st.just(pb.ObjectRef()), REFS),
    selector=st.one_of(st.just({}), LABELS),
)
def test_create_actor(
    served: Served,
    ref: pb.ObjectRef,
    template: pb.ObjectRef,
    source_tag: pb.ObjectRef,
    selector: dict[str, str],
) -> None:
    request = pb.CreateActorRequest(
        ref=ref, template=template, source_tag=source_tag, worker_selector=selector
    )
    assert served.status(served.control.create_actor, request) not in NEVER


@FUZZ
@given(ref=REFS)
def test_resume_actor(served: Served, ref: pb.ObjectRef) -> None:
    assert served.status(served.control.resume_actor, pb.ResumeActorRequest(ref=ref)) not in NEVER


@FUZZ
@given(ref=REFS, mode=SMALL_ENUM)
def test_suspend_actor(served: Served, ref: pb.ObjectRef, mode: int) -> None:
    request = pb.SuspendActorRequest(ref=ref, mode=mode)
    assert served.status(served.control.suspend_actor, request) not in NEVER


@FUZZ
@given(
    page_size=st.one_of(st.integers(0, 1001), INT32),
    page_token=st.one_of(st.just(""), st.sampled_from(["0", "lab/a1", "bGFi"]), TEXT),
    atespace=st.one_of(st.sampled_from(["", "lab"]), NAMES),
)
def test_list_actors(served: Served, page_size: int, page_token: str, atespace: str) -> None:
    request = pb.ListActorsRequest(page_size=page_size, page_token=page_token, atespace=atespace)
    assert served.status(served.control.list_actors, request) not in NEVER


PORTS = st.one_of(st.integers(1, 65535), INT32)
PROBES = st.one_of(
    st.none(),
    st.builds(pb.Probe),
    st.builds(
        pb.Probe,
        path=st.one_of(st.just("/readyz"), TEXT),
        port=PORTS,
        timeout_seconds=st.one_of(st.integers(0, 4000), INT32),
    ),
)
CONTAINERS = st.one_of(
    st.builds(
        pb.Container,
        name=st.sampled_from(["app", "side"]),
        image=st.just("local/counter"),
        ports=st.lists(st.integers(1, 65535), max_size=2),
        wakeup_probe=PROBES,
    ),
    st.builds(
        pb.Container,
        name=NAMES,
        image=st.one_of(st.just("local/counter"), TEXT),
        command=st.lists(TEXT, max_size=3),
        env=st.lists(st.builds(pb.EnvVar, name=TEXT, value=TEXT), max_size=3),
        ports=st.lists(PORTS, max_size=3),
        wakeup_probe=PROBES,
    ),
)
VALID_CONTAINERS = st.builds(
    pb.Container,
    name=st.sampled_from(["app", "side"]),
    image=st.just("local/counter"),
    ports=st.lists(st.integers(1, 65535), max_size=2),
    wakeup_probe=st.one_of(st.none(), st.builds(pb.Probe, path=st.just("/readyz"))),
)
TEMPLATES = st.one_of(
    # Mostly valid: reaches the store (created, AlreadyExists) and later the workflows.
    st.builds(
        pb.ActorTemplate,
        ref=st.builds(pb.ObjectRef, atespace=st.just("lab"), name=VALID_NAMES),
        containers=st.lists(VALID_CONTAINERS, min_size=1, max_size=2),
        resources=st.builds(
            pb.Resources, cpu_milli=st.integers(0, 2000), memory_bytes=st.integers(0, 1 << 31)
        ),
        sandbox_class=st.sampled_from([0, 3]),
        snapshot_config=st.builds(
            pb.SnapshotConfig,
            preferred_fidelity=st.integers(0, 3),
            storage_location=st.sampled_from(["memory://bucket", ""]),
        ),
    ),
    st.builds(
        pb.ActorTemplate,
        ref=REFS,
        containers=st.lists(CONTAINERS, max_size=3),
        resources=st.one_of(
            st.builds(
                pb.Resources, cpu_milli=st.integers(0, 2000), memory_bytes=st.integers(0, 1 << 31)
            ),
            st.builds(pb.Resources, cpu_milli=INT64, memory_bytes=INT64),
        ),
        worker_selector=LABELS,
        sandbox_class=SMALL_ENUM,
        snapshot_config=st.builds(
            pb.SnapshotConfig,
            preferred_fidelity=SMALL_ENUM,
            storage_location=st.one_of(st.just("memory://bucket"), st.just(""), TEXT),
        ),
        golden_snapshot=st.booleans(),
    ),
)


@FUZZ
@given(template=TEMPLATES)
def test_create_actor_template(served: Served, template: pb.ActorTemplate) -> None:
    request = pb.CreateActorTemplateRequest(template=template)
    assert served.status(served.control.create_actor_template, request) not in NEVER


async def _send_raw(channel: Channel, method: str, body: bytes) -> Status:
    try:
        async with channel.request(
            f"/substrate.v1.Control/{method}", Cardinality.UNARY_UNARY, bytes, bytes, timeout=20
        ) as stream:
            await stream.send_message(body, end=True)
            await stream.recv_message()
    except GRPCError as exc:
        return exc.status
    return Status.OK


@FUZZ
@given(
    method=st.sampled_from(["CreateActor", "CreateActorTemplate", "ListActors", "SuspendActor"]),
    body=st.binary(max_size=64),
)
def test_undecodable_requests_are_invalid_arguments(
    served: Served, method: str, body: bytes
) -> None:
    status = served.portal.call(_send_raw, served.raw, method, body)
    assert status not in NEVER


def test_known_undecodable_body_is_invalid_argument(served: Served) -> None:
    # A length-delimited field (ref) that claims more bytes than follow.
    status = served.portal.call(_send_raw, served.raw, "ResumeActor", b"\x0a\x05ab")
    assert status is Status.INVALID_ARGUMENT
