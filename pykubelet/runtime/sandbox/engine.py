"""What the shared sandbox core (core.py) needs from one container engine, and no more.

A backend that runs pods as a sandbox (an infra or pause container holding the pod's network)
plus containers joined to it implements `Engine`: the Docker Engine API (runtime/docker) and the
CRI (runtime/cri) do. The core owns everything the two have in common: the status cache and its
relist, the pod and sandbox lifecycle (a dead sandbox's retirement, never-started cleanup, what a
failed start leaves), image pull policy and single-flight pulls, and the views the layers above
see. An engine owns only its wire: request bodies, calls, parsing answers, its change stream.

The contract, for every method:
- An engine that cannot be reached raises `RuntimeFailure`; so does any call the engine fails
  that is not the container's fault. What is the container's fault (a bad config, a command
  that cannot start, an image that cannot be pulled) is a `StartError` with the kubelet's reason.
- An engine keeps no state about pods or containers beyond what it needs to talk to the engine
  and to read its answers (a connection, an open OOM watch, which sandboxes it ran in the
  node's network); `forget(id)` releases what it keeps for one id. The cache is the core's.
- Nothing here imports a backend; the backends import this.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Protocol, TypeVar

from pykubelet.api.model import Pod
from pykubelet.runtime.base import (
    ContainerConfig,
    ContainerRunState,
    ContainerStorage,
    ExecResult,
    ExecStream,
    ImageService,
    LogRotationPolicy,
    LogTimes,
    RegistryAuth,
    RuntimeImage,
    RuntimeVersion,
    SandboxConfig,
    TerminalSize,
)


class Kind(Enum):
    SANDBOX = "sandbox"
    CONTAINER = "container"


@dataclass
class SandboxEntry:
    """A pod sandbox as the engine last described it."""

    id: str
    pod_uid: str
    pod_name: str
    pod_namespace: str
    attempt: int
    state: ContainerRunState  # RUNNING: ready; CREATED: never started; EXITED: not ready
    ip: str | None
    created_at: datetime
    exit_code: int | None = None  # of its infra process, where the engine tells
    seq: int = 0  # set by the cache: when it was stored (a relist older than that missed it)
    inspected_ns: int = 0  # set by the cache: the wall clock when its inspect was sent

    @property
    def ready(self) -> bool:
        return self.state is ContainerRunState.RUNNING

    @property
    def kind(self) -> Kind:
        return Kind.SANDBOX


@dataclass
class ContainerEntry:
    """One container of a pod (one attempt) as the engine last described it."""

    id: str
    pod_uid: str
    pod_name: str
    pod_namespace: str
    name: str
    attempt: int
    spec_hash: str
    image: str
    state: ContainerRunState
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    oom_killed: bool = False  # the engine (or what watches for it) says the kernel killed it
    message: str = ""
    pid: int | None = None
    # The log as the engine keeps it: a file it writes and leaves to the kubelet to remove
    # (the CRI's), else ""; whether the engine's own log stream is a TTY's (not framed).
    log_path: str = ""
    tty: bool = False
    seq: int = 0
    inspected_ns: int = 0
    # status.imageID: the image's digest reference (docker-pullable://repo@sha256:...,
    # docker://sha256:<id>, the CRI's image_ref); "" for `image`.
    image_id: str = ""
    # terminationMessagePath and its policy as recorded with the container, the host file
    # bound at that path ("": none). `message` holds the engine's own message, and once the
    # core has read them (`message_read`) the container's termination message too.
    termination_message_path: str = ""
    termination_message_policy: str = ""
    termination_file: str = ""
    message_read: bool = False

    @property
    def kind(self) -> Kind:
        return Kind.CONTAINER


Entry = SandboxEntry | ContainerEntry


@dataclass(frozen=True)
class Listing:
    """The cheap list of what the engine has of ours: id → state, no details."""

    sandboxes: dict[str, ContainerRunState] = field(default_factory=dict)
    containers: dict[str, ContainerRunState] = field(default_factory=dict)


class PullError(Exception):
    """The engine could not pull an image; the message is the engine's reason."""


class NameInUse(Exception):
    """A create found the name of this attempt taken by a leftover (an interrupted earlier
    try). The core removes `leftovers` (ids or names the engine can remove by) and tries once
    more."""

    def __init__(self, leftovers: list[str], message: str) -> None:
        super().__init__(message)
        self.leftovers = leftovers
        self.message = message


class ChangeSink(Protocol):
    """Where an engine's change stream goes (the core)."""

    def watching(self) -> None:
        """The stream is open: what happens from now on will be told."""

    async def relist(self) -> None:
        """Something changed that only a relist can tell (a reconnect, a poll, an event that
        does not say what)."""

    async def changed(
        self,
        id: str,
        kind: Kind | None = None,
        *,
        announce: bool = False,
        ours_at_ns: int | None = None,
    ) -> None:
        """One sandbox or container may have changed. `kind` is given when the event tells it:
        only then is an id the cache does not know yet looked at. `announce`: tell the
        listeners even if its state is the same (an OOM kill). `ours_at_ns`: the change is one
        the core makes itself (a create, a start), made at that wall-clock time (this host's):
        an inspect sent after it has seen it already."""


class Inspector(Protocol):
    """What the status cache reads through."""

    async def listing(self, pod_uid: str | None = None) -> Listing:
        """Our sandboxes and containers (of one pod, if given), in one or two cheap calls."""
        ...

    async def inspect_sandbox(self, id: str) -> SandboxEntry | None:
        """Its full status; None when it is gone or not ours."""
        ...

    async def inspect_container(self, id: str) -> ContainerEntry | None:
        """Its full status; None when it is gone or not ours."""
        ...

    def forget(self, id: str) -> None:
        """The cache no longer tracks `id`: release whatever the engine keeps for it."""


R = TypeVar("R")  # an engine's create request of one container, built before the pod's lock


class Engine(Inspector, Protocol[R]):
    name: str  # the backend (--container-runtime)

    async def connect(self) -> None:
        """Reach the engine and check that it is one; on failure, leave nothing open."""

    def id_scheme(self) -> str:
        """The scheme of container IDs in pod status ("docker", "containerd"): the runtime's
        name, known once connected."""
        ...

    async def version(self) -> RuntimeVersion:
        """The engine's own name and version."""
        ...

    async def images(self) -> list[RuntimeImage]:
        """The images the engine holds."""
        ...

    async def close(self) -> None:
        """Close connections and stop what the engine started. Containers keep running."""

    async def watch(self, sink: ChangeSink) -> None:
        """Tell `sink` of changes until cancelled (events, polls, reconnects)."""

    # --- sandboxes ------------------------------------------------------------------------------

    async def create_sandbox(self, pod: Pod, attempt: int, config: SandboxConfig | None) -> str:
        """Create the pod's sandbox of that attempt (where the engine starts it at once, start
        it too), with the hostname and DNS of `config` (None: the pod's name, the engine's
        own resolver); its id. NameInUse if a leftover holds the attempt's name."""
        ...

    async def start_sandbox(self, pod: Pod, id: str) -> None:
        """Start what create_sandbox made (nothing to do where it started it). StartError if the
        engine refuses; the core then removes it."""

    def unready_sandbox(self, pod: Pod, entry: SandboxEntry | None) -> str:
        """Why a sandbox just started is not ready (None: it vanished), for the error."""
        ...

    async def retire_sandbox(self, id: str) -> None:
        """A sandbox that is no longer ready is replaced: release it, keeping what its exited
        containers need to keep their history (lastState, --previous)."""

    async def remove_sandbox(self, id: str) -> None:
        """Stop and remove it; one already gone is fine."""

    async def remove_pod_files(self, uid: str) -> None:
        """The pod is gone: remove what the engine kept for it on the host (log directories)."""

    # --- containers -----------------------------------------------------------------------------

    def container_request(self, pod: Pod, sandbox_id: str, config: ContainerConfig) -> R:
        """The create request. StartError("CreateContainerConfigError") if it cannot be one."""
        ...

    async def create_container(self, pod: Pod, sandbox: SandboxEntry, request: R) -> str:
        """Create it in the sandbox; its id. StartError("CreateContainerError") if the engine
        refuses, NameInUse if a leftover holds the attempt's name."""
        ...

    async def start_container(self, id: str, config: ContainerConfig) -> None:
        """StartError("RunContainerError") if the engine refuses; the core then removes it."""

    async def stop_container(self, id: str, seconds: int) -> None:
        """Stop within `seconds` of grace (then kill); one not running or gone is fine."""

    async def remove_container(self, id: str, *, force: bool) -> None:
        """Remove it with its logs; `force`: even if it may still run. Gone is fine."""

    # --- images, exec, logs ---------------------------------------------------------------------

    async def image_present(self, image: str) -> bool: ...

    async def container_storage(
        self, containers: list[ContainerEntry]
    ) -> dict[str, ContainerStorage]:
        """By ID, each container's writable layer as the engine measures it and where its logs
        are (Runtime.container_storage)."""
        ...

    async def rotate_log(
        self, id: str, entry: ContainerEntry | None, policy: LogRotationPolicy
    ) -> bool:
        """Rotate the running container's log if the policy says it is due (whether it was).
        An engine that rotates its own logs does nothing."""
        ...

    def image_store(self) -> ImageService:
        """The engine's images, for image GC."""
        ...

    async def pull_image(self, image: str, auth: RegistryAuth | None) -> None:
        """Pull it, with the registry credential `auth` (None: anonymously); PullError with the
        engine's reason when that fails (the core adds the timeout and the kubelet's
        ErrImagePull message)."""

    async def exec_sync(
        self, id: str, name: str, command: list[str], timeout_seconds: float
    ) -> ExecResult:
        """Run `command` in the running container `name` (for messages), with its own
        environment; killed at the timeout (exit code None)."""
        ...

    async def exec_stream(
        self,
        id: str,
        name: str,
        command: list[str],
        *,
        stdin: bool,
        tty: bool,
        size: TerminalSize | None = None,
    ) -> ExecStream:
        """Start `command` in the running container `name` as exec_sync does, with its stdio
        attached (a terminal with `tty`, of `size` as soon as the engine can); RuntimeFailure
        if it cannot start or the engine cannot do that (saying why)."""
        ...

    async def attach(self, id: str, name: str, *, stdin: bool, tty: bool) -> ExecStream:
        """Attach to the running container's own stdio (its output from now on; its stdin if it
        was created with one); RuntimeFailure if the engine cannot (saying why)."""
        ...

    async def sandbox_netns(self, id: str) -> str:
        """The path of the running sandbox's network namespace (/proc/<its pid>/ns/net, or
        the namespace file the engine keeps); RuntimeFailure if it does not run or the
        engine does not tell."""
        ...

    async def read_log(
        self,
        id: str,
        entry: ContainerEntry | None,
        tail_lines: int | None,
        limit_bytes: int | None,
        times: LogTimes,
    ) -> bytes:
        """Its stdout and stderr as written: the last `tail_lines` lines, of those what `times`
        keeps, of which at most the first `limit_bytes` bytes. `entry`: what the cache knows of
        it, if anything."""
        ...

    def follow_log(
        self,
        id: str,
        entry: ContainerEntry | None,
        tail_lines: int | None,
        times: LogTimes,
        exited: Callable[[], bool],
    ) -> AsyncGenerator[bytes, None]:
        """The log so far, then what is written, until `exited()` and all of it was yielded."""
        ...
