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
