"""Prometheus metrics, with the kubelet's names where the kubelet has one.

One registry per process (the agent is one process); `/metrics` serves it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

REGISTRY = CollectorRegistry(auto_describe=True)
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Buckets of the kubelet's pod start histogram (seconds).
_START_BUCKETS = (0.5, 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600)
_FAST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

running_pods = Gauge(
    "kubelet_running_pods", "Number of pods with at least one running container", registry=REGISTRY
)
running_containers = Gauge(
    "kubelet_running_containers",
    "Number of containers currently running",
    ["container_state"],
    registry=REGISTRY,
)
pod_start_duration = Histogram(
    "kubelet_pod_start_duration_seconds",
    "Duration in seconds from the agent first seeing a pod to all its containers running",
    buckets=_START_BUCKETS,
    registry=REGISTRY,
)
pod_worker_duration = Histogram(
    "kubelet_pod_worker_duration_seconds",
    "Duration in seconds to sync a single pod, by operation (create, update, sync, kill)",
    ["operation_type"],
    buckets=_FAST_BUCKETS,
    registry=REGISTRY,
)
pleg_relist_duration = Histogram(
    "kubelet_pleg_relist_duration_seconds",
    "Duration in seconds for relisting pods in the PLEG",
    buckets=_FAST_BUCKETS,
    registry=REGISTRY,
)
http_requests = Counter(
    "kubelet_http_requests",
    "Number of HTTP requests received since the server started",
    ["method", "path", "server_type", "code"],
    registry=REGISTRY,
)
runtime_operations = Counter(
    "kubelet_runtime_operations",
    "Cumulative number of runtime operations by operation type",
    ["operation_type"],
    registry=REGISTRY,
)
runtime_operation_errors = Counter(
    "kubelet_runtime_operations_errors",
    "Cumulative number of runtime operation errors by operation type",
    ["operation_type"],
    registry=REGISTRY,
)
evictions = Counter(
    "kubelet_evictions",
    "Cumulative number of pod evictions by eviction signal",
    ["eviction_signal"],
    registry=REGISTRY,
)
source_updates = Counter(
    "pykubelet_source_updates",
    "Pod updates a source delivered to the merger",
    ["source"],
    registry=REGISTRY,
)
source_errors = Counter(
    "pykubelet_source_errors",
    "Failures of a pod source, by reason (e.g. connection, timeout, status, decode, size, file)",
    ["source", "reason"],
    registry=REGISTRY,
)
source_last_success = Gauge(
    "pykubelet_source_last_success_timestamp_seconds",
    "Unix time of the last successful list or fetch of a source",
    ["source"],
    registry=REGISTRY,
)
config_ops = Counter(
    "pykubelet_config_operations",
    "Changes the merger emitted, by operation (ADD, UPDATE, DELETE, REMOVE, RECONCILE, SET)",
    ["op"],
    registry=REGISTRY,
)


def exposition() -> bytes:
    return generate_latest(REGISTRY)
