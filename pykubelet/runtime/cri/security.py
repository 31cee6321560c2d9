"""The restricted profile's fields in CRI requests, as the kubelet's kuberuntime fills them:

- capabilities: LinuxContainerSecurityContext.capabilities, bare names ("NET_ADMIN", "ALL";
  the runtime adds the CAP_ prefix);
- allowPrivilegeEscalation false: no_new_privs;
- seccompProfile: a SecurityProfile, always sent (no profile: Unconfined, the kubelet's default
  without SeccompDefault); Localhost's localhost_ref is <root-dir>/seccomp/<localhostProfile>,
  as the kubelet's seccompProfileRoot; the sandbox gets the pod's profile;
- procMount: the kubelet's default masked and read-only paths for Default, none for Unmasked;
- sysctls: LinuxPodSandboxConfig.sysctls;
- the image's user (Image.uid / username of ImageStatus), for runAsNonRoot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pykubelet.api.model import Pod
from pykubelet.runtime.base import ContainerConfig
from pykubelet.runtime.cri.proto import cri_api_pb2 as api

SECCOMP_DIR = "seccomp"

# pkg/securitycontext/util.go: what the kubelet masks and makes read-only for procMount Default.
DEFAULT_MASKED_PATHS = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
DEFAULT_READONLY_PATHS = (
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
)

_PROFILE_TYPES = {
    "RuntimeDefault": api.SecurityProfile.RuntimeDefault,
    "Unconfined": api.SecurityProfile.Unconfined,
    "Localhost": api.SecurityProfile.Localhost,
}


def security_profile(kind: str, localhost_profile: str, root_dir: Path) -> Any:
    """The SecurityProfile of a seccompProfile type ("" for none: Unconfined)."""
    profile = api.SecurityProfile(
        profile_type=_PROFILE_TYPES.get(kind, api.SecurityProfile.Unconfined)
    )
    if kind == "Localhost":
        profile.localhost_ref = str(root_dir / SECCOMP_DIR / localhost_profile)
    return profile


def apply_container_security(security: Any, config: ContainerConfig, root_dir: Path) -> None:
    """Fill a LinuxContainerSecurityContext's restricted-profile fields from `config`."""
    if config.capabilities_add or config.capabilities_drop:
        security.capabilities.CopyFrom(
            api.Capability(
                add_capabilities=config.capabilities_add,
                drop_capabilities=config.capabilities_drop,
            )
        )
    security.no_new_privs = config.no_new_privileges
    security.seccomp.CopyFrom(
        security_profile(config.seccomp, config.seccomp_localhost_profile, root_dir)
    )
    if not config.proc_mount_unmasked:
        security.masked_paths.extend(DEFAULT_MASKED_PATHS)
        security.readonly_paths.extend(DEFAULT_READONLY_PATHS)


def apply_sandbox_security(linux: Any, pod: Pod, root_dir: Path) -> None:
    """Fill a LinuxPodSandboxConfig's sysctls and its sandbox's seccomp profile."""
    ctx = pod.spec.security_context
    if ctx is None:
        linux.security_context.seccomp.CopyFrom(security_profile("", "", root_dir))
        return
    for sysctl in ctx.sysctls or []:
        linux.sysctls[sysctl.name] = sysctl.value
    profile = ctx.seccomp_profile
    linux.security_context.seccomp.CopyFrom(
        security_profile(
            profile.type if profile else "",
            (profile.localhost_profile or "") if profile else "",
            root_dir,
        )
    )


def image_user(image: Any) -> tuple[int | None, str]:
    """The CRI Image's configured user: (uid, "") or (None, username); (None, "") if neither."""
    if image.HasField("uid"):
        return int(image.uid.value), ""
    return None, str(image.username)
