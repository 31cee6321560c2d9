"""The CRI's ImageService for image GC: ListImages, RemoveImage, and ImageFsInfo's mount point
measured on this machine (as the kubelet's CRI stats provider does through cadvisor); its used
bytes and inodes are the Summary API's imageFs.

An image is in use when any container the runtime lists (the agent's or not, in any state)
was created from it, when it is the sandbox image, or when the runtime pins it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pykubelet.runtime.base import GcImage, ImageFsStats, ImageFsUsage, RuntimeFailure
from pykubelet.runtime.cri.client import CriError
from pykubelet.runtime.cri.proto import cri_api_pb2 as api
from pykubelet.runtime.images import fs_usage

Call = Callable[..., Awaitable[Any]]


class CriImages:
    def __init__(self, call: Call, infra_image: str) -> None:
        """`call(name, request, response_type, service=...)`: one CRI call."""
        self._call = call
        self._infra_image = infra_image

    async def list_images(self) -> list[GcImage]:
        try:
            images = await self._call(
                "ListImages", api.ListImagesRequest(), api.ListImagesResponse,
                service="ImageService",
            )  # fmt: skip
            containers = await self._call(
                "ListContainers", api.ListContainersRequest(), api.ListContainersResponse
            )
            infra = await self._call(
                "ImageStatus",
                api.ImageStatusRequest(image=api.ImageSpec(image=self._infra_image)),
                api.ImageStatusResponse,
                service="ImageService",
            )
        except (CriError, TimeoutError) as e:
            raise RuntimeFailure(f"cannot list the images: {e}") from e
        used = {c.image_ref for c in containers.containers} | {
            c.image.image for c in containers.containers
        }
        infra_id = infra.image.id if infra.HasField("image") else ""
        out = []
        for image in images.images:
            names = {image.id, *image.repo_tags, *image.repo_digests}
            out.append(
                GcImage(
                    id=image.id,
                    tags=tuple(image.repo_tags),
                    size=image.size,
                    in_use=bool(names & used),
                    pinned=image.pinned or image.id == infra_id,
                )
            )
        return out

    async def remove_image(self, image: GcImage) -> None:
        try:
            await self._call(
                "RemoveImage",
                api.RemoveImageRequest(image=api.ImageSpec(image=image.id)),
                api.RemoveImageResponse,
                service="ImageService",
            )
        except (CriError, TimeoutError) as e:
            raise RuntimeFailure(f"cannot remove image {image.id}: {e}") from e

    async def _image_fs(self) -> Any:
        """The first image file system ImageFsInfo names (the kubelet reads only the first)."""
        try:
            reply = await self._call(
                "ImageFsInfo", api.ImageFsInfoRequest(), api.ImageFsInfoResponse,
                service="ImageService",
            )  # fmt: skip
        except (CriError, TimeoutError) as e:
            raise RuntimeFailure(f"cannot ask for the image file system: {e}") from e
        found = [fs for fs in reply.image_filesystems if fs.fs_id.mountpoint]
        if not found:
            raise RuntimeFailure("the runtime's ImageFsInfo names no image file system")
        return found[0]

    async def image_fs_usage(self) -> ImageFsUsage:
        return await fs_usage((await self._image_fs()).fs_id.mountpoint)

    async def image_fs_stats(self) -> ImageFsStats:
        fs = await self._image_fs()
        return ImageFsStats(
            path=fs.fs_id.mountpoint,
            used_bytes=fs.used_bytes.value if fs.HasField("used_bytes") else None,
            inodes_used=fs.inodes_used.value if fs.HasField("inodes_used") else None,
            at=fs.timestamp / 1e9 if fs.timestamp > 0 else None,
        )
