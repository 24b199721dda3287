"""The node's :class:`~substrate.sandbox.images.ImageStore`: local images, unpacked in a thread."""

from __future__ import annotations

import os

import anyio.to_thread

from substrate.adapters.gvisor.images import LocalImages
from substrate.sandbox.images import ImageConfig


class LocalImageStore:
    """Images below ``root`` (directories or tarballs; no registry pulls)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.images = LocalImages(root)

    async def unpack(self, image: str, bundle_dir: str) -> ImageConfig:
        return await anyio.to_thread.run_sync(self.images.unpack, image, bundle_dir)


__all__ = ["LocalImageStore"]
