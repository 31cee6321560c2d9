"""What the process runtime can enforce of the restricted profile, and the refusals (naming the
field, CreateContainerConfigError) for the rest. Containers here are host processes, so:

- allowPrivilegeEscalation false: no_new_privs, set by the launcher (prctl);
- capabilities: the agent's own capabilities are the default set; drop ("ALL" or names) and
  add (only what the agent has) give the set the launcher keeps (bounding set, capset, and the
  ambient set for a user that is not root);
- fsGroup: a supplemental group (launcher) and the volumes' group (pod/ownership.py);
- seccompProfile Unconfined (and none) is what a host process has; RuntimeDefault and Localhost
  are refused: no well-kept Python binding of libseccomp is available to the agent;
- sysctls are refused: the pod shares the host's namespaces, a sysctl would be the host's;
- procMount: the host's /proc, unmasked, whatever the field says (it masks nothing);
- runAsNonRoot without runAsUser: the process runs as the agent's user, refused when that is
  root with the kubelet's message.
"""

from __future__ import annotations

import os

from pykubelet.api.model import Pod
from pykubelet.api.security import CAPABILITY_NUMBER, verify_run_as_non_root
from pykubelet.runtime.base import ContainerConfig, StartError

CONFIG_ERROR = "CreateContainerConfigError"


def check_pod(pod: Pod) -> None:
    ctx = pod.spec.security_context
    if ctx is not None and ctx.sysctls:
        raise StartError(
            CONFIG_ERROR,
            "spec.securityContext.sysctls: not supported by the process runtime (its pods "
            "share the host's network and IPC namespaces: a sysctl would be the host's)",
        )


def check_container(pod: Pod, config: ContainerConfig) -> None:
    if config.seccomp in ("RuntimeDefault", "Localhost"):
        raise StartError(
            CONFIG_ERROR,
            f"securityContext.seccompProfile: {config.seccomp} is not supported by the process "
            "runtime (no seccomp binding for the agent's Python); use Unconfined, or the "
            "docker or remote runtime",
        )
    if config.run_as_non_root and config.run_as_user is None:
        why = verify_run_as_non_root(pod, config.name, os.geteuid(), "")
        if why is not None:
            raise StartError(CONFIG_ERROR, why)


def kept_capabilities(config: ContainerConfig, agent_caps: int) -> list[int] | None:
    """The capability numbers the container keeps, None when it names none (the agent's set,
    dropped by the kernel as usual for a user that is not root)."""
    if not config.capabilities_add and not config.capabilities_drop:
        return None
    if config.privileged:
        return None
    have = {c for c in range(64) if agent_caps >> c & 1}
    if "ALL" in config.capabilities_drop:
        keep: set[int] = set()
    else:
        keep = have - {CAPABILITY_NUMBER[n] for n in config.capabilities_drop}
    for name in config.capabilities_add:
        numbers = have if name == "ALL" else {CAPABILITY_NUMBER[name]}
        missing = sorted(n for n, c in CAPABILITY_NUMBER.items() if c in numbers - have)
        if missing:
            raise StartError(
                CONFIG_ERROR,
                f"securityContext.capabilities.add: the agent itself lacks CAP_{missing[0]} "
                "(the process runtime can only keep what the agent has)",
            )
        keep |= numbers
    return sorted(keep)
