"""The node agent (atelet) over fake workers with real fake sandboxes and an object store."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import attrs
import pytest

from substrate.adapters.memory.blobstore import InMemoryBlobStore
from substrate.adapters.memory.sandbox import FakeSandboxRuntime
from substrate.adapters.objectstore.factory import BlobStores, split_uri
from substrate.api.atelet import GrpcNodeAgent, serve_atelet
from substrate.core.agent_ports import (
    CheckpointMode,
    CheckpointRequest,
    StartRequest,
    UploadRequest,
    WorkloadTarget,
)
from substrate.core.ids import ActorRef, NodeRef, TemplateRef, WorkerRef
from substrate.core.model import (
    ActorTemplate,
    Container,
    Durability,
    Fidelity,
    Probe,
    Resources,
    SandboxClass,
    Snapshot,
    SnapshotOwner,
    SnapshotStorage,
    StorageStatus,
)
from substrate.errors import FailedPrecondition, Internal, NotFound, Unavailable
from substrate.sandbox.node_layout import NodeLayout
from substrate.sandbox.worker_ports import WorkloadRequest, WorkloadStarted
from substrate.services.node_agent import BUNDLE_MARKER, NodeAgentConfig, NodeAgentService
from substrate.snapshot.layout import actor_snapshot_prefix, manifest_key, tag_prefix
from substrate.snapshot.manifest import Asset, Manifest
from substrate.snapshot.ports import BlobStore
from substrate.testing.fake_images import FakeImageStore
from substrate.testing.fake_worker import FakeWorker

pytestmark = pytest.mark.anyio

NODE = NodeRef("node-0")
LOCATION = "memory://bucket"
TEMPLATE = ActorTemplate(
    ref=TemplateRef(atespace="lab", name="counter"),
    containers=(Container(name="app", image="local/counter", wakeup_probe=Probe(path="/readyz")),),
    resources=Resources(cpu_milli=100, memory_bytes=64 << 20),
    sandbox_class=SandboxClass.FAKE,
)


class Resolver:
    """Every ``memory://`` URI → one in-memory store (key = the URI's path)."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def resolve(self, uri: str) -> tuple[BlobStore, str]:
        return self.store, key_of(uri)


def key_of(uri: str) -> str:
    assert uri.startswith("memory://"), uri
    return uri.removeprefix("memory://")


@attrs.define
class Env:
    agent: NodeAgentService
    store: InMemoryBlobStore
    layout: NodeLayout
    workers: list[FakeWorker]
    images: FakeImageStore

    def worker(self, i: int = 0) -> FakeWorker:
        return self.workers[i]


@asynccontextmanager
async def node_env(
    root: Path,
    *,
    store: InMemoryBlobStore | None = None,
    workers: int = 2,
    boot_id: str = "boot-1",
    node: NodeRef = NODE,
    runtime_assets: dict[str, Asset] | None = None,
    config: NodeAgentConfig | None = None,
) -> AsyncIterator[Env]:
    store = store if store is not None else InMemoryBlobStore()
    layout = NodeLayout(str(root))
    images = FakeImageStore()
    async with AsyncExitStack() as stack:
        fakes = []
        for i in range(workers):
            runtime = await stack.enter_async_context(FakeSandboxRuntime(pages_bytes=4096))
            fakes.append(FakeWorker(runtime, name=f"w-{node.name[-1]}-{i}", node=node))
        agent = NodeAgentService(
            node,
            layout,
            {WorkerRef(w.name): w for w in fakes},
            Resolver(store),
            images,
            runtime_assets=runtime_assets,
            boot_id=boot_id,
            config=config or NodeAgentConfig(),
        )
        yield Env(agent=agent, store=store, layout=layout, workers=fakes, images=images)


def target(
    name: str = "a1", *, worker: str = "w-0-0", epoch: int = 1, node: NodeRef = NODE
) -> WorkloadTarget:
    return WorkloadTarget(
        actor=ActorRef(atespace="lab", name=name),
        actor_uid=f"uid-{name}",
        worker=WorkerRef(worker),
        node=node,
        worker_epoch=epoch,
    )


def generation(t: WorkloadTarget, snapshot_id: str, *, durable: bool = True) -> Snapshot:
    """A generation as ateapi's suspend writes it: LOCAL IN_PROGRESS + DURABLE PENDING."""
    storages = [
        SnapshotStorage(
            durability=Durability.LOCAL,
            status=StorageStatus.IN_PROGRESS,
            fidelity=Fidelity.MEMORY,
            local_name=snapshot_id,
            node=t.node,
        )
    ]
    if durable:
        storages.append(
            SnapshotStorage(
                durability=Durability.DURABLE,
                status=StorageStatus.PENDING,
                fidelity=Fidelity.MEMORY,
                uri=actor_snapshot_prefix(LOCATION, "lab", t.actor_uid, snapshot_id),
            )
        )
    return Snapshot(
        generation=1,
        snapshot_id=snapshot_id,
        sandbox_class=SandboxClass.FAKE,
        runtime_version="fake-1",
        captured_at=1_700_000_000.0,
        storages=storages,
    )


def restore_from(t: WorkloadTarget, snap: Snapshot, durability: Durability) -> StartRequest:
    storage = snap.local() if durability is Durability.LOCAL else snap.durable()
    assert storage is not None
    return StartRequest(target=t, template=TEMPLATE, snapshot=snap, storage=storage)


def manifest_of(store: InMemoryBlobStore, uri: str) -> Manifest:
    return Manifest.from_bytes(store.objects[manifest_key(key_of(uri))])


async def run_actor(env: Env, t: WorkloadTarget, *, calls: int = 2) -> int:
    result = await env.agent.start(StartRequest(target=t, template=TEMPLATE))
    assert result.worker_epoch == t.worker_epoch
    count = 0
    for _ in range(calls):
        count = await worker_of(env, t).count(t.actor_uid)
    return count


def worker_of(env: Env, t: WorkloadTarget) -> FakeWorker:
    return next(w for w in env.workers if w.name == t.worker.name)


def sysinfo(env: Env, uid: str) -> dict[str, str]:
    d = Path(env.layout.sysinfo_dir(uid))
    return {p.name: p.read_text() for p in d.iterdir() if not p.name.startswith(".")}


# --- file checks (sync helpers: the tests' own disk reads) ------------------------------------


def exists(path: str | Path) -> bool:
    return Path(path).exists()


def is_dir(path: str | Path) -> bool:
    return Path(path).is_dir()


def names(path: str | Path) -> list[str]:
    return sorted(p.name for p in Path(path).iterdir())


def read_bytes(path: str | Path) -> bytes:
    return Path(path).read_bytes()


# --- start ----------------------------------------------------------------------------------


async def test_cold_run_prepares_bundle_and_sysinfo(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        result = await env.agent.start(StartRequest(target=t, template=TEMPLATE))
        assert result.worker_epoch == 1
        assert result.pod_ips == ("127.0.0.1",)
        kind, req = env.worker().requests[-1]
        assert kind == "run"
        assert req.bundle_dir == env.layout.bundle_dir(t.actor_uid)
        assert req.image_args == ("/bin/counter",)
        assert req.restore_dir == ""
        bundle = Path(req.bundle_dir)
        assert (bundle / "rootfs" / "etc" / "image").read_text() == "local/counter\n"
        assert json.loads((bundle / BUNDLE_MARKER).read_text())["image"] == "local/counter"
        assert (bundle / "config.json").is_file()  # written by the worker
        assert sysinfo(env, t.actor_uid) == {"name": "a1", "atespace": "lab", "uid": "uid-a1"}
        assert await env.worker().count(t.actor_uid) == 1
        assert await env.worker().count(t.actor_uid) == 2


async def test_start_reentry_is_idempotent(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        assert await run_actor(env, t) == 2
        again = await env.agent.start(StartRequest(target=t, template=TEMPLATE))
        assert again.worker_epoch == 1
        assert len(env.worker().requests) == 1  # the worker started it once
        assert env.images.unpacks == {"local/counter": 1}
        assert await env.worker().count(t.actor_uid) == 3  # the same sandbox


async def test_epoch_mismatch_returns_the_workers_epoch_and_does_nothing(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        await env.worker().restart()  # epoch 2
        result = await env.agent.start(StartRequest(target=target(epoch=1), template=TEMPLATE))
        assert result.worker_epoch == 2
        assert env.worker().requests == []
        assert not exists(env.layout.actor_dir("uid-a1"))


async def test_unknown_worker_is_not_found_and_other_node_unavailable(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        with pytest.raises(NotFound):
            await env.agent.start(StartRequest(target=target(worker="w-9-9"), template=TEMPLATE))
        with pytest.raises(Unavailable, match="node-1"):
            await env.agent.start(
                StartRequest(target=target(node=NodeRef("node-1")), template=TEMPLATE)
            )
        env.worker().down = True
        with pytest.raises(Unavailable):
            await env.agent.start(StartRequest(target=target(), template=TEMPLATE))


async def test_bundle_is_unpacked_again_for_another_image(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        await run_actor(env, t, calls=0)
        await env.agent.terminate(t)
        await env.agent.start(StartRequest(target=t, template=TEMPLATE))
        assert env.images.unpacks == {"local/counter": 2}  # terminate removed the bundle
        await env.worker().terminate(t.actor_uid)
        await env.agent.start(StartRequest(target=t, template=TEMPLATE))
        assert env.images.unpacks == {"local/counter": 2}  # still unpacked: skipped
        other = attrs.evolve(
            TEMPLATE,
            containers=(attrs.evolve(TEMPLATE.containers[0], image="local/other"),),
        )
        env.images.images["local/other"] = env.images.images["local/counter"]
        await env.worker().terminate(t.actor_uid)
        await env.agent.start(StartRequest(target=t, template=other))
        assert env.images.unpacks == {"local/counter": 2, "local/other": 1}
        image_file = Path(env.layout.bundle_dir(t.actor_uid)) / "rootfs/etc/image"
        assert image_file.read_text() == "local/other\n"


async def test_missing_image_is_failed_precondition(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        template = attrs.evolve(
            TEMPLATE, containers=(attrs.evolve(TEMPLATE.containers[0], image="local/nope"),)
        )
        with pytest.raises(FailedPrecondition, match="local/nope"):
            await env.agent.start(StartRequest(target=target(), template=template))
        assert env.worker().requests == []


# --- suspend and resume -------------------------------------------------------------------------


async def test_sync_suspend_uploads_then_resumes_on_another_worker(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        assert await run_actor(env, t, calls=3) == 3
        snap = generation(t, "s1")
        result = await env.agent.checkpoint(
            CheckpointRequest(
                target=t, template=TEMPLATE, mode=CheckpointMode.SUSPEND_SYNC, snapshot=snap
            )
        )
        assert result.upload_error == ""
        out = result.snapshot
        local, durable = out.local(), out.durable()
        assert local is not None and local.status is StorageStatus.COMPLETED
        assert durable is not None and durable.status is StorageStatus.COMPLETED
        assert out.runtime_version == "fake-1"
        manifest = manifest_of(env.store, durable.uri)
        assert set(manifest.file_names) == {"checkpoint.img", "pages.img"}
        assert manifest.sandbox_class == "fake"
        assert manifest.runtime_version == "fake-1"
        assert env.store.history[-1][1].endswith("manifest.json")  # committed last
        assert t.actor_uid not in env.worker().actors  # the sandbox is gone
        # The local copy stays (for a resume in place) with its completion marker beside it.
        local_dir = Path(env.layout.local_snapshot_dir(t.actor_uid, "s1"))
        assert names(local_dir) == ["checkpoint.img", "pages.img"]

        t2 = target(worker="w-0-1")
        started = await env.agent.start(restore_from(t2, out, Durability.DURABLE))
        assert started.worker_epoch == 1
        kind, req = env.worker(1).requests[-1]
        assert kind == "restore"
        assert req.restore_dir == env.layout.restore_dir(t.actor_uid)
        assert req.preserve_restore_dir is False
        assert not exists(req.restore_dir)  # the worker removed it after the restore
        assert await env.worker(1).count(t.actor_uid) == 4  # the counter continued


async def test_pause_then_resume_in_place_without_download(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        assert await run_actor(env, t) == 2
        snap = generation(t, "p1", durable=False)
        result = await env.agent.checkpoint(
            CheckpointRequest(target=t, template=TEMPLATE, mode=CheckpointMode.PAUSE, snapshot=snap)
        )
        assert result.snapshot.durable() is None
        local = result.snapshot.local()
        assert local is not None and local.completed
        assert env.store.calls == {}  # a pause never touches the object store

        await env.agent.start(restore_from(t, result.snapshot, Durability.LOCAL))
        kind, req = env.worker().requests[-1]
        assert kind == "restore"
        assert req.restore_dir == env.layout.local_snapshot_dir(t.actor_uid, "p1")
        assert req.preserve_restore_dir is True
        assert is_dir(req.restore_dir)  # kept
        assert env.store.calls == {}  # no download
        assert await env.worker().count(t.actor_uid) == 3


async def test_async_suspend_leaves_durable_pending_until_upload(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        await run_actor(env, t)
        snap = generation(t, "s1")
        result = await env.agent.checkpoint(
            CheckpointRequest(
                target=t, template=TEMPLATE, mode=CheckpointMode.SUSPEND_ASYNC, snapshot=snap
            )
        )
        durable = result.snapshot.durable()
        assert durable is not None and durable.status is StorageStatus.PENDING
        assert env.store.objects == {}
        uploaded = await env.agent.upload(
            UploadRequest(actor=t.actor, actor_uid=t.actor_uid, node=NODE, snapshot=result.snapshot)
        )
        durable = uploaded.durable()
        assert durable is not None and durable.completed
        assert manifest_of(env.store, durable.uri).runtime_version == "fake-1"
        # Uploading a durable copy that is COMPLETED does nothing.
        puts = len(env.store.history)
        again = await env.agent.upload(
            UploadRequest(actor=t.actor, actor_uid=t.actor_uid, node=NODE, snapshot=uploaded)
        )
        assert again == uploaded
        assert len(env.store.history) == puts


async def test_sync_suspend_with_bucket_down_keeps_the_actor_running(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        assert await run_actor(env, t) == 2
        env.store.down = True
        with pytest.raises(Unavailable):
            await env.agent.checkpoint(
                CheckpointRequest(
                    target=t,
                    template=TEMPLATE,
                    mode=CheckpointMode.SUSPEND_SYNC,
                    snapshot=generation(t, "s1"),
                )
            )
        assert env.worker().checkpoints == []  # never touched
        assert await env.worker().count(t.actor_uid) == 3  # still serving


async def test_sync_upload_failure_keeps_pending_and_local_copy(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        assert await run_actor(env, t) == 2
        # The store answers the reachability check but refuses the data uploads.
        env.store.fail_when = lambda op, key: op in ("put", "put_file") and key.endswith(".zstd")
        snap = generation(t, "s1")
        result = await env.agent.checkpoint(
            CheckpointRequest(
                target=t, template=TEMPLATE, mode=CheckpointMode.SUSPEND_SYNC, snapshot=snap
            )
        )
        assert "injected" in result.upload_error
        local, durable = result.snapshot.local(), result.snapshot.durable()
        assert local is not None and local.completed
        assert durable is not None and durable.status is StorageStatus.PENDING
        assert is_dir(env.layout.local_snapshot_dir(t.actor_uid, "s1"))
        assert manifest_key(key_of(durable.uri)) not in env.store.objects

        # ateapi's background uploader retries later, and it works.
        env.store.fail_when = None
        uploaded = await env.agent.upload(
            UploadRequest(actor=t.actor, actor_uid=t.actor_uid, node=NODE, snapshot=result.snapshot)
        )
        durable = uploaded.durable()
        assert durable is not None and durable.completed
        await env.agent.start(restore_from(target(worker="w-0-1"), uploaded, Durability.DURABLE))
        assert await env.worker(1).count(t.actor_uid) == 3


async def test_checkpoint_reentry_after_lost_reply(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        await run_actor(env, t)
        request = CheckpointRequest(
            target=t,
            template=TEMPLATE,
            mode=CheckpointMode.SUSPEND_SYNC,
            snapshot=generation(t, "s1"),
        )
        first = await env.agent.checkpoint(request)
        second = await env.agent.checkpoint(request)  # the sandbox is gone; the copy is done
        assert second.snapshot == first.snapshot
        assert len(env.worker().checkpoints) == 1


async def test_checkpoint_of_an_actor_not_running_fails(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        with pytest.raises(FailedPrecondition):
            await env.agent.checkpoint(
                CheckpointRequest(
                    target=t,
                    template=TEMPLATE,
                    mode=CheckpointMode.PAUSE,
                    snapshot=generation(t, "p1", durable=False),
                )
            )
        assert not exists(env.layout.local_snapshot_dir(t.actor_uid, "p1"))


async def test_failed_checkpoint_is_internal_and_leaves_no_local_copy(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        await run_actor(env, t)
        env.worker().checkpoint_fails = True
        with pytest.raises(Internal):
            await env.agent.checkpoint(
                CheckpointRequest(
                    target=t,
                    template=TEMPLATE,
                    mode=CheckpointMode.SUSPEND_ASYNC,
                    snapshot=generation(t, "s1"),
                )
            )
        assert not exists(env.layout.local_snapshot_dir(t.actor_uid, "s1"))
        assert await env.agent.local_checkpoint(t.actor_uid, "s1") is None
        assert t.actor_uid not in env.worker().actors


# --- restore preconditions ----------------------------------------------------------------------


async def paused(env: Env, t: WorkloadTarget, name: str = "p1") -> Snapshot:
    await run_actor(env, t)
    result = await env.agent.checkpoint(
        CheckpointRequest(
            target=t,
            template=TEMPLATE,
            mode=CheckpointMode.PAUSE,
            snapshot=generation(t, name, durable=False),
        )
    )
    return result.snapshot


async def test_missing_local_copy_is_failed_precondition(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        snap = await paused(env, t)
        await env.agent.drop_local(t.actor_uid, "p1")
        await env.agent.drop_local(t.actor_uid, "p1")  # idempotent
        with pytest.raises(FailedPrecondition, match="not on node"):
            await env.agent.start(restore_from(t, snap, Durability.LOCAL))
        assert len(env.worker().requests) == 1  # only the first run


async def test_local_copy_from_an_earlier_boot_is_not_restored(tmp_path: Path) -> None:
    async with node_env(tmp_path, boot_id="boot-1") as env:
        t = target()
        snap = await paused(env, t)
    async with node_env(tmp_path, boot_id="boot-2") as rebooted:
        with pytest.raises(FailedPrecondition, match="rebooted"):
            await rebooted.agent.start(restore_from(t, snap, Durability.LOCAL))


async def test_memory_snapshot_of_a_runtime_the_worker_lacks(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        snap = attrs.evolve(await paused(env, t), runtime_version="fake-0")
        with pytest.raises(FailedPrecondition, match="fake-0"):
            await env.agent.start(restore_from(t, snap, Durability.LOCAL))


async def test_uncommitted_durable_copy_is_failed_precondition(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        snap = generation(t, "ghost")
        durable = snap.durable()
        assert durable is not None
        snap = snap.with_storage(attrs.evolve(durable, status=StorageStatus.COMPLETED))
        with pytest.raises(FailedPrecondition, match="no committed snapshot"):
            await env.agent.start(restore_from(t, snap, Durability.DURABLE))
        assert not exists(env.layout.restore_dir(t.actor_uid))
        env.store.down = True
        with pytest.raises(Unavailable):
            await env.agent.start(restore_from(t, snap, Durability.DURABLE))


async def test_preparation_runs_concurrently(tmp_path: Path) -> None:
    """The image unpack waits for the download to begin: sequential preparation would hang."""
    async with node_env(tmp_path) as env:
        t = target()
        await run_actor(env, t)
        result = await env.agent.checkpoint(
            CheckpointRequest(
                target=t,
                template=TEMPLATE,
                mode=CheckpointMode.SUSPEND_SYNC,
                snapshot=generation(t, "s1"),
            )
        )
        downloading = anyio.Event()
        store_get = env.store.get

        async def get(key: str) -> bytes:
            downloading.set()
            return await store_get(key)

        env.store.get = get  # type: ignore[method-assign]
        unpack = env.images.unpack

        async def slow_unpack(image: str, bundle_dir: str) -> object:
            await downloading.wait()
            return await unpack(image, bundle_dir)

        env.images.unpack = slow_unpack  # type: ignore[assignment, method-assign]
        t2 = target(worker="w-0-1")
        await env.agent.terminate(t)  # the bundle goes, so it is unpacked again
        with anyio.fail_after(10):
            await env.agent.start(restore_from(t2, result.snapshot, Durability.DURABLE))
        assert await env.worker(1).count(t.actor_uid) == 3


# --- tags, sysinfo, assets ----------------------------------------------------------------------


async def tag_snapshot(env: Env, golden: WorkloadTarget, tag_uid: str) -> Snapshot:
    """Suspend ``golden`` and copy its durable copy under a tag prefix (as CreateTag does)."""
    result = await env.agent.checkpoint(
        CheckpointRequest(
            target=golden,
            template=TEMPLATE,
            mode=CheckpointMode.SUSPEND_SYNC,
            snapshot=generation(golden, "g1"),
        )
    )
    durable = result.snapshot.durable()
    assert durable is not None and durable.completed
    src = key_of(durable.uri)
    dst_uri = tag_prefix(LOCATION, "lab", tag_uid)
    dst = key_of(dst_uri)
    keys = sorted(k for k in env.store.objects if k.startswith(src))
    for key in sorted(keys, key=lambda k: k.endswith("manifest.json")):
        await env.store.copy(key, dst + key[len(src) :])
    return Snapshot(
        generation=1,
        snapshot_id="g1",
        owner=SnapshotOwner.TAG,
        sandbox_class=SandboxClass.FAKE,
        runtime_version="fake-1",
        storages=(
            SnapshotStorage(
                durability=Durability.DURABLE,
                status=StorageStatus.COMPLETED,
                fidelity=Fidelity.MEMORY,
                uri=dst_uri,
            ),
        ),
    )


async def test_tag_snapshot_is_downloaded_once_for_two_actors(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        golden = target("golden")
        assert await run_actor(env, golden, calls=5) == 5
        tag = await tag_snapshot(env, golden, "tag-1")
        gets_before = env.store.calls.get("get", 0)

        a, b = target("a", worker="w-0-0"), target("b", worker="w-0-1")
        async with anyio.create_task_group() as tg:
            for t in (a, b):
                tg.start_soon(env.agent.start, restore_from(t, tag, Durability.DURABLE))
        assert env.agent.tag_downloads == 1
        # One manifest read and two files, downloaded once (plus download's own manifest read).
        assert env.store.calls.get("get", 0) - gets_before == 4
        cache = env.layout.tag_cache_dir("tag-1", "g1")
        for t in (a, b):
            req = worker_of(env, t).requests[-1][1]
            assert req.restore_dir == cache
            assert req.preserve_restore_dir is True
            # Each actor sees its own identity, not the golden actor's.
            assert sysinfo(env, t.actor_uid) == {
                "name": t.actor.name,
                "atespace": "lab",
                "uid": t.actor_uid,
            }
            assert await worker_of(env, t).count(t.actor_uid) == 6
        assert names(cache) == ["checkpoint.img", "pages.img"]

        # A third actor later: served from the cache, no download.
        c = target("c", worker="w-0-0")
        gets_before = env.store.calls.get("get", 0)
        await env.agent.start(restore_from(c, tag, Durability.DURABLE))
        assert env.store.calls.get("get", 0) == gets_before
        assert env.agent.tag_downloads == 1
        assert await env.worker().count(c.actor_uid) == 6


def cache_size(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


async def two_tags(env: Env) -> tuple[Snapshot, Snapshot]:
    tags = []
    for n in (1, 2):
        golden = target(f"golden{n}", worker="w-0-1")
        assert await run_actor(env, golden, calls=n) == n
        tags.append(await tag_snapshot(env, golden, f"tag-{n}"))
    return tags[0], tags[1]


async def test_the_tag_cache_gives_up_its_least_recently_used_entry(tmp_path: Path) -> None:
    async with node_env(tmp_path) as probe:
        tag, _ = await two_tags(probe)
        await probe.agent.start(restore_from(target("x"), tag, Durability.DURABLE))
        one = cache_size(probe.layout.tag_cache_dir("tag-1", "g1"))
    limit = one + one // 2  # room for one entry, not two
    async with node_env(tmp_path / "n", config=NodeAgentConfig(tag_cache_max_bytes=limit)) as env:
        tag1, tag2 = await two_tags(env)
        first, second = (
            env.layout.tag_cache_dir("tag-1", "g1"),
            env.layout.tag_cache_dir("tag-2", "g1"),
        )
        await env.agent.start(restore_from(target("a"), tag1, Durability.DURABLE))
        assert is_dir(first) and env.agent.tag_evictions == 0
        await env.agent.start(restore_from(target("b"), tag2, Durability.DURABLE))
        assert not exists(first)  # the older one went; its tag's directory too
        assert not exists(Path(first).parent)
        assert is_dir(second) and env.agent.tag_evictions == 1
        assert await env.worker().count("uid-a") == 2  # a restored actor does not need it
        # tag-1 again: downloaded again, and now tag-2 is the least recently used
        await env.agent.start(restore_from(target("c"), tag1, Durability.DURABLE))
        assert env.agent.tag_downloads == 3
        assert is_dir(first) and not exists(second)
        assert await env.worker().count("uid-c") == 2


async def test_a_tag_cache_entry_in_use_is_not_evicted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = NodeAgentConfig(tag_cache_max_bytes=1)  # every entry is over the limit
    async with node_env(tmp_path, config=config) as env:
        tag1, tag2 = await two_tags(env)
        first = env.layout.tag_cache_dir("tag-1", "g1")
        worker = env.worker(0)
        restore = worker.restore
        restoring, release = anyio.Event(), anyio.Event()

        async def held(request: WorkloadRequest) -> WorkloadStarted:
            if request.actor_uid == "uid-a":
                restoring.set()
                await release.wait()
            return await restore(request)

        monkeypatch.setattr(worker, "restore", held)
        async with anyio.create_task_group() as tg:
            tg.start_soon(env.agent.start, restore_from(target("a"), tag1, Durability.DURABLE))
            await restoring.wait()
            # another start fills and uses tag-2, then evicts what is not in use
            await env.agent.start(
                restore_from(target("b", worker="w-0-1"), tag2, Durability.DURABLE)
            )
            assert is_dir(first)  # a is restoring from it
            assert not exists(env.layout.tag_cache_dir("tag-2", "g1"))
            release.set()
        assert await worker.count("uid-a") == 2
        assert not exists(first)  # free again, and over the limit: gone
        assert env.agent.tag_evictions == 2


async def test_the_tag_cache_has_no_limit_by_default(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        tag1, tag2 = await two_tags(env)
        await env.agent.start(restore_from(target("a"), tag1, Durability.DURABLE))
        await env.agent.start(restore_from(target("b"), tag2, Durability.DURABLE))
        assert is_dir(env.layout.tag_cache_dir("tag-1", "g1"))
        assert is_dir(env.layout.tag_cache_dir("tag-2", "g1"))
        assert env.agent.tag_evictions == 0


async def test_sysinfo_is_rewritten_on_every_start(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        await run_actor(env, t, calls=0)
        files = Path(env.layout.sysinfo_dir(t.actor_uid))
        (files / "name").write_text("stale")
        (files / "uid").unlink()
        await env.worker().terminate(t.actor_uid)
        await env.agent.start(StartRequest(target=t, template=TEMPLATE))
        assert sysinfo(env, t.actor_uid) == {"name": "a1", "atespace": "lab", "uid": "uid-a1"}


def _asset(store: InMemoryBlobStore, data: bytes, *, sha: str | None = None) -> Asset:
    store.objects["bucket/assets/runsc"] = data
    return Asset(url="memory://bucket/assets/runsc", sha256=sha or hashlib.sha256(data).hexdigest())


async def test_runtime_assets_are_staged_once_and_verified(tmp_path: Path) -> None:
    store = InMemoryBlobStore()
    runsc = _asset(store, b"#!/bin/runsc v1\n")
    async with node_env(tmp_path / "n0", store=store, runtime_assets={"runsc": runsc}) as env:
        t = target()
        await run_actor(env, t)
        result = await env.agent.checkpoint(
            CheckpointRequest(
                target=t,
                template=TEMPLATE,
                mode=CheckpointMode.SUSPEND_SYNC,
                snapshot=generation(t, "s1"),
            )
        )
        durable = result.snapshot.durable()
        assert durable is not None
        assert dict(manifest_of(store, durable.uri).assets) == {"runsc": runsc}
    node1 = NodeRef("node-1")
    async with node_env(tmp_path / "n1", store=store, node=node1) as other:
        t1 = target(worker="w-1-0", node=node1)
        await other.agent.start(restore_from(t1, result.snapshot, Durability.DURABLE))
        path = Path(other.layout.asset_path(runsc.sha256))
        assert read_bytes(path) == b"#!/bin/runsc v1\n"
        assert other.agent.assets.downloads == 1  # type: ignore[attr-defined]
        await other.agent.terminate(t1)
        await other.agent.start(restore_from(t1, result.snapshot, Durability.DURABLE))
        assert other.agent.assets.downloads == 1  # type: ignore[attr-defined]
        assert await other.worker().count(t.actor_uid) == 3

    # The object changed under the digest: the node refuses it.
    store.objects["bucket/assets/runsc"] = b"tampered"
    async with node_env(tmp_path / "n2", store=store, node=node1) as third:
        t2 = target(worker="w-1-0", node=node1)
        with pytest.raises(Internal, match="corrupt"):
            await third.agent.start(restore_from(t2, result.snapshot, Durability.DURABLE))
        assert not exists(third.layout.asset_path(runsc.sha256))
        assert not exists(third.layout.restore_dir(t2.actor_uid))


# --- terminate, detach --------------------------------------------------------------------------


async def test_terminate_is_idempotent_and_keeps_snapshots(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        await paused(env, t)
        await env.agent.start(StartRequest(target=t, template=TEMPLATE))
        await env.agent.terminate(t)
        await env.agent.terminate(t)
        assert t.actor_uid not in env.worker().actors
        actor_dir = Path(env.layout.actor_dir(t.actor_uid))
        assert names(actor_dir) == ["snapshots"]
        assert await env.agent.local_checkpoint(t.actor_uid, "p1") is not None
        # An actor that never ran here: nothing to do, no error.
        await env.agent.terminate(target("never"))
        assert not exists(env.layout.actor_dir("uid-never"))


async def test_terminate_cancels_a_start_in_flight(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        env.worker().probe_fails = True  # the start hangs in the wakeup probe
        env.worker().probe_timeout = 30.0
        failure: list[BaseException] = []

        async def start() -> None:
            try:
                await env.agent.start(StartRequest(target=t, template=TEMPLATE))
            except Unavailable as exc:
                failure.append(exc)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(start)
                while not env.worker().requests:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
                await env.agent.terminate(t)
        assert len(failure) == 1
        assert "cancelled by a terminate" in str(failure[0])
        assert t.actor_uid not in env.worker().actors
        assert not exists(env.layout.actor_dir(t.actor_uid))


async def test_probe_that_never_answers_fails_the_start(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        env.worker().probe_fails = True
        env.worker().probe_timeout = 0.1
        with pytest.raises(FailedPrecondition, match="wakeup probe"):
            await env.agent.start(StartRequest(target=target(), template=TEMPLATE))
        assert env.worker().actors == {}


async def test_terminate_of_a_stale_epoch_keeps_the_running_actor(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        await env.worker().restart()  # epoch 2
        t = target(epoch=2)
        await run_actor(env, t)
        await env.agent.terminate(attrs.evolve(t, worker_epoch=1))
        assert await env.worker().count(t.actor_uid) == 3
        assert is_dir(env.layout.bundle_dir(t.actor_uid))


async def test_detach_uploads_then_drops_the_local_copy(tmp_path: Path) -> None:
    async with node_env(tmp_path) as env:
        t = target()
        await run_actor(env, t)
        result = await env.agent.checkpoint(
            CheckpointRequest(
                target=t,
                template=TEMPLATE,
                mode=CheckpointMode.SUSPEND_ASYNC,
                snapshot=generation(t, "s1"),
            )
        )
        request = UploadRequest(
            actor=t.actor, actor_uid=t.actor_uid, node=NODE, snapshot=result.snapshot
        )
        env.store.down = True
        with pytest.raises(Unavailable):
            await env.agent.detach(request)
        assert await env.agent.local_checkpoint(t.actor_uid, "s1") is not None  # kept
        env.store.down = False
        detached = await env.agent.detach(request)
        assert detached.local() is None
        durable = detached.durable()
        assert durable is not None and durable.completed
        assert not exists(env.layout.local_snapshot_dir(t.actor_uid, "s1"))
        # Detached again (a lost reply): the durable copy is complete, nothing to upload.
        assert await env.agent.detach(attrs.evolve(request, snapshot=detached)) == detached
        with pytest.raises(FailedPrecondition, match="no local copy"):
            await env.agent.upload(request)


# --- real object store and real gRPC ------------------------------------------------------------


async def test_file_store_and_grpc_round_trip(tmp_path: Path) -> None:
    """ateapi's gRPC client drives the node agent; snapshots go to a file:// bucket."""
    location = f"file://{tmp_path}/objects"
    blobs = BlobStores(roots=[location])
    async with AsyncExitStack() as stack:
        fakes = []
        for i in range(2):
            runtime = await stack.enter_async_context(FakeSandboxRuntime(pages_bytes=4096))
            fakes.append(FakeWorker(runtime, name=f"w-0-{i}", node=NODE))
        agent = NodeAgentService(
            NODE,
            NodeLayout(str(tmp_path / "node")),
            {WorkerRef(w.name): w for w in fakes},
            blobs,
            FakeImageStore(),
            boot_id="b",
        )
        serving = await stack.enter_async_context(serve_atelet(agent, ssl=None, insecure=True))
        client = GrpcNodeAgent.connect(NODE, serving.address, ssl=None, insecure=True)
        stack.push_async_callback(client.close)
        t = target()
        await client.start(StartRequest(target=t, template=TEMPLATE))
        assert await fakes[0].count(t.actor_uid) == 1
        snap = generation(t, "s1")
        durable = snap.durable()
        assert durable is not None
        uri = actor_snapshot_prefix(location, "lab", t.actor_uid, "s1")
        snap = snap.with_storage(attrs.evolve(durable, uri=uri))
        result = await client.checkpoint(
            CheckpointRequest(
                target=t, template=TEMPLATE, mode=CheckpointMode.SUSPEND_SYNC, snapshot=snap
            )
        )
        assert result.upload_error == ""
        stored = tmp_path / "objects" / split_uri(uri, location)[1]
        assert (stored / "manifest.json").is_file()
        t2 = target(worker="w-0-1")
        await client.start(restore_from(t2, result.snapshot, Durability.DURABLE))
        assert await fakes[1].count(t.actor_uid) == 2
        with pytest.raises(NotFound):
            await client.start(StartRequest(target=target(worker="w-7-7"), template=TEMPLATE))
        await client.terminate(t2)
        await client.drop_local(t.actor_uid, "s1")
        assert not exists(agent.layout.actor_dir(t.actor_uid))
