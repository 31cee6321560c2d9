"""Start bursts measured on a part of the disk the bench itself has not just churned.

On an ext4 without a journal (these machines' disk), each new inode is a scan past the inodes
freed lately in its block group (the kernel's `recently_deleted`: a minute, six while their
inode table block is dirty, which a burst of new files keeps it), so a file the agent makes
costs 5-50 times more right after the bench deleted the thousands of files of its last run
than on a node that has not (`bench.fscost` measures it; a journaled ext4 or xfs has no such
scan). The floor makes no files and does not see it, so the ratio would measure the bench's
own cleanup. Hence:

- `scratch(prefix)`: each measurement's directory is made under a parent marked as the top of
  a directory hierarchy (ext4's `chattr +T`), so that the allocator spreads them over the
  block groups as it does directories under / (by free inodes and directory counts), most
  likely away from the last run's freed inodes (not certainly: `bench.fscost` measures
  each run's directory, and the figure is printed beside its burst); elsewhere, or if the
  mark cannot be set, an ordinary directory;
- `scratch(prefix, defer=True)`: kept until the bursts it belongs to are done
  (`remove_deferred`), so that the floor's 1,000 manifests are not deleted just before the
  agent's burst.

The agent's own deletions within a run (its edits and deletes) are its own.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path

_deferred: list[Path] = []


@cache
def parent() -> Path:
    """Where the bench's directories go: a directory marked +T, if the file system has it."""
    path = Path(tempfile.gettempdir()) / "pykubelet-bench"
    path.mkdir(mode=0o700, exist_ok=True)
    with contextlib.suppress(OSError):
        subprocess.run(["chattr", "+T", str(path)], capture_output=True, check=False)
    return path


@contextlib.contextmanager
def scratch(prefix: str, *, defer: bool = False) -> Iterator[Path]:
    """A new directory under `parent()`, removed on exit (or, with `defer`, by
    `remove_deferred`)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent()))
    try:
        yield path
    finally:
        if defer:
            _deferred.append(path)
        else:
            shutil.rmtree(path, ignore_errors=True)


def remove_deferred() -> None:
    while _deferred:
        shutil.rmtree(_deferred.pop(), ignore_errors=True)
