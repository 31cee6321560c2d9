"""Volumes end to end: what a pod sees in its mounts, what the node allows, what is removed."""

from __future__ import annotations

from pathlib import Path

from tests.integration.agent import Backend, container_state, wait_for, write_pod


def pod(name: str, volumes: str, mounts: str, script: str, extra: str = "") -> str:
    return f"""\
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  volumes: {volumes}
  containers:
  - name: main
    image: busybox:test
    command: [sh, -c, {script!r}]
    volumeMounts: {mounts}
{extra}"""


def test_host_paths_and_privileged_containers_need_the_nodes_consent(
    start_agent, manifests: Path, tmp_path: Path, backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "greeting").write_text("hello from the host\n")
    forever = backend.forever()
    write_pod(
        manifests,
        "reader",
        pod(
            "reader",
            f"[{{name: h, hostPath: {{path: {shared}, type: Directory}}}}]",
            "[{name: h, mountPath: /mnt, readOnly: true}]",
            f"cat /mnt/greeting; touch /mnt/x 2>/dev/null && echo writable || echo read-only; "
            f"{forever}",
        ),
    )
    write_pod(
        manifests,
        "outside",
        pod(
            "outside",
            "[{name: h, hostPath: {path: /etc}}]",
            "[{name: h, mountPath: /mnt}]",
            forever,
        ),
    )
    write_pod(
        manifests,
        "privileged",
        pod("privileged", "[]", "[]", forever, "    securityContext: {privileged: true}\n"),
    )
    agent = start_agent(*backend.flags, "--allowed-host-paths", str(shared))
    # All five words: the log may be read between cat's output and the touch's verdict.
    lines = wait_for(
        "reader output",
        lambda: (out := agent.logs("reader", "main").split()) and len(out) > 4 and out,
    )
    assert lines[:4] == ["hello", "from", "the", "host"]
    assert lines[4] == "read-only", lines
    refused = wait_for(
        "outside refused",
        lambda: (p := agent.pod("outside")) and p["status"].get("phase") == "Failed" and p,
    )
    assert refused["status"]["reason"] == "HostPathNotAllowed"
    assert (
        "spec.volumes[0].hostPath.path: /etc is not below --allowed-host-paths"
        in (refused["status"]["message"])
    )
    privileged = wait_for(
        "privileged refused",
        lambda: (p := agent.pod("privileged")) and p["status"].get("phase") == "Failed" and p,
    )
    assert privileged["status"]["reason"] == "PrivilegedNotAllowed"
    assert not (shared / "x").exists()


def test_empty_dir_over_its_size_limit_evicts_the_pod(
    start_agent, manifests: Path, tmp_path: Path, backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    write_pod(
        manifests,
        "filler",
        pod(
            "filler",
            "[{name: scratch, emptyDir: {sizeLimit: 1Mi}}]",
            "[{name: scratch, mountPath: /mnt}]",
            f"dd if=/dev/zero of=/mnt/fill bs=1k count=4096; {backend.forever()}",
        ),
    )
    agent = start_agent(*backend.flags)
    evicted = wait_for(
        "the pod evicted",
        lambda: (p := agent.pod("filler")) and p["status"].get("reason") == "Evicted" and p,
        timeout=40,
    )
    assert evicted["status"]["phase"] == "Failed"
    assert (
        evicted["status"]["message"]
        == 'Usage of EmptyDir volume "scratch" exceeds the limit "1Mi".'
    )
    wait_for(
        "its container stopped",
        lambda: "terminated" in container_state(agent.pod("filler"))["state"],
        timeout=40,
    )
    assert any(e["reason"] == "Evicted" for e in agent.events())


def test_volumes_go_with_their_pod(start_agent, manifests: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = write_pod(
        manifests,
        "scratch",
        pod(
            "scratch",
            "[{name: data, emptyDir: {}},"
            " {name: fast, emptyDir: {medium: Memory, sizeLimit: 1Mi}}]",
            "[{name: data, mountPath: /mnt}, {name: fast, mountPath: /media}]",
            "echo kept > /mnt/file; df -k /media | tail -1; exec sleep 600",
        ),
    )
    agent = start_agent()
    line = wait_for("df output", lambda: agent.logs("scratch", "main").strip())
    assert line.split()[1] == "1024"  # the Memory emptyDir is a tmpfs of sizeLimit
    pod_obj = agent.pod("scratch")
    assert pod_obj is not None
    uid = pod_obj["metadata"]["uid"]
    volumes = tmp_path / "root" / "pods" / uid / "volumes"
    assert (volumes / "kubernetes.io~empty-dir" / "data" / "file").read_text() == "kept\n"
    path.unlink()
    wait_for("the pod's volumes removed", lambda: not volumes.exists(), timeout=30)


def test_a_static_pod_may_not_reference_config_maps(start_agent, manifests: Path) -> None:  # type: ignore[no-untyped-def]
    write_pod(
        manifests,
        "cm",
        pod(
            "cm",
            "[{name: conf, configMap: {name: settings}}]",
            "[{name: conf, mountPath: /mnt}]",
            "exec sleep 600",
        ),
    )
    agent = start_agent()
    event = wait_for(
        "FailedValidation",
        lambda: [e for e in agent.events() if e["reason"] == "FailedValidation"],
    )[0]
    assert "cm.yaml: spec.volumes[0].configMap: a static pod may not reference" in event["message"]
    assert agent.pod("cm") is None
