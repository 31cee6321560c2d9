"""Small JSON state files that survive a crash of the agent or of the machine.

A file is either its old content or its new content, never a mix: the new content goes to a
temporary file in the same directory, is fsynced, renamed over the old one, and the directory is
fsynced so that the rename itself is durable. Files are 0600 and directories 0700 because state
and logs may hold secrets (environment values, command lines).

These functions block (fsync): call them from a thread (`asyncio.to_thread`) when latency matters.

Open, write, close and rename keep the interpreter lock (`common/lockedio.py`): with another
thread running Python a state file took 43 ms, each of its calls waiting to have the lock back;
12 ms now. fsync, which waits for the disk, still lets it go.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from pathlib import Path
from typing import Any

from pykubelet.common.lockedio import close_fd, open_fd, rename, write_all

DIR_MODE = 0o700
TMP_SUFFIX = ".tmp"
_PID = os.getpid()
_TMP_NUMBERS = itertools.count()  # next() on it is atomic under the GIL: safe across threads


class StateFileError(Exception):
    """A state file cannot be read or does not hold what it should; the caller logs and skips it."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"state file {path}: {problem}")
        self.path = path
        self.problem = problem


def ensure_dir(path: Path) -> None:
    """Create `path` and its missing parents with mode 0700 (existing ones are left alone)."""
    # mkdir's mode is filtered by the umask; 0700 survives any usual umask, and chmod-ing existing
    # directories (maybe the operator's --root-dir) is not ours to do.
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)


def fsync_dir(path: Path) -> None:
    fd = open_fd(str(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        close_fd(fd, str(path))


def is_temporary(name: str) -> bool:
    """Whether a directory entry is a leftover of an interrupted `write_json_many`."""
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


def write_json_many(items: list[tuple[Path, Any, Path | None, bool]]) -> list[OSError | None]:
    """Each `path` atomically replaced by its `data` as JSON, for each (path, data, then_remove,
    make_dir), with one fsync per directory for all the renames into it; once a file is durable
    its `then_remove` (if any) is deleted; with `make_dir` a missing directory is made first
    (`ensure_dir`). A callable `data` is called here (in the writer's thread) for the object;
    an OSError it raises is its item's error. Returns each item's error or None: one bad file
    does not fail the others (nor does a `then_remove` that cannot be deleted).

    The guarantee of the module: each file's content is fsynced before its rename, and the
    rename is durable (its directory fsynced) before this returns or its `then_remove` goes."""
    errors: list[OSError | None] = [None] * len(items)
    dirs: dict[str, list[int]] = {}
    for i, (path, data, _, make_dir) in enumerate(items):
        directory, name = os.path.split(path)
        try:
            if callable(data):
                data = data()
            if make_dir:
                # Mostly a new pod's: made first, rather than found missing by the write.
                try:
                    os.mkdir(directory, DIR_MODE)
                except FileExistsError:
                    pass
                except FileNotFoundError:
                    ensure_dir(Path(directory))
            _replace(directory, name, data)
        except OSError as e:
            errors[i] = e
            continue
        dirs.setdefault(directory, []).append(i)
    for directory, indexes in dirs.items():
        try:
            fsync_dir(Path(directory))
        except OSError as e:
            for i in indexes:
                errors[i] = e
    for i, (_, _, then_remove, _) in enumerate(items):
        if errors[i] is None and then_remove is not None:
            # The file is written: a leftover that cannot be deleted is the reader's to skip.
            with contextlib.suppress(OSError):
                remove(then_remove)
    return errors


def _replace(directory: str, name: str, data: Any) -> None:
    """The new content fsynced and renamed over `directory`/`name`; the directory is not
    fsynced. Strings, not Paths, and no mkstemp: this runs for every state file of a burst,
    and its Python holds the interpreter lock the event loop needs."""
    # One line, no indent: json's C encoder (with an indent it encodes in Python, the largest
    # share of a burst's state-file CPU).
    payload = json.dumps(data, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    # A name no other writer uses (this process's id and a counter), made 0600 with O_EXCL as
    # mkstemp would, in the same directory so that the rename is atomic.
    while True:
        tmp = os.path.join(directory, f".{name}.{_PID}.{next(_TMP_NUMBERS)}{TMP_SUFFIX}")
        try:
            fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:
            continue  # left by an earlier process that had this pid: the next number
    try:
        try:
            write_all(fd, payload, tmp)
            os.fsync(fd)
        finally:
            close_fd(fd, tmp)
        rename(tmp, os.path.join(directory, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`. Raises StateFileError if it is unreadable or not an object.

    A missing file raises FileNotFoundError instead, since callers usually treat it differently.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise StateFileError(path, f"cannot be read: {e.strerror or e}") from e
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StateFileError(path, f"is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise StateFileError(path, f"holds a JSON {type(data).__name__}, not an object")
    return data


def remove(path: Path) -> bool:
    """Delete `path` if it exists; whether it did."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
