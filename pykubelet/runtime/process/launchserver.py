"""The agent's side of the launch server: one long-lived `launcher.py --server` that forks a
launcher per container, instead of a Python start per container (29 -> 4 ms of CPU each here).

What this module promises:

- `LaunchServer.launch` hands the server a container's instructions and stdio and returns the
  pid of the forked launcher, which then behaves as one started by `spawn` (its own session,
  the error pipe's EOF once it exec'd); it raises `ServerUnavailable` when the server cannot
  be started or does not answer, and the caller starts a launcher of its own instead;
- the server's children are not the agent's: `owns` tells them apart, and `reap` gets the
  wait status of one that exited (seen through its pidfd) from the server, which waits for it
  only then, so that its zombie keeps the pid while the agent kills its process group;
- the calls block (a round trip over a local socket, at most a fork long): call them in the
  server's own thread (`call`), never in the loop's default pool, whose threads a burst of
  launches waiting for the server one by one would all hold (the state files' batches and
  every other thread hop of the agent waited behind them: 2.6 s between a container's start
  and its status at 1,000 API pods). One request at a time; a broken server is started again
  at the next launch, and the children of the old one are then reaped by init, their exit
  codes unknown (as after a restart of the agent).
"""

from __future__ import annotations

import asyncio
import logging
import marshal
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

# How a launcher runs, the server or one of its own: this interpreter, isolated (-I), without
# site-packages (-S): launcher.py imports the standard library alone.
LAUNCHER_ARGV = (sys.executable, "-I", "-S", str(Path(__file__).with_name("launcher.py")))
ANSWER_TIMEOUT = 30.0  # a fork, or a waitpid without waiting: seconds only if the machine stalls


class ServerUnavailable(Exception):
    """The launch server could not be started or did not answer."""


class LaunchServer:
    def __init__(self, env: dict[str, str]) -> None:
        self._env = env
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._children: set[int] = set()
        self._warned = False  # that it cannot run, said once
        self._thread: ThreadPoolExecutor | None = None

    def owns(self, pid: int) -> bool:
        return pid in self._children

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`fn(*args)` in the server's own thread (which also starts the server, so that its
        PR_SET_PDEATHSIG follows a thread that lives as long as this object is open)."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="launch-server")
        return asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def launch(self, config_fd: int, stdin_fd: int, out_fd: int, error_fd: int) -> int:
        """Fork a launcher reading `config_fd`; its pid. The fds stay the caller's to close."""
        with self._lock:
            server = self._started()
            answer = self._ask(server, ("launch",), [config_fd, stdin_fd, out_fd, error_fd])
            if answer[0] != "launched":
                raise ServerUnavailable(f"the launch server refused: {answer[1]}")
            pid = int(answer[1])
            self._children.add(pid)
            return pid

    def reap(self, pid: int) -> int | None:
        """The wait status of the server's child `pid`, which has exited; None if unknown."""
        with self._lock:
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

    def close(self) -> None:
        with self._lock:
            self._stop()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=True)

    # --- holding the lock -------------------------------------------------------------------

    def _started(self) -> socket.socket:
        if self._socket is not None and self._proc is not None and self._proc.poll() is None:
            return self._socket
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [*LAUNCHER_ARGV, "--server", str(theirs.fileno()), str(os.getpid())],
                # 0 and 1 open, so that no fd it receives takes their place; its stderr is
                # the agent's, for a traceback should it ever crash.
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                cwd="/",
                env=self._env,
                close_fds=True,
                pass_fds=(theirs.fileno(),),
            )
        except OSError as e:
            ours.close()
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot start the launch server (%s): containers get a launcher each", e
                )
            raise ServerUnavailable(f"cannot start the launch server: {e}") from e
        finally:
            theirs.close()
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
            self._stop()
            raise ServerUnavailable(f"the launch server did not answer: {e}") from e

    def _stop(self) -> None:
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
