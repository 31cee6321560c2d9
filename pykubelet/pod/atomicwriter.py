"""A volume's files written as the kubelet's atomic writer writes them, so that a container never
sees half an update: the files go to a new timestamped directory, a `..data` symlink is swapped
to name it (a rename), each top-level entry is a symlink through `..data`, and the previous
directory goes after the swap.

The calls keep the interpreter lock (`common/lockedio.py`) but the directory listing: each call
of `os` lets it go and waits to have it back from the event loop. A service-account token volume
is about 30 calls, and in a burst of API pods the pool thread writing it waited for the loop
after each one, and made the loop switch to it as often. Its files are on a tmpfs (tokens,
Secrets: microseconds a call); a ConfigMap's on the disk, where a new inode takes longer.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time

from pykubelet.common import lockedio
from pykubelet.pod.ownership import set_volume_ownership

DATA_LINK = "..data"
_DATA_TMP = "..data_tmp"


def write_files(
    path: str, files: dict[str, tuple[bytes, int]], *, private: bool, group: int | None = None
) -> None:
    """`path` made to hold `files` (relative path -> (content, mode)), atomically. `private`:
    the directory is 0700, else 0755. `group`: the pod's fsGroup, given to the new files
    before they are swapped in (as the kubelet's atomic writer runs SetVolumeOwnership), so no
    reader sees them without."""
    lockedio.makedirs(path, 0o777)
    lockedio.chmod(path, 0o700 if private else 0o755)
    stamp_name = f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    stamp = os.path.join(path, stamp_name)
    lockedio.mkdir(stamp, 0o755)
    for rel, (content, mode) in files.items():
        target = os.path.join(stamp, rel)
        parent = os.path.dirname(target)
        if parent != stamp:
            lockedio.makedirs(parent, 0o777)
        fd = lockedio.open_fd(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            lockedio.write_all(fd, content, target)
            lockedio.fchmod(fd, mode, target)
        finally:
            lockedio.close_fd(fd, target)
    if group is not None:
        set_volume_ownership(stamp, group, read_only=True, on_root_mismatch=False)
    data_link = os.path.join(path, DATA_LINK)
    previous = lockedio.readlink(data_link) if lockedio.is_symlink(data_link) else None
    temp = os.path.join(path, _DATA_TMP)
    with contextlib.suppress(FileNotFoundError):
        lockedio.unlink(temp)
    lockedio.symlink(stamp_name, temp)
    lockedio.rename(temp, data_link)
    top = {rel.split("/", 1)[0] for rel in files}
    # The links of an earlier payload that this one no longer has go; there are none before
    # the first swap (a new volume's: its listing let the lock go for nothing).
    for entry in os.listdir(path) if previous is not None else ():
        if entry.startswith(".."):
            continue
        link = os.path.join(path, entry)
        if entry not in top and lockedio.is_symlink(link):
            lockedio.unlink(link)
    for name in top:
        link = os.path.join(path, name)
        if not lockedio.is_symlink(link):
            lockedio.symlink(f"{DATA_LINK}/{name}", link)
    if previous is not None and previous != stamp_name:
        shutil.rmtree(os.path.join(path, previous), ignore_errors=True)
