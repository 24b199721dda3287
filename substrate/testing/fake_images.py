"""A fake :class:`~substrate.sandbox.images.ImageStore`: images are a few files on disk.

``FakeImageStore({"local/counter": ImageConfig(entrypoint=("/counter",))})`` knows one
image; :meth:`FakeImageStore.unpack` writes a tiny root filesystem (``etc/image`` holds the
reference, ``etc/os-release`` a line of text) into ``<bundle_dir>/rootfs`` and returns the
image's config. ``unpacks`` counts the calls per image so tests can see a skipped unpack;
``fail`` makes every unpack raise :class:`Internal`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import anyio.lowlevel
import anyio.to_thread

from substrate.errors import Internal, NotFound
from substrate.sandbox.images import ROOTFS_DIR, ImageConfig

DEFAULT_IMAGES: Mapping[str, ImageConfig] = {
    "local/counter": ImageConfig(entrypoint=("/bin/counter",), env=(("PATH", "/bin"),)),
}


def _write_rootfs(image: str, bundle_dir: Path) -> None:
    rootfs = bundle_dir / ROOTFS_DIR
    (rootfs / "etc").mkdir(parents=True, exist_ok=True)
    (rootfs / "bin").mkdir(exist_ok=True)
    (rootfs / "etc" / "image").write_text(image + "\n")
    (rootfs / "etc" / "os-release").write_text('NAME="fake"\n')
    os.chmod(rootfs / "bin", 0o755)


class FakeImageStore:
    """Implements :class:`~substrate.sandbox.images.ImageStore` for tests."""

    def __init__(self, images: Mapping[str, ImageConfig] | None = None) -> None:
        self.images: dict[str, ImageConfig] = dict(DEFAULT_IMAGES if images is None else images)
        self.unpacks: dict[str, int] = {}
        self.fail = False

    async def unpack(self, image: str, bundle_dir: str) -> ImageConfig:
        await anyio.lowlevel.checkpoint()
        self.unpacks[image] = self.unpacks.get(image, 0) + 1
        config = self.images.get(image)
        if config is None:
            raise NotFound(f"image {image!r} not found")
        if self.fail:
            raise Internal(f"unpacking image {image!r} failed (injected)")
        await anyio.to_thread.run_sync(_write_rootfs, image, Path(bundle_dir))
        return config


__all__ = ["DEFAULT_IMAGES", "FakeImageStore"]
