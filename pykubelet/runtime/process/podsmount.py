"""The pods directory (`<root-dir>/pods`, where the pods' tmpfs volumes are mounted) as a mount
of its own, so that a container's launcher takes every pod's volume out of its new mount
namespace with one detach instead of one per volume.

Why: `unshare` copies every mount into the container's namespace, and the launcher must drop the
other pods' tmpfs volumes from its copy (they would keep their memory after the agent unmounts
them). One detach each made a start cost O(pods): at 1,000 pods with a service-account token
volume each, a launcher read 1,000 lines of mountinfo and detached 1,000 mounts, and a burst of
1,000 starts O(n^2). Below a mount of their own, the launcher detaches that one mount and its
whole subtree goes (`launcher.py`'s `_detach_pods`).

What it promises: at the runtime's start, as root, the directory is bound onto itself (private:
nothing mounted below it propagates anywhere) unless it is a mount point already (an earlier
run's) or something is mounted below it already (volumes of pods an earlier version left
mounted: a bind would hide them, so the launchers keep detaching one by one until they are
gone); at the runtime's close the bind it made goes again if nothing is mounted below it (with
--keep-pods-on-exit their volumes are, and it stays for the next run). These block
(mountinfo, mount(2)): call them in a thread.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from pathlib import Path

# The launcher's own mount calls and constants: the same mounts, seen from the agent.
from pykubelet.runtime.process.launcher import MNT_DETACH, MS_BIND, MS_PRIVATE, mount_points
from pykubelet.runtime.process.launcher import c_library as libc

log = logging.getLogger(__name__)


def make_pods_mount(pods_dir: Path) -> bool:
    """Bind `pods_dir` onto itself when it can be and is not a mount point yet; True if this
    call made it one (and `release_pods_mount` may undo it: a mount point found here, an
    earlier run's or the operator's own file system, is left alone)."""
    if os.geteuid() != 0:
        return False  # no tmpfs volumes without root, and no launcher mounts either
    os.makedirs(pods_dir, 0o700, exist_ok=True)
    path = os.path.realpath(pods_dir)
    points = mount_points()
    if path in points:
        return False
    below = [p for p in points if p.startswith(path + "/")]
    if below:
        log.info(
            "%s: %d volumes are mounted below it already; it becomes a mount of its own at a "
            "start of the agent after they are gone (until then each container start detaches "
            "them one by one)",
            path,
            len(below),
        )
        return False
    c = libc()
    target = os.fsencode(path)
    if c.mount(target, target, None, ctypes.c_ulong(MS_BIND), None) != 0:
        err = ctypes.get_errno()
        log.warning("cannot bind %s onto itself: %s", path, os.strerror(err))
        return False
    if c.mount(None, target, None, ctypes.c_ulong(MS_PRIVATE), None) != 0:
        err = ctypes.get_errno()
        log.warning("cannot make the mount %s private: %s", path, os.strerror(err))
    log.debug("%s bound onto itself: the launchers detach the pods' volumes at once", path)
    return True


def release_pods_mount(pods_dir: Path) -> None:
    """Undo `make_pods_mount` when nothing is mounted below the directory any more."""
    if os.geteuid() != 0:
        return
    path = os.path.realpath(pods_dir)
    points = mount_points()
    if path not in points or any(p.startswith(path + "/") for p in points):
        return
    if libc().umount2(os.fsencode(path), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            log.warning("cannot unmount %s: %s", path, os.strerror(err))
