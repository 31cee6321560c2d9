"""A pod's QoS class and the OOM score adjustment that follows from it, as Kubernetes computes
them (`pkg/apis/core/helper/qos` and `pkg/kubelet/qos/policy.go`).

- Only cpu and memory count, summed over the init containers and the containers; a quantity
  that is zero counts as unset. A container's request that is not given is its limit (the API
  server's defaulting, which static pods get too).
- BestEffort: no container requests or limits anything. Guaranteed: every container limits both
  cpu and memory, and the summed requests equal the summed limits as quantities (`cpu: 1000m`
  is `cpu: "1"`). Everything else is Burstable.
- OOM scores: Guaranteed -997 (killed last), BestEffort 1000 (first), a Burstable container by
  the share of the node's memory it requests, kept between the two.

Status (`status.qosClass`) and the CRI runtime's OOM scores use these functions, so a pod is one
class everywhere. (The docker and process runtimes set no OOM score yet.)
"""

from __future__ import annotations

from fractions import Fraction
from typing import Literal

from pykubelet.api.model import Container, Pod
from pykubelet.api.quantity import QuantityError, parse_quantity

QOSClass = Literal["Guaranteed", "Burstable", "BestEffort"]
GUARANTEED: QOSClass = "Guaranteed"
BURSTABLE: QOSClass = "Burstable"
BEST_EFFORT: QOSClass = "BestEffort"

QOS_RESOURCES = ("cpu", "memory")

GUARANTEED_OOM_SCORE_ADJ = -997
BESTEFFORT_OOM_SCORE_ADJ = 1000


def _positive(raw: str | int | float) -> Fraction | None:
    try:
        value = parse_quantity(raw)
    except QuantityError:
        return None  # validation reports it; an unreadable quantity counts as unset here
    return value if value > 0 else None


def _container_quantities(container: Container) -> tuple[dict[str, Fraction], dict[str, Fraction]]:
    """The container's cpu/memory (requests, limits), requests defaulted from limits."""
    limits: dict[str, Fraction] = {}
    requests: dict[str, Fraction] = {}
    for name in QOS_RESOURCES:
        limit = container.resources.limits.get(name)
        if limit is not None and (value := _positive(limit)) is not None:
            limits[name] = value
        request = container.resources.requests.get(name, limit)
        if request is not None and (value := _positive(request)) is not None:
            requests[name] = value
    return requests, limits


def qos_class(pod: Pod) -> QOSClass:
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True
    for container in [*pod.spec.init_containers, *pod.spec.containers]:
        asked, capped = _container_quantities(container)
        for name, value in asked.items():
            requests[name] = requests.get(name, Fraction(0)) + value
        for name, value in capped.items():
            limits[name] = limits.get(name, Fraction(0)) + value
        if len(capped) < len(QOS_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return BEST_EFFORT
    if guaranteed and requests == limits:
        return GUARANTEED
    return BURSTABLE


def oom_score_adj(qos: QOSClass, memory_request: int, memory_capacity: int) -> int:
    """The OOM score adjustment of a container of a pod of class `qos` that requests
    `memory_request` bytes on a node with `memory_capacity` bytes."""
    if qos == GUARANTEED:
        return GUARANTEED_OOM_SCORE_ADJ
    if qos == BEST_EFFORT or memory_capacity <= 0:
        return BESTEFFORT_OOM_SCORE_ADJ if qos == BEST_EFFORT else BESTEFFORT_OOM_SCORE_ADJ - 1
    score = 1000 - (1000 * memory_request) // memory_capacity
    # A Guaranteed container at 100 % of memory scores 3: every Burstable one stays above it,
    # and below BestEffort.
    return max(1000 + GUARANTEED_OOM_SCORE_ADJ, min(score, BESTEFFORT_OOM_SCORE_ADJ - 1))
