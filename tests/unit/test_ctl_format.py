"""kubectl-style formatting of the CLI."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pykubelet.cmd.ctl import print_pods
from pykubelet.server.present import human_duration, pod_status_reason

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5, "5s"),
        (119, "119s"),
        (200, "3m20s"),
        (600, "10m"),
        (9000, "150m"),
        (9 * 3600, "9h"),
        (3 * 86400 + 3600, "3d1h"),
        (30 * 86400, "30d"),
        (800 * 86400, "2y"),
    ],
)
def test_human_duration(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


def pod(statuses: list[dict[str, Any]], phase: str = "Running", **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "default",
            "annotations": {"kubernetes.io/config.seen": (NOW - timedelta(seconds=42)).isoformat()},
        },
        "spec": {"containers": [{"name": s["name"]} for s in statuses], "nodeName": "n", **extra},
        "status": {"phase": phase, "containerStatuses": statuses},
    }


def test_status_column() -> None:
    running = {"name": "a", "ready": True, "state": {"running": {}}, "restartCount": 0}
    waiting = {"name": "b", "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "restartCount": 3}
    done = {"name": "c", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    assert pod_status_reason(pod([running])) == "Running"
    assert pod_status_reason(pod([running, waiting])) == "CrashLoopBackOff"
    assert pod_status_reason(pod([done], "Succeeded")) == "Completed"
    assert (
        pod_status_reason(pod([{"name": "d", "state": {"terminated": {"exitCode": 3}}}]))
        == "ExitCode:3"
    )
    init = pod([running], "Pending", initContainers=[{"name": "i"}, {"name": "j"}])
    init["status"]["initContainerStatuses"] = [
        {"name": "i", "state": {"terminated": {"exitCode": 0}}},
        {"name": "j", "state": {"running": {}}},
    ]
    assert pod_status_reason(init) == "Init:1/2"


def test_table() -> None:
    out = io.StringIO()
    statuses = [
        {
            "name": "a",
            "ready": True,
            "state": {"running": {}},
            "restartCount": 2,
            "lastState": {"terminated": {"finishedAt": (NOW - timedelta(seconds=7)).isoformat()}},
        }
    ]
    print_pods([pod(statuses)], False, out, NOW)
    assert out.getvalue().splitlines() == [
        "NAME   READY   STATUS    RESTARTS     AGE",
        "p      1/1     Running   2 (7s ago)   42s",
    ]


# --- top pods (pykubelet/cmd/top_cmd.py) ---------------------------------------------------------


def _top_args(**overrides: Any) -> Any:
    import argparse

    values = {
        "all_namespaces": False,
        "containers": False,
        "sort_by": None,
        "no_headers": False,
        "namespace": "default",
        "name": None,
    }
    return argparse.Namespace(**{**values, **overrides})


def test_top_units_as_kubectl_prints_them() -> None:
    from pykubelet.cmd.top_cmd import cpu_text, memory_text

    # kubectl: MilliValue (rounded up) and whole MiB (rounded down).
    assert cpu_text(0) == "0m"
    assert cpu_text(1) == "1m"
    assert cpu_text(467_000_000) == "467m"
    assert cpu_text(467_000_001) == "468m"
    assert cpu_text(1_813_200_000) == "1814m"
    assert memory_text(54 * 2**20 + 2**20 - 1) == "54Mi"
    assert memory_text(0) == "0Mi"


def test_top_table_is_kubectls_tabwriter() -> None:
    from pykubelet.cmd.top_cmd import Usage, print_usages

    rows = [
        Usage("default", "a", "", 1e6, 2**20),
        Usage("kube-system", "a-much-longer-name", "", 467e6, 54 * 2**20),
    ]
    out = io.StringIO()
    print_usages(rows, _top_args(sort_by="cpu"), out)
    assert out.getvalue() == (
        "NAME                 CPU(cores)   MEMORY(bytes)\n"
        "a-much-longer-name   467m         54Mi\n"
        "a                    1m           1Mi\n"
    )
    out = io.StringIO()
    print_usages(rows[:1], _top_args(all_namespaces=True, no_headers=True), out)
    # Cells of at least 6: "a" takes 6, as kubectl's tabwriter pads it.
    assert out.getvalue() == "default   a     1m    1Mi\n"


def test_top_node_row_is_kubectls_percent_of_allocatable() -> None:
    from pykubelet.cmd import top_cmd

    # 250m of 2 cores: 12% (truncated); 1 GiB of 4 GiB: 25%.
    row = top_cmd.node_row("n1", 250_000_000, 1 << 30, {"cpu": "2", "memory": "4Gi"})
    assert row == ["n1", "250m", "12%", "1024Mi", "25%"]
    assert top_cmd.node_row("n1", 1, 0, {"cpu": "1500m"})[1:] == ["1m", "0%", "0Mi", "<unknown>"]
