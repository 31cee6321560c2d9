"""Container log rotation as the kubelet's containerLogManager does it, for the runtimes whose
log files live on this machine (the CRI runtime's, the process runtime's).

A log `<dir>/<attempt>.log` that has reached `--container-log-max-size` is rotated: first the
rotated files beside it (`<log>.<YYYYMMDD-HHMMSS>`, `.gz` once compressed) are tidied as the
kubelet tidies them (half-written `.tmp` files and files already compressed removed, the oldest
removed until `--container-log-max-files` - 2 are left, the uncompressed ones gzipped), then
the current file is moved aside by the backend's `rotate` (a rename followed by the CRI's
ReopenContainerLog; the process runtime's own way) to `<log>.<now>`. So at most
`--container-log-max-files` files per container: the current one, the one just rotated and the
compressed older ones. `kubectl logs` reads the current file only, as with the kubelet.

Everything here is blocking file I/O: callers run it in a thread.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import time
from pathlib import Path

from pykubelet.runtime.base import LogRotationPolicy

# The kubelet's timestampFormat, compressSuffix and tmpSuffix.
TIMESTAMP_FORMAT = "%Y%m%d-%H%M%S"
COMPRESS_SUFFIX = ".gz"
TMP_SUFFIX = ".tmp"


def needs_rotation(path: Path | str, policy: LogRotationPolicy) -> bool:
    try:
        return os.stat(path).st_size >= policy.max_size
    except FileNotFoundError:
        return False


def rotated_files(path: Path) -> list[Path]:
    """The rotated files of `path`, oldest first (their names sort by time)."""
    return sorted(path.parent.glob(glob_escape(path.name) + ".*"))


def glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def tidy(path: Path, policy: LogRotationPolicy) -> None:
    """Before a rotation: the kubelet's cleanupUnusedLogs, removeExcessLogs and compression of
    the rotated files that are not compressed yet."""
    logs = rotated_files(path)
    # cleanupUnusedLogs: temporary files, and originals whose compressed file exists.
    names = {p.name for p in logs}
    kept = []
    for p in logs:
        if p.name.endswith(TMP_SUFFIX) or (
            not p.name.endswith(COMPRESS_SUFFIX) and p.name + COMPRESS_SUFFIX in names
        ):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        else:
            kept.append(p)
    # removeExcessLogs: the current file and the one about to be rotated aside, and at most
    # max_files - 2 older ones.
    keep = max(policy.max_files - 2, 0)
    for p in kept[: max(len(kept) - keep, 0)]:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    for p in kept[max(len(kept) - keep, 0) :]:
        if not p.name.endswith(COMPRESS_SUFFIX):
            compress(p)


def compress(path: Path) -> None:
    """`<log>.<time>` -> `<log>.<time>.gz`, written to `.tmp` first (the kubelet's
    compressLog)."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with path.open("rb") as src, gzip.open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.replace(tmp, path.with_name(path.name + COMPRESS_SUFFIX))
    path.unlink()


def rotated_name(path: Path, now: float | None = None) -> Path | None:
    """Where the current file goes; None if a file of this second is there already (the next
    check rotates it)."""
    stamp = time.strftime(TIMESTAMP_FORMAT, time.localtime(time.time() if now is None else now))
    target = path.with_name(f"{path.name}.{stamp}")
    if target.exists() or target.with_name(target.name + COMPRESS_SUFFIX).exists():
        return None
    return target


def prepare(path: Path, policy: LogRotationPolicy) -> Path | None:
    """If `path` is due: tidy its rotated files and return where it is to be moved."""
    if not needs_rotation(path, policy):
        return None
    tidy(path, policy)
    return rotated_name(path)


def remove_all(path: Path) -> None:
    """The log and its rotated files (the container is removed)."""
    for p in [path, *rotated_files(path)]:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
