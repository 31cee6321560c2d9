"""Admission: the pod requests it counts (containers, init containers and sidecars) and the
handlers (`NodeFeatures`, `ResourceFit`, `admit`) on their own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pykubelet.api.model import Pod
from pykubelet.kubelet.admission import (
    ADMIT,
    RESOURCES,
    AdmitHandler,
    AdmitResult,
    NodeFeatures,
    NodeUsage,
    ResourceFit,
    admit,
    pod_requests,
)


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


# --- the admit handlers -------------------------------------------------------------------------

GIB = 1 << 30
ALLOCATABLE = {"cpu": 2000, "memory": 4 * GIB, "ephemeral-storage": 10 * GIB}


def usage(pods: int = 0, **resources: int) -> NodeUsage:
    used = NodeUsage(pods=pods)
    for name, value in resources.items():
        used.resources[name.replace("_", "-")] = value
    return used


def special(*, privileged_in: str | None = None, host_paths: tuple[str, ...] = ()) -> Pod:
    """A pod with a privileged container (in "containers" or "initContainers") and hostPaths."""
    privileged = {"securityContext": {"privileged": True}}
    p = pod(
        [{}, privileged if privileged_in == "containers" else {}],
        [privileged] if privileged_in == "initContainers" else [],
    )
    volumes = [{"name": f"v{i}", "hostPath": {"path": path}} for i, path in enumerate(host_paths)]
    return Pod.model_validate({**p.to_api(), "spec": {**p.spec.to_api(), "volumes": volumes}})


def test_node_features_refuse_privileged_containers_unless_allowed() -> None:
    refuse = NodeFeatures(allow_privileged=False, allowed_host_paths=[])
    for kind, index in (("containers", 1), ("initContainers", 0)):
        result = refuse.admit(special(privileged_in=kind), {}, NodeUsage())
        assert result == AdmitResult(
            False,
            "PrivilegedNotAllowed",
            f"spec.{kind}[{index}].securityContext.privileged: privileged "
            "containers are not allowed on this node (pykubelet --allow-privileged)",
        )
    assert refuse.admit(special(), {}, NodeUsage()).admit
    explicit_false = pod([{"securityContext": {"privileged": False}}])
    assert refuse.admit(explicit_false, {}, NodeUsage()).admit
    allow = NodeFeatures(allow_privileged=True, allowed_host_paths=[])
    assert allow.admit(special(privileged_in="containers"), {}, NodeUsage()) == ADMIT


def test_node_features_admit_linux_pods_only() -> None:
    features = NodeFeatures(allow_privileged=False, allowed_host_paths=[])
    base = pod([{}]).to_api()
    windows = Pod.model_validate({**base, "spec": {**base["spec"], "os": {"name": "windows"}}})
    assert features.admit(windows, {}, NodeUsage()) == AdmitResult(
        False, "PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS"
    )
    selector = {"kubernetes.io/os": "windows"}
    elsewhere = Pod.model_validate({**base, "spec": {**base["spec"], "nodeSelector": selector}})
    assert features.admit(elsewhere, {}, NodeUsage()).reason == "PodOSSelectorNodeLabelDoesNotMatch"
    linux = Pod.model_validate({**base, "spec": {**base["spec"], "os": {"name": "linux"}}})
    assert features.admit(linux, {}, NodeUsage()).admit


def test_node_features_allow_host_paths_below_the_allowed_ones_only() -> None:
    features = NodeFeatures(False, ["/srv/data", "/var/log/"])
    for fine in (("/srv/data",), ("/srv/data/a/b", "/var/log"), ("/var/log/pods/x",)):
        assert features.admit(special(host_paths=fine), {}, NodeUsage()).admit, fine
    # Whole path components: /srv/database is not below /srv/data; .. is resolved.
    for bad in ("/srv/database", "/srv/data/../../etc", "/", "/var"):
        result = features.admit(special(host_paths=("/srv/data", bad)), {}, NodeUsage())
        assert (result.admit, result.reason) == (False, "HostPathNotAllowed"), bad
        assert result.message == (
            f"spec.volumes[1].hostPath.path: {bad} is not below "
            "--allowed-host-paths (/srv/data, /var/log/)"
        )
    none = NodeFeatures(False, []).admit(special(host_paths=("/tmp",)), {}, NodeUsage())
    assert none.message.endswith("/tmp is not below --allowed-host-paths (none are allowed)")
    # A privileged container is reported before a hostPath.
    both = features.admit(special(privileged_in="containers", host_paths=("/etc",)), {}, usage())
    assert both.reason == "PrivilegedNotAllowed"


def test_resource_fit_counts_pods_first_then_cpu_memory_storage_in_that_order() -> None:
    fit = ResourceFit(max_pods=3, allocatable=ALLOCATABLE)
    p = pod([{}])
    assert fit.admit(p, {"cpu": 2000}, usage(2)) == ADMIT  # exactly full is fine
    assert fit.admit(p, {"cpu": 1}, usage(3)) == AdmitResult(
        False,
        "OutOfpods",
        "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3",
    )
    over_all = {"cpu": 2001, "memory": 4 * GIB + 1, "ephemeral-storage": 10 * GIB + 1}
    assert fit.admit(p, over_all, usage(1)).reason == "OutOfcpu"
    assert fit.admit(p, {**over_all, "cpu": 1}, usage(1)).reason == "OutOfmemory"
    result = fit.admit(p, {"ephemeral-storage": 2 * GIB}, usage(1, ephemeral_storage=9 * GIB))
    assert result == AdmitResult(
        False,
        "OutOfephemeral-storage",
        "Node didn't have enough resource: ephemeral-storage, requested: "
        f"{2 * GIB}, used: {9 * GIB}, capacity: {10 * GIB}",
    )


def test_a_pod_that_asks_nothing_fits_an_overcommitted_node() -> None:
    fit = ResourceFit(max_pods=10, allocatable=ALLOCATABLE)
    full = usage(5, cpu=5000, memory=8 * GIB)
    assert fit.admit(pod([{}]), {"cpu": 0, "memory": 0}, full) == ADMIT
    assert fit.admit(pod([{}]), {"cpu": 1}, full).reason == "OutOfcpu"


@given(
    max_pods=st.integers(1, 5),
    pods=st.integers(0, 6),
    asked=st.fixed_dictionaries(
        {name: st.integers(0, 3 * ALLOCATABLE[name]) for name in RESOURCES}
    ),
    used=st.fixed_dictionaries({name: st.integers(0, 2 * ALLOCATABLE[name]) for name in RESOURCES}),
)
def test_resource_fit_admits_exactly_what_fits(
    max_pods: int, pods: int, asked: dict[str, int], used: dict[str, int]
) -> None:
    current = NodeUsage(pods=pods, resources=dict(used))
    result = ResourceFit(max_pods, ALLOCATABLE).admit(pod([{}]), asked, current)
    fits = pods < max_pods and all(
        asked[name] == 0 or used[name] + asked[name] <= ALLOCATABLE[name] for name in RESOURCES
    )
    assert result.admit == fits
    if not fits:
        assert result.reason.startswith("OutOf") and result.message.startswith(
            "Node didn't have enough resource: "
        )
    assert current == NodeUsage(pods=pods, resources=used)  # admission does not count it


class Refuse:
    def __init__(self, reason: str, calls: list[str]) -> None:
        self.reason = reason
        self.calls = calls

    def admit(self, pod: Pod, requests: Mapping[str, int], usage: NodeUsage) -> AdmitResult:
        self.calls.append(self.reason)
        return AdmitResult(False, self.reason, f"no: {self.reason}")


def test_admit_returns_the_first_refusal_and_asks_no_further() -> None:
    calls: list[str] = []
    handlers: list[AdmitHandler] = [
        NodeFeatures(True, []),
        Refuse("First", calls),
        Refuse("Second", calls),
    ]
    assert admit(handlers, pod([{}]), {}, NodeUsage()) == AdmitResult(False, "First", "no: First")
    assert calls == ["First"]
    assert admit([], pod([{}]), {}, NodeUsage()) == ADMIT
    # The kubelet's order: what the node allows at all before what is left of it.
    kubelet_order: list[AdmitHandler] = [NodeFeatures(False, []), ResourceFit(1, ALLOCATABLE)]
    both = special(privileged_in="containers")
    assert admit(kubelet_order, both, {"cpu": 9999}, usage(1)).reason == "PrivilegedNotAllowed"
    assert admit(kubelet_order, pod([{}]), {"cpu": 9999}, usage(0)).reason == "OutOfcpu"


def test_node_usage_adds_a_pod_and_its_requests() -> None:
    used = NodeUsage()
    used.add({"cpu": 250, "memory": 64})
    used.add(pod_requests(pod([req("1", "1Gi")])))
    assert used.pods == 2
    assert used.resources == {"cpu": 1250, "memory": 64 + GIB, "ephemeral-storage": 0}
