"""The image port: unpack a container image into an actor's OCI bundle (pure records + Protocol).

atelet unpacks the first container image of an actor's template into the actor's bundle
directory before a run or restore (:class:`~substrate.sandbox.node_layout.NodeLayout`
``bundle_dir``): the root filesystem goes to ``<bundle_dir>/rootfs`` and the worker writes
``config.json`` beside it. What the image says about its process (entrypoint, cmd, env)
comes back as an :class:`ImageConfig`, which atelet passes to the worker for a container
that declares no command of its own. It is the one record of an image's config: the gVisor
image store reads its on-disk ``image.json`` into it
(:mod:`substrate.adapters.gvisor.images`), and atelet keeps it in the bundle's marker
(:meth:`ImageConfig.to_json`).

Adapters: a local image store (another module) and the tmpdir fake in
:mod:`substrate.testing.fake_images`.

Errors (from :mod:`substrate.errors`): ``NotFound`` for an image the store does not have;
``InvalidArgument`` for a malformed reference; ``Internal`` for a failed unpack (the
bundle directory is then left for the caller to discard); ``Unavailable`` when the store
cannot be used right now.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final, Protocol

import attrs

from substrate.errors import InvalidArgument
from substrate.sandbox.spec import DEFAULT_ROOTFS

ROOTFS_DIR: Final = DEFAULT_ROOTFS
"""The root filesystem directory inside a bundle (``<bundle_dir>/rootfs``)."""


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise InvalidArgument("expected a sequence of strings, not one string")
    out = tuple(value)
    for item in out:
        if not isinstance(item, str) or "\x00" in item:
            raise InvalidArgument(f"image argument {item!r} is invalid")
    return out


def _env_pairs(value: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    out = tuple((str(k), str(v)) for k, v in value)
    names = [k for k, _ in out]
    if len(set(names)) != len(names):
        raise InvalidArgument("image env has duplicate names")
    for k, v in out:
        if not k or "=" in k or "\x00" in k or "\x00" in v:
            raise InvalidArgument(f"image env name {k!r} is invalid")
    return out


def _frozen_mapping(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


@attrs.frozen(slots=True, kw_only=True)
class ImageConfig:
    """What an image declares about the process it runs (its OCI image config)."""

    entrypoint: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    cmd: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    env: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_env_pairs)
    """``(name, value)`` pairs, in the image's order."""
    runtime: Mapping[str, Any] = attrs.field(
        factory=dict, converter=_frozen_mapping, eq=False, hash=False
    )
    """Free-form hints for the runtime, kept as the image gives them (not compared)."""

    @property
    def args(self) -> tuple[str, ...]:
        """The image's process: entrypoint followed by cmd."""
        return self.entrypoint + self.cmd

    def to_json(self) -> dict[str, object]:
        """The config as stored in a bundle's marker (``runtime`` only when there are hints)."""
        doc: dict[str, object] = {
            "entrypoint": list(self.entrypoint),
            "cmd": list(self.cmd),
            "env": [[k, v] for k, v in self.env],
        }
        if self.runtime:
            doc["runtime"] = dict(self.runtime)
        return doc

    @classmethod
    def from_json(cls, doc: object) -> ImageConfig:
        """The config :meth:`to_json` wrote; :class:`InvalidArgument` if malformed."""
        if not isinstance(doc, dict):
            raise InvalidArgument("image config must be a JSON object")
        entrypoint, cmd, env = doc.get("entrypoint", []), doc.get("cmd", []), doc.get("env", [])
        if not (isinstance(entrypoint, list) and isinstance(cmd, list) and isinstance(env, list)):
            raise InvalidArgument("image config fields must be JSON arrays")
        pairs: list[tuple[str, str]] = []
        for item in env:
            if not (
                isinstance(item, list)
                and len(item) == 2
                and all(isinstance(part, str) for part in item)
            ):
                raise InvalidArgument("image config env entries must be [name, value] pairs")
            pairs.append((item[0], item[1]))
        if not all(isinstance(a, str) for a in [*entrypoint, *cmd]):
            raise InvalidArgument("image config arguments must be strings")
        runtime = doc.get("runtime", {})
        if not isinstance(runtime, dict):
            raise InvalidArgument("image config runtime must be a JSON object")
        return cls(entrypoint=entrypoint, cmd=cmd, env=pairs, runtime=runtime)


class ImageStore(Protocol):
    """The node's container images, as atelet sees them.

    ``unpack`` is declared as returning an awaitable so this module stays free of async
    code; implement it as ``async def unpack(self, image, bundle_dir) -> ImageConfig``.
    """

    def unpack(self, image: str, bundle_dir: str) -> Awaitable[ImageConfig]:
        """Unpack ``image``'s root filesystem into ``<bundle_dir>/rootfs``; its config.

        ``bundle_dir`` exists and holds no root filesystem yet. Raises ``NotFound`` for an
        image the store does not have.
        """
        ...


__all__ = ["ROOTFS_DIR", "ImageConfig", "ImageStore"]
