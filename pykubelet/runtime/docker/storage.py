"""The docker runtime's container storage, for the stats collector: each container's writable
layer from `GET /containers/{id}/json?size=true` (`SizeRw`: the bytes the container added over
its image; the engine walks the layer to count them, so a few containers are asked at a time)
and its log file (`LogPath`: Docker's json-file, Podman's k8s-file; empty with a driver that
keeps no file, such as journald, whose logs are then not measured). Podman's compatible API
answers `SizeRw` as Docker does; neither counts the layer's inodes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from pykubelet.runtime.base import ContainerStorage, RuntimeFailure
from pykubelet.runtime.docker.client import EngineError

CONCURRENT = 4  # inspects with size at once: each one walks a layer


class InspectCalls(Protocol):
    async def json(
        self, method: str, path: str, params: dict[str, str] | None = None
    ) -> object: ...


async def container_storage(
    client: InspectCalls, ids: Sequence[str]
) -> dict[str, ContainerStorage]:
    """By ID, the writable layer and log file of each container the engine still has."""
    gate = asyncio.Semaphore(CONCURRENT)

    async def one(id: str) -> ContainerStorage | None:
        async with gate:
            try:
                info = await client.json("GET", f"containers/{id}/json", {"size": "true"})
            except EngineError as e:
                if e.not_found:
                    return None  # removed meanwhile
                raise RuntimeFailure(f"cannot measure container {id[:12]}: {e}") from e
        if not isinstance(info, dict):
            return None
        size = info.get("SizeRw")
        log_path = str(info.get("LogPath") or "")
        return ContainerStorage(
            rootfs_bytes=int(size) if isinstance(size, int) and size >= 0 else None,
            log_paths=(log_path,) if log_path else (),
        )

    found = await asyncio.gather(*(one(id) for id in ids))
    return {id: storage for id, storage in zip(ids, found, strict=True) if storage is not None}
