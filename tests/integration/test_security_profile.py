"""The security context through the whole agent, on each runtime: the Kubernetes
documentation's example ("Configure a Security Context for a Pod or Container":
runAsUser 1000, runAsGroup 3000, fsGroup 2000, supplementalGroups 4000, allowPrivilegeEscalation
false, an emptyDir at /data/demo) runs as its page says; a pod of the Pod Security "restricted"
profile is enforced (or refused naming the field where the runtime cannot); runAsNonRoot
against an image that runs as root, and a sysctl outside the safe set, are refused with the
kubelet's reasons. All checked through /pods and the container logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.agent import Agent, Backend, container_state, wait_for, write_pod

STATUS = "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status"


def pods(backend: Backend) -> dict[str, str]:
    forever = backend.forever()
    # The process runtime binds volumes at their path on the host's tree: keep it to /srv.
    demo = "/data/demo" if backend.engine is not None else "/srv/demo"
    script = (
        f"echo hello > {demo}/testfile; id -u; id -g; id -G; "
        f"stat -c '%g %a' {demo} {demo}/testfile; {STATUS}; {forever}"
    )
    return {
        "security-context-demo": f"""
spec:
  securityContext:
    runAsUser: 1000
    runAsGroup: 3000
    fsGroup: 2000
    supplementalGroups: [4000]
  volumes:
  - name: sec-ctx-vol
    emptyDir: {{}}
  containers:
  - name: sec-ctx-demo
    image: busybox:test
    command: [sh, -c, {json.dumps(script)}]
    volumeMounts:
    - name: sec-ctx-vol
      mountPath: {demo}
    securityContext:
      allowPrivilegeEscalation: false
""",
        "restricted": f"""
spec:
  securityContext:
    runAsNonRoot: true
    runAsUser: 1000
    seccompProfile: {{type: RuntimeDefault}}
  containers:
  - name: app
    image: busybox:test
    command: [sh, -c, {json.dumps(STATUS + "; " + forever)}]
    securityContext:
      allowPrivilegeEscalation: false
      capabilities: {{drop: [ALL]}}
""",
        "root-image": f"""
spec:
  containers:
  - name: app
    image: busybox:test
    command: [sh, -c, {json.dumps(forever)}]
    securityContext: {{runAsNonRoot: true}}
""",
        "unsafe-sysctl": f"""
spec:
  securityContext:
    sysctls: [{{name: net.core.somaxconn, value: "1024"}}]
  containers:
  - name: app
    image: busybox:test
    command: [sh, -c, {json.dumps(forever)}]
""",
    }


def status(log: str) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in log.splitlines() if ":\t" in line)


def waiting(agent: Agent, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        state = container_state(agent.pod(name))["state"]
        found: dict[str, Any] | None = state.get("waiting")
        return found if found and found.get("reason") != "ContainerCreating" else None

    return wait_for(f"{name} waiting with a reason", check, timeout=60)  # type: ignore[no-any-return]


def log_of(agent: Agent, name: str, container: str, lines: int) -> list[str]:
    def check() -> list[str] | None:
        out = agent.logs(name, container).strip().splitlines()
        return out if len(out) >= lines else None

    return wait_for(f"{name}/{container} log", check, timeout=60)  # type: ignore[no-any-return]


def test_the_security_context_example_and_the_restricted_profile(
    start_agent: Any, manifests: Path, backend: Backend
) -> None:
    for name, body in pods(backend).items():
        text = f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n" + body.lstrip("\n")
        write_pod(manifests, name, text)
    agent = start_agent(*backend.flags)

    # The documentation's example: uid 1000, gid 3000, groups 2000 (fsGroup) and 4000; the
    # volume is group 2000 with setgid, so the file written there is group 2000 too.
    out = log_of(agent, "security-context-demo", "sec-ctx-demo", 8)
    assert out[:2] == ["1000", "3000"]
    assert set(out[2].split()) == {"3000", "2000", "4000"}
    assert out[3] == "2000 2777" and out[4].split()[0] == "2000"
    assert status("\n".join(out))["NoNewPrivs"] == "1"

    # The restricted profile: no capabilities, no new privileges, the runtime's seccomp filter.
    if backend.engine is not None:
        st = status("\n".join(log_of(agent, "restricted", "app", 3)))
        assert st == {"CapEff": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}
    else:
        refused = waiting(agent, "restricted")
        assert refused["reason"] == "CreateContainerConfigError"
        assert (
            "securityContext.seccompProfile: RuntimeDefault is not supported" in refused["message"]
        )

    # runAsNonRoot with an image (or, for processes, an agent) that runs as root.
    root = waiting(agent, "root-image")
    assert root["reason"] == "CreateContainerConfigError"
    assert root["message"].startswith("container has runAsNonRoot and image will run as root")

    # A sysctl outside the safe set: rejected at admission.
    rejected = wait_for(
        "unsafe-sysctl rejected",
        lambda: (p := agent.pod("unsafe-sysctl")) and p["status"].get("phase") == "Failed" and p,
    )
    assert rejected["status"]["reason"] == "SysctlForbidden"
    assert 'forbidden sysctl: "net.core.somaxconn" not allowlisted' in rejected["status"]["message"]
