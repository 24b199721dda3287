"""The node directory (standing in for ``/var/lib/ate``), shared by atelet and its workers (pure).

::

    <root>/workers/<worker>/worker.sock           the worker's gRPC socket
    <root>/workers/<worker>/epoch                 last epoch (rises on every start)
    <root>/workers/<worker>/runsc/                runsc --root (sandbox state)
    <root>/workers/<worker>/actors/<uid>.json     what the worker created for an actor
    <root>/workers/<worker>/logs/                 sandbox output (O_APPEND files)
    <root>/actors/<uid>/bundle/rootfs/            OCI bundle (config.json written by the worker)
    <root>/actors/<uid>/sysinfo/                  name, atespace, uid (mounted at /run/ate)
    <root>/actors/<uid>/restore/                  a downloaded durable copy, restored then removed
    <root>/actors/<uid>/snapshots/<local-name>/   node-local snapshot copies (checkpoints)
    <root>/cache/tags/<tag-uid>/<snapshot-id>/    tag snapshots kept after the first download
    <root>/assets/sha256/<hex>                    content-addressed runtime assets
    <root>/tmp/                                   staging (same filesystem, for renames)

Every name that becomes a path segment is checked, so no request can reach outside
``<root>``.
"""

from __future__ import annotations

import os
import re
from typing import Final

import attrs

from substrate.errors import InvalidArgument
from substrate.snapshot.layout import validate_file_name, validate_id

SOCKET_NAME: Final = "worker.sock"
_HEX_RE: Final = re.compile(r"^[0-9a-f]{64}$")


def _validate_root(_inst: object, _attribute: object, value: str) -> None:
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value:
        raise InvalidArgument(f"node directory {value!r} must be an absolute path")


@attrs.frozen(slots=True)
class NodeLayout:
    """Paths below one node directory."""

    root: str = attrs.field(validator=_validate_root)

    def _join(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    # --- workers ----------------------------------------------------------------------

    def workers_dir(self) -> str:
        return self._join("workers")

    def worker_dir(self, worker: str) -> str:
        return self._join("workers", validate_id(worker, what="worker name"))

    def worker_socket(self, worker: str) -> str:
        return os.path.join(self.worker_dir(worker), SOCKET_NAME)

    def worker_epoch_file(self, worker: str) -> str:
        return os.path.join(self.worker_dir(worker), "epoch")

    def worker_runsc_root(self, worker: str) -> str:
        return os.path.join(self.worker_dir(worker), "runsc")

    def worker_journal_dir(self, worker: str) -> str:
        return os.path.join(self.worker_dir(worker), "actors")

    def worker_journal(self, worker: str, actor_uid: str) -> str:
        uid = validate_id(actor_uid, what="actor uid")
        return os.path.join(self.worker_journal_dir(worker), f"{uid}.json")

    def worker_logs_dir(self, worker: str) -> str:
        return os.path.join(self.worker_dir(worker), "logs")

    # --- actors -------------------------------------------------------------------------

    def actor_dir(self, actor_uid: str) -> str:
        return self._join("actors", validate_id(actor_uid, what="actor uid"))

    def bundle_dir(self, actor_uid: str) -> str:
        return os.path.join(self.actor_dir(actor_uid), "bundle")

    def sysinfo_dir(self, actor_uid: str) -> str:
        return os.path.join(self.actor_dir(actor_uid), "sysinfo")

    def restore_dir(self, actor_uid: str) -> str:
        return os.path.join(self.actor_dir(actor_uid), "restore")

    def snapshots_dir(self, actor_uid: str) -> str:
        return os.path.join(self.actor_dir(actor_uid), "snapshots")

    def local_snapshot_dir(self, actor_uid: str, local_name: str) -> str:
        name = validate_file_name(local_name, what="local snapshot name")
        return os.path.join(self.snapshots_dir(actor_uid), name)

    # --- caches -------------------------------------------------------------------------

    def tag_cache_root(self) -> str:
        """``<root>/cache/tags``: one directory per tag, one per cached snapshot below it."""
        return self._join("cache", "tags")

    def tag_cache_dir(self, tag_uid: str, snapshot_id: str) -> str:
        return self._join(
            "cache",
            "tags",
            validate_id(tag_uid, what="tag uid"),
            validate_id(snapshot_id, what="snapshot id"),
        )

    def asset_path(self, sha256_hex: str) -> str:
        if not isinstance(sha256_hex, str) or not _HEX_RE.match(sha256_hex):
            raise InvalidArgument(f"asset digest {sha256_hex!r} is not a sha256 hex digest")
        return self._join("assets", "sha256", sha256_hex)

    def tmp_dir(self) -> str:
        return self._join("tmp")


__all__ = ["SOCKET_NAME", "NodeLayout"]
