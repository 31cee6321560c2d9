"""The restricted profile's fields: decoded and validated as the API server does, merged into a
container's effective security context, and sysctls admitted as the kubelet's allowlist does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pykubelet.api.decode import decode_pod
from pykubelet.api.errors import ManifestError
from pykubelet.api.model import Pod
from pykubelet.api.security import image_user, to_dots, verify_run_as_non_root
from pykubelet.cmd import config_file
from pykubelet.cmd.cli import parse_options
from pykubelet.kubelet.admission import NodeUsage
from pykubelet.kubelet.sysctls import SysctlAllowlist
from pykubelet.pod.security import SecurityError, security_fields


def manifest(pod_ctx: dict[str, Any] | None = None, ctx: dict[str, Any] | None = None,
             **spec: Any) -> bytes:  # fmt: skip
    container: dict[str, Any] = {"name": "c", "image": "busybox"}
    if ctx is not None:
        container["securityContext"] = ctx
    body: dict[str, Any] = {"containers": [container], **spec}
    if pod_ctx is not None:
        body["securityContext"] = pod_ctx
    return json.dumps(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": body}
    ).encode()


def decode(pod_ctx: dict[str, Any] | None = None, ctx: dict[str, Any] | None = None,
           **spec: Any) -> Pod:  # fmt: skip
    return decode_pod(manifest(pod_ctx, ctx, **spec), "p.json")


def errors_of(pod_ctx: dict[str, Any] | None = None, ctx: dict[str, Any] | None = None,
              **spec: Any) -> str:  # fmt: skip
    with pytest.raises(ManifestError) as info:
        decode(pod_ctx, ctx, **spec)
    return str(info.value)


RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def test_the_restricted_profile_decodes() -> None:
    pod = decode(
        {"fsGroup": 2000, "fsGroupChangePolicy": "OnRootMismatch", "runAsUser": 1000},
        {**RESTRICTED, "procMount": "Default"},
    )
    sec = security_fields(pod, pod.spec.containers[0])
    assert sec.no_new_privileges
    assert sec.capabilities_drop == ["ALL"]
    assert sec.capabilities_add == ["NET_BIND_SERVICE"]
    assert sec.seccomp == "RuntimeDefault"
    assert sec.run_as_user == 1000 and sec.run_as_non_root
    assert sec.supplemental_groups == [2000]
    assert not sec.proc_mount_unmasked


@pytest.mark.parametrize(
    ("pod_ctx", "ctx", "expected"),
    [
        (
            None,
            {"allowPrivilegeEscalation": False, "privileged": True},
            "spec.containers[0].securityContext: cannot set `allowPrivilegeEscalation` to false "
            "and `privileged` to true",
        ),
        (
            None,
            {"allowPrivilegeEscalation": False, "capabilities": {"add": ["CAP_SYS_ADMIN"]}},
            "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN",
        ),
        (
            None,
            {"seccompProfile": {"type": "Localhost"}},
            "seccompProfile.localhostProfile: must be set when seccomp type is Localhost",
        ),
        (
            None,
            {"seccompProfile": {"type": "RuntimeDefault", "localhostProfile": "a.json"}},
            "seccompProfile.localhostProfile: can only be set when seccomp type is Localhost",
        ),
        (
            {"seccompProfile": {"type": "Localhost", "localhostProfile": "/etc/a.json"}},
            None,
            "spec.securityContext.seccompProfile.localhostProfile: invalid value '/etc/a.json': "
            "must be a relative path",
        ),
        (
            {"seccompProfile": {"type": "Localhost", "localhostProfile": "../a.json"}},
            None,
            "must not contain '..'",
        ),
        (None, {"seccompProfile": {"type": "Nope"}}, "seccompProfile.type: unsupported value"),
        (None, {"procMount": "Masked"}, "procMount: unsupported value 'Masked'"),
        (
            {"fsGroupChangePolicy": "Sometimes"},
            None,
            "spec.securityContext.fsGroupChangePolicy: unsupported value 'Sometimes'",
        ),
        (
            {"fsGroup": -1},
            None,
            "spec.securityContext.fsGroup: invalid value -1: must be between 0 and 2147483647",
        ),
        (
            {"sysctls": [{"name": "Net.Bad", "value": "1"}]},
            None,
            "spec.securityContext.sysctls[0].name: invalid value 'Net.Bad': must have at most "
            "253 characters and match regex",
        ),
        (
            {"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}] * 2},
            None,
            "spec.securityContext.sysctls[1].name: duplicate value 'kernel.shm_rmid_forced'",
        ),
    ],
)
def test_invalid_as_the_api_server_says(
    pod_ctx: dict[str, Any] | None, ctx: dict[str, Any] | None, expected: str
) -> None:
    assert expected in errors_of(pod_ctx, ctx)


def test_net_sysctls_are_invalid_with_host_network() -> None:
    err = errors_of(
        {"sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}]}, None, hostNetwork=True
    )
    assert "may not be specified when 'hostNetwork' is true" in err


def test_the_container_overrides_the_pods_seccomp_and_fs_group_comes_first() -> None:
    pod = decode(
        {
            "seccompProfile": {"type": "RuntimeDefault"},
            "fsGroup": 2000,
            "supplementalGroups": [3000, 2000],
        },
        {"seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/audit.json"}},
    )
    sec = security_fields(pod, pod.spec.containers[0])
    assert (sec.seccomp, sec.seccomp_localhost_profile) == ("Localhost", "profiles/audit.json")
    assert sec.supplemental_groups == [2000, 3000]
    bare = decode({"seccompProfile": {"type": "Unconfined"}}, {})
    assert security_fields(bare, bare.spec.containers[0]).seccomp == "Unconfined"
    none = decode()
    assert security_fields(none, none.spec.containers[0]).seccomp == ""


def test_capability_names_with_or_without_the_prefix() -> None:
    pod = decode(None, {"capabilities": {"add": ["cap_net_admin", "SYS_TIME"], "drop": ["all"]}})
    sec = security_fields(pod, pod.spec.containers[0])
    assert sec.capabilities_add == ["NET_ADMIN", "SYS_TIME"]
    assert sec.capabilities_drop == ["ALL"]
    bad = decode(None, {"capabilities": {"add": ["NET_WIZARD"]}})
    with pytest.raises(SecurityError, match=r"capabilities.add\[0\]: 'NET_WIZARD' is not a Linux"):
        security_fields(bad, bad.spec.containers[0])


def test_run_as_non_root_with_root_user_names_the_pod() -> None:
    pod = decode({"runAsUser": 0}, {"runAsNonRoot": True})
    with pytest.raises(SecurityError, match=r"container's runAsUser breaks non-root policy \(pod"):
        security_fields(pod, pod.spec.containers[0])


def test_the_image_user_against_run_as_non_root() -> None:
    pod = decode()
    assert image_user("") == (None, "")
    assert image_user("1000:1000") == (1000, "")
    assert image_user("nobody:nogroup") == (None, "nobody")
    root = verify_run_as_non_root(pod, "c", None, "")
    assert root is not None and root.startswith("container has runAsNonRoot and image will run")
    assert verify_run_as_non_root(pod, "c", 0, "") == root
    named = verify_run_as_non_root(pod, "c", None, "nobody")
    assert named is not None
    assert "image has non-numeric user (nobody), cannot verify user is non-root" in named
    assert verify_run_as_non_root(pod, "c", 65534, "") is None


def sysctl_pod(*names: str, host_network: bool = False) -> Pod:
    return decode(
        {"sysctls": [{"name": n, "value": "1"} for n in names]}, None, hostNetwork=host_network
    )


def test_sysctl_admission_safe_set_and_allowed_unsafe() -> None:
    safe = SysctlAllowlist([])
    assert safe.admit(sysctl_pod("net.ipv4.tcp_keepalive_time"), {}, NodeUsage()).admit
    refused = safe.admit(sysctl_pod("net.core.somaxconn"), {}, NodeUsage())
    assert (refused.admit, refused.reason) == (False, "SysctlForbidden")
    assert refused.message == 'forbidden sysctl: "net.core.somaxconn" not allowlisted'
    unsafe = SysctlAllowlist(["net.core.*", "kernel.msgmax"])
    assert unsafe.admit(sysctl_pod("net.core.somaxconn", "kernel.msgmax"), {}, NodeUsage()).admit
    assert to_dots("net/ipv4/conf/eno2.100/rp_filter") == "net.ipv4.conf.eno2/100.rp_filter"


def test_allowed_unsafe_sysctls_flag_and_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    opts = parse_options(["--allowed-unsafe-sysctls", "net.core.*,kernel.msgmax"])
    assert opts.allowed_unsafe_sysctls == ["net.core.*", "kernel.msgmax"]
    assert opts.kubelet_configuration()["allowedUnsafeSysctls"] == ["net.core.*", "kernel.msgmax"]
    with pytest.raises(SystemExit):
        parse_options(["--allowed-unsafe-sysctls", "vm.swappiness"])
    assert "the sysctl 'vm.swappiness' are not known to be namespaced" in capsys.readouterr().err
    path = tmp_path / "config.yaml"
    path.write_text(config_file.dump({"allowedUnsafeSysctls": ["net.ipv4.tcp_mem", "fs.mqueue.*"]}))
    opts = parse_options(["--config", str(path)])
    assert opts.allowed_unsafe_sysctls == ["net.ipv4.tcp_mem", "fs.mqueue.*"]
