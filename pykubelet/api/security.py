"""The security context of the Pod Security "restricted" profile: what the API server checks
(pkg/apis/core/validation), and the facts about its fields the kubelet and the runtimes share
(capability names, which namespace a sysctl belongs to, the kubelet's safe sysctls).

Pure: no I/O. `validate_container_security` and `validate_pod_security` return every error at
once, with the API server's messages where it has one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pykubelet.api.errors import FieldError
from pykubelet.api.model import Pod, PodSecurityContext, SeccompProfile, SecurityContext

MAX_ID = 2**31 - 1

# The API server's sysctl name: dot- or slash-separated segments, at most 253 characters.
SYSCTL_SEGMENT = r"[a-z0-9]([-_a-z0-9]*[a-z0-9])?"
SYSCTL_FMT = rf"({SYSCTL_SEGMENT}[\./])*{SYSCTL_SEGMENT}"
SYSCTL_MAX_LENGTH = 253
_SYSCTL_NAME = re.compile(rf"^{SYSCTL_FMT}$")
# An allowlist pattern (--allowed-unsafe-sysctls): a name, or a prefix ending in "*".
_SYSCTL_PATTERN = re.compile(rf"^({SYSCTL_SEGMENT}[\./])*({SYSCTL_SEGMENT}|\*)$")

# The kubelet's safe sysctls (pkg/kubelet/sysctl/safe_sysctls.go, 1.32): namespaced and without
# effect on other pods, so allowed without --allowed-unsafe-sysctls. The kubelet drops those
# newer than the node's kernel; the kernels pykubelet supports (5.x and later) have them all.
SAFE_SYSCTLS = (
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
)

# Linux capabilities (capability.h, up to CAP_CHECKPOINT_RESTORE = 40), by number.
CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
)  # fmt: skip
CAPABILITY_NUMBER = {name: number for number, name in enumerate(CAPABILITIES)}

# What containerd, CRI-O and Docker give a container that is not privileged (the kubelet adds
# and drops against this set).
DEFAULT_CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID",
    "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE",
)  # fmt: skip


def capability_name(name: str) -> str | None:
    """The bare name ("NET_ADMIN") of "NET_ADMIN", "CAP_NET_ADMIN" or "cap_net_admin"; "ALL"
    for ALL; None if it is no Linux capability."""
    upper = name.upper()
    if upper == "ALL":
        return "ALL"
    bare = upper.removeprefix("CAP_")
    return bare if bare in CAPABILITY_NUMBER else None


def namespaced_by(sysctl: str) -> str | None:
    """ "ipc" or "net" for a sysctl the kernel keeps per namespace, else None (the kubelet's
    utilsysctl.NamespacedBy); `sysctl` may be a prefix."""
    name = to_dots(sysctl)
    if name.startswith(("kernel.shm", "kernel.msg", "fs.mqueue.")) or name == "kernel.sem":
        return "ipc"
    if name.startswith("net."):
        return "net"
    return None


def to_dots(sysctl: str) -> str:
    """A sysctl name with '/' separators in the dotted form (the kubelet's
    ConvertSysctlVariableToDotsSeparator: "net/ipv4/conf/eno2.100" → "net.ipv4.conf.eno2/100")."""
    if "/" not in sysctl:
        return sysctl
    return ".".join(part.replace(".", "/") for part in sysctl.split("/"))


def sysctl_name_error(name: str) -> str | None:
    if len(name) > SYSCTL_MAX_LENGTH or not _SYSCTL_NAME.match(name):
        return (
            f"invalid value {name!r}: must have at most {SYSCTL_MAX_LENGTH} characters and "
            f"match regex {SYSCTL_FMT}"
        )
    return None


def sysctl_pattern_error(pattern: str) -> str | None:
    """Why an --allowed-unsafe-sysctls entry is refused (the kubelet's NewAllowlist), or None."""
    if len(pattern) > SYSCTL_MAX_LENGTH or not _SYSCTL_PATTERN.match(pattern):
        return (
            f"sysctl {pattern!r} must have at most {SYSCTL_MAX_LENGTH} characters and match "
            f"regex ({SYSCTL_SEGMENT}[\\./])*({SYSCTL_SEGMENT}|\\*)"
        )
    name = to_dots(pattern)
    if namespaced_by(name.removesuffix("*")) is None:
        which = "sysctls" if name.endswith("*") else "sysctl"
        return f"the {which} {name!r} are not known to be namespaced"
    return None


def _id_errors(value: int | None, where: str) -> list[FieldError]:
    if value is not None and not 0 <= value <= MAX_ID:
        return [FieldError(where, f"invalid value {value}: must be between 0 and {MAX_ID}")]
    return []


def _seccomp_errors(profile: SeccompProfile | None, where: str) -> list[FieldError]:
    if profile is None:
        return []
    at = f"{where}.localhostProfile"
    local = profile.localhost_profile
    if profile.type != "Localhost":
        if local is not None:
            return [FieldError(at, "can only be set when seccomp type is Localhost")]
        return []
    if local is None:
        return [FieldError(at, "must be set when seccomp type is Localhost")]
    if local.startswith("/"):
        return [FieldError(at, f"invalid value {local!r}: must be a relative path")]
    if ".." in local.split("/"):
        return [FieldError(at, f"invalid value {local!r}: must not contain '..'")]
    if not local:
        return [FieldError(at, "must be set when seccomp type is Localhost")]
    return []


def validate_container_security(ctx: SecurityContext, where: str) -> list[FieldError]:
    """A container's securityContext, as ValidateSecurityContext does."""
    errors = _id_errors(ctx.run_as_user, f"{where}.runAsUser")
    errors += _id_errors(ctx.run_as_group, f"{where}.runAsGroup")
    if ctx.run_as_non_root and ctx.run_as_user == 0:
        errors.append(
            FieldError(f"{where}.runAsUser", "runAsNonRoot is true: must not be 0 (root)")
        )
    if ctx.allow_privilege_escalation is False:
        if ctx.privileged:
            errors.append(
                FieldError(
                    where, "cannot set `allowPrivilegeEscalation` to false and `privileged` to true"
                )
            )
        added = ctx.capabilities.add if ctx.capabilities else None
        if added and "CAP_SYS_ADMIN" in added:
            errors.append(
                FieldError(
                    where,
                    "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` "
                    "CAP_SYS_ADMIN",
                )
            )
    errors += _seccomp_errors(ctx.seccomp_profile, f"{where}.seccompProfile")
    return errors


def validate_pod_security(
    ctx: PodSecurityContext, where: str, *, host_network: bool
) -> list[FieldError]:
    """The pod's securityContext, as ValidatePodSecurityContext does."""
    errors = _id_errors(ctx.run_as_user, f"{where}.runAsUser")
    errors += _id_errors(ctx.run_as_group, f"{where}.runAsGroup")
    errors += _id_errors(ctx.fs_group, f"{where}.fsGroup")
    if ctx.run_as_non_root and ctx.run_as_user == 0:
        errors.append(
            FieldError(f"{where}.runAsUser", "runAsNonRoot is true: must not be 0 (root)")
        )
    for k, gid in enumerate(ctx.supplemental_groups or []):
        errors += _id_errors(gid, f"{where}.supplementalGroups[{k}]")
    errors += _seccomp_errors(ctx.seccomp_profile, f"{where}.seccompProfile")
    seen: set[str] = set()
    for k, sysctl in enumerate(ctx.sysctls or []):
        at = f"{where}.sysctls[{k}].name"
        if not sysctl.name:
            errors.append(FieldError(at, "required"))
        elif err := sysctl_name_error(sysctl.name):
            errors.append(FieldError(at, err))
        elif sysctl.name in seen:
            errors.append(FieldError(at, f"duplicate value {sysctl.name!r}"))
        elif host_network and namespaced_by(sysctl.name) == "net":
            errors.append(
                FieldError(
                    at,
                    f"invalid value {sysctl.name!r}: may not be specified when 'hostNetwork' "
                    "is true",
                )
            )
        seen.add(sysctl.name)
    return errors


def capability_errors(names: Sequence[str] | None, where: str) -> list[str]:
    """The entries of capabilities.add/drop that name no Linux capability (the runtimes refuse
    them; the API server does not look)."""
    return [
        f"{where}[{k}]: {name!r} is not a Linux capability"
        for k, name in enumerate(names or [])
        if capability_name(name) is None
    ]


def pod_ref(pod: Pod) -> str:
    """The kubelet's format.Pod: "name_namespace(uid)", quoted as %q does."""
    meta = pod.metadata
    return f'"{meta.name}_{meta.namespace}({pod.uid})"'


def verify_run_as_non_root(pod: Pod, container: str, uid: int | None, username: str) -> str | None:
    """Why an image's user breaks runAsNonRoot (the kubelet's verifyRunAsNonRoot), or None.
    `uid`/`username`: the image's configured user, numeric or not; neither: root."""
    where = f"(pod: {pod_ref(pod)}, container: {container})"
    if uid is None and not username:
        uid = 0
    if uid == 0:
        return f"container has runAsNonRoot and image will run as root {where}"
    if uid is None:
        return (
            f"container has runAsNonRoot and image has non-numeric user ({username}), "
            f"cannot verify user is non-root {where}"
        )
    return None


def image_user(user: str) -> tuple[int | None, str]:
    """An image's `User` ("1000", "1000:1000", "app", "app:staff", "") as (uid, username),
    as containerd's getUserFromImage reads it."""
    name = user.split(":", 1)[0]
    if not name:
        return None, ""
    if name.isdigit():
        return int(name), ""
    return None, name
