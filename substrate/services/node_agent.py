"""The node side of :class:`~substrate.core.agent_ports.NodeAgent`: one node's atelet.

:class:`NodeAgentService` drives the node's ateworkers (:class:`WorkerApi`) and owns what
lives on the node's disk (:class:`NodeLayout`): OCI bundles, restore directories, the
actors' system-info files, node-local snapshot copies, the tag snapshot cache and the
runtime asset cache. Serve it with ``serve_atelet(NodeAgentService(...))``.

Start (seed 000 §5): where the state comes from is decided by
:func:`~substrate.snapshot.restore_plan.plan_restore`; the bundle is unpacked, the
snapshot made available (in place, from the tag cache, or downloaded), the runtime assets
staged and the system-info files rewritten concurrently, and only the final
``WorkerApi.restore``/``run`` waits for all of them.

Checkpoint: the worker writes the image into the generation's node-local directory;
atelet then writes a completion marker *beside* that directory
(``snapshots/.<local-name>.done``), so an upload never ships it and a checkpoint retried
after a lost reply can tell that the directory holds a complete image. A SUSPEND_SYNC
first checks that the object store answers (before touching the actor), then uploads;
an upload that fails keeps the durable copy PENDING with ``upload_error`` and the local
copy intact.

Errors keep the port's contract: ``Unavailable`` for anything retryable with nothing lost
(worker or object store unreachable, object store refusing our credentials, a call meant
for another node), ``FailedPrecondition`` for a request the node cannot carry out in its
state (a local copy missing or from an earlier boot of the node, a durable copy not
committed, a runtime the worker lacks), ``NotFound`` for a worker that is not on this
node, ``Internal`` for failures that retrying cannot heal (a corrupt snapshot or asset, a
failed checkpoint).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final, Protocol

import anyio
import anyio.to_thread
import attrs
import structlog

from substrate.core.agent_ports import (
    CheckpointRequest,
    CheckpointResult,
    StartRequest,
    StartResult,
    UploadRequest,
    WorkloadTarget,
)
from substrate.core.ids import NodeRef, WorkerRef
from substrate.core.model import Durability, Fidelity, SandboxClass, Snapshot
from substrate.errors import (
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    SubstrateError,
    Unauthenticated,
    Unavailable,
)
from substrate.sandbox.images import ROOTFS_DIR, ImageConfig, ImageStore
from substrate.sandbox.node_layout import NodeLayout
from substrate.sandbox.worker_ports import WorkerApi, WorkloadRequest, WorkloadStarted
from substrate.services.snapshots import (
    DEFAULT_CONCURRENCY,
    DEFAULT_LEVEL,
    DEFAULT_THREADS,
    download_snapshot,
    read_manifest,
    snapshot_committed,
    upload_snapshot,
)
from substrate.snapshot.manifest import Asset, Manifest
from substrate.snapshot.ports import BlobStore
from substrate.snapshot.restore_plan import (
    NodeRestorePlan,
    RestoreKind,
    checkpointed,
    plan_checkpoint,
    plan_restore,
    plan_upload,
    sysinfo_files,
    uploaded_snapshot,
)
from substrate.snapshot.tag_cache import TagCacheEntry, tag_cache_victims

log = structlog.get_logger("substrate.atelet")

BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"
MARKER_SUFFIX: Final = ".done"
"""``snapshots/.<local-name>.done``: a node-local checkpoint directory is complete."""
BUNDLE_MARKER: Final = ".ate-image.json"
"""``<bundle_dir>/.ate-image.json``: which image the bundle's rootfs was unpacked from."""
TAG_MANIFEST_SUFFIX: Final = ".manifest.json"
"""``cache/tags/<tag>/.<snapshot-id>.manifest.json``: the manifest of a cached tag snapshot."""


# --- ports --------------------------------------------------------------------------------


class BlobResolver(Protocol):
    """Maps a full object URI to the store holding it and the key within that store
    (:class:`~substrate.adapters.objectstore.factory.BlobStores` implements it)."""

    def resolve(self, uri: str) -> tuple[BlobStore, str]: ...


class AssetCache(Protocol):
    """The node's content-addressed cache of sandbox runtime assets."""

    async def ensure(self, name: str, asset: Asset) -> str:
        """The local path of ``asset`` (sha256-verified), downloading it if missing.

        ``Internal`` if the downloaded bytes do not match the digest; ``FailedPrecondition``
        if the asset is not at its url; the store's ``Unavailable`` passes through.
        """
        ...


WorkerLookup = Mapping[WorkerRef, WorkerApi] | Callable[[WorkerRef], WorkerApi | None]
"""The node's workers: a mapping, or a function answering None for an unknown worker."""


@attrs.frozen(slots=True, kw_only=True)
class NodeAgentConfig:
    """Tuning of snapshot transfers."""

    upload_concurrency: int = DEFAULT_CONCURRENCY
    download_concurrency: int = DEFAULT_CONCURRENCY
    zstd_level: int = DEFAULT_LEVEL
    zstd_threads: int = DEFAULT_THREADS
    sync_upload_timeout: float = 300.0
    """Seconds a SUSPEND_SYNC upload may take before the checkpoint answers with the
    durable copy PENDING (keep it below ateapi's checkpoint timeout)."""
    store_check_timeout: float = 10.0
    """Seconds the pre-checkpoint reachability check of the object store may take."""
    tag_cache_max_bytes: int = 0
    """Size of the tag snapshot cache in bytes; past it the least recently used entries no
    start is using are removed after each start from the cache (:func:`tag_cache_victims`).
    0 (or less): no limit."""


# --- small file helpers (run in worker threads) --------------------------------------------


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """This boot of the machine ("" if the kernel does not say)."""
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with tmp.open("wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _read_json(path: Path) -> object | None:
    try:
        doc: object = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return doc


def _rmtree(path: str | Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


async def _remove(path: str | Path) -> None:
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(_rmtree, path)


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(path)


def _tree_size(path: str) -> int:
    total = 0
    for parent, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


def _tag_cache_entries(root: str) -> list[TagCacheEntry]:
    """Every cached tag snapshot below ``root`` with its size and last use (the mtime of
    its saved manifest, touched at each use; the directory's if there is none)."""
    entries = []
    with contextlib.suppress(OSError):
        for tag in os.scandir(root):
            if not tag.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                for snap in os.scandir(tag.path):
                    if snap.name.startswith(".") or not snap.is_dir(follow_symlinks=False):
                        continue
                    marker = os.path.join(tag.path, f".{snap.name}{TAG_MANIFEST_SUFFIX}")
                    try:
                        used = os.stat(marker).st_mtime
                    except OSError:
                        used = snap.stat(follow_symlinks=False).st_mtime
                    entries.append(
                        TagCacheEntry(
                            key=str(Path(snap.path)), size=_tree_size(snap.path), last_used=used
                        )
                    )
    return entries


def _drop_tag_entry(path: str) -> None:
    """Remove a cached tag snapshot, its saved manifest, and its tag's directory if empty."""
    entry = Path(path)
    with contextlib.suppress(OSError):
        (entry.parent / f".{entry.name}{TAG_MANIFEST_SUFFIX}").unlink()
    _rmtree(entry)
    with contextlib.suppress(OSError):
        entry.parent.rmdir()  # only if nothing else of the tag is left


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while chunk := src.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _local_io(exc: OSError, what: str) -> Internal:
    return Internal(f"local I/O failed while {what}: {exc}")


async def _gather(jobs: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """Run ``jobs`` concurrently; the first failure cancels the rest and is raised alone."""
    failures: list[BaseException] = []
    async with anyio.create_task_group() as tg:

        async def guarded(job: Callable[[], Awaitable[None]]) -> None:
            try:
                await job()
            except Exception as exc:
                failures.append(exc)
                tg.cancel_scope.cancel()

        for job in jobs:
            tg.start_soon(guarded, job)
    if failures:
        raise failures[0]


@contextlib.contextmanager
def _store_errors(what: str) -> Iterator[None]:
    """Object-store refusals mean "cannot use the store now": retryable, nothing lost."""
    try:
        yield
    except (PermissionDenied, Unauthenticated) as exc:
        raise Unavailable(f"object store refused {what}: {exc.description}") from exc


class _KeyedLocks:
    """One lock per key, forgotten when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[anyio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (anyio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


# --- the asset cache ----------------------------------------------------------------------


class NodeAssetCache:
    """:class:`AssetCache` under ``<root>/assets/sha256/<hex>``, fetched via ``blobs``.

    A download goes to ``<root>/tmp`` first, is checked against the digest and only then
    renamed into place, so a present file is always a verified one. Concurrent requests
    for one digest share one download.
    """

    def __init__(self, layout: NodeLayout, blobs: BlobResolver) -> None:
        self.layout = layout
        self.blobs = blobs
        self.downloads = 0
        self._locks = _KeyedLocks()

    async def ensure(self, name: str, asset: Asset) -> str:
        path = Path(self.layout.asset_path(asset.sha256))
        if await anyio.to_thread.run_sync(path.is_file):
            return str(path)
        async with self._locks.hold(asset.sha256):
            if await anyio.to_thread.run_sync(path.is_file):
                return str(path)
            store, key = self.blobs.resolve(asset.url)
            tmp_dir = Path(self.layout.tmp_dir())
            tmp = tmp_dir / f"asset-{asset.sha256[:16]}-{secrets.token_hex(4)}"
            try:
                await anyio.to_thread.run_sync(lambda: tmp_dir.mkdir(parents=True, exist_ok=True))
                with _store_errors(f"runtime asset {name}"):
                    try:
                        await store.get_to_file(key, tmp)
                    except NotFound as exc:
                        raise FailedPrecondition(
                            f"runtime asset {name} is not at {asset.url}"
                        ) from exc
                self.downloads += 1
                digest = await anyio.to_thread.run_sync(_sha256_file, tmp)
                if digest != asset.sha256:
                    raise Internal(
                        f"runtime asset {name} from {asset.url} is corrupt: sha256 {digest}, "
                        f"expected {asset.sha256}"
                    )

                def install() -> None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    os.chmod(tmp, 0o755)
                    os.replace(tmp, path)

                await anyio.to_thread.run_sync(install)
            except OSError as exc:
                raise _local_io(exc, f"staging runtime asset {name}") from exc
            finally:
                with contextlib.suppress(OSError):
                    await anyio.to_thread.run_sync(lambda: tmp.unlink(missing_ok=True))
        log.info("asset.staged", name=name, sha256=asset.sha256)
        return str(path)


# --- the node agent -----------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class LocalCheckpoint:
    """What the completion marker of a node-local checkpoint records."""

    runtime_version: str
    files: tuple[str, ...]
    size_bytes: int = 0
    boot_id: str = ""
    worker: str = ""
    created_at: float = 0.0

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "runtimeVersion": self.runtime_version,
                "files": list(self.files),
                "sizeBytes": self.size_bytes,
                "bootId": self.boot_id,
                "worker": self.worker,
                "createdAt": self.created_at,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, doc: object) -> LocalCheckpoint | None:
        if not isinstance(doc, dict):
            return None
        try:
            return cls(
                runtime_version=str(doc["runtimeVersion"]),
                files=tuple(str(f) for f in doc["files"]),
                size_bytes=int(doc.get("sizeBytes", 0)),
                boot_id=str(doc.get("bootId", "")),
                worker=str(doc.get("worker", "")),
                created_at=float(doc.get("createdAt", 0.0)),
            )
        except (KeyError, TypeError, ValueError):
            return None


class NodeAgentService:
    """One node's atelet: implements :class:`~substrate.core.agent_ports.NodeAgent`.

    ``workers`` finds the node's workers by name; ``blobs`` maps snapshot and asset URIs
    to object stores; ``images`` unpacks container images into bundles; ``assets`` is the
    runtime asset cache (default: :class:`NodeAssetCache` under the node directory);
    ``runtime_assets`` are recorded in the manifest of every snapshot this node uploads
    (e.g. the ``runsc`` binary's url and digest). ``boot_id`` identifies this boot of the
    node (default: the kernel's); a node-local copy written on another boot is not
    restored in place.
    """

    def __init__(
        self,
        node: NodeRef,
        layout: NodeLayout,
        workers: WorkerLookup,
        blobs: BlobResolver,
        images: ImageStore,
        *,
        assets: AssetCache | None = None,
        runtime_assets: Mapping[str, Asset] | None = None,
        config: NodeAgentConfig = NodeAgentConfig(),
        clock: Callable[[], float] = time.time,
        boot_id: str | None = None,
    ) -> None:
        self.node = node
        self.layout = layout
        self.blobs = blobs
        self.images = images
        self.assets: AssetCache = assets if assets is not None else NodeAssetCache(layout, blobs)
        self.runtime_assets: dict[str, Asset] = dict(runtime_assets or {})
        self.config = config
        self.clock = clock
        self.boot_id = read_boot_id() if boot_id is None else boot_id
        self._workers = workers
        self._actor_locks = _KeyedLocks()
        self._local_locks = _KeyedLocks()
        self._tag_locks = _KeyedLocks()
        self._starts: dict[str, anyio.CancelScope] = {}
        self._tag_users: Counter[str] = Counter()
        """Starts using each tag cache entry (its directory) now: never evicted."""
        self.tag_downloads = 0
        """How many tag snapshots this agent downloaded into the tag cache."""
        self.tag_evictions = 0
        """How many tag cache entries this agent removed to stay within its size."""

    # --- lookups ----------------------------------------------------------------------

    def _check_node(self, node: NodeRef) -> None:
        if node != self.node:
            raise Unavailable(
                f"this is the atelet of node {self.node}; the call was meant for node {node}"
            )

    def _lookup(self, ref: WorkerRef) -> WorkerApi | None:
        if isinstance(self._workers, Mapping):
            return self._workers.get(ref)
        return self._workers(ref)

    def _worker(self, ref: WorkerRef) -> WorkerApi:
        worker = self._lookup(ref)
        if worker is None:
            raise NotFound(f"worker {ref} is not on node {self.node}")
        return worker

    def _marker_path(self, actor_uid: str, local_name: str) -> Path:
        directory = Path(self.layout.local_snapshot_dir(actor_uid, local_name))
        return directory.parent / f".{directory.name}{MARKER_SUFFIX}"

    async def local_checkpoint(self, actor_uid: str, local_name: str) -> LocalCheckpoint | None:
        """The complete node-local checkpoint ``local_name`` of the actor, if there is one."""
        marker = self._marker_path(actor_uid, local_name)
        directory = Path(self.layout.local_snapshot_dir(actor_uid, local_name))

        def load() -> LocalCheckpoint | None:
            done = LocalCheckpoint.from_json(_read_json(marker))
            if done is None or not directory.is_dir():
                return None
            if not all((directory / name).is_file() for name in done.files):
                return None
            return done

        return await anyio.to_thread.run_sync(load)

    # --- start --------------------------------------------------------------------------

    async def start(self, request: StartRequest) -> StartResult:
        began = self.clock()
        target = request.target
        self._check_node(target.node)
        worker = self._worker(target.worker)
        info = await worker.info()
        if info.epoch != target.worker_epoch:
            log.info(
                "start.epoch_mismatch",
                worker=str(target.worker),
                expected=target.worker_epoch,
                actual=info.epoch,
            )
            return StartResult(worker_epoch=info.epoch)
        uid = target.actor_uid
        async with self._actor_locks.hold(uid):
            with anyio.CancelScope() as scope:
                self._starts[uid] = scope
                try:
                    started = await self._start_locked(
                        request, worker, info.sandbox_class, info.runtime_versions
                    )
                finally:
                    if self._starts.get(uid) is scope:
                        del self._starts[uid]
            if scope.cancelled_caught:
                raise Unavailable(f"the start of actor {uid} was cancelled by a terminate")
        duration = max(0.0, self.clock() - began)
        return StartResult(
            worker_epoch=started.worker_epoch, pod_ips=started.pod_ips, duration=duration
        )

    async def _start_locked(
        self,
        request: StartRequest,
        worker: WorkerApi,
        sandbox_class: SandboxClass,
        runtime_versions: tuple[str, ...],
    ) -> WorkloadStarted:
        target = request.target
        uid = target.actor_uid
        base = WorkloadRequest(
            actor=target.actor,
            actor_uid=uid,
            worker_epoch=target.worker_epoch,
            bundle_dir=self.layout.bundle_dir(uid),
            containers=request.template.containers,
            resources=request.template.resources,
            sysinfo_dir=self.layout.sysinfo_dir(uid),
        )
        if await self._running(worker, uid):
            # Re-entry after a lost reply: the worker answers at once; touch nothing the
            # running sandbox uses (its bundle, its restore directory).
            await self._write_sysinfo(request)
            if request.snapshot is None:
                return await worker.run(base)
            return await worker.restore(
                attrs.evolve(base, restore_dir=self.layout.restore_dir(uid))
            )
        plan = plan_restore(
            layout=self.layout,
            node=self.node,
            actor_uid=uid,
            snapshot=request.snapshot,
            storage=request.storage,
            fidelity=request.fidelity,
            sandbox_class=sandbox_class,
            runtime_versions=runtime_versions,
        )
        if not request.template.containers:
            raise InvalidArgument("the template has no containers")
        image = request.template.containers[0].image
        configs: list[ImageConfig] = []

        async def bundle() -> None:
            configs.append(await self._prepare_bundle(uid, image))

        async def source() -> None:
            await self._prepare_source(uid, plan)

        async def sysinfo() -> None:
            await self._write_sysinfo(request)

        async with self._tag_in_use(plan):
            return await self._prepare_and_start(
                plan, base, worker, str(target.worker), configs, [bundle, source, sysinfo]
            )

    @asynccontextmanager
    async def _tag_in_use(self, plan: NodeRestorePlan) -> AsyncIterator[None]:
        """Mark the tag cache entry ``plan`` restores from as in use (never evicted) until
        the start returned — gVisor has read the snapshot's files completely by then —
        and then bring the cache within its size (:meth:`_evict_tags`)."""
        if plan.kind is not RestoreKind.TAG_CACHE:
            yield
            return
        key = str(Path(plan.restore_dir))  # as _restore_from_tag and the eviction name it
        self._tag_users[key] += 1
        try:
            yield
        finally:
            self._tag_users[key] -= 1
            if self._tag_users[key] <= 0:
                del self._tag_users[key]
            with anyio.CancelScope(shield=True):
                await self._evict_tags()

    async def _prepare_and_start(
        self,
        plan: NodeRestorePlan,
        base: WorkloadRequest,
        worker: WorkerApi,
        worker_name: str,
        configs: list[ImageConfig],
        jobs: list[Callable[[], Awaitable[None]]],
    ) -> WorkloadStarted:
        """Run the preparation ``jobs`` concurrently (the first fills ``configs``), then
        run or restore the workload on ``worker``."""
        t0 = time.monotonic()
        try:
            await _gather(jobs)
        except BaseException:
            if plan.kind is RestoreKind.DOWNLOAD:
                await _remove(plan.restore_dir)
            raise
        config = configs[0]
        workload = attrs.evolve(
            base,
            image_args=config.args,
            image_env=config.env,
            restore_dir=plan.restore_dir,
            preserve_restore_dir=plan.preserve,
        )
        log.info(
            "start.prepared",
            actor_uid=base.actor_uid,
            source=plan.kind.value,
            worker=worker_name,
            seconds=round(time.monotonic() - t0, 3),
        )
        if not plan.restores:
            return await worker.run(workload)
        try:
            return await worker.restore(workload)
        except BaseException:
            if plan.kind is RestoreKind.DOWNLOAD:
                await _remove(plan.restore_dir)
            raise

    async def _running(self, worker: WorkerApi, uid: str) -> bool:
        try:
            await worker.stats(uid)
        except (NotFound, FailedPrecondition):
            return False
        return True

    async def _prepare_bundle(self, uid: str, image: str) -> ImageConfig:
        bundle_dir = Path(self.layout.bundle_dir(uid))
        marker = bundle_dir / BUNDLE_MARKER

        def current() -> ImageConfig | None:
            doc = _read_json(marker)
            if not isinstance(doc, dict) or doc.get("image") != image:
                return None
            if not (bundle_dir / ROOTFS_DIR).is_dir():
                return None
            try:
                return ImageConfig.from_json(doc.get("config"))
            except InvalidArgument:
                return None

        config = await anyio.to_thread.run_sync(current)
        if config is not None:
            return config

        def reset() -> None:
            _rmtree(bundle_dir)
            bundle_dir.mkdir(parents=True)

        try:
            await anyio.to_thread.run_sync(reset)
        except OSError as exc:
            raise _local_io(exc, f"creating bundle {bundle_dir}") from exc
        try:
            config = await self.images.unpack(image, str(bundle_dir))
            doc = {"image": image, "config": config.to_json()}
            await anyio.to_thread.run_sync(
                _write_atomic, marker, json.dumps(doc, sort_keys=True).encode()
            )
        except NotFound as exc:
            await _remove(bundle_dir)
            raise FailedPrecondition(
                f"image {image} is not available on node {self.node}: {exc.description}"
            ) from exc
        except OSError as exc:
            await _remove(bundle_dir)
            raise _local_io(exc, f"unpacking {image}") from exc
        except BaseException:
            await _remove(bundle_dir)
            raise
        return config

    async def _write_sysinfo(self, request: StartRequest) -> None:
        uid = request.target.actor_uid
        directory = Path(self.layout.sysinfo_dir(uid))
        files = sysinfo_files(request.target.actor, uid)

        def write() -> None:
            directory.mkdir(parents=True, exist_ok=True)
            for name, content in files.items():
                _write_atomic(directory / name, content.encode())

        try:
            await anyio.to_thread.run_sync(write)
        except OSError as exc:
            raise _local_io(exc, f"writing system-info files into {directory}") from exc

    async def _prepare_source(self, uid: str, plan: NodeRestorePlan) -> None:
        match plan.kind:
            case RestoreKind.COLD:
                return
            case RestoreKind.LOCAL:
                done = await self.local_checkpoint(uid, plan.local_name)
                if done is None:
                    raise FailedPrecondition(
                        f"local snapshot {plan.local_name} of actor {uid} is not on node "
                        f"{self.node}"
                    )
                if done.boot_id and self.boot_id and done.boot_id != self.boot_id:
                    raise FailedPrecondition(
                        f"local snapshot {plan.local_name} of actor {uid} was written before "
                        f"node {self.node} rebooted"
                    )
            case RestoreKind.TAG_CACHE:
                await self._restore_from_tag(plan)
            case RestoreKind.DOWNLOAD:
                await self._restore_by_download(plan)

    def _resolve(self, uri: str) -> tuple[BlobStore, str]:
        return self.blobs.resolve(uri)

    async def _manifest(self, store: BlobStore, key: str, uri: str) -> Manifest:
        with _store_errors(f"reading snapshot {uri}"):
            try:
                return await read_manifest(store, key)
            except NotFound as exc:
                raise FailedPrecondition(
                    f"no committed snapshot at {uri}: {exc.description}"
                ) from exc

    async def _download(self, store: BlobStore, key: str, uri: str, dest: Path) -> None:
        with _store_errors(f"downloading snapshot {uri}"):
            try:
                await download_snapshot(
                    store, key, dest, concurrency=self.config.download_concurrency
                )
            except NotFound as exc:
                raise FailedPrecondition(
                    f"no committed snapshot at {uri}: {exc.description}"
                ) from exc

    async def _stage_assets(self, manifest: Manifest) -> None:
        jobs: list[Callable[[], Awaitable[None]]] = []
        for name, asset in manifest.assets.items():

            async def one(name: str = name, asset: Asset = asset) -> None:
                await self.assets.ensure(name, asset)

            jobs.append(one)
        await _gather(jobs)

    async def _restore_by_download(self, plan: NodeRestorePlan) -> None:
        dest = Path(plan.restore_dir)
        await _remove(dest)
        store, key = self._resolve(plan.uri)
        manifest = await self._manifest(store, key, plan.uri)

        async def files() -> None:
            await self._download(store, key, plan.uri, dest)

        async def assets() -> None:
            await self._stage_assets(manifest)

        await _gather([files, assets])

    async def _restore_from_tag(self, plan: NodeRestorePlan) -> None:
        final = Path(plan.restore_dir)
        saved = final.parent / f".{final.name}{TAG_MANIFEST_SUFFIX}"
        async with self._tag_locks.hold(str(final)):
            if await anyio.to_thread.run_sync(final.is_dir):
                doc = await anyio.to_thread.run_sync(_read_json, saved)
                if doc is not None:
                    try:
                        manifest = Manifest.from_json(doc)
                    except InvalidArgument:
                        pass
                    else:
                        await self._stage_assets(manifest)
                        await anyio.to_thread.run_sync(_touch, saved)  # recently used
                        return
            store, key = self._resolve(plan.uri)
            manifest = await self._manifest(store, key, plan.uri)
            staging = Path(self.layout.tmp_dir()) / (
                f"tag-{plan.tag_uid}-{final.name}-{secrets.token_hex(4)}"
            )

            async def files() -> None:
                await self._download(store, key, plan.uri, staging)

            async def assets() -> None:
                await self._stage_assets(manifest)

            try:
                await _gather([files, assets])

                def install() -> None:
                    final.parent.mkdir(parents=True, exist_ok=True)
                    _write_atomic(saved, manifest.to_bytes())
                    _rmtree(final)
                    os.replace(staging, final)

                await anyio.to_thread.run_sync(install)
            except OSError as exc:
                raise _local_io(exc, f"caching tag snapshot {plan.uri}") from exc
            finally:
                await _remove(staging)
            self.tag_downloads += 1
            log.info("tag_cache.filled", tag_uid=plan.tag_uid, dir=str(final))

    async def _evict_tags(self) -> None:
        """Bring the tag cache within ``tag_cache_max_bytes``: remove the least recently
        used entries no start is using (:func:`tag_cache_victims`). Runs after each start
        from the cache, so the cache is over its size at most while starts use it."""
        limit = self.config.tag_cache_max_bytes
        if limit <= 0:
            return
        found = await anyio.to_thread.run_sync(_tag_cache_entries, self.layout.tag_cache_root())
        entries = [attrs.evolve(e, in_use=e.key in self._tag_users) for e in found]
        for victim in tag_cache_victims(entries, limit):
            async with self._tag_locks.hold(victim.key):
                if victim.key in self._tag_users:  # a start took it up meanwhile
                    continue
                await anyio.to_thread.run_sync(_drop_tag_entry, victim.key)
            self.tag_evictions += 1
            log.info("tag_cache.evicted", dir=victim.key, bytes=victim.size)

    # --- checkpoint ---------------------------------------------------------------------

    async def _check_store(self, uri: str) -> None:
        """Raise :class:`Unavailable` unless the object store holding ``uri`` answers."""
        store, key = self._resolve(uri)
        try:
            with (
                anyio.fail_after(self.config.store_check_timeout),
                _store_errors(f"access to {uri}"),
            ):
                await snapshot_committed(store, key)
        except TimeoutError as exc:
            raise Unavailable(f"object store holding {uri} did not answer") from exc

    async def checkpoint(self, request: CheckpointRequest) -> CheckpointResult:
        target = request.target
        self._check_node(target.node)
        uid = target.actor_uid
        plan = plan_checkpoint(
            layout=self.layout,
            node=self.node,
            actor_uid=uid,
            mode=request.mode,
            snapshot=request.snapshot,
        )
        worker = self._worker(target.worker)
        if plan.check_store_first and plan.durable is not None:
            # Before touching the actor: an unreachable store leaves it running.
            await self._check_store(plan.durable.uri)
        local_name = plan.local.local_name
        async with self._actor_locks.hold(uid), self._local_locks.hold(f"{uid}/{local_name}"):
            done = await self.local_checkpoint(uid, local_name)
            if done is None:
                done = await self._take_checkpoint(worker, target, plan.local_dir, local_name)
            else:
                log.info("checkpoint.reentry", actor_uid=uid, local_name=local_name)
            snapshot = checkpointed(
                request.snapshot, runtime_version=done.runtime_version, uploaded=False
            )
            upload_error = ""
            if plan.upload_now and plan.durable is not None:
                try:
                    with anyio.fail_after(self.config.sync_upload_timeout):
                        await self._upload_dir(
                            snapshot, Path(plan.local_dir), plan.durable.uri, plan.durable.fidelity
                        )
                    snapshot = uploaded_snapshot(snapshot)
                except TimeoutError:
                    upload_error = (
                        f"upload to {plan.durable.uri} did not finish within "
                        f"{self.config.sync_upload_timeout} s"
                    )
                except SubstrateError as exc:
                    upload_error = exc.description
                if upload_error:
                    log.warning(
                        "checkpoint.upload_failed",
                        actor_uid=uid,
                        uri=plan.durable.uri,
                        error=upload_error,
                    )
        return CheckpointResult(snapshot=snapshot, upload_error=upload_error)

    async def _take_checkpoint(
        self, worker: WorkerApi, target: WorkloadTarget, local_dir: str, local_name: str
    ) -> LocalCheckpoint:
        uid = target.actor_uid
        directory = Path(local_dir)
        marker = self._marker_path(uid, local_name)
        await anyio.to_thread.run_sync(lambda: marker.unlink(missing_ok=True))
        await _remove(directory)  # no leftovers of an earlier failed attempt
        try:
            await anyio.to_thread.run_sync(lambda: directory.mkdir(parents=True))
        except OSError as exc:
            raise _local_io(exc, f"creating {directory}") from exc
        try:
            result = await worker.checkpoint(uid, local_dir, worker_epoch=target.worker_epoch)
        except FailedPrecondition:
            await _remove(directory)  # nothing was checkpointed: the actor was not running
            raise
        except Internal:
            await _remove(directory)  # a partial image is useless
            raise
        done = LocalCheckpoint(
            runtime_version=result.runtime_version,
            files=result.files,
            size_bytes=result.size_bytes,
            boot_id=self.boot_id,
            worker=target.worker.name,
            created_at=self.clock(),
        )
        try:
            await anyio.to_thread.run_sync(_write_atomic, marker, done.to_bytes())
        except OSError as exc:
            raise _local_io(exc, f"recording the checkpoint in {directory}") from exc
        log.info(
            "checkpoint.done",
            actor_uid=uid,
            local_name=local_name,
            files=len(result.files),
            bytes=result.size_bytes,
        )
        return done

    async def _upload_dir(
        self, snapshot: Snapshot, local_dir: Path, uri: str, fidelity: Fidelity
    ) -> None:
        store, key = self._resolve(uri)
        scratch = Path(self.layout.tmp_dir())
        try:
            await anyio.to_thread.run_sync(lambda: scratch.mkdir(parents=True, exist_ok=True))
        except OSError as exc:
            raise _local_io(exc, f"creating {scratch}") from exc
        with _store_errors(f"uploading snapshot {uri}"):
            await upload_snapshot(
                store,
                key,
                local_dir,
                sandbox_class=snapshot.sandbox_class.name.lower(),
                runtime_version=snapshot.runtime_version,
                assets=self.runtime_assets,
                fidelity=fidelity,
                created_at=snapshot.captured_at or self.clock(),
                concurrency=self.config.upload_concurrency,
                level=self.config.zstd_level,
                threads=self.config.zstd_threads,
                scratch_dir=scratch,
            )

    # --- upload, detach, drop -----------------------------------------------------------

    async def upload(self, request: UploadRequest) -> Snapshot:
        self._check_node(request.node)
        uid = request.actor_uid
        plan = plan_upload(
            layout=self.layout, node=self.node, actor_uid=uid, snapshot=request.snapshot
        )
        if plan is None:
            return request.snapshot
        local = request.snapshot.local()
        assert local is not None
        async with self._local_locks.hold(f"{uid}/{local.local_name}"):
            done = await self.local_checkpoint(uid, local.local_name)
            if done is None:
                raise FailedPrecondition(
                    f"no local copy to upload: local snapshot {local.local_name} of actor "
                    f"{uid} is not on node {self.node}"
                )
            snapshot = request.snapshot
            if done.runtime_version and not snapshot.runtime_version:
                snapshot = attrs.evolve(snapshot, runtime_version=done.runtime_version)
            await self._upload_dir(snapshot, Path(plan.local_dir), plan.uri, plan.fidelity)
        return uploaded_snapshot(snapshot)

    async def detach(self, request: UploadRequest) -> Snapshot:
        uploaded = await self.upload(request)
        local = uploaded.local()
        if local is not None and local.local_name:
            await self.drop_local(request.actor_uid, local.local_name)
        return uploaded.without(Durability.LOCAL)

    async def drop_local(self, actor_uid: str, local_name: str) -> None:
        directory = self.layout.local_snapshot_dir(actor_uid, local_name)
        marker = self._marker_path(actor_uid, local_name)
        async with self._local_locks.hold(f"{actor_uid}/{local_name}"):

            def drop() -> None:
                marker.unlink(missing_ok=True)  # first: a half-deleted copy is never complete
                _rmtree(directory)
                for empty in (Path(directory).parent, Path(directory).parent.parent):
                    with contextlib.suppress(OSError):
                        empty.rmdir()  # the snapshots and actor directories, once empty

            try:
                await anyio.to_thread.run_sync(drop)
            except OSError as exc:
                raise _local_io(exc, f"dropping {directory}") from exc
        log.info("local_snapshot.dropped", actor_uid=actor_uid, local_name=local_name)

    # --- terminate ----------------------------------------------------------------------

    async def terminate(self, target: WorkloadTarget) -> None:
        self._check_node(target.node)
        uid = target.actor_uid
        scope = self._starts.get(uid)
        if scope is not None:
            scope.cancel()  # an in-flight start of the actor ends now
        worker = self._lookup(target.worker)
        async with self._actor_locks.hold(uid):
            if worker is not None:
                await worker.terminate(uid, worker_epoch=target.worker_epoch)
                if await self._running(worker, uid):
                    # The worker runs the actor in another epoch: its files stay.
                    return
            for path in (
                self.layout.bundle_dir(uid),
                self.layout.restore_dir(uid),
                self.layout.sysinfo_dir(uid),
            ):
                await _remove(path)

            def tidy() -> None:
                actor_dir = Path(self.layout.actor_dir(uid))
                with contextlib.suppress(OSError):
                    actor_dir.rmdir()  # only if nothing (no snapshot) is left

            await anyio.to_thread.run_sync(tidy)


__all__ = [
    "BUNDLE_MARKER",
    "MARKER_SUFFIX",
    "AssetCache",
    "BlobResolver",
    "LocalCheckpoint",
    "NodeAgentConfig",
    "NodeAgentService",
    "NodeAssetCache",
    "WorkerLookup",
    "read_boot_id",
]
