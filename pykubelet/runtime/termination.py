"""A container's termination message (`terminationMessagePath`, `terminationMessagePolicy`), as
the kubelet's kuberuntime makes and reads it, for every backend.

What this module promises:

- `create_message_file` makes, for one container start, an empty file of mode 0666 (whatever
  the umask) at `<pod dir>/containers/<name>/<8 hex digits>` (the kubelet's PodContainerDir and
  makeUID), to be bound read-write at the container's `terminationMessagePath`; None (logged)
  if it cannot be made, as the kubelet then starts the container without it.
- `termination_message` is what an exited container's status says (getTerminationMessage,
  readLastStringFromContainerLogs): the last 4096 bytes of the file; with
  FallbackToLogsOnError, a non-zero exit and a file that is empty or missing, the last 2048
  bytes of the log's last 80 lines; an unreadable file, the kubelet's error text instead.
  `with_engine_message` joins it to the engine's own message ("<engine's>: <file's>").
- `is_message_file` tells a file made here from anything else bound at the same path (a
  volume's file), so only ours is ever deleted with its container.

Blocking file work is in plain functions, for the caller to run in a thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_PATH = "/dev/termination-log"  # the API server's default (SetDefaults_Container)
FILE = "File"
FALLBACK_TO_LOGS_ON_ERROR = "FallbackToLogsOnError"

# kubecontainer.MaxContainerTerminationMessageLength, ...LogLength and ...LogLines.
MAX_MESSAGE_BYTES = 4096
MAX_LOG_BYTES = 2048
MAX_LOG_LINES = 80

# The kubelet's names for what it records with a container (CRI annotations; docker labels,
# as its Docker integration kept them), so a restarted agent still knows them.
ANNOTATION_PATH = "io.kubernetes.container.terminationMessagePath"
ANNOTATION_POLICY = "io.kubernetes.container.terminationMessagePolicy"

CONTAINERS_DIR = "containers"  # in the pod's directory, as the kubelet's getPodContainerDir


def create_message_file(pod_dir: Path, container: str) -> str | None:
    """The empty message file of one container start (blocking); None if it cannot be made."""
    containers = pod_dir / CONTAINERS_DIR
    directory = containers / container
    # As the kubelet's makeUID, not a secret: no system call for it (secrets' getrandom lets
    # the interpreter lock go, and waits to have it back).
    path = directory / f"{random.getrandbits(32):08x}"
    try:
        # The pod's directory is private (0700 elsewhere in --root-dir); this one is the
        # kubelet's 0750, the file 0666 so that a container of any user can write it.
        # `os`, letting the interpreter lock go: new inodes on a disk (common/lockedio.py).
        # Each directory made from the top, where the pod's usually is, rather than looked
        # for from the bottom (each call waits for the lock after it).
        try:
            os.mkdir(containers)
        except FileExistsError:
            pass
        except FileNotFoundError:
            os.makedirs(pod_dir, 0o700, exist_ok=True)
            os.makedirs(containers, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o750)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(path, flags, 0o600)  # private until its mode is set below
        try:
            os.fchmod(fd, 0o666)
        finally:
            os.close(fd)
    except OSError as e:
        log.error("error on creating termination-log file %s: %s", path, e.strerror or e)
        return None
    return str(path)


def is_message_file(path: str, pod_uid: str, container: str) -> bool:
    """Whether `path` is one create_message_file made for this pod's container."""
    p = Path(path)
    return (
        p.parent.name == container
        and p.parent.parent.name == CONTAINERS_DIR
        and p.parent.parent.parent.name == pod_uid
        and len(p.name) == 8
        and all(ch in "0123456789abcdef" for ch in p.name)
    )


def remove_message_file(path: str) -> None:
    """Delete it (blocking); gone already is fine, a failure is logged (the pod's directory
    goes with the pod anyway)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot delete termination-log file %s: %s", path, e.strerror or e)


def read_at_most(path: str, limit: int) -> bytes:
    """The last `limit` bytes of the file (the kubelet's tail.ReadAtMost); OSError if it cannot
    be read."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            f.seek(size - limit)
        return f.read(limit)


def read_message_file(path: str) -> tuple[str, bool]:
    """(the message, whether the log should be read instead if the policy says so): a missing
    file says nothing, an unreadable one says why (blocking)."""
    try:
        data = read_at_most(path, MAX_MESSAGE_BYTES)
    except FileNotFoundError:
        return "", True
    except OSError as e:
        reason = (e.strerror or str(e)).lower()
        return f"Error on reading termination log {path}: {reason}", False
    return data.decode("utf-8", errors="replace"), not data


def falls_back_to_logs(policy: str, exit_code: int | None, reason: str | None) -> bool:
    """FallbackToLogsOnError applies: a failure (non-zero exit) of a container that ran (a
    container that could not even start has no log)."""
    return (
        policy == FALLBACK_TO_LOGS_ON_ERROR
        and exit_code is not None
        and exit_code != 0
        and reason != "ContainerCannotRun"
    )


def log_tail(log: bytes) -> str:
    """What of the last lines of a log becomes the message: its last 2048 bytes."""
    return log[-MAX_LOG_BYTES:].decode("utf-8", errors="replace")


async def termination_message(
    host_file: str | None,
    policy: str,
    exit_code: int | None,
    reason: str | None,
    read_file: Callable[[str], Awaitable[tuple[str, bool]]],
    read_log: Callable[[int], Awaitable[bytes]],
) -> str:
    """The message of an exited container. `host_file`: the host's file bound at its
    terminationMessagePath (None: nothing is bound there, or the path is empty);
    `read_file`: read_message_file, run where blocking is fine; `read_log(lines)`: the last
    lines of its log (stdout and stderr, as `kubectl logs` gives them)."""
    fallback = falls_back_to_logs(policy, exit_code, reason)
    message = ""
    if host_file is not None:
        message, empty = await read_file(host_file)
        fallback = fallback and empty
    if not fallback:
        return message
    try:
        return log_tail(await read_log(MAX_LOG_LINES))
    except Exception as e:  # any failure of the runtime's log read: the kubelet's words
        return f"Error on reading termination message from logs: {e}"


def with_engine_message(engine: str | None, message: str) -> str | None:
    """The engine's own message (an OOM kill's, say) enriched with the container's."""
    if not message:
        return engine or None
    return f"{engine}: {message}" if engine else message
