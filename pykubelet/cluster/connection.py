"""The connection to the API server: the kubeconfig loaded and the client built, retried while
it fails (a kubeconfig written later by a bootstrap, a typo fixed). An empty --kubeconfig path
means the in-cluster service account, as client-go."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from pykubelet.client.kubeapi import ConfigError, KubeApi
from pykubelet.client.throttle import Failures, Retry

log = logging.getLogger(__name__)


class ApiConnection:
    def __init__(
        self, kubeconfig: Path, node_name: str, *, qps: float = 50.0, burst: int = 100
    ) -> None:
        self.kubeconfig = kubeconfig
        self._node_name = node_name
        self._qps, self._burst = qps, burst
        self._api: KubeApi | None = None
        self.connected = asyncio.Event()

    @property
    def api(self) -> KubeApi | None:
        """The client once connected, else None."""
        return self._api

    async def run(self) -> None:
        retry = Retry(1.0, 30.0)
        failures = Failures(f"loading --kubeconfig {self.kubeconfig}")
        while True:
            try:
                api = await KubeApi.connect(
                    self.kubeconfig, self._node_name, qps=self._qps, burst=self._burst
                )
            except ConfigError as exc:
                failures.failed(exc, " (retrying; the API server source stays not ready)")
                await asyncio.sleep(retry.delay())
                continue
            break
        failures.ok()
        log.info("API server %s", api.host)
        self._api = api
        self.connected.set()

    async def with_api(self, run: Callable[[KubeApi], Awaitable[None]]) -> None:
        """`run(api)` once connected."""
        await self.connected.wait()
        assert self._api is not None
        await run(self._api)

    async def reload(self, _: Path | None = None) -> None:
        """The kubeconfig's credentials changed (a rotated certificate): the client is rebuilt."""
        if self._api is not None:
            await self._api.reload(self.kubeconfig, self._node_name)
            log.info("API client rebuilt with the rotated credentials of %s", self.kubeconfig)

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None
