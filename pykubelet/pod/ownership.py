"""A volume owned by the pod's fsGroup, as the kubelet's SetVolumeOwnership
(pkg/volume/volume_linux.go) leaves it: every file and directory gets group fsGroup (lchown, so
symlinks themselves), files gain rw for owner and group (0660; 0440 on a read-only volume),
directories also setgid and the exec bits (0110), so what a container creates there belongs to
the group. Symlinks keep their mode (a chmod would reach their target).

With fsGroupChangePolicy OnRootMismatch the walk is skipped when the volume's root already has
the group, the bits and setgid (`requires_change`). Blocking: run it in a thread.
"""

from __future__ import annotations

import logging
import os
import stat

log = logging.getLogger(__name__)

RW_MASK = 0o660
RO_MASK = 0o440
EXEC_MASK = 0o110


def requires_change(root: str, gid: int, read_only: bool) -> bool:
    """Whether the root of a volume lacks what the walk would give it (OnRootMismatch)."""
    try:
        info = os.stat(root)
    except OSError:
        return True
    if info.st_gid != gid or not stat.S_ISDIR(info.st_mode):
        return True
    wanted = (RO_MASK if read_only else RW_MASK) | EXEC_MASK
    return (stat.S_IMODE(info.st_mode) & wanted) != wanted or not info.st_mode & stat.S_ISGID


def _change(path: str, gid: int, read_only: bool) -> None:
    try:
        os.lchown(path, -1, gid)
    except OSError as e:
        # As the kubelet: logged, and the walk goes on.
        log.warning("fsGroup: cannot change the group of %s: %s", path, e.strerror)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return
    mask = RO_MASK if read_only else RW_MASK
    if stat.S_ISDIR(info.st_mode):
        mask |= stat.S_ISGID | EXEC_MASK
    try:
        os.chmod(path, stat.S_IMODE(info.st_mode) | mask)
    except OSError as e:
        log.warning("fsGroup: cannot change the mode of %s: %s", path, e.strerror)


def set_volume_ownership(root: str, gid: int, *, read_only: bool, on_root_mismatch: bool) -> bool:
    """Give the volume at `root` to group `gid`; False if OnRootMismatch found nothing to do."""
    if on_root_mismatch and not requires_change(root, gid, read_only):
        log.debug("fsGroup: %s already owned by group %d, skipped", root, gid)
        return False
    _change(root, gid, read_only)
    for top, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            _change(os.path.join(top, name), gid, read_only)
    return True
