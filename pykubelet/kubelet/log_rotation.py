"""Container log rotation (the kubelet's containerLogManager), every
`--container-log-monitor-interval` (10 s): the runtime rotates the logs of its running
containers that reached `--container-log-max-size`, keeping at most `--container-log-max-files`
files each (runtime/logrotation.py; the docker runtime's engine rotates its own)."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from pykubelet.runtime.base import LogRotationPolicy

log = logging.getLogger(__name__)


class RotatingRuntime(Protocol):
    async def rotate_logs(self, policy: LogRotationPolicy) -> None: ...


async def run_periodically(
    runtime: RotatingRuntime, policy: LogRotationPolicy, interval: float, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        try:
            async with asyncio.timeout(interval):
                await stop.wait()
            return
        except TimeoutError:
            pass
        try:
            await runtime.rotate_logs(policy)
        except Exception as exc:
            log.warning("container log rotation failed: %s", exc)
