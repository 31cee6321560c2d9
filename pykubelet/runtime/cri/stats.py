"""The remote runtime's container storage, for the stats collector: the writable layers from one
ListContainerStats call (the CRI's `writable_layer`: its used bytes and inodes, which containerd
measures on a period of its own, `stats_collect_period`, 10 s by default), and each container's
log directory (<root-dir>/logs/pods/<namespace>_<name>_<uid>/<container>/: every attempt of the
container and its rotated files, as the kubelet measures it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from pykubelet.runtime.base import ContainerStorage, RuntimeFailure
from pykubelet.runtime.cri.client import CriError
from pykubelet.runtime.cri.convert import LABEL_MANAGED
from pykubelet.runtime.cri.proto import cri_api_pb2 as api
from pykubelet.runtime.sandbox.engine import ContainerEntry

Call = Callable[..., Awaitable[Any]]


async def container_storage(
    call: Call, containers: Sequence[ContainerEntry]
) -> dict[str, ContainerStorage]:
    """By ID, the writable layer and log directory of each of `containers`."""
    request = api.ListContainerStatsRequest(
        filter=api.ContainerStatsFilter(label_selector={LABEL_MANAGED: "true"})
    )
    try:
        reply = await call("ListContainerStats", request, api.ListContainerStatsResponse)
    except (CriError, TimeoutError) as e:
        raise RuntimeFailure(f"cannot ask for the containers' stats: {e}") from e
    layers = {
        s.attributes.id: s.writable_layer for s in reply.stats if s.HasField("writable_layer")
    }
    out: dict[str, ContainerStorage] = {}
    for container in containers:
        logs = (str(Path(container.log_path).parent),) if container.log_path else ()
        layer = layers.get(container.id)
        if layer is None:
            out[container.id] = ContainerStorage(log_paths=logs)
            continue
        out[container.id] = ContainerStorage(
            rootfs_bytes=layer.used_bytes.value if layer.HasField("used_bytes") else None,
            rootfs_inodes=layer.inodes_used.value if layer.HasField("inodes_used") else None,
            rootfs_at=layer.timestamp / 1e9 if layer.timestamp > 0 else None,
            log_paths=logs,
        )
    return out
