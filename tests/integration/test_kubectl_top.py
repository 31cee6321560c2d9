"""`kubectl top pod` and `kubectl top node` against a pykubelet node, end to end: the real agent in
cluster mode samples its pods (pykubelet/stats) and serves `/metrics/resource`; the fixture API
server, as metrics-server, scrapes it with its kubelet client certificate and serves
`metrics.k8s.io/v1beta1`; the real `kubectl` (1.32) reads it.

The pod is on the process runtime, with a memory limit, so that the runtime gives it cgroups of
its own; it holds 50 MiB and spins (a CPU limit of 500m keeps the machine usable). metrics-server
gives a CPU rate only from two kubelet samples (10 s apart), so the figures take up to ~30 s.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import Agent, wait_for
from tests.integration.kubelet_node import https_apiserver, start_kubelet_node
from tests.integration.test_cluster import KubeClient, running_in_api
from tests.integration.test_kubelet_api import call, kubectl

Obj = dict[str, Any]
NODE = "top-node"
MiB = 1 << 20
HELD_MIB = 50
# Up to two kubelet samples (10 s each) and a scrape, with room for a slow machine.
METRICS_TIMEOUT = 90.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
]

HOG = f"""
import time
held = bytearray({HELD_MIB} << 20)
for i in range(0, len(held), 4096):
    held[i] = 1
print("holding", len(held), flush=True)
while True:
    end = time.monotonic() + 0.05
    while time.monotonic() < end:
        pass
    time.sleep(0.01)
"""


@pytest.fixture
def metrics_apiserver() -> Iterator[ApiServer]:
    yield from https_apiserver()


@pytest.fixture
def top_node(
    metrics_apiserver: ApiServer, start_agent: Callable[..., Agent], tmp_path: Path
) -> tuple[Agent, KubeClient, Path]:
    return start_kubelet_node(metrics_apiserver, start_agent, tmp_path, NODE)


def hog_pod() -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hog", "labels": {"app": "hog"}},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": "python:test",
                    "command": [sys.executable, "-c", HOG],
                    # Limits: the process runtime gives the container cgroups of its own.
                    "resources": {"limits": {"memory": "256Mi", "cpu": "500m"}},
                }
            ],
        },
    }


def cpu_millis(text: str) -> float:
    if text.endswith("n"):
        return int(text[:-1]) / 1e6
    if text.endswith("m"):
        return float(text[:-1])
    return float(text) * 1000


def mebibytes(text: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    for suffix, scale in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return int(text) / MiB


def table(out: str) -> list[list[str]]:
    return [line.split() for line in out.strip().splitlines()]


def top(kubeconfig: Path, *args: str) -> list[list[str]] | None:
    """The rows of `kubectl top ...` once it answers; None while metrics are not ready."""
    result = kubectl(kubeconfig, "top", *args)
    if result.returncode != 0:
        assert "metrics not available yet" in result.stderr or "not found" in result.stderr, (
            result.stderr
        )
        return None
    rows = table(result.stdout)
    return rows if len(rows) > 1 else None


def test_kubectl_top_pod_and_node(
    top_node: tuple[Agent, KubeClient, Path], metrics_apiserver: ApiServer
) -> None:
    agent, client, kubeconfig = top_node
    client.create_pod(hog_pod())
    wait_for("the pod running", lambda: running_in_api(client, "hog"), timeout=30)

    # Discovery first: kubectl top needs metrics.k8s.io among the groups.
    result = kubectl(kubeconfig, "api-versions")
    assert result.returncode == 0, result.stderr
    assert "metrics.k8s.io/v1beta1" in result.stdout.split()
    result = kubectl(kubeconfig, "api-resources", "--api-group", "metrics.k8s.io")
    assert result.returncode == 0, result.stderr
    assert {row[0] for row in table(result.stdout)[1:]} == {"nodes", "pods"}

    rows = wait_for(
        "kubectl top pod to show the pod",
        lambda: top(kubeconfig, "pod", "hog"),
        timeout=METRICS_TIMEOUT,
        interval=1.0,
    )
    assert rows[0] == ["NAME", "CPU(cores)", "MEMORY(bytes)"]
    name, cpu, memory = rows[1]
    assert name == "hog"
    assert 0 < cpu_millis(cpu) <= 700, rows  # spinning under a 500m limit
    assert HELD_MIB <= mebibytes(memory) <= HELD_MIB + 70, rows  # what it holds, and Python

    rows = wait_for("kubectl top pod (all)", lambda: top(kubeconfig, "pod"), timeout=20)
    assert [r[0] for r in rows[1:]] == ["hog"]
    rows = wait_for(
        "kubectl top pod --containers",
        lambda: top(kubeconfig, "pod", "hog", "--containers"),
        timeout=20,
    )
    assert rows[1][:2] == ["hog", "main"]
    rows = wait_for("kubectl top pod -A", lambda: top(kubeconfig, "pod", "-A"), timeout=20)
    assert rows[1][:2] == ["default", "hog"]

    rows = wait_for(
        "kubectl top node to show the node",
        lambda: top(kubeconfig, "node"),
        timeout=METRICS_TIMEOUT,
        interval=1.0,
    )
    assert rows[0][:5] == ["NAME", "CPU(cores)", "CPU(%)", "MEMORY(bytes)", "MEMORY(%)"]
    node_row = rows[1]
    assert node_row[0] == NODE
    assert cpu_millis(node_row[1]) > 0 and node_row[2].endswith("%")
    assert mebibytes(node_row[3]) > HELD_MIB, node_row  # the node holds at least the pod
    rows = wait_for("kubectl top node NAME", lambda: top(kubeconfig, "node", NODE), timeout=20)
    assert rows[1][0] == NODE

    # What metrics-server read: the kubelet's own endpoints, with the API server's client
    # certificate (CN kube-apiserver-kubelet-client, system:masters), authorized as
    # nodes/metrics and nodes/stats.
    cert = metrics_apiserver.pki.kubelet_client
    status, body = call(agent, "/metrics/resource", cert=cert)
    assert status == 200, body
    series = {
        (s.name, s.labels.get("container"), s.labels.get("pod")): s
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
    working_set = series[("container_memory_working_set_bytes", "main", "hog")]
    assert working_set.labels["namespace"] == "default"
    assert working_set.value >= HELD_MIB * MiB and working_set.timestamp is not None
    assert series[("container_cpu_usage_seconds_total", "main", "hog")].value > 0
    assert series[("container_start_time_seconds", "main", "hog")].timestamp is None
    assert series[("node_memory_working_set_bytes", None, None)].value > working_set.value
    assert series[("scrape_error", None, None)].value == 0

    status, body = call(agent, "/stats/summary", cert=cert)
    assert status == 200, body
    summary = json.loads(body)
    assert summary["node"]["nodeName"] == NODE
    (pod,) = [p for p in summary["pods"] if p["podRef"]["name"] == "hog"]
    assert pod["podRef"]["namespace"] == "default"
    (main,) = pod["containers"]
    assert main["name"] == "main" and main["memory"]["workingSetBytes"] >= HELD_MIB * MiB
    assert main["memory"]["availableBytes"] <= 256 * MiB - HELD_MIB * MiB  # under its limit
    assert main["cpu"]["usageCoreNanoSeconds"] > 0

    subresources = {
        review["spec"]["resourceAttributes"].get("subresource")
        for review in metrics_apiserver.reviews()
        if review["kind"] == "SubjectAccessReview"
    }
    assert {"metrics", "stats"} <= subresources


def test_a_pod_that_is_not_running_has_no_metrics(
    top_node: tuple[Agent, KubeClient, Path],
) -> None:
    _, client, kubeconfig = top_node
    body = hog_pod()
    body["metadata"]["name"] = "done"
    body["spec"]["restartPolicy"] = "Never"
    body["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", "exit 0"]
    client.create_pod(body)
    wait_for(
        "the pod to succeed",
        lambda: ((client.pod("done") or {}).get("status") or {}).get("phase") == "Succeeded",
        timeout=30,
    )
    result = kubectl(kubeconfig, "top", "pod", "done")
    assert result.returncode != 0
    assert re.search(r'podmetrics.metrics.k8s.io "default/done" not found', result.stderr), (
        result.stderr
    )
