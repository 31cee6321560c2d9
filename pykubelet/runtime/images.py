"""What the image services of the engines share: the file system an engine keeps its images on,
measured here as the kubelet's cadvisor measures it (statvfs of the engine's directory, which
must be on this machine, as the kubelet's image GC needs)."""

from __future__ import annotations

import asyncio
import os

from pykubelet.runtime.base import ImageFsUsage, RuntimeFailure


def _statvfs(path: str) -> ImageFsUsage:
    st = os.statvfs(path)
    return ImageFsUsage(
        path=path,
        capacity_bytes=st.f_blocks * st.f_frsize,
        available_bytes=st.f_bavail * st.f_frsize,
    )


async def fs_usage(path: str) -> ImageFsUsage:
    """The usage of the file system holding `path`; RuntimeFailure if it cannot be read here."""
    try:
        return await asyncio.to_thread(_statvfs, path)
    except OSError as exc:
        raise RuntimeFailure(
            f"cannot measure the image file system at {path}: {exc.strerror or exc}"
        ) from exc
