"""Every Control RPC end to end: AteClient → mTLS gRPC → servicers → ActorService (memory)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from substrate.api.status import INTERNAL_MESSAGE
from substrate.core.ids import ActorRef, Labels, TagRef, TemplateRef, WorkerRef
from substrate.core.model import (
    ActorState,
    ActorTemplate,
    Container,
    Resources,
    RestoreSource,
    SandboxClass,
    SnapshotConfig,
    SuspendMode,
    WorkerState,
)
from substrate.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)

from .mtls_stack import Pki, api_stack, make_pki

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(Path(tmp_path_factory.mktemp("pki")))


def web_template(atespace: str = "team", name: str = "web", cpu: int = 100) -> ActorTemplate:
    return ActorTemplate(
        ref=TemplateRef(atespace=atespace, name=name),
        containers=(Container(name="app", image="local/counter"),),
        resources=Resources(cpu_milli=cpu, memory_bytes=64 << 20),
        sandbox_class=SandboxClass.FAKE,
        snapshot_config=SnapshotConfig(storage_location="memory://bucket"),
    )


async def test_atespaces_and_templates(pki: Pki) -> None:
    async with api_stack(pki) as st, st.connect() as ate:
        team = await ate.create_atespace("team")
        assert team.name == "team"
        assert team.metadata.uid
        assert (await ate.get_atespace("team")) == team
        assert [a.name for a in await ate.list_atespaces()] == ["lab", "team"]

        created = await ate.create_template(web_template())
        assert created.metadata.version == 1
        assert created.ref == TemplateRef("team", "web")
        assert (await ate.get_template("team/web")) == created
        assert [t.ref.name for t in await ate.list_templates("team")] == ["web"]

        bigger = attrs.evolve(created, resources=Resources(cpu_milli=200, memory_bytes=1 << 20))
        updated = await ate.update_template(bigger)
        assert updated.metadata.version == 2
        assert updated.resources.cpu_milli == 200
        with pytest.raises(Aborted):  # created's version 1 is stale now
            await ate.update_template(attrs.evolve(created, resources=Resources(cpu_milli=1)))

        await ate.delete_template(TemplateRef("team", "web"))
        with pytest.raises(NotFound):
            await ate.get_template("team/web")
        await ate.delete_atespace("team")
        assert [a.name for a in await ate.list_atespaces()] == ["lab"]


async def test_actor_lifecycle_through_the_client(pki: Pki) -> None:
    async with api_stack(pki) as st, st.connect() as ate:
        actor = await ate.create_actor("lab/a1", template="lab/counter")
        assert actor.state is ActorState.SUSPENDED
        assert actor.ref == ActorRef("lab", "a1")
        assert await ate.get_actor(ActorRef("lab", "a1")) == actor

        first = await ate.resume_actor("lab/a1")
        assert first.resumed
        assert first.cold_boot
        assert first.actor.state is ActorState.RUNNING
        assert st.cluster.call(first.actor) == 1
        warm = await ate.resume_actor("lab/a1")
        assert warm.resumed is False
        assert warm.actor.state is ActorState.RUNNING

        suspended = await ate.suspend_actor("lab/a1", SuspendMode.SYNC)
        assert suspended.state is ActorState.SUSPENDED
        again = await ate.resume_actor("lab/a1")
        assert again.resumed
        assert again.source in (RestoreSource.LOCAL, RestoreSource.DURABLE)
        assert again.generation == 1
        assert st.cluster.call(again.actor) == 2  # the counter survived the snapshot

        paused = await ate.pause_actor("lab/a1")
        assert paused.state is ActorState.PAUSED
        reverted = await ate.revert_actor("lab/a1")
        assert reverted.state is ActorState.SUSPENDED

        selected = await ate.update_actor_selector("lab/a1", {"zone": "b"})
        assert selected.worker_selector == Labels({"zone": "b"})
        await ate.update_actor_selector("lab/a1", None)

        await ate.resume_actor("lab/a1")
        with pytest.raises(FailedPrecondition):
            await ate.delete_actor("lab/a1")  # RUNNING needs force
        await ate.delete_actor("lab/a1", force=True)
        with pytest.raises(NotFound, match="a1"):
            await ate.get_actor("lab/a1")
        await st.cluster.allocated_matches_bindings()


async def test_list_actors_pages_and_iterates(pki: Pki) -> None:
    async with api_stack(pki) as st, st.connect() as ate:
        await ate.create_atespace("other")
        for i in range(5):
            await ate.create_actor(f"lab/a{i}", template="lab/counter")
        page, token = await ate.list_actors_page("lab", page_size=2)
        assert [a.ref.name for a in page] == ["a0", "a1"]
        assert token
        page, token = await ate.list_actors_page("lab", page_size=2, page_token=token)
        assert [a.ref.name for a in page] == ["a2", "a3"]
        assert token
        page, token = await ate.list_actors_page("lab", page_size=2, page_token=token)
        assert [a.ref.name for a in page] == ["a4"]
        assert token == ""
        names = [a.ref.name async for a in ate.list_actors("lab", page_size=2)]
        assert names == [f"a{i}" for i in range(5)]
        assert [a.ref async for a in ate.list_actors()] == [
            ActorRef("lab", f"a{i}") for i in range(5)
        ]
        assert [a async for a in ate.list_actors("other")] == []
        with pytest.raises(InvalidArgument, match="page_size"):
            await ate.list_actors_page("lab", page_size=5000)
        with pytest.raises(NotFound):
            await ate.list_actors_page("nowhere")


async def test_tags_and_actors_from_tags(pki: Pki) -> None:
    async with api_stack(pki) as st, st.connect() as ate:
        await ate.create_actor("lab/src", template="lab/counter")
        running = (await ate.resume_actor("lab/src")).actor
        for _ in range(2):
            st.cluster.call(running)
        with pytest.raises(FailedPrecondition, match="SUSPENDED"):
            await ate.create_tag("lab/t1", "lab/src")
        await ate.suspend_actor("lab/src", SuspendMode.SYNC)

        tag = await ate.create_tag("lab/t1", "lab/src")
        assert tag.ref == TagRef("lab", "t1")
        assert tag.snapshot is not None
        assert await ate.get_tag("lab/t1") == tag
        assert [t.ref.name for t in await ate.list_tags("lab")] == ["t1"]
        with pytest.raises(AlreadyExists):
            await ate.create_tag("lab/t1", "lab/src")

        child = await ate.create_actor("lab/child", source_tag="lab/t1")
        assert child.source_tag == TagRef("lab", "t1")
        assert child.template == TemplateRef("lab", "counter")
        resumed = await ate.resume_actor("lab/child")
        assert resumed.source is RestoreSource.TAG
        assert st.cluster.call(resumed.actor) == 3

        with pytest.raises(FailedPrecondition, match="borrowed"):
            await ate.delete_tag("lab/t1")
        await ate.delete_actor("lab/child", force=True)
        await ate.delete_tag("lab/t1")
        assert await ate.list_tags("lab") == []


async def test_workers_list_get_and_drain(pki: Pki) -> None:
    async with api_stack(pki) as st, st.connect() as ate:
        workers = await ate.list_workers()
        assert [w.ref.name for w in workers] == ["w-0-0", "w-0-1", "w-1-0", "w-1-1"]
        assert len(await ate.list_workers(pool="default")) == 4
        assert await ate.list_workers(pool="gpu") == []
        w = await ate.get_worker("w-0-0")
        assert w.state is WorkerState.ACTIVE
        assert w.node.name == "node-0"

        await ate.create_actor("lab/a1", template="lab/counter")
        placed = (await ate.resume_actor("lab/a1")).actor
        assert placed.status.assignment is not None
        drained = await ate.drain_worker(placed.status.assignment.worker)
        assert drained.state is WorkerState.DRAINING
        assert (await ate.get_actor("lab/a1")).state is ActorState.SUSPENDED
        with pytest.raises(NotFound):
            await ate.get_worker(WorkerRef("nope"))


async def test_errors_arrive_as_substrate_errors_with_their_messages(pki: Pki) -> None:
    async with api_stack(pki) as st, st.connect() as ate:
        with pytest.raises(AlreadyExists) as exists:
            await ate.create_atespace("lab")
        assert "lab" in exists.value.description

        with pytest.raises(NotFound) as missing:
            await ate.resume_actor("lab/ghost")
        assert "ghost" in missing.value.description

        with pytest.raises(FailedPrecondition, match="ActorTemplate lab/nope not found"):
            await ate.create_actor("lab/a1", template="lab/nope")

        with pytest.raises(InvalidArgument, match="actor name"):
            await ate.create_actor("lab/Not_A_Name", template="lab/counter")

        await ate.create_actor("lab/keep", template="lab/counter")
        with pytest.raises(FailedPrecondition, match="lab"):
            await ate.delete_atespace("lab")

        # 2 nodes x 2 workers x 2 slots: the ninth actor finds no room.
        for i in range(8):
            await ate.create_actor(f"lab/r{i}", template="lab/counter")
            await ate.resume_actor(f"lab/r{i}")
        await ate.create_actor("lab/r8", template="lab/counter")
        with pytest.raises(ResourceExhausted, match="no worker has room"):
            await ate.resume_actor("lab/r8")

        lease = await st.cluster.store.acquire_lease(ActorRef("lab", "r8").lease_key, ttl=60)
        with pytest.raises(Aborted, match="another operation"):
            await ate.suspend_actor("lab/r8")
        await st.cluster.store.release_lease(lease)


async def test_unexpected_failures_are_internal_with_a_generic_message(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken() -> list[object]:
        raise RuntimeError("secret detail: db password is hunter2")

    async with api_stack(pki) as st, st.connect() as ate:
        monkeypatch.setattr(st.cluster.store, "list_atespaces", broken)
        with pytest.raises(Internal) as failed:
            await ate.list_atespaces()
        assert failed.value.description == INTERNAL_MESSAGE
