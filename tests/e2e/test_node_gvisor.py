"""Issue 4's "done when": a real gVisor actor runs, suspends to an S3 bucket, and comes back
on another worker of another node with its memory intact — through ateapi, atelet and
ateworker as real processes over their real RPCs (mTLS gRPC, the worker's Unix socket),
with requests through the worker's atunnel as the router sends them.
"""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest

from substrate.adapters.linux.netlink import LinuxHostNetwork
from substrate.adapters.objectstore import open_blobstore
from substrate.client import AteClient
from substrate.core.ids import TemplateRef
from substrate.core.model import (
    ActorState,
    ActorTemplate,
    Container,
    Durability,
    Probe,
    Resources,
    RestoreSource,
    SandboxClass,
    SnapshotConfig,
    StorageStatus,
    SuspendMode,
)
from substrate.errors import SubstrateError, Unavailable
from substrate.net.plan import netns_prefix, veth_prefix
from substrate.testing.s3 import S3Server, start_moto
from tests.contracts.blob_fixtures import s3_options, shared_s3_server
from tests.e2e.node_stack import COUNTER_IMAGE, Stack, held_tunnel, stack, tunnel_get
from tests.privileges import needs_nft, needs_runsc

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.runsc, needs_runsc, needs_nft]

_COUNT = re.compile(rb"count=(\d+) boot=(\w+)")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def s3_server(request: pytest.FixtureRequest) -> S3Server:
    return shared_s3_server(request)


def s3_env(server: S3Server) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": server.endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_S3_FORCE_PATH_STYLE": "true",
        "AWS_ALLOW_HTTP": "true",
    }


async def count(s: Stack, worker: str, actor: str) -> tuple[int, str]:
    answer = await tunnel_get(s.router_files(), s.tunnels[worker], actor)
    assert answer.status == 200, answer
    match = _COUNT.search(answer.body)
    assert match is not None, answer.body
    return int(match.group(1)), match.group(2).decode()


async def wait_workers(client: AteClient, names: set[str]) -> None:
    with anyio.fail_after(60):
        while True:
            workers = await client.list_workers()
            if {w.ref.name for w in workers if w.state.name == "ACTIVE"} >= names:
                return
            await anyio.sleep(0.2)


async def test_suspend_to_s3_and_resume_on_another_node(
    tmp_path: Path, s3_server: S3Server
) -> None:
    bucket = s3_server.new_bucket()
    location = f"s3://{bucket}/snapshots"
    with stack(tmp_path, s3_env(s3_server)) as s:
        s.start_ateapi(objects=location)
        s.start_atelet("node-a", objects=location)
        s.start_atelet("node-b", objects=location)
        s.start_worker("w-a", "node-a", labels={"slot": "a"})
        s.start_worker("w-b", "node-b", labels={"slot": "b"})
        async with AteClient.connect(s.ateapi_address, tls_dir=s.client_dir(), name="client") as c:
            await wait_workers(c, {"w-a", "w-b"})
            await c.create_atespace("lab")
            await c.create_template(
                ActorTemplate(
                    ref=TemplateRef(atespace="lab", name="counter"),
                    containers=(
                        Container(
                            name="app", image=COUNTER_IMAGE, wakeup_probe=Probe(path="/readyz")
                        ),
                    ),
                    resources=Resources(cpu_milli=100, memory_bytes=64 << 20),
                    sandbox_class=SandboxClass.GVISOR,
                    snapshot_config=SnapshotConfig(storage_location=location),
                )
            )
            await c.create_actor("lab/c1", template="lab/counter", worker_selector={"slot": "a"})

            # cold boot on node-a
            r = await c.resume_actor("lab/c1")
            assert r.actor.state is ActorState.RUNNING and r.cold_boot
            assert r.actor.status.assignment is not None
            assert r.actor.status.assignment.worker.name == "w-a"
            first, boot = await count(s, "w-a", "lab/c1")
            assert first == 1
            assert (await count(s, "w-a", "lab/c1")) == (2, boot)
            assert (await count(s, "w-a", "lab/c1")) == (3, boot)

            # suspend SYNC while a router connection is held open (keep-alive traffic just
            # answered): the worker resets it first, so runsc can checkpoint
            async with held_tunnel(s.router_files(), s.tunnels["w-a"], "lab/c1") as answer:
                assert b"count=4 " in answer
                suspended = await c.suspend_actor("lab/c1", mode=SuspendMode.SYNC)
            assert suspended.state is ActorState.SUSPENDED
            snap = suspended.status.snapshots[-1]
            durable = [x for x in snap.storages if x.durability is Durability.DURABLE]
            assert durable and durable[0].status is StorageStatus.COMPLETED
            store = open_blobstore(f"s3://{bucket}", options=s3_options(s3_server))
            keys = await store.list("snapshots/")
            assert any(k.endswith("manifest.json") for k in keys), keys
            stale = await tunnel_get(s.router_files(), s.tunnels["w-a"], "lab/c1")
            assert stale.status == 421
            assert stale.headers.get("x-ate-assignment-stale") == "true"

            # resume on node-b: only the durable copy can serve it
            await c.update_actor_selector("lab/c1", {"slot": "b"})
            r2 = await c.resume_actor("lab/c1")
            assert r2.actor.state is ActorState.RUNNING
            assert r2.source is RestoreSource.DURABLE
            assert r2.actor.status.assignment is not None
            assert r2.actor.status.assignment.worker.name == "w-b"
            assert (await count(s, "w-b", "lab/c1")) == (5, boot), "memory came back"

            # pause and resume in place on node-b, from the node-local copy
            paused = await c.pause_actor("lab/c1")
            assert paused.state is ActorState.PAUSED
            r3 = await c.resume_actor("lab/c1")
            assert r3.source is RestoreSource.LOCAL
            assert (await count(s, "w-b", "lab/c1")) == (6, boot)

            # a running actor keeps its worker until it is suspended; then it can go
            await c.suspend_actor("lab/c1", mode=SuspendMode.SYNC)
            await c.delete_actor("lab/c1")
            # the actor's second sandbox runs on w-b again for the worker-stop check
            await c.create_actor("lab/c2", template="lab/counter", worker_selector={"slot": "b"})
            assert (await c.resume_actor("lab/c2")).actor.state is ActorState.RUNNING
            assert (await count(s, "w-b", "lab/c2"))[0] == 1
        codes = s.stop_all()
        assert all(code == 0 for code in codes.values()), (codes, s.logs())
    # the workers removed everything they created when they stopped
    for worker in ("w-a", "w-b"):
        netns, veths = await LinuxHostNetwork().owned(netns_prefix(worker), veth_prefix(worker))
        assert (netns, veths) == ([], [])
    for node, worker in (("node-a", "w-a"), ("node-b", "w-b")):
        root = s.node_dir(node) / "workers" / worker / "runsc"
        listed = await anyio.run_process(["runsc", "--root", str(root), "list"], check=False)
        assert listed.stdout.decode().strip().splitlines()[1:] == [], listed.stdout


async def test_bucket_away_during_sync_suspend_and_a_probe_that_never_answers(
    tmp_path: Path,
) -> None:
    """The bucket refuses connections during a SYNC suspend: the actor keeps serving (or its
    snapshot stays PENDING with the local copy kept) — nothing is lost. A workload whose
    wakeup probe never answers 200 fails its start and leaves nothing on the worker."""
    server = start_moto()  # our own: this test stops it
    try:
        bucket = server.new_bucket()
        location = f"s3://{bucket}/snapshots"
        with stack(tmp_path, s3_env(server)) as s:
            s.start_ateapi(objects=location)
            s.start_atelet("node-a", objects=location)
            s.start_worker("w-a", "node-a", probe_timeout=3.0)
            async with AteClient.connect(
                s.ateapi_address, tls_dir=s.client_dir(), name="client"
            ) as c:
                await wait_workers(c, {"w-a"})
                await c.create_atespace("lab")
                for name, path in (("counter", "/readyz"), ("broken", "/never-ready")):
                    await c.create_template(
                        ActorTemplate(
                            ref=TemplateRef(atespace="lab", name=name),
                            containers=(
                                Container(
                                    name="app", image=COUNTER_IMAGE, wakeup_probe=Probe(path=path)
                                ),
                            ),
                            resources=Resources(cpu_milli=100, memory_bytes=64 << 20),
                            sandbox_class=SandboxClass.GVISOR,
                            snapshot_config=SnapshotConfig(storage_location=location),
                        )
                    )
                await c.create_actor("lab/c1", template="lab/counter")
                await c.resume_actor("lab/c1")
                assert (await count(s, "w-a", "lab/c1"))[0] == 1

                server.stop()  # the bucket goes away
                try:
                    after = await c.suspend_actor("lab/c1", mode=SuspendMode.SYNC)
                except Unavailable:
                    actor = await c.get_actor("lab/c1")
                    assert actor.state is ActorState.RUNNING
                    assert (await count(s, "w-a", "lab/c1"))[0] == 2, "still serving"
                else:
                    assert after.state is ActorState.SUSPENDED
                    snap = after.status.snapshots[-1]
                    local = snap.local()
                    durable = snap.durable()
                    assert local is not None and local.status is StorageStatus.COMPLETED
                    assert durable is not None and durable.status is not StorageStatus.COMPLETED
                    resumed = await c.resume_actor("lab/c1")
                    assert resumed.source is RestoreSource.LOCAL
                    assert (await count(s, "w-a", "lab/c1"))[0] == 2, "nothing was lost"

                await c.create_actor("lab/b1", template="lab/broken")
                with pytest.raises(SubstrateError):
                    await c.resume_actor("lab/b1")
                broken = await c.get_actor("lab/b1")
                assert broken.state in (ActorState.CRASHED, ActorState.SUSPENDED), broken
                netns, veths = await LinuxHostNetwork().owned(
                    netns_prefix("w-a"), veth_prefix("w-a")
                )
                assert (len(netns), len(veths)) == (1, 1), "only c1's network is left"
                assert (await count(s, "w-a", "lab/c1"))[0] == 3
            codes = s.stop_all()
            assert all(code == 0 for code in codes.values()), (codes, s.logs())
    finally:
        server.stop()
