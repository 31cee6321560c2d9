"""Node admission on the real agent: requests counted against what the node has."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.integration.agent import pod_yaml, wait_for, write_pod


def test_pods_asking_more_than_the_node_has_are_rejected(start_agent, manifests: Path) -> None:  # type: ignore[no-untyped-def]
    cpus = len(os.sched_getaffinity(0))
    write_pod(
        manifests,
        "huge",
        pod_yaml("huge", "exec sleep 600") + f"    resources: {{requests: {{cpu: {cpus + 1}}}}}\n",
    )
    # Two pods each asking for more than half the node's cpu: the first admitted stays.
    half = f"{cpus * 600}m"
    for name in ("first", "second"):
        write_pod(
            manifests,
            name,
            pod_yaml(name, "exec sleep 600") + f"    resources: {{requests: {{cpu: {half}}}}}\n",
        )
    agent = start_agent()
    huge = wait_for(
        "huge rejected",
        lambda: (p := agent.pod("huge")) and p["status"].get("reason") == "OutOfcpu" and p,
    )
    assert huge["status"]["phase"] == "Failed"
    assert re.fullmatch(
        "Pod was rejected: Node didn't have enough resource: cpu, "
        rf"requested: {(cpus + 1) * 1000}, used: (0|{cpus * 600}), capacity: {cpus * 1000}",
        huge["status"]["message"],
    ), huge["status"]["message"]
    pods = wait_for(
        "one of two admitted",
        lambda: (
            (f := agent.pod("first")) and (s := agent.pod("second"))
            and f["status"].get("phase") and s["status"].get("phase") and [f, s]
        ),
    )  # fmt: skip
    reasons = sorted(str(p["status"].get("reason")) for p in pods)
    assert reasons == ["None", "OutOfcpu"], reasons
