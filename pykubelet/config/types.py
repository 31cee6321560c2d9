"""What flows from the sources through the merger to the sync loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from pykubelet.api.model import Pod

FILE_SOURCE = "file"
HTTP_SOURCE = "http"
API_SOURCE = "api"
ALL_SOURCES = "*"


class Op(Enum):
    ADD = "ADD"  # pods new to the merged state
    UPDATE = "UPDATE"  # spec, labels or non-local annotations changed
    DELETE = "DELETE"  # deletionTimestamp set: terminate gracefully (API pods)
    REMOVE = "REMOVE"  # no source has the pod any more: kill it
    SET = "SET"  # a source's whole state (input), or the merged state (Snapshot modes)
    RECONCILE = "RECONCILE"  # only the status changed


@dataclass(frozen=True)
class PodUpdate:
    pods: list[Pod]
    op: Op
    source: str
    # UIDs of a REMOVE input, for sources that know only what went away.
    uids: list[str] = field(default_factory=list)


class NotificationMode(Enum):
    INCREMENTAL = "incremental"  # the kubelet's mode
    SNAPSHOT = "snapshot"
    SNAPSHOT_AND_UPDATES = "snapshot-and-updates"
