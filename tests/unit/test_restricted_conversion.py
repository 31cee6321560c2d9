"""The restricted profile's fields as the docker and CRI runtimes put them in their requests."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from pykubelet.api.model import Pod
from pykubelet.runtime.base import ContainerConfig, StartError
from pykubelet.runtime.cri.convert import container_config, sandbox_config
from pykubelet.runtime.cri.proto import cri_api_pb2 as api
from pykubelet.runtime.cri.security import (
    DEFAULT_MASKED_PATHS,
    DEFAULT_READONLY_PATHS,
    apply_container_security,
    apply_sandbox_security,
    image_user,
)
from pykubelet.runtime.docker.convert import container_body, sandbox_body
from pykubelet.runtime.docker.security import read_seccomp, seccomp_file


def make_pod(**spec: Any) -> Pod:
    return Pod.model_validate(
        {
            "metadata": {"name": "p", "namespace": "default", "uid": uuid.uuid4().hex},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec},
        }
    )


def config(**fields: Any) -> ContainerConfig:
    base = ContainerConfig(
        name="c", image="busybox", command=[], args=[], env=[], working_dir=None, attempt=0,
        spec_hash="h", image_pull_policy="Never",
    )  # fmt: skip
    return dataclasses.replace(base, **fields)


RESTRICTED = {
    "no_new_privileges": True,
    "capabilities_drop": ["ALL"],
    "capabilities_add": ["NET_BIND_SERVICE"],
    "seccomp": "RuntimeDefault",
}


def test_docker_host_config() -> None:
    host = container_body(make_pod(), "sb", config(**RESTRICTED), podman=True)["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and host["CapAdd"] == ["NET_BIND_SERVICE"]
    assert host["SecurityOpt"] == ["no-new-privileges"]  # RuntimeDefault: the engine's own
    plain = container_body(make_pod(), "sb", config(), podman=True)["HostConfig"]
    assert plain["SecurityOpt"] == ["seccomp=unconfined"]  # the kubelet's default
    assert "CapAdd" not in plain and "CapDrop" not in plain
    unmasked = container_body(make_pod(), "sb", config(proc_mount_unmasked=True), podman=True)
    assert "unmask=ALL" in unmasked["HostConfig"]["SecurityOpt"]
    with pytest.raises(StartError, match=r"securityContext\.procMount: Unmasked"):
        container_body(make_pod(), "sb", config(proc_mount_unmasked=True), podman=False)
    groups = container_body(make_pod(), "sb", config(supplemental_groups=[2000, 4000]), podman=True)
    assert groups["HostConfig"]["GroupAdd"] == ["2000", "4000"]


def test_docker_sandbox_sysctls() -> None:
    pod = make_pod(securityContext={"sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}]})
    assert sandbox_body(pod, "pause", 0)["HostConfig"]["Sysctls"] == {
        "net.ipv4.tcp_syncookies": "1"
    }
    assert "Sysctls" not in sandbox_body(make_pod(), "pause", 0)["HostConfig"]


def test_docker_localhost_profile(tmp_path: Path) -> None:
    local = config(seccomp="Localhost", seccomp_localhost_profile="a/b.json")
    path = seccomp_file(local, tmp_path)
    assert path == tmp_path / "seccomp" / "a" / "b.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"defaultAction": "SCMP_ACT_ALLOW"}))
    assert read_seccomp(path, podman=True) == f"seccomp={path}"
    assert read_seccomp(path, podman=False) == 'seccomp={"defaultAction": "SCMP_ACT_ALLOW"}'
    path.write_text("not json")
    with pytest.raises(StartError, match="is not a JSON seccomp profile"):
        read_seccomp(path, podman=True)
    assert seccomp_file(config(seccomp="RuntimeDefault"), tmp_path) is None


def cri_security(tmp_path: Path, **fields: Any) -> Any:
    request = container_config(make_pod(), config(**fields), 1 << 30)
    apply_container_security(request.linux.security_context, config(**fields), tmp_path)
    return request.linux.security_context


def test_cri_container_security(tmp_path: Path) -> None:
    sc = cri_security(tmp_path, **RESTRICTED)
    assert list(sc.capabilities.drop_capabilities) == ["ALL"]
    assert list(sc.capabilities.add_capabilities) == ["NET_BIND_SERVICE"]
    assert sc.no_new_privs
    assert sc.seccomp.profile_type == api.SecurityProfile.RuntimeDefault
    assert tuple(sc.masked_paths) == DEFAULT_MASKED_PATHS
    assert tuple(sc.readonly_paths) == DEFAULT_READONLY_PATHS
    plain = cri_security(tmp_path)
    assert (
        plain.HasField("seccomp") and plain.seccomp.profile_type == api.SecurityProfile.Unconfined
    )
    assert not plain.HasField("capabilities") and not plain.no_new_privs
    local = cri_security(tmp_path, seccomp="Localhost", seccomp_localhost_profile="x.json")
    assert local.seccomp.profile_type == api.SecurityProfile.Localhost
    assert local.seccomp.localhost_ref == str(tmp_path / "seccomp" / "x.json")
    unmasked = cri_security(tmp_path, proc_mount_unmasked=True)
    assert list(unmasked.masked_paths) == [] and list(unmasked.readonly_paths) == []


def test_cri_sandbox_sysctls_and_seccomp(tmp_path: Path) -> None:
    pod = make_pod(
        securityContext={
            "sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}],
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    )
    sandbox = sandbox_config(pod, 0, "/logs")
    apply_sandbox_security(sandbox.linux, pod, tmp_path)
    assert dict(sandbox.linux.sysctls) == {"kernel.shm_rmid_forced": "1"}
    assert sandbox.linux.security_context.seccomp.profile_type == api.SecurityProfile.RuntimeDefault


def test_cri_image_user() -> None:
    assert image_user(api.Image(id="x")) == (None, "")
    with_uid = api.Image(id="x")
    with_uid.uid.value = 0
    assert image_user(with_uid) == (0, "")
    assert image_user(api.Image(id="x", username="app")) == (None, "app")
