"""fsGroup on volumes, as the kubelet's SetVolumeOwnership: the group and the masks, setgid on
directories, OnRootMismatch skipping a root that already matches, hostPath never touched."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pykubelet.pod.envvars import ApiObjects
from pykubelet.pod.ownership import requires_change, set_volume_ownership
from pykubelet.pod.volumes import VolumeManager
from tests.unit.test_volumes import NODE, pod

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's group needs root")
GID = 2000


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_masks_and_setgid_on_a_tree(tmp_path: Path) -> None:
    root = tmp_path / "vol"
    (root / "sub").mkdir(parents=True)
    (root / "f").write_text("x")
    os.chmod(root / "f", 0o600)
    (root / "sub" / "g").write_text("y")
    os.chmod(root / "sub" / "g", 0o400)
    (root / "link").symlink_to("f")
    root.chmod(0o700)
    assert requires_change(str(root), GID, read_only=False)
    assert set_volume_ownership(str(root), GID, read_only=False, on_root_mismatch=False)
    assert {os.lstat(p).st_gid for p in (root, root / "f", root / "sub", root / "link")} == {GID}
    assert mode(root / "f") == 0o660 and mode(root / "sub" / "g") == 0o660
    assert mode(root) == 0o2770 and mode(root / "sub") == 0o2775
    assert not requires_change(str(root), GID, read_only=False)
    # OnRootMismatch: a matching root is not walked again.
    (root / "new").write_text("z")
    os.chmod(root / "new", 0o600)
    assert not set_volume_ownership(str(root), GID, read_only=False, on_root_mismatch=True)
    assert mode(root / "new") == 0o600  # not walked
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "k").write_text("v")
    os.chmod(ro / "k", 0o644)
    set_volume_ownership(str(ro), GID, read_only=True, on_root_mismatch=False)
    assert mode(ro / "k") == 0o644 and os.stat(ro / "k").st_gid == GID


async def test_the_pods_volumes_get_the_fs_group(tmp_path: Path) -> None:
    host = tmp_path / "host" / "h"
    host.mkdir(parents=True)
    manager = VolumeManager(tmp_path / "root", NODE, [str(tmp_path / "host")])
    base = pod(
        [
            {"name": "data", "emptyDir": {}},
            {"name": "conf", "configMap": {"name": "app", "defaultMode": 0o400}},
            {"name": "h", "hostPath": {"path": str(host)}},
        ],
        [],
    )
    p = base.model_validate(
        {
            **base.to_api(),
            "spec": {
                **base.to_api()["spec"],
                "securityContext": {"fsGroup": GID, "fsGroupChangePolicy": "OnRootMismatch"},
            },
        }
    )
    objects = ApiObjects(config_maps={"app": {"key": "value"}})
    paths = await manager.setup(p, objects)
    data, conf = Path(paths["data"]), Path(paths["conf"])
    assert os.stat(data).st_gid == GID and mode(data) == 0o2777
    (data / "made").write_text("x")  # a new file in a setgid directory: the group's
    assert os.stat(data / "made").st_gid == GID
    assert os.stat(conf / "key").st_gid == GID and mode(conf / "..data/key") == 0o440
    assert os.stat(host).st_gid != GID  # hostPath: never
    await manager.setup(p, objects)  # a second sync keeps setgid
    assert mode(data) == 0o2777
    objects.config_maps["app"] = {"key": "changed"}
    await manager.setup(p, objects)
    assert os.stat(conf / "key").st_gid == GID and (conf / "key").read_text() == "changed"
    await manager.teardown(p.uid)
