"""The CRI calls we make, typed, over one grpc.aio channel. grpc has no type hints; everything
untyped about it stays in here.

Errors: a runtime that cannot be reached is a RuntimeFailure; a call without an answer in time
is a TimeoutError; any other error status is a CriError, for the caller to judge.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Iterator
from typing import Any, TypeVar

from pykubelet.runtime.base import RuntimeFailure
from pykubelet.runtime.sandbox.naming import normalize_endpoint

CALL_TIMEOUT = 120.0  # one ordinary call (the kubelet's default --runtime-request-timeout: 2m)
MAX_MESSAGE = 16 * 1024 * 1024  # the kubelet's limit for CRI messages

T = TypeVar("T")


class CriError(Exception):
    """The runtime answered a call with an error status."""

    def __init__(self, call: str, code: str, details: str) -> None:
        super().__init__(f"{call}: {code}: {details}")
        self.call = call
        self.code = code
        self.details = details

    @property
    def not_found(self) -> bool:
        return self.code == "NOT_FOUND" or "not found" in self.details

    @property
    def unimplemented(self) -> bool:
        return self.code == "UNIMPLEMENTED"


def unix_socket_path(endpoint: str) -> str | None:
    if endpoint.startswith("unix://"):
        return endpoint[len("unix://") :]
    return endpoint if endpoint.startswith("/") else None


class CriClient:
    def __init__(self, endpoint: str) -> None:
        import grpc  # type: ignore[import-untyped]

        self.endpoint = endpoint
        self._grpc: Any = grpc
        self._channel: Any = grpc.aio.insecure_channel(
            normalize_endpoint(endpoint),
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE),
            ],
        )
        self._methods: dict[str, Any] = {}

    async def close(self) -> None:
        await self._channel.close()

    async def wait_ready(self, seconds: float) -> None:
        try:
            async with asyncio.timeout(seconds):
                await self._channel.channel_ready()
        except TimeoutError:
            raise RuntimeFailure(
                f"cannot reach the container runtime at {self.endpoint}: no connection in "
                f"{seconds:g}s"
            ) from None

    def _method(self, service: str, name: str, response: type[Any], stream: bool) -> Any:
        key = f"/runtime.v1.{service}/{name}"
        method = self._methods.get(key)
        if method is None:
            make = self._channel.unary_stream if stream else self._channel.unary_unary
            method = make(
                key,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=response.FromString,
            )
            self._methods[key] = method
        return method

    async def call(
        self,
        name: str,
        request: Any,
        response: type[T],
        deadline: float | None = CALL_TIMEOUT,
        service: str = "RuntimeService",
    ) -> T:
        """One call; `deadline` None: none (a command run for as long as it takes)."""
        method = self._method(service, name, response, stream=False)
        with self._errors(name):
            result: T = await method(request, timeout=deadline)
            return result

    async def stream(self, name: str, request: Any, response: type[T]) -> AsyncGenerator[T, None]:
        method = self._method("RuntimeService", name, response, stream=True)
        with self._errors(name):
            async for item in method(request):
                yield item

    @contextlib.contextmanager
    def _errors(self, call: str) -> Iterator[None]:
        grpc = self._grpc
        try:
            yield
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if code == grpc.StatusCode.UNAVAILABLE:
                raise RuntimeFailure(
                    f"cannot reach the container runtime at {self.endpoint} ({call}): {e.details()}"
                ) from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(f"{call}: no answer from {self.endpoint} in time") from None
            raise CriError(call, code.name, e.details() or "") from None
