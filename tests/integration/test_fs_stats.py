"""File systems in the Summary API on the real agent, once per runtime: a container writes
20 MiB into its writable layer (its /tmp, in the image's root: not a tmpfs in either engine)
and 1 MiB into an emptyDir, and logs a line; /stats/summary then shows the container's `rootfs`
(docker: Podman's SizeRw; remote: containerd's ContainerStats writable layer) and `logs`, the
pod's `volume` and `ephemeral-storage` holding them, and the node's `fs` (and `runtime.imageFs`
on the engines). The process runtime has no writable layer: its containers write to the host's
own file system, so only the volume, the logs and the node's file system are there.

`--housekeeping-interval=1s --volume-stats-agg-period=1s` make the collector sample and measure
the file systems every second (containerd measures the layers every second too:
scripts/containerd-test-env's stats_collect_period).

The writable layer also counts against `limits.ephemeral-storage`: a container filling its
layer past its limit has its pod evicted with the kubelet's message (docker only: the path is
the same for the others, and each such test waits for an eviction)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agent import Agent, Backend, pod_yaml, wait_for, write_pod
from tests.integration.test_kubelet_api import call

MiB = 1 << 20
Obj = dict[str, Any]


def _pod_stats(agent: Agent, name: str) -> Obj | None:
    status, body = call(agent, "/stats/summary")
    assert status == 200, body
    summary: Obj = json.loads(body)
    found = [p for p in summary["pods"] if p["podRef"]["name"].startswith(f"{name}-")]
    return {"node": summary["node"], **found[0]} if found else None


def test_the_summary_reports_writable_layers_logs_volumes_and_the_node_fs(
    start_agent: Callable[..., Agent], manifests: Path, backend: Backend
) -> None:
    engine = backend.engine is not None
    script = "dd if=/dev/zero of=/mnt/data bs=1M count=1 2>/dev/null; "
    if engine:
        script += "dd if=/dev/zero of=/tmp/fill bs=1M count=20 2>/dev/null; sync; "
    script += "echo written; " + backend.forever()
    write_pod(
        manifests,
        "disk",
        pod_yaml("disk", script, grace=1, extra_spec="  volumes: [{name: data, emptyDir: {}}]\n")
        + "    volumeMounts: [{name: data, mountPath: /mnt}]\n",
    )
    agent = start_agent(
        *backend.flags,
        "--housekeeping-interval=1s",
        "--volume-stats-agg-period=1s",
        "--anonymous-auth",
    )
    wait_for("the pod's line", lambda: "written" in agent.logs("disk", "main"), timeout=60)

    def measured() -> Obj | None:
        pod = _pod_stats(agent, "disk")
        if pod is None or not pod.get("containers"):
            return None
        main = pod["containers"][0]
        if (main.get("logs") or {}).get("usedBytes", 0) <= 0:
            return None
        if engine and (main.get("rootfs") or {}).get("usedBytes", 0) < 20 * MiB:
            return None
        return pod

    pod = wait_for("the file systems in the summary", measured, timeout=30, interval=0.5)
    node = pod["node"]
    fs = node["fs"]
    assert fs["capacityBytes"] >= fs["availableBytes"] > 0 and fs["usedBytes"] > 0
    assert fs["inodes"] >= fs["inodesFree"] > 0 and fs["inodesUsed"] > 0
    (volume,) = [v for v in pod["volume"] if v["name"] == "data"]
    assert volume["usedBytes"] >= MiB and volume["capacityBytes"] > 0
    main = pod["containers"][0]
    logs = main["logs"]["usedBytes"]
    ephemeral = pod["ephemeral-storage"]
    assert ephemeral["capacityBytes"] == fs["capacityBytes"]
    if engine:
        rootfs = main["rootfs"]
        assert rootfs["usedBytes"] >= 20 * MiB, rootfs
        assert rootfs["capacityBytes"] > 0  # the image file system's totals
        image_fs = node["runtime"]["imageFs"]
        assert image_fs["usedBytes"] > 0 and image_fs["capacityBytes"] > 0, image_fs
        assert ephemeral["usedBytes"] >= rootfs["usedBytes"] + logs + volume["usedBytes"]
    else:
        assert "rootfs" not in main and "runtime" not in node
        assert ephemeral["usedBytes"] >= logs + volume["usedBytes"]


@pytest.mark.parametrize(
    "backend", [pytest.param("docker", marks=pytest.mark.docker)], indirect=True
)
def test_a_writable_layer_past_the_ephemeral_storage_limit_evicts_the_pod(
    start_agent: Callable[..., Agent], manifests: Path, backend: Backend
) -> None:
    script = "dd if=/dev/zero of=/tmp/fill bs=1M count=20 2>/dev/null; " + backend.forever()
    write_pod(
        manifests,
        "hog",
        pod_yaml("hog", script, grace=1) + "    resources: {limits: {ephemeral-storage: 10Mi}}\n",
    )
    agent = start_agent(
        *backend.flags,
        "--housekeeping-interval=1s",
        "--volume-stats-agg-period=1s",
        "--eviction-monitoring-interval=1s",
    )
    pod = wait_for(
        "the pod evicted",
        lambda: (p := agent.pod("hog")) and p["status"].get("reason") == "Evicted" and p,
        timeout=40,
    )
    message = "Pod ephemeral local storage usage exceeds the total limit of containers 10Mi. "
    assert pod["status"]["phase"] == "Failed" and pod["status"]["message"] == message
    assert any(e["reason"] == "Evicted" for e in agent.events())
