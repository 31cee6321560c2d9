"""Volumes prepared on the real filesystem: emptyDir, hostPath, ConfigMap, Secret, downward API."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from pykubelet.api.model import Pod
from pykubelet.pod.envvars import Allocatable, ApiObjects
from pykubelet.pod.volumes import VolumeError, VolumeManager, host_path_allowed
from pykubelet.runtime.base import Mount

NODE = Allocatable(cpu=Fraction(4), memory=8 << 30, ephemeral_storage=100 << 30)
ROOT = os.geteuid() == 0


def pod(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]], **extra: Any) -> Pod:
    return Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "uid": "uid-vol",
                "labels": {"app": "web", "tier": 'fr"ont'},
            },
            "spec": {
                "volumes": volumes,
                "containers": [
                    {
                        "name": "c",
                        "image": "i",
                        "volumeMounts": mounts,
                        "resources": {"limits": {"memory": "64Mi"}},
                        **extra,
                    }
                ],
            },
        }
    )


@pytest.fixture
def manager(tmp_path: Path) -> VolumeManager:
    return VolumeManager(tmp_path / "root", NODE, [str(tmp_path / "host")])


async def test_empty_dir_is_shared_writable_and_removed_with_the_pod(
    manager: VolumeManager, tmp_path: Path
) -> None:
    p = pod([{"name": "data", "emptyDir": {}}], [{"name": "data", "mountPath": "/data"}])
    paths = await manager.setup(p, ApiObjects())
    path = Path(paths["data"])
    assert path == tmp_path / "root/pods/uid-vol/volumes/kubernetes.io~empty-dir/data"
    assert path.is_dir() and path.stat().st_mode & 0o777 == 0o777
    (path / "kept").write_text("x")
    assert await manager.setup(p, ApiObjects()) == paths  # idempotent: data stays
    assert (path / "kept").read_text() == "x"
    mounts = await manager.container_mounts(p, p.spec.containers[0], paths)
    assert mounts == [Mount(str(path), "/data", False)]
    assert await manager.pod_uids() == ["uid-vol"]
    await manager.teardown("uid-vol")
    assert not (tmp_path / "root/pods/uid-vol").exists()


async def test_sub_path_is_created_inside_and_may_not_escape(
    manager: VolumeManager, tmp_path: Path
) -> None:
    p = pod(
        [{"name": "data", "emptyDir": {}}],
        [{"name": "data", "mountPath": "/cache", "subPath": "a/b", "readOnly": True}],
    )
    paths = await manager.setup(p, ApiObjects())
    mounts = await manager.container_mounts(p, p.spec.containers[0], paths)
    assert mounts == [Mount(paths["data"] + "/a/b", "/cache", True)]
    assert Path(paths["data"], "a/b").is_dir()
    # A link that a container planted in the volume must not lead a subPath out of it.
    os.symlink("/etc", Path(paths["data"], "out"))
    escaping = pod(
        [{"name": "data", "emptyDir": {}}],
        [{"name": "data", "mountPath": "/x", "subPath": "out"}],
    )
    with pytest.raises(VolumeError, match="outside the volume"):
        await manager.container_mounts(escaping, escaping.spec.containers[0], paths)
    # Nor may it make the agent create anything out there on its way.
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, Path(paths["data"], "link"))
    deeper = pod(
        [{"name": "data", "emptyDir": {}}],
        [{"name": "data", "mountPath": "/x", "subPath": "link/new/deeper"}],
    )
    with pytest.raises(VolumeError, match="outside the volume"):
        await manager.container_mounts(deeper, deeper.spec.containers[0], paths)
    assert os.listdir(outside) == []


async def test_sub_path_of_a_config_map_must_exist(manager: VolumeManager) -> None:
    p = pod(
        [{"name": "conf", "configMap": {"name": "app"}}],
        [{"name": "conf", "mountPath": "/etc/mode", "subPath": "mode"}],
    )
    objects = ApiObjects(config_maps={"app": {"mode": "fast"}})
    paths = await manager.setup(p, objects)
    [mount] = await manager.container_mounts(p, p.spec.containers[0], paths)
    assert Path(mount.host_path).read_text() == "fast" and mount.read_only
    missing = pod(
        [{"name": "conf", "configMap": {"name": "app"}}],
        [{"name": "conf", "mountPath": "/etc/x", "subPath": "later"}],
    )
    with pytest.raises(VolumeError, match='subPath "later" does not exist in volume "conf"'):
        await manager.container_mounts(missing, missing.spec.containers[0], paths)
    # The key appears later: the volume still updates (nothing was created in its place).
    objects.config_maps["app"] = {"mode": "fast", "later": "now"}
    await manager.setup(p, objects)
    assert Path(paths["conf"], "later").read_text() == "now"


async def test_config_map_files_are_written_atomically_and_updated(
    manager: VolumeManager,
) -> None:
    p = pod(
        [{"name": "conf", "configMap": {"name": "app"}}],
        [{"name": "conf", "mountPath": "/etc/app"}],
    )
    objects = ApiObjects(config_maps={"app": {"mode": "fast", "nested.conf": "a=1\n"}})
    paths = await manager.setup(p, objects)
    path = Path(paths["conf"])
    assert (path / "mode").read_text() == "fast"
    assert (path / "mode").is_symlink() and os.readlink(path / "mode") == "..data/mode"
    assert (path / "..data/mode").stat().st_mode & 0o777 == 0o644
    first = os.readlink(path / "..data")
    objects.config_maps["app"] = {"mode": "slow"}
    await manager.setup(p, objects)
    assert (path / "mode").read_text() == "slow"
    assert not (path / "nested.conf").exists()  # a key that went away goes
    assert os.readlink(path / "..data") != first and not (path / first).exists()
    # ConfigMap volumes are read-only, whatever the mount says.
    mounts = await manager.container_mounts(p, p.spec.containers[0], paths)
    assert mounts[0].read_only


async def test_config_map_items_modes_and_missing_objects(manager: VolumeManager) -> None:
    items = [{"key": "a", "path": "dir/renamed", "mode": 0o600}]
    p = pod(
        [{"name": "conf", "configMap": {"name": "app", "items": items, "defaultMode": 0o640}}],
        [],
    )
    paths = await manager.setup(p, ApiObjects(config_maps={"app": {"a": "1", "b": "2"}}))
    path = Path(paths["conf"])
    assert sorted(os.listdir(path / "..data")) == ["dir"]
    assert (path / "dir/renamed").read_text() == "1"
    assert (path / "dir/renamed").stat().st_mode & 0o777 == 0o600
    with pytest.raises(VolumeError, match='volume "conf": configmap app references non-existent'):
        await manager.setup(p, ApiObjects(config_maps={"app": {"b": "2"}}))
    with pytest.raises(VolumeError, match='configmap "app" not found'):
        await manager.setup(p, ApiObjects(config_maps={"app": None}))
    optional = pod([{"name": "conf", "configMap": {"name": "app", "optional": True}}], [])
    paths = await manager.setup(optional, ApiObjects(config_maps={"app": None}))
    assert os.listdir(Path(paths["conf"], "..data")) == []


async def test_secret_volume(manager: VolumeManager) -> None:
    p = pod([{"name": "creds", "secret": {"secretName": "db", "defaultMode": 0o400}}], [])
    paths = await manager.setup(p, ApiObjects(secrets={"db": {"password": b"s3cr3t\x00"}}))
    path = Path(paths["creds"])
    assert (path / "password").read_bytes() == b"s3cr3t\x00"
    assert (path / "password").stat().st_mode & 0o777 == 0o400
    if ROOT:
        assert os.path.ismount(path)  # a tmpfs: a Secret never touches the disk
    await manager.teardown(p.uid)
    assert not path.exists()


async def test_downward_api_files(manager: VolumeManager) -> None:
    items = [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
        {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
        {
            "path": "mem",
            "resourceFieldRef": {
                "containerName": "c",
                "resource": "limits.memory",
                "divisor": "1Mi",
            },
        },
        {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu"}},
    ]
    p = pod([{"name": "info", "downwardAPI": {"items": items}}], [])
    path = Path((await manager.setup(p, ApiObjects()))["info"])
    assert (path / "labels").read_text() == 'app="web"\ntier="fr\\"ont"'
    assert (path / "name").read_text() == "p"
    assert (path / "app").read_text() == "web"
    assert (path / "mem").read_text() == "64"
    assert (path / "cpu").read_text() == "4"  # no limit: the node's allocatable


async def test_host_path_types_and_allowed_prefixes(manager: VolumeManager, tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    cases = [
        ({"path": str(host / "new"), "type": "DirectoryOrCreate"}, None),
        ({"path": str(host / "new")}, None),
        ({"path": str(host / "missing"), "type": "Directory"}, "does not exist"),
        ({"path": str(host / "new"), "type": "File"}, "is not a file"),
        ({"path": str(host / "f"), "type": "FileOrCreate"}, None),
        ({"path": str(host / "f"), "type": "Socket"}, "is not a socket file"),
    ]
    for source, problem in cases:
        p = pod([{"name": "h", "hostPath": source}], [])
        if problem is None:
            assert (await manager.setup(p, ApiObjects()))["h"] == source["path"]
        else:
            with pytest.raises(VolumeError, match=f"hostPath type check failed: .*{problem}"):
                await manager.setup(p, ApiObjects())
    assert (host / "new").is_dir() and (host / "f").is_file()
    # A link below an allowed prefix that leads elsewhere is refused.
    os.symlink("/etc", host / "etc")
    p = pod([{"name": "h", "hostPath": {"path": str(host / "etc")}}], [])
    with pytest.raises(VolumeError, match="outside --allowed-host-paths"):
        await manager.setup(p, ApiObjects())
    assert host_path_allowed("/var/log/app", ["/var/log"])
    assert not host_path_allowed("/var/logs", ["/var/log"])
    assert host_path_allowed("/anything", ["/"])
    assert not host_path_allowed("/var/log", [])


@pytest.mark.skipif(not ROOT, reason="a tmpfs mount needs root")
async def test_memory_empty_dir_is_a_sized_tmpfs(manager: VolumeManager) -> None:
    p = pod([{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}], [])
    path = Path((await manager.setup(p, ApiObjects()))["shm"])
    assert os.path.ismount(path)
    stats = os.statvfs(path)
    assert stats.f_blocks * stats.f_frsize == 1 << 20
    with pytest.raises(OSError, match="No space left"):
        (path / "big").write_bytes(b"x" * (2 << 20))
    await manager.teardown(p.uid)
    assert not os.path.ismount(path) and not path.exists()


async def test_size_limit_usage(manager: VolumeManager) -> None:
    p = pod([{"name": "data", "emptyDir": {"sizeLimit": "100Ki"}}], [])
    path = Path((await manager.setup(p, ApiObjects()))["data"])
    (path / "small").write_bytes(os.urandom(10_000))
    assert await manager.over_limit(p) == []
    (path / "sub").mkdir()
    (path / "sub/big").write_bytes(os.urandom(300_000))
    [exceeded] = await manager.over_limit(p)
    assert exceeded.volume == "data" and exceeded.used > 300_000 and exceeded.limit == "100Ki"


async def test_binary_data_of_a_config_map_is_written_as_is(manager: VolumeManager) -> None:
    p = pod([{"name": "conf", "configMap": {"name": "app"}}], [])
    blob = bytes(range(256))
    paths = await manager.setup(p, ApiObjects(config_maps={"app": {"text": "é", "blob": blob}}))
    assert Path(paths["conf"], "blob").read_bytes() == blob
    assert Path(paths["conf"], "text").read_text() == "é"
