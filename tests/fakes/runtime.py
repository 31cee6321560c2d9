"""An in-memory `Runtime`, as the kubelet's `fake_runtime_service.go`: sandboxes, containers with
their attempts, states, exit codes and reasons, logs and exec, all in memory, with no process,
engine or file behind them; plus what a test needs to drive it.

It keeps the promises of `pykubelet/runtime/base.py` as the real backends keep them:
- `start_container` returns a running container (or a created one, if told to stay created) and
  tells the listeners; an exit tells them too. A container that is told to exit right away
  does so on the next turn of the loop, as a process that crashes at once would.
- `stop_container` returns once the container has exited: 143 (SIGTERM) at once, or, for one
  that ignores SIGTERM, 137 (SIGKILL) after the grace period unless it exits before.
- `remove_container` refuses a running container (`RuntimeFailure`); `remove_pod` kills what
  still runs (137) and forgets the pod, its sandbox, containers and logs.
- A start against a missing or not-ready sandbox is a `RuntimeFailure`; an image is pulled as
  `imagePullPolicy` says (`ensure_image`), a pull that fails is `StartError("ErrImagePull")`;
  a name and attempt already in use is `StartError("CreateContainerError")`, as with the CRI.
- `exec_sync` on a container that is not running is a `RuntimeFailure`; else its result is the
  programmed one (exit 0, no output, by default), cut at `MAX_EXEC_OUTPUT`.
- `exec_stream` on a container that is not running is a `RuntimeFailure`; else a
  `FakeExecStream` driven by the programmed script (`set_exec_stream`), or, without one, by
  `exec_sync`'s programmed answer (its output on stdout, then its exit code). Its output is
  bounded as a pipe's: a command writes at most `FakeExecStream.PENDING` chunks ahead of its
  reader, then waits; input written after its end or its EOF is dropped; it dies (exit code
  None) when closed or when its container exits.
- `attach` to a container that is not running is a `RuntimeFailure`; else a `FakeExecStream`
  (command `[]`) driven by the programmed script (`set_attach`), or, without one, one that
  writes nothing until its container exits; `attaches` lists them. Closing it detaches (the
  container runs on); it ends when its container exits.
- `port_forward` into a pod without a ready sandbox is a `RuntimeFailure`; to a port nothing
  serves (`serve_port`) too, in the words of a refused dial; else a real socket pair, the
  other end handed to the port's handler (a task), so reads and writes block as a TCP
  connection's do.
- `read_log` / `follow_log` read what was written with `write_log` or a `Behaviour`'s `output`,
  with `tail_lines` and `limit_bytes` as `runtime/logfiles.py` applies them.

Test controls: `behave()` (how containers of a name behave when started), `exit_container()`,
`oom_kill()`, `kill_sandbox()`, `write_log()`, `fail()` / `heal()` (make operations raise),
`hang()` / `release()` (make them wait), `set_exec()`, `set_exec_stream()`, `set_attach()`,
`serve_port()`; and
what happened:
`calls` (every call, in order), `ops()`, `containers()`, `latest()`, `config_of()`,
`exec_streams` and `attaches` (each stream, with what it was sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import socket
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from pykubelet.api.model import Pod
from pykubelet.runtime import logfiles
from pykubelet.runtime.base import (
    MAX_EXEC_OUTPUT,
    NO_LOG_TIMES,
    ChangeListener,
    ContainerConfig,
    ContainerRunState,
    ContainerStorage,
    ExecResult,
    LogRotationPolicy,
    LogTimes,
    PullCredentials,
    Runtime,
    RuntimeContainer,
    RuntimeFailure,
    RuntimeImage,
    RuntimePod,
    RuntimeSandbox,
    RuntimeVersion,
    SandboxConfig,
    StartError,
    ensure_image,
)
from tests.fakes.exec_stream import ExecScript, FakeExecStream

log = logging.getLogger(__name__)

SIGTERM_EXIT = 143
SIGKILL_EXIT = 137

# Every operation of the Runtime protocol (what `fail()` accepts), and the fake's image pull.
OPERATIONS = frozenset(
    {
        "start",
        "close",
        "list_pods",
        "get_pod",
        "run_sandbox",
        "start_container",
        "stop_container",
        "remove_container",
        "remove_pod",
        "read_log",
        "follow_log",
        "exec_sync",
        "exec_stream",
        "attach",
        "port_forward",
        "pull_image",
    }
)

ExecHandler = Callable[
    [RuntimeContainer, list[str], list[tuple[str, str]]], ExecResult | Awaitable[ExecResult]
]
# What listens on a port of a pod: called with each connection made to it.
PortHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
# The command of an exec stream: writes with `emit`, reads with `read_stdin`, ends with `exit`
# (returning without it is exit 0).


def _now() -> datetime:
    return datetime.now(UTC)


def _reason(code: int) -> str:
    return "Completed" if code == 0 else "Error"


def tail(data: bytes, lines: int | None) -> bytes:
    """The last `lines` lines of `data` (a final newline ends a line, it starts none)."""
    if lines is None:
        return data
    if lines <= 0:
        return b""
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(lines):
        end = data.rfind(b"\n", 0, end)
        if end < 0:
            return data
    return data[end + 1 :]


@dataclass(frozen=True)
class Behaviour:
    """How a started container behaves (set per container name with `FakeRuntime.behave`)."""

    exit_code: int | None = None  # exit with this code right after the start
    output: bytes = b""  # written to its log when it starts
    term_exit_code: int = SIGTERM_EXIT  # its exit code when stopped (SIGTERM)
    ignores_term: bool = False  # runs on until SIGKILL at the end of the grace period
    stays_created: bool = False  # created, never running (a start that hangs in the runtime)
    start_delay: float = 0.0  # seconds start_container takes (a slow create)


@dataclass(frozen=True)
class Call:
    """One call the fake received."""

    op: str
    pod_uid: str = ""
    container: str = ""  # the container's name in its pod
    detail: str = ""  # attempt=1, grace=30, the exec command, the image pulled ...


@dataclass
class _Failure:
    op: str
    error: Exception
    times: int | None  # None: until healed
    pod_uid: str | None
    container: str | None


@dataclass
class _Container:
    id: str
    pod_uid: str
    pod_name: str
    pod_namespace: str
    name: str
    attempt: int
    spec_hash: str
    image: str
    behaviour: Behaviour
    config: ContainerConfig
    state: ContainerRunState
    created_at: datetime
    started_at: datetime | None
    pid: int
    finished_at: datetime | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    log: bytearray = field(default_factory=bytearray)
    last_write_ns: int = 0  # when `log` was last written to (Unix ns): a file's mtime
    removed: bool = False
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    execs: list[FakeExecStream] = field(default_factory=list)  # exec streams that may run

    @property
    def alive(self) -> bool:
        return self.state in (ContainerRunState.RUNNING, ContainerRunState.CREATED)

    def view(self) -> RuntimeContainer:
        return RuntimeContainer(
            id=self.id,
            runtime=FakeRuntime.name,
            pod_uid=self.pod_uid,
            pod_name=self.pod_name,
            pod_namespace=self.pod_namespace,
            name=self.name,
            attempt=self.attempt,
            spec_hash=self.spec_hash,
            image=self.image,
            state=self.state,
            created_at=self.created_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            exit_code=self.exit_code,
            reason=self.reason,
            message=self.message,
            pid=self.pid,
        )

    def wake(self) -> None:
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.waiters.clear()

    async def changed(self) -> None:
        """Until its log or its state changes."""
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        await waiter


@dataclass
class _Pod:
    uid: str
    name: str
    namespace: str
    sandbox: RuntimeSandbox | None = None
    containers: dict[str, _Container] = field(default_factory=dict)  # by id


class FakeRuntime:
    """An in-memory container runtime; see the module's documentation."""

    name: str = "fake"

    def __init__(self, *, images: set[str] | None = None, started: bool = False) -> None:
        # None: every image is present; else the images present (pulls add to it).
        self.present_images = images
        self.pull_errors: dict[str, str] = {}  # image -> why its pull fails
        self.started = started
        self.calls: list[Call] = []
        self._pods: dict[str, _Pod] = {}
        self.storage: dict[str, ContainerStorage] = {}  # what container_storage() answers
        # The SandboxConfig of the latest run_sandbox of each pod (uid).
        self.sandbox_configs: dict[str, SandboxConfig | None] = {}
        self._listeners: list[ChangeListener] = []
        self._behaviours: dict[str, Behaviour] = {}
        self._failures: list[_Failure] = []
        self._hangs: dict[str, asyncio.Event] = {}
        self._exec: dict[str | None, ExecResult | ExecHandler | Exception] = {}
        self._exec_scripts: dict[str | None, ExecScript] = {}
        self.exec_streams: list[FakeExecStream] = []
        self._attach_scripts: dict[str | None, ExecScript] = {}
        self.attaches: list[FakeExecStream] = []
        self._ports: dict[tuple[str | None, int], PortHandler] = {}
        self._port_tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._pids = itertools.count(1000)
        self._ips = itertools.count(2)

    # --- test controls ------------------------------------------------------------------------

    def behave(self, name: str, behaviour: Behaviour | None = None, **fields: object) -> None:
        """How containers named `name` (in any pod) behave from their next start on."""
        base = behaviour or self._behaviours.get(name, Behaviour())
        self._behaviours[name] = replace(base, **fields)  # type: ignore[arg-type]

    def fail(
        self,
        op: str,
        error: Exception | None = None,
        *,
        times: int | None = 1,
        pod_uid: str | None = None,
        container: str | None = None,
    ) -> None:
        """The next `times` calls of `op` (None: every call until `heal`), for that pod or
        container name only if given, raise `error` (default: a RuntimeFailure)."""
        if op not in OPERATIONS:
            raise ValueError(f"unknown operation {op!r}: one of {sorted(OPERATIONS)}")
        if error is None:
            error = RuntimeFailure(f"{op}: injected failure")
        self._failures.append(_Failure(op, error, times, pod_uid, container))

    def heal(self, op: str | None = None) -> None:
        """Forget the injected failures (of `op`, or all)."""
        self._failures = [f for f in self._failures if op is not None and f.op != op]

    def hang(self, op: str) -> None:
        """Calls of `op` from now on wait (a runtime that stopped answering) until `release`."""
        if op not in OPERATIONS:
            raise ValueError(f"unknown operation {op!r}: one of {sorted(OPERATIONS)}")
        self._hangs.setdefault(op, asyncio.Event())

    def release(self, op: str) -> None:
        """The calls of `op` that hang go on; new ones do not wait."""
        gate = self._hangs.pop(op, None)
        if gate is not None:
            gate.set()

    def set_exec(
        self, result: ExecResult | ExecHandler | Exception, *, container: str | None = None
    ) -> None:
        """What `exec_sync` answers (for containers of that name, or all): a result, a
        function `(container, command, env) -> ExecResult` (may be async), or an exception."""
        self._exec[container] = result

    def set_exec_stream(self, script: ExecScript, *, container: str | None = None) -> None:
        """The command `exec_stream` starts (in containers of that name, or all): an async
        function of its `FakeExecStream`, run as a task."""
        self._exec_scripts[container] = script

    def set_attach(self, script: ExecScript, *, container: str | None = None) -> None:
        """What an `attach` to containers of that name (or all) sees: an async function of its
        `FakeExecStream`, run as a task (the container's side of its stdio)."""
        self._attach_scripts[container] = script

    def serve_port(self, port: int, handler: PortHandler, *, pod_uid: str | None = None) -> None:
        """What listens on `port` (in that pod, or in every pod): `handler(reader, writer)` runs
        as a task for each connection `port_forward` makes; the writer is closed after it."""
        self._ports[(pod_uid, port)] = handler

    def exit_container(
        self,
        pod_uid: str,
        name: str,
        code: int = 0,
        *,
        reason: str | None = None,
        message: str | None = None,
    ) -> RuntimeContainer:
        """The latest attempt of container `name`, running, exits with `code` now."""
        rec = self._latest_record(pod_uid, name)
        if rec is None or not rec.alive:
            raise LookupError(f"pod {pod_uid} has no running container {name}")
        self._exit(rec, code, reason, message)
        return rec.view()

    def oom_kill(self, pod_uid: str, name: str) -> RuntimeContainer:
        """The kernel kills it for its memory limit."""
        return self.exit_container(pod_uid, name, SIGKILL_EXIT, reason="OOMKilled")

    def kill_sandbox(self, pod_uid: str) -> None:
        """The pod's sandbox dies (not ready); its containers are left as they are."""
        pod = self._pods.get(pod_uid)
        if pod is None or pod.sandbox is None:
            raise LookupError(f"pod {pod_uid} has no sandbox")
        pod.sandbox = replace(pod.sandbox, ready=False)
        self._notify(pod_uid)

    def write_log(self, pod_uid: str, name: str, data: bytes) -> None:
        """The latest attempt of container `name` writes `data` (stdout and stderr are one)."""
        rec = self._latest_record(pod_uid, name)
        if rec is None:
            raise LookupError(f"pod {pod_uid} has no container {name}")
        rec.log += data
        rec.last_write_ns = time.time_ns()
        rec.wake()

    def containers(self, pod_uid: str, name: str | None = None) -> list[RuntimeContainer]:
        """The pod's containers (of that name), oldest attempt first, as the runtime has them."""
        pod = self._pods.get(pod_uid)
        if pod is None:
            return []
        return [c.view() for c in self._ordered(pod) if name is None or c.name == name]

    def latest(self, pod_uid: str, name: str) -> RuntimeContainer | None:
        rec = self._latest_record(pod_uid, name)
        return rec.view() if rec is not None else None

    def config_of(self, container_id: str) -> ContainerConfig:
        """What the container was started with (env, mounts, limits, security fields ...)."""
        for pod in self._pods.values():
            if container_id in pod.containers:
                return pod.containers[container_id].config
        raise LookupError(f"no container {container_id}")

    def ops(self, op: str | None = None, pod_uid: str | None = None) -> list[Call]:
        """The calls of `op` (all if None), for that pod if given."""
        return [
            c
            for c in self.calls
            if (op is None or c.op == op) and (pod_uid is None or c.pod_uid == pod_uid)
        ]

    # --- the Runtime protocol -----------------------------------------------------------------

    def image_service(self) -> None:
        return None  # image GC has its own in-memory engine in its tests

    async def rotate_logs(self, policy: LogRotationPolicy) -> None:
        return None  # its logs are in memory

    async def start(self) -> None:
        await self._enter("start")
        self.started = True

    async def close(self) -> None:
        await self._enter("close")
        self.started = False  # what runs keeps running, as with the real backends

    async def version(self) -> RuntimeVersion:
        return RuntimeVersion("fake", "0")

    async def images(self) -> list[RuntimeImage]:
        return []

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    async def list_pods(self) -> list[RuntimePod]:
        await self._enter("list_pods")
        return [self._view(pod) for _, pod in sorted(self._pods.items())]

    async def container_storage(
        self, containers: list[RuntimeContainer]
    ) -> dict[str, ContainerStorage]:
        """What a test set in `storage` (container ID -> ContainerStorage)."""
        return {c.id: self.storage[c.id] for c in containers if c.id in self.storage}

    async def get_pod(self, uid: str) -> RuntimePod | None:
        await self._enter("get_pod", uid)
        pod = self._pods.get(uid)
        return self._view(pod) if pod is not None else None

    async def run_sandbox(self, pod: Pod, config: SandboxConfig | None = None) -> RuntimeSandbox:
        await self._enter("run_sandbox", pod.uid)
        self.sandbox_configs[pod.uid] = config
        state = self._pods.get(pod.uid)
        if state is not None and state.sandbox is not None and state.sandbox.ready:
            return state.sandbox
        if state is None:
            state = self._pods[pod.uid] = _Pod(pod.uid, pod.metadata.name, pod.metadata.namespace)
        state.name, state.namespace = pod.metadata.name, pod.metadata.namespace
        state.sandbox = RuntimeSandbox(
            id=f"sandbox-{next(self._ids)}",
            pod_uid=pod.uid,
            pod_name=pod.metadata.name,
            pod_namespace=pod.metadata.namespace,
            ready=True,
            ip=f"10.88.0.{next(self._ips)}",
            created_at=_now(),
        )
        return state.sandbox

    async def start_container(
        self, pod: Pod, sandbox: RuntimeSandbox, config: ContainerConfig
    ) -> RuntimeContainer:
        await self._enter("start_container", pod.uid, config.name, f"attempt={config.attempt}")
        if not self.started:
            raise RuntimeFailure("the fake runtime is not started")
        behaviour = self._behaviours.get(config.name, Behaviour())
        if behaviour.start_delay:
            await asyncio.sleep(behaviour.start_delay)
        state = self._pods.get(pod.uid)
        if state is None or state.sandbox is None or state.sandbox.id != sandbox.id:
            raise RuntimeFailure(f"pod {pod.key} has no sandbox {sandbox.id} in this runtime")
        if not state.sandbox.ready:
            raise RuntimeFailure(f"the sandbox of pod {pod.key} is not ready")
        await ensure_image(
            config.image,
            config.image_pull_policy,
            self._present,
            self._pull,
            credentials=config.pull_credentials,
        )
        if any(
            c.name == config.name and c.attempt == config.attempt for c in state.containers.values()
        ):
            raise StartError(
                "CreateContainerError",
                f'the container name "{config.name}_{pod.full_name}_{config.attempt}" '
                "is already in use",
            )
        now = _now()
        rec = _Container(
            id=f"c{next(self._ids)}",
            pod_uid=pod.uid,
            pod_name=pod.metadata.name,
            pod_namespace=pod.metadata.namespace,
            name=config.name,
            attempt=config.attempt,
            spec_hash=config.spec_hash,
            image=config.image,
            behaviour=behaviour,
            config=config,
            state=ContainerRunState.CREATED
            if behaviour.stays_created
            else ContainerRunState.RUNNING,
            created_at=now,
            started_at=None if behaviour.stays_created else now,
            pid=next(self._pids),
        )
        rec.log += behaviour.output
        if behaviour.output:
            rec.last_write_ns = time.time_ns()
        state.containers[rec.id] = rec
        started = rec.view()
        self._notify(pod.uid)
        if behaviour.exit_code is not None and not behaviour.stays_created:
            code = behaviour.exit_code
            asyncio.get_running_loop().call_soon(self._exit, rec, code, None, None)
        return started

    async def stop_container(self, container: RuntimeContainer, grace_seconds: float) -> None:
        await self._enter(
            "stop_container", container.pod_uid, container.name, f"grace={grace_seconds:g}"
        )
        rec = self._record(container)
        if rec is None or not rec.alive:
            return
        if not rec.behaviour.ignores_term:
            self._exit(rec, rec.behaviour.term_exit_code, None, None)
            return
        deadline = asyncio.get_running_loop().time() + max(grace_seconds, 0.0)
        while rec.alive:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                self._exit(rec, SIGKILL_EXIT, None, None)
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await rec.changed()

    async def remove_container(self, container: RuntimeContainer) -> None:
        await self._enter("remove_container", container.pod_uid, container.name)
        rec = self._record(container)
        if rec is None:
            return
        if rec.alive:
            raise RuntimeFailure(
                f"container {rec.name} of pod {rec.pod_namespace}/{rec.pod_name} is running: "
                "stop it before removing it"
            )
        rec.removed = True
        rec.wake()
        self._pods[rec.pod_uid].containers.pop(rec.id, None)

    async def remove_pod(self, uid: str) -> None:
        await self._enter("remove_pod", uid)
        pod = self._pods.get(uid)
        if pod is None:
            return
        for rec in list(pod.containers.values()):
            if rec.alive:
                self._exit(rec, SIGKILL_EXIT, None, None)
            rec.removed = True
            rec.wake()
        del self._pods[uid]

    async def read_log(
        self,
        container: RuntimeContainer,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
        times: LogTimes = NO_LOG_TIMES,
    ) -> bytes:
        await self._enter("read_log", container.pod_uid, container.name)
        rec = self._record(container)
        if rec is None:
            return b""
        if times.any and not _plain_times(times, rec):
            return b""
        data = tail(bytes(rec.log), tail_lines)
        return data if limit_bytes is None else data[: max(limit_bytes, 0)]

    async def follow_log(
        self,
        container: RuntimeContainer,
        tail_lines: int | None = None,
        times: LogTimes = NO_LOG_TIMES,
    ) -> AsyncGenerator[bytes, None]:
        await self._enter("follow_log", container.pod_uid, container.name)
        rec = self._record(container)
        if rec is None:
            return
        whole = not times.any or _plain_times(times, rec)
        head = tail(bytes(rec.log), tail_lines) if whole else b""
        offset = len(rec.log)
        if head:
            yield head
        while True:
            done = rec.removed or not rec.alive
            chunk = bytes(rec.log[offset:])
            if chunk:
                offset += len(chunk)
                yield chunk
            elif done:
                return
            else:
                await rec.changed()

    async def exec_sync(
        self,
        container: RuntimeContainer,
        command: list[str],
        env: list[tuple[str, str]],
        timeout_seconds: float,
    ) -> ExecResult:
        await self._enter("exec_sync", container.pod_uid, container.name, " ".join(command))
        rec = self._record(container)
        if rec is None or rec.state is not ContainerRunState.RUNNING:
            raise RuntimeFailure(f"container {container.name} is not running")
        answer = self._exec.get(container.name, self._exec.get(None, ExecResult(0, b"")))
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, ExecResult):
            result = answer
        else:
            produced = answer(container, command, env)
            result = await produced if inspect.isawaitable(produced) else produced
        return ExecResult(result.exit_code, result.output[:MAX_EXEC_OUTPUT])

    async def exec_stream(
        self,
        container: RuntimeContainer,
        command: list[str],
        env: list[tuple[str, str]],
        *,
        stdin: bool,
        tty: bool,
    ) -> FakeExecStream:
        await self._enter("exec_stream", container.pod_uid, container.name, " ".join(command))
        rec = self._record(container)
        if rec is None or rec.state is not ContainerRunState.RUNNING:
            raise RuntimeFailure(f"container {container.name} is not running")
        script = self._exec_scripts.get(container.name, self._exec_scripts.get(None))
        if script is None:
            answer = self._exec.get(container.name, self._exec.get(None, ExecResult(0, b"")))
            if isinstance(answer, Exception):
                raise answer
            script = self._script_of(answer)
        stream = FakeExecStream(container, command, env, stdin=stdin, tty=tty)
        rec.execs.append(stream)
        self.exec_streams.append(stream)
        stream.start(script)
        return stream

    async def attach(
        self, container: RuntimeContainer, *, stdin: bool, tty: bool
    ) -> FakeExecStream:
        await self._enter("attach", container.pod_uid, container.name)
        rec = self._record(container)
        if rec is None or rec.state is not ContainerRunState.RUNNING:
            raise RuntimeFailure(f"container {container.name} is not running")
        script = self._attach_scripts.get(container.name, self._attach_scripts.get(None))
        stream = FakeExecStream(container, [], [], stdin=stdin, tty=tty)
        rec.execs.append(stream)  # ends with its container
        self.attaches.append(stream)
        stream.start(script or _until_exit)
        return stream

    async def port_forward(
        self, pod_uid: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        await self._enter("port_forward", pod_uid, detail=str(port))
        pod = self._pods.get(pod_uid)
        if pod is None or pod.sandbox is None or not pod.sandbox.ready:
            raise RuntimeFailure(f"pod {pod_uid} has no ready sandbox")
        handler = self._ports.get((pod_uid, port), self._ports.get((None, port)))
        if handler is None:
            raise RuntimeFailure(f"dial tcp4 127.0.0.1:{port}: connect: connection refused")
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=theirs)

        async def serve() -> None:
            try:
                await handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass  # the client went away: as a server would see it
            finally:
                writer.close()

        task = asyncio.create_task(serve(), name=f"fake port {port} of {pod_uid}")
        self._port_tasks.add(task)
        task.add_done_callback(self._port_tasks.discard)
        return await asyncio.open_connection(sock=ours)

    # --- inside -------------------------------------------------------------------------------

    @staticmethod
    def _script_of(answer: ExecResult | ExecHandler) -> ExecScript:
        """exec_sync's programmed answer as a command: its output on stdout, its exit code."""

        async def script(stream: FakeExecStream) -> None:
            if isinstance(answer, ExecResult):
                result = answer
            else:
                produced = answer(stream.container, stream.command, stream.env)
                result = await produced if inspect.isawaitable(produced) else produced
            await stream.emit(result.output)
            stream.exit(result.exit_code)

        return script

    async def _enter(
        self, op: str, pod_uid: str = "", container: str = "", detail: str = ""
    ) -> None:
        """Record the call; wait while `op` hangs; then raise an injected failure that matches."""
        self.calls.append(Call(op, pod_uid, container, detail))
        gate = self._hangs.get(op)
        if gate is not None:
            await gate.wait()
        for failure in self._failures:
            if (
                failure.op == op
                and failure.pod_uid in (None, pod_uid)
                and failure.container in (None, container)
            ):
                if failure.times is not None:
                    failure.times -= 1
                    if failure.times <= 0:
                        self._failures.remove(failure)
                raise failure.error

    async def _present(self, image: str) -> bool:
        return self.present_images is None or image in self.present_images

    async def _pull(self, image: str, credentials: PullCredentials) -> None:
        users = ",".join(a.username for a in credentials.auths)
        await self._enter("pull_image", detail=f"{image} as {users}" if users else image)
        why = self.pull_errors.get(image)
        if why is not None:
            raise StartError("ErrImagePull", f'failed to pull image "{image}": {why}')
        if self.present_images is not None:
            self.present_images.add(image)

    def _exit(self, rec: _Container, code: int, reason: str | None, message: str | None) -> None:
        if not rec.alive or rec.removed:
            return
        rec.state = ContainerRunState.EXITED
        for stream in rec.execs:  # they die with it, as in its PID namespace
            stream.kill()
        rec.execs.clear()
        rec.finished_at = _now()
        rec.exit_code = code
        rec.reason = reason or _reason(code)
        rec.message = message
        rec.wake()
        self._notify(rec.pod_uid)

    def _notify(self, uid: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(uid)
            except Exception:  # as the real backends: a listener cannot fail the runtime
                log.exception("runtime listener failed for pod %s", uid)

    def _record(self, container: RuntimeContainer) -> _Container | None:
        pod = self._pods.get(container.pod_uid)
        return pod.containers.get(container.id) if pod is not None else None

    def _latest_record(self, pod_uid: str, name: str) -> _Container | None:
        pod = self._pods.get(pod_uid)
        if pod is None:
            return None
        found = [c for c in self._ordered(pod) if c.name == name]
        return found[-1] if found else None

    @staticmethod
    def _ordered(pod: _Pod) -> list[_Container]:
        return sorted(pod.containers.values(), key=lambda c: (c.name, c.attempt, c.created_at))

    def _view(self, pod: _Pod) -> RuntimePod:
        return RuntimePod(
            uid=pod.uid,
            name=pod.name,
            namespace=pod.namespace,
            sandbox=pod.sandbox,
            containers=[c.view() for c in self._ordered(pod)],
        )


# mypy --strict checks that the fake is a Runtime, member by member.
_: type[Runtime] = FakeRuntime


async def _until_exit(stream: FakeExecStream) -> None:
    """An attach to a container that writes nothing: it lasts until the container exits."""
    await stream._exited.wait()


def _plain_times(times: LogTimes, rec: _Container) -> bool:
    """As the process runtime's plain log answers `times`: all of it or none (logfiles)."""
    created = (rec.created_at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    return logfiles.plain_times(times, created * 1000, rec.last_write_ns, time.time_ns())
