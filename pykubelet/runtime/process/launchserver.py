"""The agent's side of the launch server: one long-lived `launchserver_main.py` that forks a
launcher per container, instead of a Python start per container (29 -> 4 ms of CPU each here),
or spawns a container that asks for mounts alone into a namespace it made (1.4 ms).

What this module promises:

- `LaunchServer.launch` hands the server a container's instructions and stdio and returns the
  pid of the forked launcher (or of the container), which then behaves as one started by
  `spawn` (its own session, the error pipe's EOF once it exec'd); it raises
  `ServerUnavailable` when the server cannot be started or does not answer, and the caller
  starts a launcher of its own instead;
- the server's children are not the agent's: `owns` tells them apart, and `reap` gets the
  wait status of one that exited (seen through its pidfd) from the server, which waits for it
  only then, so that its zombie keeps the pid while the agent kills its process group;
- the calls block (a round trip over a local socket, at most a fork long): call them in the
  servers' own threads (`call`), never in the loop's default pool, whose threads a burst of
  launches waiting for the server one by one would all hold (the state files' batches and
  every other thread hop of the agent waited behind them: 2.6 s between a container's start
  and its status at 1,000 API pods). Each server takes one request at a time; there are up to
  LAUNCH_SERVERS of them, each with a thread, a launch taking the first idle one (a second is
  started only while the first is busy). A broken server is started again at its next
  launch, and the children of the old one are then reaped by init, their exit codes unknown
  (as after a restart of the agent).
"""

from __future__ import annotations

import asyncio
import logging
import marshal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from pykubelet.runtime.process.launcher import MAX_TREES
from pykubelet.runtime.process.spawnserver import SpawnServers, server_process

T = TypeVar("T")

log = logging.getLogger(__name__)

# How a launcher runs, and the server: this interpreter, isolated (-I), without site-packages
# (-S): launcher.py and launchserver_main.py import the standard library alone.
LAUNCHER_ARGV = (sys.executable, "-I", "-S", str(Path(__file__).with_name("launcher.py")))
SERVER_ARGV = (sys.executable, "-I", "-S", str(Path(__file__).with_name("launchserver_main.py")))
ANSWER_TIMEOUT = 30.0  # a fork, or a waitpid without waiting: seconds only if the machine stalls
# Servers forking at once. A launch is a round trip that waits for a fork and for the child's
# setsid (0.9 ms in the server, 1.6 ms in the agent's thread, p50, in a 1,000-pod burst), and
# its thread then waits for the interpreter lock after each blocking call (4 ms p50 from the
# request to the answer while the loop is busy): one server at a time had them back to back,
# 2.2 s of a 3.2 s burst. Five overlap them: 1,000 API pods all running 3.52 -> 3.25 s against
# three (4 alternating runs), the launch's thread no longer the queue.
LAUNCH_SERVERS = 5


class ServerUnavailable(Exception):
    """The launch server could not be started or did not answer."""


class LaunchServer:
    """Up to `servers` launch servers, each forking one launcher at a time; a launch takes the
    first idle one, and a server is started only when every one before it is busy (a node that
    starts its containers one by one keeps a single server)."""

    def __init__(
        self,
        env: dict[str, str],
        servers: int = LAUNCH_SERVERS,
        pods_dir: str | None = None,
        spawns: SpawnServers | None = None,
    ) -> None:
        """`pods_dir`: where the pods' volumes are mounted, which the servers' own mount
        namespace leaves out (launcher.py). `spawns`: the spawn servers (of plain containers and
        of those with mounts alone), whose children `owns` and `reap_child` answer for too
        (spawnserver.py); their owner starts and stops them."""
        self._servers = [_Server(env, pods_dir) for _ in range(max(1, servers))]
        self._thread: ThreadPoolExecutor | None = None
        self._spawns = spawns

    def owns(self, pid: int) -> bool:
        spawned = self._spawns is not None and self._spawns.owns(pid)
        return spawned or any(server.owns(pid) for server in self._servers)

    async def reap_child(self, pid: int) -> int | None:
        """The wait status of any server's child `pid`, which has exited; None if unknown."""
        if self._spawns is not None and self._spawns.owns(pid):
            return await self._spawns.reap(pid)
        return await self.call(self.reap, pid)

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`fn(*args)` in one of the servers' own threads (which also start them, so that their
        PR_SET_PDEATHSIG follows a thread that lives as long as this object is open)."""
        if self._thread is None:
            threads = len(self._servers)
            self._thread = ThreadPoolExecutor(threads, thread_name_prefix="launch-server")
        return asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def launch(
        self, config_fd: int, stdin_fd: int, out_fd: int, error_fd: int, trees: list[int]
    ) -> int:
        """Fork a launcher reading `config_fd`, given the mount `trees`; its pid. The fds stay
        the caller's to close."""
        if len(trees) > MAX_TREES:
            raise ServerUnavailable(f"{len(trees)} mounts: more fds than one message carries")
        server = self._idle()
        try:
            return server.launch([config_fd, stdin_fd, out_fd, error_fd, *trees])
        finally:
            server.release()

    def reap(self, pid: int) -> int | None:
        """The wait status of a server's child `pid`, which has exited; None if unknown."""
        for server in self._servers:
            if server.owns(pid):
                server.acquire()
                try:
                    return server.reap(pid)
                finally:
                    server.release()
        return None  # the server that forked it is gone, and its status with it

    def close(self) -> None:
        for server in self._servers:
            server.acquire()
            try:
                server.stop()
            finally:
                server.release()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=True)

    def _idle(self) -> _Server:
        """The first server not in use, locked; else the first, once it is free."""
        for server in self._servers:
            if server.acquire(blocking=False):
                return server
        server = self._servers[0]
        server.acquire()
        return server


class _Server:
    """One launch server process and its socket; every other method is called between
    `acquire` and `release`, one request at a time (`owns` at any time)."""

    def __init__(self, env: dict[str, str], pods_dir: str | None) -> None:
        self._env = env
        self._pods_dir = pods_dir
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._children: set[int] = set()
        self._warned = False  # that it cannot run, said once

    def acquire(self, blocking: bool = True) -> bool:
        return self._lock.acquire(blocking)

    def release(self) -> None:
        self._lock.release()

    def owns(self, pid: int) -> bool:
        return pid in self._children

    def launch(self, fds: list[int]) -> int:
        server = self._started()
        answer = self._ask(server, ("launch",), fds)
        if answer[0] != "launched":
            raise ServerUnavailable(f"the launch server refused: {answer[1]}")
        pid = int(answer[1])
        self._children.add(pid)
        return pid

    def reap(self, pid: int) -> int | None:
        self._children.discard(pid)
        if self._socket is None:
            return None  # the server that forked it is gone, and its status with it
        try:
            answer = self._ask(self._socket, ("reap", pid), [])
        except ServerUnavailable as e:
            log.warning("cannot learn the exit status of process %d: %s", pid, e)
            return None
        if answer[0] != "reaped":
            log.warning("cannot learn the exit status of process %d: %s", pid, answer[1])
            return None
        return None if answer[1] is None else int(answer[1])

    def _started(self) -> socket.socket:
        if self._socket is not None and self._proc is not None and self._proc.poll() is None:
            return self._socket
        self.stop()
        try:
            pods_dir = [self._pods_dir] if self._pods_dir else []
            self._proc, ours = server_process(SERVER_ARGV, self._env, *pods_dir)
        except OSError as e:
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot start the launch server (%s): containers get a launcher each", e
                )
            raise ServerUnavailable(f"cannot start the launch server: {e}") from e
        ours.settimeout(ANSWER_TIMEOUT)
        self._socket = ours
        log.debug("launch server started (pid %d)", self._proc.pid)
        return ours

    def _ask(self, server: socket.socket, request: tuple[Any, ...], fds: list[int]) -> Any:
        try:
            socket.send_fds(server, [marshal.dumps(request)], fds)
            answer = server.recv(4096)
            if not answer:
                raise OSError("the launch server closed its socket")
            return marshal.loads(answer)
        except (OSError, ValueError, EOFError) as e:
            log.warning("the launch server failed (%s); it starts again at the next launch", e)
            self.stop()
            raise ServerUnavailable(f"the launch server did not answer: {e}") from e

    def stop(self) -> None:
        """Its children run on; init reaps them once the server is gone."""
        if self._socket is not None:
            self._socket.close()  # the server reads EOF and exits
            self._socket = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        self._children.clear()
