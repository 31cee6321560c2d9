"""The actions probes and lifecycle hooks run: exec, httpGet, tcpSocket, sleep.

Each returns (ok, message); the message says why it failed, for the Unhealthy / FailedPostStartHook
events. Backend-blind: exec goes through the runtime's exec_sync.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import aiohttp

from pykubelet.api.model import (
    Container,
    ExecAction,
    GRPCAction,
    HTTPGetAction,
    Pod,
    SleepAction,
    TCPSocketAction,
)
from pykubelet.runtime.base import Runtime, RuntimeContainer, RuntimeFailure

Action = ExecAction | HTTPGetAction | TCPSocketAction | GRPCAction | SleepAction


def resolve_port(port: int | str, spec: Container) -> int:
    if isinstance(port, int):
        return port
    for p in spec.ports:
        if p.name == port:
            return p.container_port
    # Validation checks named ports; a number given as a string is still a number.
    return int(port)


# The environment an exec action runs with: (pod, container, pod IP) -> variables in order.
ExecEnv = Callable[[Pod, Container, str], list[tuple[str, str]]]


class ActionRunner:
    def __init__(self, runtime: Runtime, host_ip: str, exec_env: ExecEnv) -> None:
        self.runtime = runtime
        self.host_ip = host_ip
        self._exec_env = exec_env
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No keep-alive: a probe must see a server that stopped accepting connections.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True, ssl=False)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def run(
        self,
        action: Action,
        pod: Pod,
        spec: Container,
        container: RuntimeContainer,
        pod_ip: str | None,
        timeout_seconds: float,
    ) -> tuple[bool, str]:
        host = pod_ip or self.host_ip
        if isinstance(action, ExecAction):
            return await self._exec(action, pod, spec, container, host, timeout_seconds)
        if isinstance(action, HTTPGetAction):
            return await self._http_get(action, spec, action.host or host, timeout_seconds)
        if isinstance(action, TCPSocketAction):
            return await self._tcp(action, spec, action.host or host, timeout_seconds)
        if isinstance(action, GRPCAction):
            return await _grpc_health(action, host, timeout_seconds)
        await asyncio.sleep(action.seconds)
        return True, ""

    async def _exec(
        self,
        action: ExecAction,
        pod: Pod,
        spec: Container,
        container: RuntimeContainer,
        pod_ip: str,
        timeout_seconds: float,
    ) -> tuple[bool, str]:
        env = self._exec_env(pod, spec, pod_ip)
        try:
            result = await self.runtime.exec_sync(container, action.command, env, timeout_seconds)
        except RuntimeFailure as exc:
            return False, str(exc)
        output = result.output.decode(errors="replace").strip()
        if result.timed_out:
            return False, f"command {action.command!r} timed out after {timeout_seconds:g}s"
        if result.exit_code != 0:
            detail = f": {output}" if output else ""
            return False, f"command {action.command!r} exited with {result.exit_code}{detail}"
        return True, output

    async def _http_get(
        self, action: HTTPGetAction, spec: Container, host: str, timeout_seconds: float
    ) -> tuple[bool, str]:
        port = resolve_port(action.port, spec)
        path = action.path if action.path.startswith("/") else "/" + action.path
        shown = f"[{host}]" if ":" in host else host
        url = f"{action.scheme.lower()}://{shown}:{port}{path}"
        headers = {h.name: h.value for h in action.http_headers}
        headers.setdefault("User-Agent", "kube-probe/pykubelet")
        try:
            async with self._http().get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_seconds)
            ) as resp:
                await resp.read()
                if 200 <= resp.status < 400:
                    return True, ""
                return False, f"HTTP probe failed with statuscode: {resp.status}"
        except TimeoutError:
            return False, f'Get "{url}": timed out after {timeout_seconds:g}s'
        except aiohttp.ClientError as exc:
            return False, f'Get "{url}": {exc}'

    async def _tcp(
        self, action: TCPSocketAction, spec: Container, host: str, timeout_seconds: float
    ) -> tuple[bool, str]:
        port = resolve_port(action.port, spec)
        try:
            async with asyncio.timeout(timeout_seconds):
                _, writer = await asyncio.open_connection(host, port)
        except TimeoutError:
            return False, f"dial tcp {host}:{port}: i/o timeout"
        except OSError as exc:
            return False, f"dial tcp {host}:{port}: {exc.strerror or exc}"
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True, ""


async def _grpc_health(action: GRPCAction, host: str, timeout_seconds: float) -> tuple[bool, str]:
    """The gRPC health protocol (grpc.health.v1.Health/Check), as the kubelet's grpc probe."""
    # Imported here: grpc costs ~100 ms at start, and most nodes have no grpc probe.
    import grpc  # type: ignore[import-untyped]
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

    target = f"[{host}]:{action.port}" if ":" in host else f"{host}:{action.port}"
    request = health_pb2.HealthCheckRequest(service=action.service or "")
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                request, timeout=timeout_seconds
            )
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return (
                False,
                f"timeout: health rpc to {target} did not complete within {timeout_seconds:g}s",
            )
        return False, f"error: health rpc to {target} failed: {exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if status != "SERVING":
        return False, f'service unhealthy (responded with "{status}")'
    return True, ""
