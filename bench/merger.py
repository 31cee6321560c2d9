"""PodConfig merger throughput: full SETs of 1,000 and 10,000 pods, and a SET where one changed."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from pykubelet.api.model import Pod
from pykubelet.config.pod_config import PodStorage
from pykubelet.config.types import NotificationMode, Op, PodUpdate


def _pods(n: int, image: str = "busybox") -> list[Pod]:
    return [
        Pod.model_validate(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"p{i}", "namespace": "default", "uid": f"uid-{i}"},
                "spec": {"containers": [{"name": "c", "image": image, "command": ["sleep", "1"]}]},
            }
        )
        for i in range(n)
    ]


def run(n: int) -> dict[str, Any]:
    storage = PodStorage(NotificationMode.INCREMENTAL, clock=lambda: datetime.now(UTC))
    storage.register("file")
    pods = _pods(n)

    started = time.perf_counter()
    out = storage.merge(PodUpdate(pods, Op.SET, "file"))
    first = time.perf_counter() - started
    assert sum(len(u.pods) for u in out) == n

    started = time.perf_counter()
    out = storage.merge(PodUpdate(list(pods), Op.SET, "file"))
    unchanged = time.perf_counter() - started
    assert not any(u.pods for u in out)

    changed = list(pods)
    changed[n // 2] = _pods(n // 2 + 1, image="nginx")[-1]
    started = time.perf_counter()
    out = storage.merge(PodUpdate(changed, Op.SET, "file"))
    one_changed = time.perf_counter() - started
    assert [len(u.pods) for u in out if u.pods] == [1]

    # Incremental updates, one pod each, as an API watch would send them.
    updated = _pods(n, image="redis")
    started = time.perf_counter()
    for pod in updated:
        storage.merge(PodUpdate([pod], Op.UPDATE, "file"))
    incremental = time.perf_counter() - started
    return {
        "n": n,
        "first_set_seconds": round(first, 4),
        "first_set_pods_per_second": round(n / first),
        "unchanged_set_seconds": round(unchanged, 4),
        "one_changed_set_seconds": round(one_changed, 4),
        "single_updates_per_second": round(n / incremental),
    }
