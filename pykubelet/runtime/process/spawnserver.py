"""Plain containers (no launcher, stdin or terminal), and those that ask for their mounts alone
(a pod's volumes), started by servers of their own, asked from the event loop itself: the
agent's side of launchserver_main.py's "spawn" and "spawn-in-namespace" requests.

Started in a thread of the agent's, a plain container cost a thread hop (a pool thread woken,
the interpreter lock taken back after each of its system calls, the loop woken again), and its
start marker, log directory and log file were new inodes made by the agent's own process: in a
burst the pool's threads and the loop took the lock in turn, and a start waited 25 ms for its
thread at the median (bench/HISTORY.md, session 25). Here a start is one message written from
the loop and one answer read there; the servers, processes of their own, do the files and the
spawn on the machine's other core.

What this module promises:

- `SpawnServers.spawn` returns the pid of the container's process, started as starts.py's
  plain route starts one in a thread (the marker, the log's directory and file, the spawn in
  its own session with stdin /dev/null and its output appended to the log), or raises
  `SpawnFailed` saying at which step and why (which the caller words as that route does),
  `ServerUnavailable` when no server answered and nothing of the container runs, and
  `RequestTooLarge` for a request no message carries; in those two cases the caller starts
  the container itself. `SpawnServers.launch` does the same for a container that asks for
  its mounts alone (launcher.spawnable), started as a launch server starts one: in a mount
  namespace of its own without the other pods' volumes, its own cloned by the server from
  the agent's namespace (bound by their path in a copy of the agent's, where the server has
  no launch namespace: no open_tree, or no pods directory's mount); or raises `LaunchFailed`
  with the launcher's report. A server given up with the request in flight (it died, its
  answer could not be read, or none came within ANSWER_TIMEOUT) has its socket closed, is
  waited for, and what it may have started killed by the container's tag
  (processes.kill_tagged) before the ServerUnavailable; a failed server is not asked again
  for RETRY_SECONDS. It is not killed at once: killed in a posix_spawn, it would leave a
  child between its clone and its exec, whose environment (the server's until the exec)
  has no tag yet. Its socket closed, it ends the request it is in (or the next one, already
  in its socket; a posix_spawn returns once the child has exec'd) and exits as it sends the
  answer; one still running after GIVE_UP_GRACE seconds (stuck in the kernel) is killed;
- requests are sent as they come, never waiting for the previous answer (each server answers
  in order), to the first server with none in flight, else the one with the fewest; there
  are SPAWN_SERVERS servers, started by `start_all` before the first start (or by the first
  request that finds one not running);
- the servers' children are not the agent's: `owns` tells them apart and `reap` gets the wait
  status of one that exited from its server, which waits for it only then (its zombie keeps
  the pid meanwhile, as the agent's own children's do); `kill` has one that must not go on
  killed and reaped (by its tag if its server is gone). A server's children outlive it: once
  it is gone their exit codes are unknown, as after the agent's restart;
- `detach` (on the loop) gives the servers up as the agent stops; `close` (in a thread) then
  waits for them. The containers run on, reaped by init.

A server is started from a thread of this object's own, which lives until `close`: the server's
PR_SET_PDEATHSIG follows the thread that started it, not the agent's process.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import marshal
import os
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pykubelet.runtime.process.processes import kill_tagged, readable, settle

# launchserver_main.py's flag for a server that stays in the agent's mount namespace (that
# module imports the standard library alone, loaded by path, and is not imported here).
IN_AGENT_NAMESPACE = "--in-agent-namespace"

log = logging.getLogger(__name__)

# Two: each answers in order, about a spawn's time apiece (0.7-1 ms here), and the machine has
# two cores; three measured no better (bench/HISTORY.md, session 26).
SPAWN_SERVERS = 2
# The longest request: launchserver_main.REQUEST_BYTES, which reads no more of one.
REQUEST_BYTES = 65536


# After a server could not be started or failed, the starts go without it for this long.
RETRY_SECONDS = 60.0
# An answer is a spawn's time (under a millisecond here): a server that gives none for this
# long is stuck (an exec, or a volume's mount, on a dead network file system, say) and is
# given up.
ANSWER_TIMEOUT = 30.0


STOPPING = "the agent stops"
# How long a server given up has to end the request it is in before it is killed.
GIVE_UP_GRACE = 5.0


class ServerUnavailable(Exception):
    """No spawn server answered, and the request did nothing: the caller starts the container
    itself."""


class ServerLost(ServerUnavailable):
    """The server died, or was given up, with the request in flight: it may have started the
    container, which the caller must kill (by its tag) before starting it again."""


class SpawnFailed(Exception):
    """The server could not start the container: `stage` says where (launchserver_main.py's
    "marker", "cwd", "log", "exec" or "value"), `error` the OSError, or the reason."""

    def __init__(self, stage: str, error: OSError | str) -> None:
        super().__init__(stage, error)
        self.stage = stage
        self.error = error


class LaunchFailed(Exception):
    """The server could not start a container in a namespace of its own: `report` is the
    launcher's report of why (launcher.py's `report_of`: stage, errno, message)."""

    def __init__(self, report: Any) -> None:
        super().__init__(report)
        self.report = report


class RequestTooLarge(Exception):
    """The container's command and environment do not fit in one request."""


class SpawnServers:
    """Up to `servers` spawn servers (launchserver_main.py processes), asked from the loop."""

    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        servers: int = SPAWN_SERVERS,
        pods_dir: str | None = None,
    ) -> None:
        """`argv`: how a server is started (launchserver.SERVER_ARGV), given its socket's fd
        and the agent's pid after it; `env`: its environment; `pods_dir`: where the pods'
        volumes are mounted, which the namespaces of the containers it starts with mounts of
        their own (`launch`) leave out."""
        args = (*([pods_dir] if pods_dir else []), IN_AGENT_NAMESPACE)
        self._servers = [_Server(argv, env, args) for _ in range(max(1, servers))]
        self._thread: ThreadPoolExecutor | None = None
        self._prestarts: set[asyncio.Future[None]] = set()

    def owns(self, pid: int) -> bool:
        return any(pid in server.children for server in self._servers)

    def start_all(self) -> None:
        """Every server started now, in the background (on the loop): a burst's first starts
        then do not wait for a server's Python to start (tens of ms in a burst here). One that
        cannot start says so once, and the starts go without it."""
        for server in self._servers:
            server.reopen()
            task = asyncio.ensure_future(server.started(self._start))
            self._prestarts.add(task)
            task.add_done_callback(self._prestarted)

    def _prestarted(self, task: asyncio.Future[None]) -> None:
        self._prestarts.discard(task)
        if not task.cancelled():
            task.exception()  # ServerUnavailable: said by `started`, and left to the starts

    async def spawn(
        self,
        container_id: str,
        marker: str,
        sandbox_record: str,
        log_path: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
    ) -> int:
        """The container's pid (above); its pidfd is the caller's to open. `container_id`:
        the tag in its environment (processes.ID_VARIABLE), by which it is killed if its
        server is lost with the request in flight. A caller cancelled meanwhile waits for the
        answer, and what was started is killed and reaped first."""
        request = ("spawn", marker, sandbox_record, log_path, argv, env, cwd)
        return await self._started(request, container_id)

    async def launch(
        self,
        container_id: str,
        marker: str,
        sandbox_record: str,
        log_path: str,
        instructions: dict[str, Any],
    ) -> int:
        """As `spawn`, for a container that asks for its mounts alone (launcher.spawnable):
        started by the server in a mount namespace of its own made from the launcher's
        `instructions`, as a launch server starts one. SpawnFailed says why its marker or log
        file could not be made, LaunchFailed why it could not be started."""
        request = ("spawn-in-namespace", marker, sandbox_record, log_path, instructions)
        return await self._started(request, container_id)

    async def _started(self, fields: tuple[Any, ...], container_id: str) -> int:
        request = marshal.dumps(fields)
        if len(request) > REQUEST_BYTES:
            raise RequestTooLarge(f"{len(request)} bytes")
        server = self._least_busy()
        await server.started(self._start)
        sent, proc = server.send(request)
        try:
            answer = await asyncio.shield(sent)
        except asyncio.CancelledError:
            await settle(sent)
            await settle(asyncio.ensure_future(self._undo(server, sent, proc, container_id)))
            raise
        except ServerLost as e:
            # Whatever it may have started is killed before the caller starts it again.
            await settle(asyncio.ensure_future(self._undo(server, sent, proc, container_id)))
            raise ServerUnavailable(str(e)) from e
        if answer[0] == "spawned":
            pid = int(answer[1])
            server.children.add(pid)
            return pid
        if answer[0] != "failed":
            raise ServerUnavailable(f"the spawn server refused: {answer[1]!r:.200}")
        if answer[1] == "launch":
            raise LaunchFailed(answer[2])
        _, stage, number, reason, filename = answer
        raise SpawnFailed(stage, OSError(number, reason, filename) if number else reason)

    async def reap(self, pid: int) -> int | None:
        """The wait status of a server's child `pid`, which has exited; None if unknown."""
        server = self._owner(pid)
        if server is None:
            return None  # the server that started it is gone, and its status with it
        server.children.discard(pid)
        answer = await self._ask(server, ("reap", pid))
        return None if answer is None or answer[1] is None else int(answer[1])

    async def kill(self, pid: int, container_id: str) -> None:
        """A server's child `pid` (container `container_id`) that must not go on: its group
        killed and it reaped; by its tag if its server is gone."""
        server = self._owner(pid)
        if server is None or await self._ask(server, ("kill", pid)) is None:
            await asyncio.to_thread(kill_tagged, container_id)
            return
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = None  # not expected: its server keeps its zombie until asked to reap
        if pidfd is not None:
            try:
                await readable(pidfd)
            finally:
                os.close(pidfd)
        await self.reap(pid)

    async def _undo(
        self,
        server: _Server,
        sent: asyncio.Future[Any],
        proc: subprocess.Popen[bytes] | None,
        container_id: str,
    ) -> None:
        """The container asked for by `sent` (answered, or lost) not left running."""
        error = None if sent.cancelled() else sent.exception()
        if error is None and not sent.cancelled():
            answer = sent.result()
            if answer[0] == "spawned":
                pid = int(answer[1])
                server.children.add(pid)
                await self.kill(pid, container_id)
            return
        if isinstance(error, ServerLost):
            # Killed when it was given up: once it has exited it starts nothing more, and
            # what it started has its tag in its environment.
            if proc is not None:
                await asyncio.to_thread(_waited, proc)
            await asyncio.to_thread(kill_tagged, container_id)

    async def _ask(self, server: _Server, request: tuple[Any, ...]) -> Any:
        """The server's answer to a "reap" or "kill" of one of its children; None if it gave
        none (said in the log)."""
        try:
            answer = await asyncio.shield(server.send(marshal.dumps(request))[0])
        except ServerUnavailable as e:
            answer = e
        if isinstance(answer, tuple) and answer and answer[0] in ("reaped", "killed"):
            return answer
        log.warning("cannot %s process %d: %s", request[0], request[1], answer)
        return None

    def _owner(self, pid: int) -> _Server | None:
        return next((server for server in self._servers if pid in server.children), None)

    def detach(self) -> None:
        """The servers given up as the agent stops (on the loop): killed, so that they start
        nothing more, and what is in flight fails (`_Server.detach`)."""
        for server in self._servers:
            server.detach(STOPPING)

    def close(self) -> None:
        """Let the servers go and wait for them (blocks: call it in a thread, after `detach`).
        A server still starting is let finish first, and then waited for too."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=True)
        for server in self._servers:
            server.stop()

    def _least_busy(self) -> _Server:
        """The first server with nothing in flight, else the one with the least."""
        for server in self._servers:
            if not server.in_flight:
                return server
        return min(self._servers, key=lambda server: server.in_flight)

    async def _start(self, server: _Server) -> None:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(len(self._servers), thread_name_prefix="spawn-server")
        loop = asyncio.get_running_loop()
        sock = await loop.run_in_executor(self._thread, server.start_process)
        server.attach(sock, loop)


def server_process(
    argv: Sequence[str], env: dict[str, str], *args: str
) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """A launchserver_main.py process started (blocks) as `argv` SOCKET_FD AGENT_PID `args`,
    and the agent's end of its socket. Raises the OSError of its start."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        proc = subprocess.Popen(
            [*argv, str(theirs.fileno()), str(os.getpid()), *args],
            # 0 and 1 open, so that no fd it receives or opens takes their place; its stderr
            # is the agent's, for a traceback should it ever crash.
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            cwd="/",
            env=env,
            close_fds=True,
            pass_fds=(theirs.fileno(),),
        )
    except OSError:
        ours.close()
        raise
    finally:
        theirs.close()
    return proc, ours


def _waited(proc: subprocess.Popen[bytes]) -> None:
    """A server given up (its socket closed) waited for until it exits, killed if it is still
    running after GIVE_UP_GRACE seconds (blocks)."""
    try:
        proc.wait(timeout=GIVE_UP_GRACE)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=GIVE_UP_GRACE)


class _Server:
    """One server process and its socket, read by the loop; its answers come in order."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], args: Sequence[str]) -> None:
        self._argv = argv
        self._env = env
        self._args = args
        self._proc: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Future[None] | None = None
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._unsent: collections.deque[bytes] = collections.deque()
        self._warned = False  # that it cannot run, said once
        self._failed_at: float | None = None  # when it last could not be started
        self._stopped = False  # detached as the agent stops: never read again
        self.children: set[int] = set()

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    async def started(self, start: Callable[[_Server], Awaitable[None]]) -> None:
        """Running and read by the loop, started by `start` if it is not (one start for all
        the requests that find it so)."""
        if self._socket is not None:
            return
        if self._stopped:
            raise ServerUnavailable(STOPPING)
        if self._failed_at is not None and time.monotonic() - self._failed_at < RETRY_SECONDS:
            raise ServerUnavailable("the spawn server failed a moment ago")
        if self._starting is None:
            self._starting = asyncio.ensure_future(start(self))
        starting = self._starting
        try:
            await asyncio.shield(starting)
        except OSError as e:
            self._failed_at = time.monotonic()
            if not self._warned:
                self._warned = True
                log.warning("cannot start a spawn server (%s): the agent spawns its containers", e)
            raise ServerUnavailable(f"cannot start the spawn server: {e}") from e
        finally:
            if self._starting is starting and starting.done():
                self._starting = None
        if self._socket is None:
            raise ServerUnavailable("the spawn server stopped as it started")

    def send(self, request: bytes) -> tuple[asyncio.Future[Any], subprocess.Popen[bytes] | None]:
        """The future of the server's answer to `request`, and the process asked. The future
        fails with ServerUnavailable if the server is not running or the request could not be
        sent, with ServerLost if the server was given up after it was sent (it died, its
        answer could not be read, or none came within ANSWER_TIMEOUT: it is then killed)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        # Retrieved even when its asker was cancelled meanwhile: no "never retrieved" noise.
        answer.add_done_callback(lambda f: f.cancelled() or f.exception())
        if self._socket is None:
            answer.set_exception(ServerUnavailable("the spawn server is gone"))
            return answer, None
        self._waiting.append(answer)
        late = loop.call_later(ANSWER_TIMEOUT, self._overdue, answer)
        answer.add_done_callback(lambda _: late.cancel())
        self._write(request)
        return answer, self._proc

    def _overdue(self, answer: asyncio.Future[Any]) -> None:
        if not answer.done():
            self.detach(
                f"no answer within {ANSWER_TIMEOUT:g} s (a start stuck in an exec or a mount?)"
            )

    def reopen(self) -> None:
        """Startable again after a `detach` as the agent stopped (the runtime started again)."""
        self._stopped = False

    def start_process(self) -> socket.socket:
        """The server's process started (in the owner's thread, blocking); our socket to it."""
        self.stop()  # one that failed before: its process waited for
        self._proc, ours = server_process(self._argv, self._env, *self._args)
        ours.setblocking(False)
        log.debug("spawn server started (pid %d)", self._proc.pid)
        return ours

    def attach(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        """Its answers read by `loop` from now on (on the loop); closed at once if the agent
        stopped while it started (the server exits at the EOF)."""
        if self._stopped:
            sock.close()
            return
        self._loop = loop
        self._socket = sock
        loop.add_reader(sock.fileno(), self._readable)

    def _write(self, request: bytes) -> None:
        assert self._socket is not None and self._loop is not None
        if not self._unsent:
            try:
                self._socket.send(request)
                return
            except BlockingIOError:
                self._loop.add_writer(self._socket.fileno(), self._writable)
            except OSError as e:
                self.detach(f"cannot write to it: {e}")
                return
        self._unsent.append(request)

    def _writable(self) -> None:
        assert self._socket is not None and self._loop is not None
        while self._unsent:
            try:
                self._socket.send(self._unsent[0])
            except BlockingIOError:
                return
            except OSError as e:
                self.detach(f"cannot write to it: {e}")
                return
            self._unsent.popleft()
        self._loop.remove_writer(self._socket.fileno())

    def _readable(self) -> None:
        while self._socket is not None:
            try:
                data = self._socket.recv(REQUEST_BYTES)  # an answer is shorter (ANSWER_TEXT)
            except BlockingIOError:
                return
            except OSError as e:
                self.detach(f"cannot read from it: {e}")
                return
            if not data or not self._waiting:
                self.detach("it closed its socket" if not data else "it answered unasked")
                return
            try:
                result = marshal.loads(data)
            except (ValueError, EOFError) as e:
                # What it did is unknown, and so is what the next answers answer.
                self.detach(f"an answer that cannot be read: {e}")
                return
            answer = self._waiting.popleft()
            if not answer.done():
                answer.set_result(result)

    def detach(self, why: str) -> None:
        """The server given up: its socket closed, so that it starts nothing more of what it
        was sent than the request it is in or the next one (it exits as it sends that answer:
        the callers wait for it, `_waited` or `stop`); the requests it was sent fail with
        ServerLost, those still unsent with ServerUnavailable. Its children are init's once
        it is gone. After a failure the starts go without it for RETRY_SECONDS."""
        self._stopped = self._stopped or why == STOPPING
        sock, self._socket = self._socket, None
        if sock is not None:
            assert self._loop is not None
            self._loop.remove_reader(sock.fileno())
            if self._unsent:
                self._loop.remove_writer(sock.fileno())
            sock.close()
            if not self._stopped:
                self._failed_at = time.monotonic()
                log.warning(
                    "the spawn server failed (%s); the agent spawns its containers for %g s",
                    why,
                    RETRY_SECONDS,
                )
        unsent = len(self._unsent)
        self._unsent.clear()
        waiting, self._waiting = list(self._waiting), collections.deque()
        for i, answer in enumerate(waiting):
            if answer.done():
                continue
            if i >= len(waiting) - unsent:
                answer.set_exception(ServerUnavailable(f"the spawn server failed: {why}"))
            else:
                answer.set_exception(ServerLost(f"the spawn server failed: {why}"))
        self.children.clear()

    def stop(self) -> None:
        """Wait for the process (blocks), once `detach` closed its socket."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _waited(proc)
