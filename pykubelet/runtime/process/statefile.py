"""Small JSON state files that survive a crash of the agent or of the machine.

A file is either its old content or its new content, never a mix: the new content goes to a
temporary file in the same directory, is fsynced, renamed over the old one, and the directory is
fsynced so that the rename itself is durable. Files are 0600 and directories 0700 because state
and logs may hold secrets (environment values, command lines).

A file may also be written unsynced (`durable=False`): renamed into place all the same, so that
an agent that dies finds it (the page cache outlives the process), and made durable by a later
durable write into its directory that names it (`also_fsync`; statewriter.py keeps track). The
process runtime writes a sandbox record so: no process survives the machine, and until one of
its containers is recorded (durably, the sandbox record with it) a sandbox record lost with the
machine loses nothing the pod needs.

These functions block (fsync): call them from a thread (`asyncio.to_thread`) when latency matters.

The write, the close, the rename and the fsyncs' opens keep the interpreter lock
(`common/lockedio.py`): with another thread running Python a state file took 43 ms, each of its
calls waiting to have the lock back; 12 ms with them. The calls that make a new inode (the
temporary file's create, a pod directory's mkdir) let it go, as fsync does: they may wait long
on a disk (an ext4 without a journal scans past the inodes freed recently), and in a burst of
1,000 manifests they were a third of the lock's held time, the loop stalled behind them;
letting them go took the burst from 2.99 to 2.68 s (six rounds alternated, bench/HISTORY.md
session 22).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, NamedTuple

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


def _fsync(path: str, flags: int = 0) -> None:
    """fsync a file, or a directory with `flags` O_DIRECTORY."""
    fd = open_fd(path, os.O_RDONLY | os.O_CLOEXEC | flags)
    try:
        os.fsync(fd)
    finally:
        close_fd(fd, path)


def is_temporary(name: str) -> bool:
    """Whether a directory entry is a leftover of an interrupted `write_json_many`."""
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


class StateWrite(NamedTuple):
    """One file for `write_json_many`: `path` replaced by `data` (a callable is called in the
    writer's thread); then `then_remove` deleted; `make_dir`: its directory made if missing.
    `durable=False`: renamed into place unsynced (see `write_json_many`)."""

    path: Path
    data: Any
    then_remove: Path | None = None
    make_dir: bool = False
    durable: bool = True


def write_json_many(
    items: list[StateWrite],
    also_fsync: Collection[Path] = (),
    placed: Callable[[list[OSError | None]], None] | None = None,
) -> list[OSError | None]:
    """Each item's `path` atomically replaced by its `data` as JSON, with one fsync per
    directory for all the renames into it; once a file is durable its `then_remove` (if any) is
    deleted. An OSError of `data` is its item's error. Returns each item's error or None: one
    bad file does not fail the others (nor does a `then_remove` that cannot be deleted).

    The guarantee of the module: each durable file's content is fsynced before its rename, and
    the rename is durable (its directory fsynced) before this returns or its `then_remove` goes.
    A file written with `durable=False` is in place when this returns (an agent that dies then
    finds it) and becomes durable with a later durable write into its directory that names it
    in `also_fsync`: its content is fsynced before that directory is (one missing by then is
    skipped; one that cannot be fsynced fails that directory's items).

    The files written with `durable=False` are written first, and then `placed` (if any, and
    if there are such files) is called with the list of errors, whose entries for them are then
    final: their writers need not wait for the others' fsyncs."""
    errors: list[OSError | None] = [None] * len(items)
    dirs: dict[str, list[int]] = {}
    unsynced = [i for i, item in enumerate(items) if not item.durable]
    for i in unsynced:
        errors[i] = _write_one(items[i])
    if unsynced and placed is not None:
        placed(errors)
    for i, item in enumerate(items):
        if item.durable:
            errors[i] = _write_one(item)
            if errors[i] is None:
                dirs.setdefault(os.path.dirname(item.path), []).append(i)
    for path in also_fsync:
        indexes = dirs.get(str(path.parent))
        if indexes is None:
            continue
        try:
            _fsync(str(path))
        except FileNotFoundError:
            continue  # removed since (its pod's directory with it, most likely)
        except OSError as e:
            for i in indexes:
                errors[i] = e
    for directory, indexes in dirs.items():
        if all(errors[i] is not None for i in indexes):
            continue
        try:
            _fsync(directory, os.O_DIRECTORY)
        except OSError as e:
            for i in indexes:
                errors[i] = e
    for i, item in enumerate(items):
        if errors[i] is None and item.then_remove is not None:
            # The file is written: a leftover that cannot be deleted is the reader's to skip.
            with contextlib.suppress(OSError):
                remove(item.then_remove)
    return errors


def _write_one(item: StateWrite) -> OSError | None:
    """The item's file in place (fsynced if durable, its directory not); its error if any."""
    directory, name = os.path.split(item.path)
    try:
        data = item.data() if callable(item.data) else item.data
        if item.make_dir:
            # Mostly a new pod's: made first, rather than found missing by the write.
            try:
                os.mkdir(directory, DIR_MODE)  # a new inode: lets the lock go (above)
            except FileExistsError:
                pass
            except FileNotFoundError:
                ensure_dir(Path(directory))
        _replace(directory, name, data, item.durable)
    except OSError as e:
        return e
    return None


def _replace(directory: str, name: str, data: Any, sync: bool = True) -> None:
    """The new content (fsynced if `sync`) renamed over `directory`/`name`; the directory is
    not fsynced. Strings, not Paths, and no mkstemp: this runs for every state file of a burst,
    and its Python holds the interpreter lock the event loop needs."""
    # One line, no indent: json's C encoder (with an indent it encodes in Python, the largest
    # share of a burst's state-file CPU).
    payload = json.dumps(data, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    # A name no other writer uses (this process's id and a counter), made 0600 with O_EXCL as
    # mkstemp would, in the same directory so that the rename is atomic.
    while True:
        tmp = os.path.join(directory, f".{name}.{_PID}.{next(_TMP_NUMBERS)}{TMP_SUFFIX}")
        try:
            # `os`: a new inode lets the lock go (above).
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:
            continue  # left by an earlier process that had this pid: the next number
    try:
        try:
            write_all(fd, payload, tmp)
            if sync:
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
    except (FileNotFoundError, NotADirectoryError):  # NotADirectory: a parent is not one
        return False
    return True
