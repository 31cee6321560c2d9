"""The pod requests admission counts: containers, init containers and sidecars."""

from __future__ import annotations

from typing import Any

from pykubelet.api.model import Pod
from pykubelet.kubelet.admission import pod_requests


def pod(containers: list[dict[str, Any]], inits: list[dict[str, Any]] = ()) -> Pod:  # type: ignore[assignment]
    def c(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "image": "i", **spec}

    return Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {
                "containers": [c(f"c{i}", s) for i, s in enumerate(containers)],
                "initContainers": [c(f"i{i}", s) for i, s in enumerate(inits)],
            },
        }
    )


def req(
    cpu: str | None = None, memory: str | None = None, *, limits: bool = False
) -> dict[str, Any]:
    values = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"resources": {"limits" if limits else "requests": values}}


def test_containers_add_up_and_a_limit_is_a_request() -> None:
    p = pod([req("250m", "64Mi"), req("1", "1Gi", limits=True), {}])
    assert pod_requests(p) == {
        "cpu": 1250,
        "memory": (64 << 20) + (1 << 30),
        "ephemeral-storage": 0,
    }


def test_the_largest_init_container_or_the_app_whichever_is_more() -> None:
    p = pod([req("100m")], [req("2"), req("500m")])
    assert pod_requests(p)["cpu"] == 2000
    # A sidecar runs beside what starts after it, and beside the app.
    p = pod([req("100m")], [{**req("300m"), "restartPolicy": "Always"}, req("250m")])
    assert pod_requests(p)["cpu"] == 550  # max(300 + 250, 300 + 100)
