"""The ExecStreams of the docker runtime: an exec (`kubectl exec`) or an attach (`kubectl
attach`) on the engine's hijacked connection (client.py's ExecSession). The engine says nothing
when an exec or a container ends: its state is polled, soon at first, then less often.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pykubelet.runtime.base import STDERR, STDOUT, RuntimeFailure
from pykubelet.runtime.docker.client import EngineError, ExecSession

log = logging.getLogger(__name__)

WAIT_POLL_MIN = 0.02  # how often an exec's end is polled: at first, and at most
WAIT_POLL_MAX = 0.5


class _SessionStream:
    """What an exec and an attach share on the engine's hijacked connection: the output (one
    stream under a terminal), the terminal's size, and the end, polled from `inspect`."""

    def __init__(self, session: ExecSession, what: str, *, stdin: bool, tty: bool) -> None:
        self._session = session
        self._what = what
        self._stdin = stdin
        self._tty = tty
        self._stdin_closed = False
        self._closed = False

    async def _send(self, data: bytes) -> None:
        if self._stdin_closed or self._closed:
            return  # nobody reads it any more (as the process runtime drops it)
        try:
            await self._session.write(data)
        except ConnectionError:
            self._stdin_closed = True  # it ended: its input goes nowhere

    async def output(self) -> AsyncIterator[tuple[str, bytes]]:
        while (chunk := await self._session.read()) is not None:
            stream, data = chunk
            yield (STDERR if stream == 2 and not self._tty else STDOUT), data

    async def resize(self, width: int, height: int) -> None:
        if not self._tty or self._closed:
            return
        try:
            await self._session.resize(width, height)
        except EngineError as e:  # it has just exited: nothing to resize
            log.debug("cannot resize the terminal of %s: %s", self._what, e)

    async def _poll_exit(self, state: Callable[[dict[str, Any]], dict[str, Any]]) -> int | None:
        """The exit code once `state(inspect())` says it is no longer running; None if it is
        gone. The engine does not say when it ends: polled, soon at first, then less often."""
        delay = WAIT_POLL_MIN
        while True:
            try:
                info = state(await self._session.inspect())
            except EngineError as e:
                if e.not_found:
                    return None  # gone (with its container)
                raise RuntimeFailure(f"cannot learn how {self._what} ended: {e.message}") from e
            if not info.get("Running"):
                code = info.get("ExitCode")
                return code if isinstance(code, int) else None
            await asyncio.sleep(delay)
            delay = min(delay * 2, WAIT_POLL_MAX)


class DockerExecStream(_SessionStream):
    """The ExecStream of one exec of the engine (see ExecSession for its bounded output)."""

    def __init__(
        self,
        session: ExecSession,
        what: str,
        *,
        stdin: bool,
        tty: bool,
        kill: Callable[[str], Awaitable[None]],
    ) -> None:
        super().__init__(session, what, stdin=stdin, tty=tty)
        self._kill = kill

    async def write_stdin(self, data: bytes) -> None:
        if not self._stdin:
            raise RuntimeFailure("the command's standard input is not attached")
        await self._send(data)

    async def close_stdin(self) -> None:
        if not self._stdin or self._stdin_closed or self._closed:
            return
        if self._tty:
            # The engine cannot close a terminal's input: the command reads ^D, as typed.
            await self.write_stdin(b"\x04")
            return
        self._stdin_closed = True
        self._session.close_write()

    async def wait(self) -> int | None:
        return await self._poll_exit(lambda info: info)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            # The engine lets an exec run on when its connection closes: it is killed here.
            await self._kill(self._session.id)
        finally:
            await self._session.close()


class DockerAttachStream(_SessionStream):
    """The ExecStream of an attach to a container's own stdio: its end is the container's."""

    def __init__(self, session: ExecSession, name: str, *, stdin: bool, tty: bool) -> None:
        super().__init__(session, f"container {name}", stdin=stdin, tty=tty)

    async def write_stdin(self, data: bytes) -> None:
        if self._stdin:
            await self._send(data)  # a container without stdin: the engine drops it too

    async def close_stdin(self) -> None:
        if self._stdin and not self._stdin_closed and not self._closed:
            self._stdin_closed = True
            # The engine stops copying; it closes the container's stdin with StdinOnce.
            self._session.close_write()

    async def wait(self) -> int | None:
        """The container's exit code, once the engine says it stopped."""
        return await self._poll_exit(lambda info: info.get("State") or {})

    async def close(self) -> None:
        self._closed = True
        await self._session.close()  # detaches: the container runs on
