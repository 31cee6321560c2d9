"""The runtime interface: what the layers above need from a container runtime, and no more.

A backend (host processes, the Docker Engine API, ...) implements `Runtime`. Everything above
`runtime/` sees only these types, so it does not know which backend runs the pods.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Protocol

from pykubelet.api.model import Pod

# Labels/keys every backend records with each container so that a restarted agent can rebuild
# its view of the node from the runtime alone.
LABEL_POD_UID = "io.kubernetes.pod.uid"
LABEL_POD_NAME = "io.kubernetes.pod.name"
LABEL_POD_NAMESPACE = "io.kubernetes.pod.namespace"
LABEL_CONTAINER_NAME = "io.kubernetes.container.name"
LABEL_ATTEMPT = "io.kubernetes.container.restartCount"
LABEL_SPEC_HASH = "io.kubernetes.container.hash"


class ContainerRunState(Enum):
    CREATED = "created"
    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class RuntimeContainer:
    """One instance (one attempt) of a container of a pod."""

    id: str  # unique within the runtime
    runtime: str  # backend name, the scheme of containerID ("process://<id>")
    pod_uid: str
    pod_name: str
    pod_namespace: str
    name: str  # the container's name in the pod spec
    attempt: int  # 0 on the first start; the restartCount of the next is attempt + 1
    spec_hash: str  # hash of the container spec it was started from
    image: str
    state: ContainerRunState
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    reason: str | None = None  # Completed, Error, OOMKilled, ContainerStatusUnknown, ...
    message: str | None = None
    pid: int | None = None
    image_id: str = ""  # status.imageID, the image's digest reference ("": `image`)

    @property
    def container_id(self) -> str:
        return f"{self.runtime}://{self.id}"


@dataclass(frozen=True)
class RuntimeVersion:
    """The runtime's own name and version, as the Node's nodeInfo.containerRuntimeVersion."""

    name: str  # containerd, docker, process
    version: str

    def __str__(self) -> str:
        return f"{self.name}://{self.version}"


@dataclass(frozen=True)
class RuntimeImage:
    """An image the runtime holds: its digests and tags, its size (the Node's status.images)."""

    names: tuple[str, ...]
    size_bytes: int


@dataclass(frozen=True, slots=True)
class RuntimeSandbox:
    """What holds a pod's shared resources (an infra container, a directory)."""

    id: str
    pod_uid: str
    pod_name: str
    pod_namespace: str
    ready: bool
    ip: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RuntimePod:
    uid: str
    name: str
    namespace: str
    sandbox: RuntimeSandbox | None
    containers: list[RuntimeContainer] = field(default_factory=list)  # oldest attempt first


@dataclass(frozen=True)
class Mount:
    """A host file or directory made visible in a container (a volumeMount, resolved).

    The sync layer prepares `host_path` (a volume's directory, a file of it for a subPath, a
    hostPath) before the container starts; a backend only binds it at `container_path`.
    """

    host_path: str  # absolute, on the host
    container_path: str  # absolute, in the container
    read_only: bool = False


@dataclass(frozen=True)
class DNSConfig:
    """A pod's resolver configuration as the kubelet hands it to a runtime (the CRI's
    DNSConfig), decided above the runtime (pykubelet.pod.dns). Empty: the node's own
    /etc/resolv.conf, as containerd then copies it."""

    servers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.servers or self.searches or self.options)

    def resolv_conf(self) -> str:
        """The file, written as containerd writes it from a sandbox's DNSConfig."""
        out = ""
        if self.searches:
            out += "search " + " ".join(self.searches) + "\n"
        out += "".join(f"nameserver {server}\n" for server in self.servers)
        if self.options:
            out += "options " + " ".join(self.options) + "\n"
        return out


@dataclass(frozen=True)
class SandboxConfig:
    """What the kubelet decides for a pod's sandbox, as data: the kernel hostname (None: the
    node's, a pod on the host's network) and the resolver (empty: the node's own)."""

    hostname: str | None = None
    dns: DNSConfig = field(default_factory=DNSConfig)


@dataclass(frozen=True)
class RegistryAuth:
    """One registry credential from an image pull secret, given to the engine with the pull
    (the CRI's AuthConfig, the Docker API's X-Registry-Auth)."""

    username: str
    password: str = field(repr=False)
    # The registry the image is pulled from ("registry.example.com:5000"); the Docker API sends
    # it, the CRI leaves it empty as the kubelet does for a pull secret's credentials.
    server_address: str = ""


@dataclass(frozen=True)
class PullCredentials:
    """What a container's image pull secrets give its pull: the credentials matching the
    image's registry, tried in order (none: an anonymous pull), or why the secrets could not
    be used (the pull then fails with ErrImagePull saying so, as the kubelet's does)."""

    auths: tuple[RegistryAuth, ...] = ()
    error: str | None = None


ANONYMOUS = PullCredentials()


@dataclass(frozen=True)
class ContainerConfig:
    """A container to start, with everything resolved by the sync layer."""

    name: str
    image: str
    command: list[str]  # overrides the image entrypoint
    args: list[str]  # overrides the image command
    env: list[tuple[str, str]]  # expanded, in order
    working_dir: str | None
    attempt: int
    spec_hash: str
    image_pull_policy: str  # Always, IfNotPresent, Never
    pull_credentials: PullCredentials = ANONYMOUS
    limits: dict[str, str] = field(default_factory=dict)
    host_ports: list[tuple[int, int, str]] = field(default_factory=list)  # (host, container, proto)
    requests: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    # securityContext, the container's merged over the pod's; None: the backend's default (root
    # for the process runtime, the image's user for the docker runtime).
    run_as_user: int | None = None
    run_as_group: int | None = None
    supplemental_groups: list[int] = field(default_factory=list)
    read_only_root_filesystem: bool = False
    privileged: bool = False
    # The rest of the restricted profile. `run_as_non_root` with no `run_as_user`: the runtime
    # checks the image's user (api/security.py's verify_run_as_non_root). Capabilities are bare
    # upper-case names ("NET_ADMIN", "ALL"); `seccomp` is "" (not set: the kubelet's default,
    # Unconfined), RuntimeDefault, Unconfined or Localhost, whose profile is
    # `seccomp_localhost_profile` under <root-dir>/seccomp.
    run_as_non_root: bool = False
    no_new_privileges: bool = False
    capabilities_add: list[str] = field(default_factory=list)
    capabilities_drop: list[str] = field(default_factory=list)
    seccomp: str = ""
    seccomp_localhost_profile: str = ""
    proc_mount_unmasked: bool = False
    # The container's own stdio, for `kubectl attach`: stdin kept open by the runtime (closed
    # after the first attach ends with `stdin_once`), a terminal with `tty`.
    stdin: bool = False
    stdin_once: bool = False
    tty: bool = False
    # An ephemeral container's targetContainerName, resolved to the runtime id of that
    # container's latest instance: the new container joins its process namespace.
    target_container_id: str | None = None
    # The pod's resolv.conf on the host (its SandboxConfig.dns written out), for the backends
    # that bind it at /etc/resolv.conf themselves; a CRI runtime writes its own from the
    # sandbox's DNSConfig. None: the node's own file.
    resolv_conf: str | None = None
    # terminationMessagePath ("": none) and terminationMessagePolicy. The file bound there
    # for this start (runtime/termination.py) is the last of `mounts`; a backend records both
    # with the container, to read its message once it has exited.
    termination_message_path: str = ""
    termination_message_policy: str = "File"


# Kubernetes keeps at most this much of an exec probe's output.
MAX_EXEC_OUTPUT = 10 * 1024


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # None: killed at the timeout
    output: bytes  # stdout and stderr together, at most MAX_EXEC_OUTPUT bytes

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None


class StartError(Exception):
    """A container could not be started. `reason` goes into its waiting state."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class RuntimeFailure(Exception):
    """The runtime failed an operation (not the container's fault)."""


@dataclass(frozen=True)
class LogTimes:
    """What a log request asks of its records' times (the kubelet's `sinceSeconds`/`sinceTime`
    and `timestamps`): records written before `since_ns` (Unix time in nanoseconds) are left
    out; with `timestamps` each record is prefixed with its time (RFC3339Nano, fixed width, and
    a space)."""

    since_ns: int | None = None
    timestamps: bool = False

    @property
    def any(self) -> bool:
        return self.since_ns is not None or self.timestamps


NO_LOG_TIMES = LogTimes()


class LogUnsupported(Exception):
    """A log request the runtime cannot answer truthfully; the message names the parameter
    and the reason (answered 400)."""


ChangeListener = Callable[[str], None]


Pull = Callable[[str, RegistryAuth | None], Awaitable[None]]


class SharedPulls:
    """One pull per image and credentials at a time, shared by every container waiting for it;
    a waiter that is cancelled does not cancel the pull the others wait for.

    `pull(image, credentials)` pulls as the kubelet does: anonymously without credentials,
    else with each credential in order until one succeeds; when all fail, the StartError of
    each attempt is joined into one ErrImagePull (the kubelet's aggregate error)."""

    def __init__(self, pull: Pull) -> None:
        self._pull = pull
        self._tasks: dict[tuple[str, PullCredentials], asyncio.Task[None]] = {}

    async def pull(self, image: str, credentials: PullCredentials = ANONYMOUS) -> None:
        key = (image, credentials)
        task = self._tasks.get(key)
        if task is None:
            task = asyncio.create_task(self._run(image, credentials), name=f"pull {image}")
            self._tasks[key] = task
            task.add_done_callback(lambda t: self._done(key, t))
        await asyncio.shield(task)

    async def _run(self, image: str, credentials: PullCredentials) -> None:
        if not credentials.auths:
            await self._pull(image, None)
            return
        failures: list[StartError] = []
        for auth in credentials.auths:
            try:
                await self._pull(image, auth)
                return
            except StartError as e:
                failures.append(e)
        if len(failures) == 1:
            raise failures[0]
        raise StartError("ErrImagePull", "[" + ", ".join(e.message for e in failures) + "]")

    def _done(self, key: tuple[str, PullCredentials], task: asyncio.Task[None]) -> None:
        self._tasks.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: whoever waited has it, or nobody waits any more

    def cancel(self) -> list[asyncio.Task[None]]:
        """Cancel the pulls in progress (the runtime closes); returns them to be awaited."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        self._tasks.clear()
        return tasks


async def ensure_image(
    image: str,
    policy: str,
    present: Callable[[str], Awaitable[bool]],
    pull: Callable[[str, PullCredentials], Awaitable[None]],
    *,
    credentials: PullCredentials = ANONYMOUS,
    sandbox: bool = False,
) -> None:
    """Pull as imagePullPolicy says, for any backend: StartError with the kubelet's reasons for
    a container; for the sandbox's image, a failure of the runtime. Pull secrets that could not
    be used fail the pull (not a present image's start), as in the kubelet's PullImage."""
    try:
        if policy != "Always" and await present(image):
            return
        if policy == "Never":
            raise StartError(
                "ErrImageNeverPull",
                f'Container image "{image}" is not present with pull policy of Never',
            )
        if credentials.error is not None:
            raise StartError("ErrImagePull", f'failed to pull image "{image}": {credentials.error}')
        await pull(image, credentials)
    except StartError as e:
        if sandbox:
            raise RuntimeFailure(f"pod infra image: {e.message}") from e
        raise


STDOUT, STDERR = "stdout", "stderr"

# How long a port-forward dial into a pod may take before it counts as failed.
DIAL_TIMEOUT = 10.0


async def dial_local_port(
    port: int, sock: socket.socket | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to 127.0.0.1:`port` (with `sock`, an unconnected IPv4 TCP socket created in the
    network namespace that is to be dialled; else one of the agent's own) and return the
    stream pair. RuntimeFailure saying why, in the words Go's dialer uses (kubectl users know
    them): "dial tcp4 127.0.0.1:80: connect: connection refused"."""
    address = f"127.0.0.1:{port}"
    if sock is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(DIAL_TIMEOUT):
            await loop.sock_connect(sock, ("127.0.0.1", port))
        return await asyncio.open_connection(sock=sock)
    except TimeoutError:
        sock.close()
        raise RuntimeFailure(f"dial tcp4 {address}: i/o timeout") from None
    except OSError as exc:
        sock.close()
        # Go's words are the C library's, lowercased ("connection refused").
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise RuntimeFailure(f"dial tcp4 {address}: connect: {reason}") from exc


@dataclass(frozen=True)
class TerminalSize:
    """A terminal's size in characters, as the client's terminal has it."""

    width: int
    height: int


class ExecStream(Protocol):
    """A command running in a container with its stdio attached (`kubectl exec`), or the
    container's own stdio (`kubectl attach`). Output is bounded: a reader that does not keep
    up stops the command's writes (a pipe or a terminal that fills), never memory."""

    async def write_stdin(self, data: bytes) -> None:
        """Send bytes to its standard input (waits while the pipe is full)."""

    async def close_stdin(self) -> None:
        """End of its input (EOF)."""

    def output(self) -> AsyncIterator[tuple[str, bytes]]:
        """(STDOUT or STDERR, bytes) as it writes them, until both are closed; with a
        terminal everything comes as STDOUT."""
        ...

    async def resize(self, width: int, height: int) -> None:
        """The terminal's new size (only with tty)."""

    async def wait(self) -> int | None:
        """Its exit code once it has exited (None: killed by a signal or unknown).
        RuntimeFailure with the runtime's reason if the runtime reports that it failed
        otherwise (a remote runtime tells that a command could not start only here)."""

    async def close(self) -> None:
        """Kill it if it still runs and release what it holds; safe to call twice."""


@dataclass(frozen=True)
class LogRotationPolicy:
    """`--container-log-max-size` and `--container-log-max-files`."""

    max_size: int = 10 * 1024 * 1024
    max_files: int = 5


@dataclass(frozen=True)
class GcImage:
    """One image the engine holds, as image GC sees it."""

    id: str
    tags: tuple[str, ...]
    size: int  # bytes
    # A container of the engine uses it (running or not, the agent's or another's), or the
    # engine keeps it whatever happens (the pod infra image, the CRI's pinned images).
    in_use: bool
    pinned: bool


@dataclass(frozen=True)
class ImageFsUsage:
    """The file system the engine keeps its images on."""

    path: str
    capacity_bytes: int
    available_bytes: int


@dataclass(frozen=True)
class ImageFsStats:
    """What the engine says of the file system it keeps its images on (the Summary API's
    `runtime.imageFs`): where it is, and what its images use of it; the file system's totals
    are measured by the stats collector (statvfs of `path`)."""

    path: str
    used_bytes: int | None = None
    inodes_used: int | None = None
    at: float | None = None  # when the engine measured it (Unix time); None: now


@dataclass(frozen=True, slots=True)
class ContainerStorage:
    """What one container keeps on disk, as its runtime knows it; the stats collector measures
    the log files itself (in a thread). `rootfs_*` is the writable layer as the engine measured
    it (None: not known, or the runtime has none: the process runtime's containers write to the
    host's own file system)."""

    rootfs_bytes: int | None = None
    rootfs_inodes: int | None = None
    rootfs_at: float | None = None  # when the engine measured it (Unix time); None: now
    # The container's log files, or the directories holding them (every attempt of the
    # container, as the kubelet measures <pod log dir>/<container>/).
    log_paths: tuple[str, ...] = ()


class ImageService(Protocol):
    """The engine's images (the CRI's ImageService, the Docker API's /images), for image GC."""

    async def list_images(self) -> list[GcImage]: ...

    async def remove_image(self, image: GcImage) -> None:
        """Remove it (every tag of it); RuntimeFailure saying why it could not be."""

    async def image_fs_usage(self) -> ImageFsUsage: ...

    async def image_fs_stats(self) -> ImageFsStats:
        """Where the images are and what they use (the Summary API's imageFs); RuntimeFailure
        if the engine cannot say."""
        ...


class Runtime(Protocol):
    name: str

    def image_service(self) -> ImageService | None:
        """The engine's images; None: the backend has no images (the process runtime)."""

    async def start(self) -> None:
        """Connect, and load what is already running (adoption after a restart)."""

    async def close(self) -> None:
        """Release connections. Running containers keep running."""

    def add_listener(self, listener: ChangeListener) -> None:
        """Call `listener(pod_uid)` as soon as a container of that pod starts or exits."""

    async def version(self) -> RuntimeVersion:
        """The runtime's name and version (asked of the engine once connected)."""
        ...

    async def images(self) -> list[RuntimeImage]:
        """The images the runtime holds (none for the process runtime)."""
        ...

    async def list_pods(self) -> list[RuntimePod]:
        """Every pod this agent created that the runtime still has, running or not."""

    async def container_storage(
        self, containers: list[RuntimeContainer]
    ) -> dict[str, ContainerStorage]:
        """By container ID, what each of `containers` keeps on disk (its writable layer as the
        engine measures it, where its logs are). Expensive on the engines (a writable layer is
        walked): the stats collector asks once per period. A container the runtime no longer
        has is left out; RuntimeFailure if the runtime cannot be asked."""
        ...

    async def get_pod(self, uid: str) -> RuntimePod | None: ...

    async def run_sandbox(self, pod: Pod, config: SandboxConfig | None = None) -> RuntimeSandbox:
        """Create the pod's sandbox, or return the ready one that exists. `config`: its
        hostname and DNS (None: the pod's name, the runtime's own resolver)."""

    async def start_container(
        self, pod: Pod, sandbox: RuntimeSandbox, config: ContainerConfig
    ) -> RuntimeContainer:
        """Create and start one container. Raises StartError with a Kubernetes reason."""

    async def stop_container(self, container: RuntimeContainer, grace_seconds: float) -> None:
        """SIGTERM (or the engine's stop), SIGKILL after grace_seconds; returns once it is gone."""

    async def remove_container(self, container: RuntimeContainer) -> None:
        """Forget an exited container and its logs."""

    async def remove_pod(self, uid: str) -> None:
        """Stop and remove the sandbox and whatever is left of the pod (containers are stopped)."""

    async def rotate_logs(self, policy: LogRotationPolicy) -> None:
        """Rotate the log files of running containers that reached the policy's size, where the
        agent keeps them (see runtime/logrotation.py); the docker runtime's engine rotates its
        own (its log driver), so it does nothing."""

    async def read_log(
        self,
        container: RuntimeContainer,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
        times: LogTimes = NO_LOG_TIMES,
    ) -> bytes:
        """The container's stdout and stderr, interleaved as written: the last `tail_lines`
        lines, of those the ones `times` keeps, of that the first `limit_bytes` bytes (as the
        kubelet applies them). LogUnsupported if `times` cannot be honoured."""

    def follow_log(
        self,
        container: RuntimeContainer,
        tail_lines: int | None = None,
        times: LogTimes = NO_LOG_TIMES,
    ) -> AsyncGenerator[bytes, None]:
        """The log so far (or its last `tail_lines` lines), then what is written, until the
        container has exited and everything it wrote was yielded; `times` as in read_log."""
        ...

    async def exec_sync(
        self,
        container: RuntimeContainer,
        command: list[str],
        env: list[tuple[str, str]],
        timeout_seconds: float,
    ) -> ExecResult:
        """Run a command in the running container (exec probes and hooks). `env` is the
        container's resolved environment, for backends that do not keep it. Raises
        RuntimeFailure if the container is not running or the command cannot start."""
        ...

    async def exec_stream(
        self,
        container: RuntimeContainer,
        command: list[str],
        env: list[tuple[str, str]],
        *,
        stdin: bool,
        tty: bool,
        size: TerminalSize | None = None,
    ) -> ExecStream:
        """Start a command in the running container as exec_sync does, with its stdio
        attached (a terminal with `tty`, of `size` from before the command starts where the
        backend can, so it never sees 0x0). Raises RuntimeFailure if the container is not
        running, the command cannot start, or the backend cannot do it (saying why)."""
        ...

    async def attach(self, container: RuntimeContainer, *, stdin: bool, tty: bool) -> ExecStream:
        """The running container's own stdio (`kubectl attach`): what it writes from now on,
        its stdin if its spec has `stdin: true` (input is dropped otherwise, as the engines
        drop it), its terminal's size with `tty`. `wait()` is the container's exit; `close()`
        detaches and never stops it (with `stdinOnce`, the first attach's end closes the
        container's stdin). RuntimeFailure if it is not running or the backend cannot attach
        (saying why)."""
        ...

    async def port_forward(
        self, pod_uid: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection to `port` on the pod's loopback, in the pod's network (`kubectl
        port-forward`): the caller owns the pair and closes the writer. Raises
        RuntimeFailure saying why when it cannot: the pod or its sandbox is not there or not
        ready, nothing listens on the port, the namespace cannot be entered."""
        ...
