"""The Docker Engine API's HTTP calls, over aiodocker (pinned): its helpers where they fit, its
`_query` where raw streams are needed (logs, events, exec), its `Exec` for an exec with its stdio
attached (`ExecSession`: the hijacked connection of exec/{id}/start), and the same for a
container's own stdio (`attach_session`: containers/{id}/attach). Everything untyped about
aiodocker stays in here.

Errors: an engine that cannot be reached (or does not answer in time) is a RuntimeFailure; an
engine that answers with an error status is an EngineError, for the caller to judge (a 404 is
often fine).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import aiodocker
import aiohttp
from aiodocker.execs import Exec
from aiodocker.jsonstream import json_stream_list
from aiodocker.stream import Stream
from yarl import URL

from pykubelet.runtime.base import RuntimeFailure, TerminalSize

API_TIMEOUT = 120.0  # one ordinary call; Podman serialises creates, so a busy engine is slow
CONNECT_TIMEOUT = 10.0

T = TypeVar("T")


class EngineError(Exception):
    """The engine answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"[{status}] {message}")
        self.status = status
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        # Docker answers 409; Podman 4.3 answers 500 "... is already in use".
        return self.status == 409 or "already in use" in self.message


class DockerClient:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._client: aiodocker.Docker | None = None

    async def open(self) -> dict[str, str]:
        """Connect; the headers of /_ping (Api-Version, Server, Libpod-Api-Version)."""
        try:
            self._client = aiodocker.Docker(
                url=self.endpoint,
                timeout=aiohttp.ClientTimeout(total=API_TIMEOUT, connect=CONNECT_TIMEOUT),
            )
        except ValueError as e:
            raise RuntimeFailure(f"bad container runtime endpoint {self.endpoint!r}: {e}") from e

        async def ping(c: aiodocker.Docker) -> dict[str, str]:
            async with c._query("_ping", versioned_api=False) as resp:
                await resp.read()
                return dict(resp.headers)

        try:
            headers = await self._call(ping)
        except EngineError as e:
            await self.close()
            raise RuntimeFailure(
                f"{self.endpoint} does not answer as a Docker Engine API: {e}"
            ) from e
        except RuntimeFailure:
            await self.close()
            raise
        # From /_ping, not /version: Podman answers /version in 0.36 s (it runs conmon and runc
        # to ask theirs), and aiodocker would ask it before the first call if not told.
        assert self._client is not None
        self._client.api_version = f"v{headers.get('Api-Version', '1.41')}"
        return headers

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def json(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Any:
        return await self._call(lambda c: c._query_json(path, method, params=params, data=body))

    async def post(
        self, path: str, params: dict[str, str] | None = None, deadline: float = API_TIMEOUT
    ) -> None:
        async def call(c: aiodocker.Docker) -> None:
            async with c._query(path, "POST", params=params, timeout=_timeout(deadline)) as resp:
                await resp.read()

        await self._call(call)

    async def delete(self, path: str, params: dict[str, str]) -> None:
        async def call(c: aiodocker.Docker) -> None:
            async with c._query(path, "DELETE", params=params) as resp:
                await resp.read()

        await self._call(call)

    async def pull(self, image: str, registry_auth: str | None = None) -> None:
        """Pull, with no deadline of its own (the caller sets one); `registry_auth`: the
        X-Registry-Auth header (base64url JSON of username, password, serveraddress).
        EngineError if the engine says the pull failed, or the connection broke off during it
        (status 0)."""
        client = self._require()
        try:
            if registry_auth is None:
                await client.images.pull(image, timeout=None)
            else:
                # aiodocker's own pull takes the first path component for the registry (wrong
                # for a Docker Hub "user/repo"): the header is made by the caller.
                params = {"fromImage": image}
                if not _has_tag_or_digest(image):
                    params["tag"] = "latest"
                headers = {"X-Registry-Auth": registry_auth}
                async with client._query(
                    "images/create", "POST", params=params, headers=headers, timeout=None
                ) as resp:
                    await json_stream_list(resp)
        except aiodocker.DockerError as e:
            if e.status == 900:
                raise RuntimeFailure(f"cannot reach the container engine: {e.message}") from e
            raise EngineError(e.status, e.message) from e
        except aiohttp.ClientError as e:
            raise EngineError(0, str(e)) from e

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        params: dict[str, str],
        deadline: float | None = API_TIMEOUT,
        body: dict[str, Any] | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        client = self._require()
        with self._errors():
            # None: no deadline at all (a log followed, the event stream), but still one to
            # connect, so a dead engine is reported.
            limit = (
                aiohttp.ClientTimeout(connect=CONNECT_TIMEOUT)
                if deadline is None
                else _timeout(deadline)
            )
            async with client._query(
                path,
                method,
                params=params,
                timeout=limit,
                data=None if body is None else json.dumps(body),
                headers=None if body is None else {"Content-Type": "application/json"},
            ) as resp:
                yield resp

    async def exec_session(
        self, exec_id: str, tty: bool, size: TerminalSize | None = None
    ) -> ExecSession:
        """Start the exec `exec_id` (created with its stdio attached) on a hijacked connection,
        its terminal (with `tty`) of `size` from the start: Docker reads the start's
        ConsoleSize ([height, width]), Podman its h and w; each ignores the other's."""
        client = self._require()
        body: dict[str, Any] = {"Detach": False, "Tty": tty}
        if size is not None:
            body.update(ConsoleSize=[size.height, size.width], h=size.height, w=size.width)
        payload = json.dumps(body).encode()

        async def setup() -> tuple[URL, bytes, bool]:
            return URL(f"exec/{exec_id}/start"), payload, tty

        # aiodocker's Exec.start, with our body. No deadline once connected: the command runs
        # as long as it likes.
        stream = Stream(client, setup, aiohttp.ClientTimeout(connect=CONNECT_TIMEOUT))
        with self._errors():
            await stream.__aenter__()
        return ExecSession(self, exec_id, stream)

    async def attach_session(self, container_id: str, stdin: bool) -> ExecSession:
        """Attach to the running container's stdio on a hijacked connection (`stream=1`: what
        it writes from now on, not its logs)."""
        client = self._require()
        stream = client.containers.container(container_id).attach(
            stdout=True,
            stderr=True,
            stdin=stdin,
            timeout=aiohttp.ClientTimeout(connect=CONNECT_TIMEOUT),
        )
        with self._errors():
            await stream.__aenter__()
        return AttachSession(self, container_id, stream)

    def _require(self) -> aiodocker.Docker:
        if self._client is None:
            raise RuntimeFailure("the docker runtime is not started")
        return self._client

    async def _call(self, call: Callable[[aiodocker.Docker], Awaitable[T]]) -> T:
        client = self._require()
        with self._errors():
            return await call(client)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """The client's errors as the runtime's: unreachable → RuntimeFailure, else EngineError."""
        try:
            yield
        except aiodocker.DockerError as e:
            if e.status == 900:
                raise RuntimeFailure(
                    f"cannot reach the container engine at {self.endpoint}: {e.message}"
                ) from e
            raise EngineError(e.status, e.message) from e
        except (aiohttp.ClientError, TimeoutError) as e:
            raise RuntimeFailure(f"container engine at {self.endpoint}: {e!r}") from e


def _has_tag_or_digest(image: str) -> bool:
    last = image.rsplit("/", 1)[-1]
    return ":" in last or "@" in last


def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=seconds, connect=CONNECT_TIMEOUT, sock_read=seconds)


class ExecSession:
    """One started exec and its hijacked connection. The engine's frames (8-byte headers unless
    it has a terminal) are parsed by aiodocker into (1 stdout | 2 stderr, bytes); its queue holds
    at most 64 KiB before it stops reading the socket, so an output nobody reads fills the
    engine's buffers and then the command's pipe, never our memory."""

    def __init__(self, client: DockerClient, exec_id: str, stream: Stream) -> None:
        self.id = exec_id
        self._client = client
        self._stream = stream
        self._closed = False

    async def read(self) -> tuple[int, bytes] | None:
        """The next chunk of output, None at its end (or once closed)."""
        if self._closed:
            return None
        try:
            with self._client._errors():
                message = await self._stream.read_out()
        except RuntimeFailure:
            if self._closed:
                return None  # our own close() broke it off
            raise
        return None if message is None else (message.stream, message.data)

    async def write(self, data: bytes) -> None:
        """Send to its stdin, waiting while the connection's buffer is full. ConnectionError if
        the connection is closed (the command ended, or close())."""
        if self._closed:
            raise ConnectionResetError("the exec's connection is closed")
        try:
            await self._stream.write_in(data)
        except RuntimeError as e:  # aiodocker's "closed transport"
            raise ConnectionResetError(str(e)) from e

    def close_write(self) -> None:
        """Half-close the connection: the engine closes the command's stdin (EOF)."""
        resp = self._stream._resp
        transport = None if resp is None or resp.connection is None else resp.connection.transport
        if transport is not None and not transport.is_closing() and transport.can_write_eof():
            transport.write_eof()

    async def resize(self, width: int, height: int) -> None:
        await self._client._call(lambda c: Exec(c, self.id).resize(h=height, w=width))

    async def inspect(self) -> dict[str, Any]:
        info = await self._client.json("GET", f"exec/{self.id}/json")
        return dict(info or {})

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(aiohttp.ClientError, OSError):
            await self._stream.close()


class AttachSession(ExecSession):
    """A container's own stdio on a hijacked connection: `id` is the container's."""

    async def resize(self, width: int, height: int) -> None:
        await self._client.post(
            f"containers/{self.id}/resize", params={"h": str(height), "w": str(width)}
        )

    async def inspect(self) -> dict[str, Any]:
        info = await self._client.json("GET", f"containers/{self.id}/json")
        return dict(info or {})
