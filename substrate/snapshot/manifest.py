"""The snapshot manifest: what a snapshot contains and which runtime restores it.

``manifest.json`` is the commit marker of a durable snapshot. The writer uploads every
file first (each as ``<name>.zstd``, see :func:`substrate.snapshot.layout.object_key`) and
writes the manifest LAST; a prefix without a manifest is an unfinished upload and is never
restored. A reader fetches the manifest first and then exactly the files it lists. The
manifest itself is stored uncompressed.

The JSON keeps the original system's fields — ``sandboxClass``, ``assets`` (``{name:
{"url", "sha256"}}``) and ``snapshotFiles`` (the list of file names) — so a reader of the
original format understands it, and adds ``formatVersion``, ``runtimeVersion``,
``fidelity``, ``createdAt`` and ``files`` (name, uncompressed size and sha256 of the
uncompressed bytes of each file). :meth:`Manifest.to_bytes` is canonical (sorted keys, no
insignificant whitespace), so equal manifests serialize to equal bytes.
"""

from __future__ import annotations

import json
import math
import re
import types
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeVar

import attrs

from substrate.core.model import Fidelity
from substrate.errors import InvalidArgument
from substrate.snapshot.layout import validate_file_name

FORMAT_VERSION: Final = 1
_T = TypeVar("_T")
_SHA256_RE: Final = re.compile(r"^[0-9a-f]{64}$")
_TOP_KEYS: Final = frozenset(
    {
        "formatVersion",
        "sandboxClass",
        "runtimeVersion",
        "assets",
        "snapshotFiles",
        "files",
        "fidelity",
        "createdAt",
    }
)


def _check_sha256(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not _SHA256_RE.match(value):
        raise InvalidArgument(f"{attribute.name} {value!r} must be 64 lowercase hex characters")


def _check_str(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str):
        raise InvalidArgument(f"{attribute.name} must be a string")


def _check_nonempty_str(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{attribute.name} must be a non-empty string")


@attrs.frozen(slots=True, kw_only=True)
class Asset:
    """A sandbox runtime binary the snapshot was taken with (e.g. ``runsc``)."""

    url: str = attrs.field(validator=_check_nonempty_str)
    sha256: str = attrs.field(validator=_check_sha256)


@attrs.frozen(slots=True, kw_only=True)
class ManifestFile:
    """One snapshot file; ``size`` and ``sha256`` describe its uncompressed bytes."""

    name: str = attrs.field()
    size: int = attrs.field()
    sha256: str = attrs.field(validator=_check_sha256)

    @name.validator
    def _check_name(self, _attribute: attrs.Attribute[str], value: str) -> None:
        validate_file_name(value)

    @size.validator
    def _check_size(self, _attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgument(f"file {self.name!r} size must be a non-negative integer")


def _freeze_assets(value: Mapping[str, Asset]) -> Mapping[str, Asset]:
    if not isinstance(value, Mapping):
        raise InvalidArgument("assets must be a mapping of name to asset")
    return types.MappingProxyType(dict(sorted(value.items())))


def _files_tuple(value: Iterable[ManifestFile]) -> tuple[ManifestFile, ...]:
    return tuple(value)


@attrs.frozen(slots=True, kw_only=True)
class Manifest:
    """The content of ``manifest.json``."""

    sandbox_class: str = attrs.field(validator=_check_nonempty_str)
    """The sandbox class that wrote the snapshot (e.g. ``gvisor``)."""
    runtime_version: str = attrs.field(default="", validator=_check_str)
    """The runtime that wrote it; a MEMORY restore needs exactly this runtime."""
    assets: Mapping[str, Asset] = attrs.field(factory=dict, converter=_freeze_assets, hash=False)
    files: tuple[ManifestFile, ...] = attrs.field(default=(), converter=_files_tuple)
    fidelity: Fidelity = attrs.field(default=Fidelity.MEMORY)
    created_at: float = attrs.field(default=0.0)

    @assets.validator
    def _check_assets(self, _attribute: object, value: Mapping[str, Asset]) -> None:
        for name, asset in value.items():
            validate_file_name(name, what="asset name")
            if not isinstance(asset, Asset):
                raise InvalidArgument(f"asset {name!r} must be an Asset")

    @files.validator
    def _check_files(self, _attribute: object, value: tuple[ManifestFile, ...]) -> None:
        seen: set[str] = set()
        for f in value:
            if not isinstance(f, ManifestFile):
                raise InvalidArgument("files must hold ManifestFile records")
            if f.name in seen:
                raise InvalidArgument(f"manifest lists file {f.name!r} more than once")
            seen.add(f.name)

    @fidelity.validator
    def _check_fidelity(self, _attribute: object, value: Fidelity) -> None:
        if not isinstance(value, Fidelity):
            raise InvalidArgument("fidelity must be a Fidelity")

    @created_at.validator
    def _check_created_at(self, _attribute: object, value: float) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise InvalidArgument("created_at must be a finite, non-negative number")

    @property
    def file_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.files)

    @property
    def total_size(self) -> int:
        """Sum of the uncompressed sizes of all files."""
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "formatVersion": FORMAT_VERSION,
            "sandboxClass": self.sandbox_class,
            "runtimeVersion": self.runtime_version,
            "assets": {n: {"url": a.url, "sha256": a.sha256} for n, a in self.assets.items()},
            "snapshotFiles": list(self.file_names),
            "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in self.files],
            "fidelity": self.fidelity.name,
            "createdAt": float(self.created_at),
        }

    def to_bytes(self) -> bytes:
        """Canonical UTF-8 JSON: sorted keys, no insignificant whitespace."""
        return json.dumps(
            self.to_json(), sort_keys=True, separators=(",", ":"), allow_nan=False
        ).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Manifest:
        """Parse and validate ``manifest.json``; anything malformed is :class:`InvalidArgument`."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidArgument("manifest must be bytes")
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgument(f"manifest is not UTF-8: {exc}") from exc
        try:
            doc = json.loads(
                text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant
            )
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"manifest is not valid JSON: {exc}") from exc
        except RecursionError as exc:
            raise InvalidArgument("manifest JSON is nested too deeply") from exc
        return cls.from_json(doc)

    @classmethod
    def from_json(cls, doc: object) -> Manifest:
        """Build a manifest from decoded JSON, validating every field."""
        obj = _object(doc, what="manifest")
        unknown = sorted(set(obj) - _TOP_KEYS)
        if unknown:
            raise InvalidArgument(f"manifest has unknown fields {unknown}")
        version = _field(obj, "formatVersion", int, what="manifest")
        if version != FORMAT_VERSION:
            raise InvalidArgument(
                f"manifest formatVersion {version} is not supported (expected {FORMAT_VERSION})"
            )
        assets: dict[str, Asset] = {}
        for name, raw in _object(obj.get("assets"), what="manifest assets").items():
            a = _object(raw, what=f"asset {name!r}")
            if set(a) != {"url", "sha256"}:
                raise InvalidArgument(f"asset {name!r} must have exactly 'url' and 'sha256'")
            assets[name] = Asset(
                url=_field(a, "url", str, what=f"asset {name!r}"),
                sha256=_field(a, "sha256", str, what=f"asset {name!r}"),
            )
        names = _list(obj.get("snapshotFiles"), what="manifest snapshotFiles")
        files: list[ManifestFile] = []
        for raw in _list(obj.get("files"), what="manifest files"):
            f = _object(raw, what="manifest file")
            if set(f) != {"name", "size", "sha256"}:
                raise InvalidArgument("manifest file must have exactly 'name', 'size', 'sha256'")
            files.append(
                ManifestFile(
                    name=_field(f, "name", str, what="manifest file"),
                    size=_field(f, "size", int, what="manifest file"),
                    sha256=_field(f, "sha256", str, what="manifest file"),
                )
            )
        if names != [f.name for f in files]:
            raise InvalidArgument("manifest snapshotFiles does not match files")
        fidelity_name = _field(obj, "fidelity", str, what="manifest")
        try:
            fidelity = Fidelity[fidelity_name]
        except KeyError as exc:
            raise InvalidArgument(f"manifest fidelity {fidelity_name!r} is unknown") from exc
        created_at = obj.get("createdAt")
        if isinstance(created_at, bool) or not isinstance(created_at, int | float):
            raise InvalidArgument("manifest field 'createdAt' must be a number")
        return cls(
            sandbox_class=_field(obj, "sandboxClass", str, what="manifest"),
            runtime_version=_field(obj, "runtimeVersion", str, what="manifest"),
            assets=assets,
            files=files,
            fidelity=fidelity,
            created_at=float(created_at),
        )


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise InvalidArgument(f"manifest JSON has duplicate key {k!r}")
        out[k] = v
    return out


def _reject_constant(name: str) -> Any:
    raise InvalidArgument(f"manifest JSON must not contain {name}")


def _object(value: object, *, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what} must be a JSON object")
    return value


def _list(value: object, *, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidArgument(f"{what} must be a JSON array")
    return value


def _field(obj: Mapping[str, Any], key: str, kind: type[_T], *, what: str) -> _T:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise InvalidArgument(f"{what} field {key!r} must be a {kind.__name__}")
    return value


__all__ = ["FORMAT_VERSION", "Asset", "Manifest", "ManifestFile"]
