"""The Docker Engine API's images for image GC: /images/json, DELETE /images/{name} (never
forced: the engine refuses an image a container uses), and the file system of the engine's
root directory (/info's DockerRootDir, Podman's graph root) measured on this machine; the same
root and the images' sizes are the Summary API's imageFs.

An image is in use when any container the engine lists (the agent's or not, in any state)
was created from it, or when it is the pod infra image."""

from __future__ import annotations

from typing import Protocol

from pykubelet.runtime.base import GcImage, ImageFsStats, ImageFsUsage, RuntimeFailure
from pykubelet.runtime.docker.client import EngineError
from pykubelet.runtime.images import fs_usage


class ImageCalls(Protocol):
    async def json(
        self, method: str, path: str, params: dict[str, str] | None = None
    ) -> object: ...

    async def delete(self, path: str, params: dict[str, str]) -> None: ...


def _id(value: object) -> str:
    return str(value or "").removeprefix("sha256:")


class DockerImages:
    def __init__(self, client: ImageCalls, infra_image: str) -> None:
        self._client = client
        self._infra_image = infra_image

    async def list_images(self) -> list[GcImage]:
        try:
            images = await self._client.json("GET", "images/json")
            containers = await self._client.json("GET", "containers/json", {"all": "1"})
            infra = await self._infra_id()
        except EngineError as e:
            raise RuntimeFailure(f"cannot list the images: {e}") from e
        used: set[str] = set()
        for c in containers if isinstance(containers, list) else []:
            used.add(_id(c.get("ImageID")))
            used.add(str(c.get("Image") or ""))
        out = []
        for image in images if isinstance(images, list) else []:
            tags = tuple(t for t in image.get("RepoTags") or [] if t and t != "<none>:<none>")
            image_id = _id(image.get("Id"))
            out.append(
                GcImage(
                    id=image_id,
                    tags=tags,
                    size=int(image.get("Size") or 0),
                    in_use=image_id in used or any(t in used for t in tags),
                    pinned=image_id == infra,
                )
            )
        return out

    async def _infra_id(self) -> str:
        try:
            info = await self._client.json("GET", f"images/{self._infra_image}/json")
        except EngineError as e:
            if e.not_found:
                return ""
            raise
        return _id(info.get("Id")) if isinstance(info, dict) else ""

    async def remove_image(self, image: GcImage) -> None:
        # By each tag (the engine refuses to remove by id an image of several tags unforced),
        # as the kubelet's dockershim did; untagged, by id.
        try:
            for name in image.tags or (image.id,):
                try:
                    await self._client.delete(f"images/{name}", {})
                except EngineError as e:
                    if not e.not_found:
                        raise
        except EngineError as e:
            raise RuntimeFailure(f"cannot remove image {image.id[:12]}: {e}") from e

    async def _root(self) -> str:
        try:
            info = await self._client.json("GET", "info")
        except EngineError as e:
            raise RuntimeFailure(f"cannot ask the engine for its root directory: {e}") from e
        root = info.get("DockerRootDir") if isinstance(info, dict) else None
        if not root:
            raise RuntimeFailure("the engine's /info names no DockerRootDir")
        return str(root)

    async def image_fs_usage(self) -> ImageFsUsage:
        return await fs_usage(await self._root())

    async def image_fs_stats(self) -> ImageFsStats:
        """The engine's root, and the sum of its images' sizes as the kubelet's ImageStats adds
        them (layers two images share count twice: /system/df would walk every layer)."""
        root = await self._root()
        try:
            images = await self._client.json("GET", "images/json")
        except EngineError as e:
            raise RuntimeFailure(f"cannot list the images: {e}") from e
        rows = images if isinstance(images, list) else []
        return ImageFsStats(path=root, used_bytes=sum(int(i.get("Size") or 0) for i in rows))
