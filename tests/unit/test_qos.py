"""Property tests of a pod's QoS class and the OOM score adjustment (`pykubelet/api/qos.py`)
against the kubelet's rules: `pkg/apis/core/helper/qos/qos.go` (ComputePodQOS) and
`pkg/kubelet/qos/policy.go` (GetContainerOOMScoreAdjust).

`reference_qos` and `reference_oom_score_adj` below are those Go functions written out in Python
(on a pod the API server has defaulted: a request not given is its limit); the properties hold
for `qos_class` and `oom_score_adj` and, where they are the kubelet's, for the references too.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pykubelet.api.model import Pod
from pykubelet.api.qos import (
    BEST_EFFORT,
    BURSTABLE,
    GUARANTEED,
    QOS_RESOURCES,
    QOSClass,
    oom_score_adj,
    qos_class,
)
from pykubelet.api.quantity import parse_quantity

Quantity = str | int
# One container's cpu (millicores) and memory (bytes): {"requests": {...}, "limits": {...}}.
Shape = dict[str, dict[str, int]]
GIB = 1 << 30

# --- quantities and their spellings -------------------------------------------------------------


def cpu_spellings(millis: int) -> list[Quantity]:
    """Every way to write `millis` millicores: 1500m, 1.5, 1500e-3; 2 and "2" when whole."""
    spellings: list[Quantity] = [f"{millis}m", f"{millis}e-3", format(Decimal(millis) / 1000, "f")]
    if millis % 1000 == 0:
        spellings += [millis // 1000, str(millis // 1000)]
    return spellings


MEMORY_SUFFIXES = (("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("k", 10**3), ("M", 10**6))


def memory_spellings(size: int) -> list[Quantity]:
    """Every way to write `size` bytes: 1073741824, 1048576Ki, 1024Mi, 1Gi, ..."""
    spellings: list[Quantity] = [size, str(size), f"{size}e0"]
    spellings += [f"{size // f}{suffix}" for suffix, f in MEMORY_SUFFIXES if size % f == 0]
    if size % 1000 == 0:
        spellings.append(f"{size // 1000}e3")
    return spellings


def spellings(resource: str, value: int) -> list[Quantity]:
    return cpu_spellings(value) if resource == "cpu" else memory_spellings(value)


ZEROS: list[Quantity] = [0, "0", "0m", "0Gi", "0.0", "0e3"]

cpu_values = st.one_of(st.sampled_from([100, 250, 500, 1000, 1500, 2000]), st.integers(1, 8000))
memory_values = st.one_of(
    st.builds(
        lambda unit, n: unit * n,
        st.sampled_from([1, 1000, 1 << 10, 10**6, 1 << 20, 1 << 30]),
        st.integers(1, 64),
    ),
    st.integers(1, 1 << 40),
)


def values_of(resource: str) -> st.SearchStrategy[int]:
    return cpu_values if resource == "cpu" else memory_values


# A container's resources as canonical numbers (0 included: "unset" as far as QoS goes).
shapes = st.fixed_dictionaries(
    {
        kind: st.dictionaries(
            st.sampled_from(QOS_RESOURCES),
            st.one_of(st.just(0), cpu_values | memory_values),
            max_size=2,
        )
        for kind in ("requests", "limits")
    }
)
pod_shapes = st.tuples(st.lists(shapes, min_size=1, max_size=3), st.lists(shapes, max_size=2))


def render(shape: Shape, data: st.DataObject) -> dict[str, Any]:
    """The container's resources, each quantity in a spelling drawn from `data`."""
    return {
        kind: {
            name: data.draw(st.sampled_from(spellings(name, value) if value else ZEROS))
            for name, value in values.items()
        }
        for kind, values in shape.items()
    }


def make_pod(containers: list[dict[str, Any]], inits: list[dict[str, Any]] = ()) -> Pod:  # type: ignore[assignment]
    """A pod whose containers (then init containers) have these `resources`."""

    def spec(prefix: str, i: int, resources: dict[str, Any]) -> dict[str, Any]:
        return {"name": f"{prefix}{i}", "image": "busybox", "resources": resources}

    return Pod.model_validate(
        {
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {
                "containers": [spec("c", i, r) for i, r in enumerate(containers)],
                "initContainers": [spec("i", i, r) for i, r in enumerate(inits)],
            },
        }
    )


def draw_pod(shape: tuple[list[Shape], list[Shape]], data: st.DataObject) -> Pod:
    containers, inits = shape
    return make_pod([render(c, data) for c in containers], [render(c, data) for c in inits])


# --- the kubelet's functions, written out -------------------------------------------------------


def reference_qos(pod: Pod) -> QOSClass:
    """ComputePodQOS of qos.go, on the pod as the API server defaults it."""
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True
    for container in [*pod.spec.containers, *pod.spec.init_containers]:
        given_limits = container.resources.limits
        # SetDefaults_ResourceRequirements: a limit with no request is also the request.
        given_requests = {**given_limits, **container.resources.requests}
        for name, raw in given_requests.items():
            if name in QOS_RESOURCES and (quantity := parse_quantity(raw)) > 0:
                requests[name] = requests.get(name, Fraction(0)) + quantity
        found = set()
        for name, raw in given_limits.items():
            if name in QOS_RESOURCES and (quantity := parse_quantity(raw)) > 0:
                found.add(name)
                limits[name] = limits.get(name, Fraction(0)) + quantity
        if not {"cpu", "memory"} <= found:
            guaranteed = False
    if not requests and not limits:
        return BEST_EFFORT
    if guaranteed:
        for name, request in requests.items():
            if limits.get(name) != request:
                guaranteed = False
                break
    if guaranteed and len(requests) == len(limits):
        return GUARANTEED
    return BURSTABLE


def reference_oom_score_adj(qos: QOSClass, memory_request: int, memory_capacity: int) -> int:
    """GetContainerOOMScoreAdjust of policy.go, for a pod that is not node-critical and a
    container that is not a sidecar."""
    if qos == GUARANTEED:
        return -997
    if qos == BEST_EFFORT:
        return 1000
    # Go's int64 division truncates towards zero: both operands are positive here.
    score = 1000 - (1000 * memory_request) // memory_capacity
    if score < 1000 + -997:
        return 1000 + -997
    if score == 1000:
        return score - 1
    return score


# --- the class ----------------------------------------------------------------------------------


def test_the_kubelets_examples() -> None:
    both = {"cpu": "100m", "memory": "100Mi"}
    assert qos_class(make_pod([{}])) == BEST_EFFORT
    assert qos_class(make_pod([{"limits": both}])) == GUARANTEED  # requests default to limits
    assert qos_class(make_pod([{"requests": both, "limits": both}] * 2)) == GUARANTEED
    assert qos_class(make_pod([{"requests": both}])) == BURSTABLE
    assert qos_class(make_pod([{"limits": {"cpu": "1"}}])) == BURSTABLE  # no memory limit
    assert qos_class(make_pod([{"limits": both}, {}])) == BURSTABLE
    # Only cpu and memory count.
    assert qos_class(make_pod([{"requests": {"ephemeral-storage": "1Gi"}}])) == BEST_EFFORT
    assert qos_class(make_pod([{"limits": {**both, "hugepages-2Mi": "2Mi"}}])) == GUARANTEED
    # Sums are compared, as quantities.
    split = [
        {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1000m", "memory": 1 << 30}}
    ]
    assert qos_class(make_pod(split)) == GUARANTEED


@given(shape=pod_shapes, data=st.data())
def test_equivalent_spellings_never_change_the_class(
    shape: tuple[list[Shape], list[Shape]], data: st.DataObject
) -> None:
    first, second = draw_pod(shape, data), draw_pod(shape, data)
    assert qos_class(first) == qos_class(second) == reference_qos(first) == reference_qos(second)


@given(
    containers=st.lists(st.tuples(cpu_values, memory_values), min_size=1, max_size=3),
    inits=st.lists(st.tuples(cpu_values, memory_values), max_size=2),
    data=st.data(),
)
def test_limits_with_equal_or_no_requests_everywhere_is_guaranteed(
    containers: list[tuple[int, int]], inits: list[tuple[int, int]], data: st.DataObject
) -> None:
    def guaranteed(cpu: int, memory: int) -> dict[str, Any]:
        limits = {"cpu": cpu, "memory": memory}
        resources: dict[str, Any] = {
            "limits": {n: data.draw(st.sampled_from(spellings(n, v))) for n, v in limits.items()}
        }
        # Each request: omitted, or the limit (in any spelling).
        asked = data.draw(st.sets(st.sampled_from(QOS_RESOURCES)))
        resources["requests"] = {
            n: data.draw(st.sampled_from(spellings(n, limits[n]))) for n in sorted(asked)
        }
        return resources

    pod = make_pod([guaranteed(*c) for c in containers], [guaranteed(*c) for c in inits])
    assert qos_class(pod) == reference_qos(pod) == GUARANTEED


@given(
    containers=st.integers(1, 3),
    inits=st.integers(0, 2),
    where=st.sampled_from(["containers", "initContainers"]),
    kind=st.sampled_from(["requests", "limits"]),
    resource=st.sampled_from(QOS_RESOURCES),
    data=st.data(),
)
def test_any_request_or_limit_makes_a_best_effort_pod_not_best_effort(
    containers: int, inits: int, where: str, kind: str, resource: str, data: st.DataObject
) -> None:
    app: list[dict[str, Any]] = [{} for _ in range(containers)]
    init: list[dict[str, Any]] = [{} for _ in range(inits)]
    assert qos_class(make_pod(app, init)) == BEST_EFFORT
    targets = init if where == "initContainers" and init else app
    target = targets[data.draw(st.integers(0, len(targets) - 1))]
    value = data.draw(values_of(resource))
    target[kind] = {resource: data.draw(st.sampled_from(spellings(resource, value)))}
    pod = make_pod(app, init)
    assert qos_class(pod) != BEST_EFFORT
    assert reference_qos(pod) != BEST_EFFORT


@given(
    containers=st.lists(st.tuples(cpu_values, memory_values), min_size=1, max_size=3),
    init=st.sampled_from(
        [{}, {"limits": {"cpu": "1"}}, {"limits": {"memory": "1Gi"}}, {"requests": {"cpu": "1"}}]
    ),
)
def test_an_init_container_without_both_limits_makes_a_guaranteed_pod_burstable(
    containers: list[tuple[int, int]], init: dict[str, Any]
) -> None:
    app = [{"limits": {"cpu": f"{cpu}m", "memory": memory}} for cpu, memory in containers]
    assert qos_class(make_pod(app)) == GUARANTEED
    pod = make_pod(app, [init])
    assert qos_class(pod) == reference_qos(pod) == BURSTABLE


@given(shape=pod_shapes, data=st.data())
def test_zero_quantities_count_as_unset(
    shape: tuple[list[Shape], list[Shape]], data: st.DataObject
) -> None:
    containers, inits = shape
    pod = draw_pod(shape, data)
    expected = qos_class(pod)
    # Where a container says nothing of a resource, a zero request and/or limit changes nothing.
    rendered = [render(c, data) for c in containers], [render(c, data) for c in inits]
    for resources in [*rendered[0], *rendered[1]]:
        for name in QOS_RESOURCES:
            if name in resources["requests"] or name in resources["limits"]:
                continue
            for kind in data.draw(st.sets(st.sampled_from(["requests", "limits"]))):
                resources[kind][name] = data.draw(st.sampled_from(ZEROS))
    zeroed = make_pod(*rendered)
    assert qos_class(zeroed) == expected == reference_qos(zeroed)


@given(resource=st.sampled_from(QOS_RESOURCES), data=st.data())
def test_a_zero_limit_is_no_limit(resource: str, data: st.DataObject) -> None:
    value = data.draw(values_of(resource))
    request = {resource: data.draw(st.sampled_from(spellings(resource, value)))}
    zero_limit = make_pod(
        [{"requests": request, "limits": {resource: data.draw(st.sampled_from(ZEROS))}}]
    )
    no_limit = make_pod([{"requests": request}])
    assert qos_class(zero_limit) == qos_class(no_limit) == BURSTABLE
    # A limit of 0 is not "the request defaults to the limit": a zero limit alone is nothing.
    only_zero = make_pod([{"limits": {"cpu": "0", "memory": "0"}}])
    assert qos_class(only_zero) == reference_qos(only_zero) == BEST_EFFORT


# --- OOM scores ---------------------------------------------------------------------------------

capacities = st.integers(1, 1 << 42)
memory_requests = st.integers(0, 1 << 43)


@given(request=memory_requests, capacity=capacities)
def test_guaranteed_and_best_effort_scores_are_fixed(request: int, capacity: int) -> None:
    assert oom_score_adj(GUARANTEED, request, capacity) == -997
    assert oom_score_adj(BEST_EFFORT, request, capacity) == 1000


@given(request=memory_requests, capacity=capacities)
def test_burstable_scores_stay_between_guaranteed_and_best_effort(
    request: int, capacity: int
) -> None:
    score = oom_score_adj(BURSTABLE, request, capacity)
    assert 3 <= score <= 999
    assert score == reference_oom_score_adj(BURSTABLE, request, capacity)


@given(
    requests=st.lists(memory_requests, min_size=2, max_size=6),
    capacity=capacities,
)
def test_burstable_scores_do_not_increase_with_the_memory_request(
    requests: list[int], capacity: int
) -> None:
    scores = [oom_score_adj(BURSTABLE, r, capacity) for r in sorted(requests)]
    assert scores == sorted(scores, reverse=True)


def test_burstable_score_examples() -> None:
    capacity = 8 * GIB
    assert oom_score_adj(BURSTABLE, 0, capacity) == 999  # no request: just below BestEffort
    assert oom_score_adj(BURSTABLE, 1, capacity) == 999
    assert oom_score_adj(BURSTABLE, 2 * GIB, capacity) == 750
    assert oom_score_adj(BURSTABLE, capacity // 10, capacity) == 901  # 1000 - 99.99..
    assert oom_score_adj(BURSTABLE, capacity, capacity) == 3  # never as low as Guaranteed
    assert oom_score_adj(BURSTABLE, 2 * capacity, capacity) == 3
    # The kubelet divides by the capacity; an unknown one (0) keeps the Burstable bounds.
    assert 3 <= oom_score_adj(BURSTABLE, GIB, 0) <= 999
