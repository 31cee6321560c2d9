"""The pod-source merger: classification, cross-source name claims, notification modes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pykubelet.api.model import Pod
from pykubelet.api.static import (
    CONFIG_HASH,
    CONFIG_MIRROR,
    CONFIG_SEEN,
    CONFIG_SOURCE,
    LOCAL_ANNOTATIONS,
)
from pykubelet.config.pod_config import FAILED_VALIDATION, PodConfig, PodStorage
from pykubelet.config.types import (
    ALL_SOURCES,
    API_SOURCE,
    FILE_SOURCE,
    HTTP_SOURCE,
    NotificationMode,
    Op,
    PodUpdate,
)

INC = NotificationMode.INCREMENTAL
SNAP = NotificationMode.SNAPSHOT
SNAP_UPD = NotificationMode.SNAPSHOT_AND_UPDATES
T0 = datetime(2024, 1, 1, tzinfo=UTC)

Event = tuple[str, str, str]


def make_pod(
    name: str = "web",
    uid: str | None = None,
    *,
    namespace: str = "default",
    image: str = "nginx",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    phase: str | None = None,
    deleted: bool = False,
    grace: int | None = None,
) -> Pod:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"}
    if labels is not None:
        metadata["labels"] = labels
    if annotations is not None:
        metadata["annotations"] = annotations
    if deleted:
        metadata["deletionTimestamp"] = "2024-01-02T00:00:00Z"
    if grace is not None:
        metadata["deletionGracePeriodSeconds"] = grace
    data: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "c", "image": image}]},
    }
    if phase is not None:
        data["status"] = {"phase": phase}
    return Pod.model_validate(data)


class Clock:
    """Each reading is one second after the last, so stamps show which merge made them."""

    def __init__(self) -> None:
        self.ticks = 0

    def __call__(self) -> datetime:
        self.ticks += 1
        return T0 + timedelta(seconds=self.ticks)


def new_storage(mode: NotificationMode = INC) -> tuple[PodStorage, list[Event]]:
    events: list[Event] = []

    def record(reason: str, key: str, message: str) -> None:
        events.append((reason, key, message))

    return PodStorage(mode, Clock(), record), events


def up(op: Op, source: str, *pods: Pod, uids: list[str] | None = None) -> PodUpdate:
    return PodUpdate(list(pods), op, source, uids or [])


def summary(updates: list[PodUpdate]) -> list[tuple[Op, str, list[str]]]:
    return [(u.op, u.source, [p.uid for p in u.pods]) for u in updates]


def uids(pods: list[Pod]) -> list[str]:
    return [p.uid for p in pods]


# --- ADD / UPDATE / DELETE / RECONCILE -----------------------------------------------------------


def test_add_stamps_a_copy_and_leaves_the_input_alone() -> None:
    storage, events = new_storage()
    pod = make_pod(annotations={CONFIG_HASH: "uid-web"})
    before = pod.model_dump()
    out = storage.merge(up(Op.ADD, FILE_SOURCE, pod))
    assert summary(out) == [(Op.ADD, FILE_SOURCE, ["uid-web"])]
    emitted = out[0].pods[0]
    assert emitted is not pod
    assert pod.model_dump() == before
    assert emitted.metadata.annotations == {
        CONFIG_HASH: "uid-web",
        CONFIG_SOURCE: FILE_SOURCE,
        CONFIG_SEEN: (T0 + timedelta(seconds=1)).isoformat(),
    }
    assert storage.active_pods() == [emitted]
    assert storage.active_pods()[0] is emitted
    assert events == []


@pytest.mark.parametrize("op", [Op.ADD, Op.UPDATE, Op.DELETE])
def test_unknown_uid_is_an_add_whatever_the_input_op(op: Op) -> None:
    storage, _ = new_storage()
    assert summary(storage.merge(up(op, API_SOURCE, make_pod()))) == [
        (Op.ADD, API_SOURCE, ["uid-web"])
    ]


@pytest.mark.parametrize(
    "changed",
    [
        make_pod(image="nginx:2"),
        make_pod(labels={"app": "web"}),
        make_pod(annotations={"team": "blue"}),
        make_pod(grace=5),
    ],
    ids=["spec", "labels", "annotation", "grace-period"],
)
def test_a_semantic_change_is_an_update_that_keeps_the_first_seen_stamp(changed: Pod) -> None:
    storage, _ = new_storage()
    first = storage.merge(up(Op.ADD, FILE_SOURCE, make_pod()))[0].pods[0]
    out = storage.merge(up(Op.UPDATE, FILE_SOURCE, changed))
    assert summary(out) == [(Op.UPDATE, FILE_SOURCE, ["uid-web"])]
    stored = out[0].pods[0]
    assert stored is not changed
    assert stored.spec == changed.spec
    assert stored.metadata.labels == changed.metadata.labels
    assert stored.metadata.annotations[CONFIG_SEEN] == first.metadata.annotations[CONFIG_SEEN]
    assert stored.metadata.annotations[CONFIG_SOURCE] == FILE_SOURCE
    # What went out earlier is not rewritten behind the consumer's back.
    assert first.spec == make_pod().spec
    assert CONFIG_SEEN not in changed.metadata.annotations


def test_a_change_of_local_annotations_only_is_no_change() -> None:
    storage, _ = new_storage()
    storage.merge(up(Op.ADD, FILE_SOURCE, make_pod(annotations={"team": "blue"})))
    local = {
        "team": "blue",
        CONFIG_SEEN: "2030-01-01T00:00:00+00:00",
        CONFIG_SOURCE: "elsewhere",
        CONFIG_MIRROR: "x",
    }
    assert set(local) - LOCAL_ANNOTATIONS == {"team"}
    assert storage.merge(up(Op.UPDATE, FILE_SOURCE, make_pod(annotations=local))) == []
    assert storage.merge(up(Op.ADD, FILE_SOURCE, make_pod(annotations={"team": "blue"}))) == []


def test_status_only_is_a_reconcile_that_stores_the_status() -> None:
    storage, _ = new_storage()
    first = storage.merge(up(Op.ADD, API_SOURCE, make_pod()))[0].pods[0]
    out = storage.merge(up(Op.UPDATE, API_SOURCE, make_pod(phase="Running")))
    assert summary(out) == [(Op.RECONCILE, API_SOURCE, ["uid-web"])]
    assert out[0].pods[0].status.phase == "Running"
    assert storage.active_pods()[0] is out[0].pods[0]
    assert out[0].pods[0].metadata.annotations == first.metadata.annotations
    assert first.status.phase is None
    # The same status again is a duplicate.
    assert storage.merge(up(Op.UPDATE, API_SOURCE, make_pod(phase="Running"))) == []


def test_deletion_timestamp_is_a_delete() -> None:
    storage, _ = new_storage()
    storage.merge(up(Op.ADD, API_SOURCE, make_pod()))
    out = storage.merge(up(Op.UPDATE, API_SOURCE, make_pod(deleted=True, grace=30)))
    assert summary(out) == [(Op.DELETE, API_SOURCE, ["uid-web"])]
    assert out[0].pods[0].metadata.deletion_grace_period_seconds == 30
    assert storage.merge(up(Op.DELETE, API_SOURCE, make_pod(deleted=True, grace=30))) == []
    # A shorter grace period on a deleted pod is another DELETE.
    out = storage.merge(up(Op.DELETE, API_SOURCE, make_pod(deleted=True, grace=0)))
    assert summary(out) == [(Op.DELETE, API_SOURCE, ["uid-web"])]


def test_unchanged_pod_is_dropped() -> None:
    storage, _ = new_storage()
    storage.merge(up(Op.ADD, FILE_SOURCE, make_pod()))
    assert storage.merge(up(Op.ADD, FILE_SOURCE, make_pod())) == []
    assert storage.merge(up(Op.UPDATE, FILE_SOURCE, make_pod())) == []
    storage.merge(up(Op.SET, FILE_SOURCE, make_pod()))
    assert storage.merge(up(Op.SET, FILE_SOURCE, make_pod())) == []


def test_emitted_lists_follow_the_update_order() -> None:
    storage, _ = new_storage()
    names = ["zeta", "alpha", "mid", "beta"]
    out = storage.merge(up(Op.SET, FILE_SOURCE, *(make_pod(n) for n in names)))
    assert summary(out) == [(Op.ADD, FILE_SOURCE, [f"uid-{n}" for n in names])]
    changed = [make_pod(n, image="v2") for n in reversed(names)]
    out = storage.merge(up(Op.SET, FILE_SOURCE, *changed))
    assert summary(out) == [(Op.UPDATE, FILE_SOURCE, [f"uid-{n}" for n in reversed(names)])]


def test_one_set_emits_each_kind_in_the_incremental_order() -> None:
    storage, _ = new_storage()
    storage.merge(
        up(Op.SET, API_SOURCE, make_pod("gone"), make_pod("upd"), make_pod("del"), make_pod("rec"))
    )
    out = storage.merge(
        up(
            Op.SET,
            API_SOURCE,
            make_pod("rec", phase="Running"),
            make_pod("del", deleted=True),
            make_pod("new"),
            make_pod("upd", image="v2"),
        )
    )
    assert summary(out) == [
        (Op.REMOVE, API_SOURCE, ["uid-gone"]),
        (Op.ADD, API_SOURCE, ["uid-new"]),
        (Op.UPDATE, API_SOURCE, ["uid-upd"]),
        (Op.DELETE, API_SOURCE, ["uid-del"]),
        (Op.RECONCILE, API_SOURCE, ["uid-rec"]),
    ]


# --- REMOVE / SET --------------------------------------------------------------------------------


def test_remove_by_pod_and_by_uid_ignores_unknown() -> None:
    storage, _ = new_storage()
    stored = storage.merge(up(Op.ADD, FILE_SOURCE, make_pod("a"), make_pod("b"), make_pod("c")))
    a, _, c = stored[0].pods
    out = storage.merge(
        up(Op.REMOVE, FILE_SOURCE, make_pod("c"), make_pod("nope"), uids=["uid-a", "uid-c", "x"])
    )
    assert summary(out) == [(Op.REMOVE, FILE_SOURCE, ["uid-c", "uid-a"])]
    assert out[0].pods == [c, a]
    assert out[0].pods[0] is c
    assert uids(storage.active_pods()) == ["uid-b"]
    assert storage.merge(up(Op.REMOVE, FILE_SOURCE, uids=["uid-a"])) == []
    # A source removes only its own pods.
    assert storage.merge(up(Op.REMOVE, HTTP_SOURCE, uids=["uid-b"])) == []
    assert uids(storage.active_pods()) == ["uid-b"]


def test_set_replaces_the_sources_pods() -> None:
    storage, _ = new_storage()
    storage.merge(up(Op.SET, FILE_SOURCE, make_pod("a"), make_pod("b")))
    storage.merge(up(Op.SET, HTTP_SOURCE, make_pod("h")))
    out = storage.merge(up(Op.SET, FILE_SOURCE, make_pod("b"), make_pod("c")))
    assert summary(out) == [
        (Op.REMOVE, FILE_SOURCE, ["uid-a"]),
        (Op.ADD, FILE_SOURCE, ["uid-c"]),
    ]
    assert summary(storage.merge(up(Op.SET, FILE_SOURCE))) == [
        (Op.REMOVE, FILE_SOURCE, ["uid-b", "uid-c"])
    ]
    assert uids(storage.active_pods()) == ["uid-h"]
    assert storage.source_pods(FILE_SOURCE) == []
    assert uids(storage.source_pods(HTTP_SOURCE)) == ["uid-h"]


def test_first_set_without_changes_sends_an_empty_add() -> None:
    storage, _ = new_storage()
    assert summary(storage.merge(up(Op.SET, FILE_SOURCE))) == [(Op.ADD, FILE_SOURCE, [])]
    assert storage.merge(up(Op.SET, FILE_SOURCE)) == []
    # Pods that arrived by ADD before the first SET: the SET changes nothing, but is still news.
    storage.merge(up(Op.ADD, HTTP_SOURCE, make_pod("h")))
    assert summary(storage.merge(up(Op.SET, HTTP_SOURCE, make_pod("h")))) == [
        (Op.ADD, HTTP_SOURCE, [])
    ]
    # Reconciles do not count: the empty ADD still goes out, before them.
    storage.merge(up(Op.ADD, API_SOURCE, make_pod("p")))
    out = storage.merge(up(Op.SET, API_SOURCE, make_pod("p", phase="Running")))
    assert summary(out) == [(Op.ADD, API_SOURCE, []), (Op.RECONCILE, API_SOURCE, ["uid-p"])]


def test_first_set_with_pods_sends_no_extra_empty_add() -> None:
    storage, _ = new_storage()
    assert summary(storage.merge(up(Op.SET, FILE_SOURCE, make_pod()))) == [
        (Op.ADD, FILE_SOURCE, ["uid-web"])
    ]


def test_non_input_op_is_rejected() -> None:
    storage, _ = new_storage()
    with pytest.raises(ValueError, match="RECONCILE"):
        storage.merge(up(Op.RECONCILE, FILE_SOURCE, make_pod()))


# --- duplicates and name claims ------------------------------------------------------------------


def test_duplicate_name_or_uid_within_one_update_is_dropped() -> None:
    storage, events = new_storage()
    out = storage.merge(
        up(
            Op.SET,
            FILE_SOURCE,
            make_pod("web", "u1"),
            make_pod("web", "u2", image="other"),
            make_pod("db", "u1"),
            make_pod("web", "u1", image="third"),
            make_pod("db", "u3"),
        )
    )
    assert summary(out) == [(Op.ADD, FILE_SOURCE, ["u1", "u3"])]
    assert out[0].pods[0].spec.containers[0].image == "nginx"
    assert [(r, k) for r, k, _ in events] == [
        (FAILED_VALIDATION, "default/web"),
        (FAILED_VALIDATION, "default/db"),
        (FAILED_VALIDATION, "default/web"),
    ]
    assert "duplicate pod default/web in one update from source file" in events[0][2]
    assert "duplicate pod uid u1" in events[1][2]


def test_same_name_in_another_namespace_is_no_clash() -> None:
    storage, events = new_storage()
    out = storage.merge(
        up(Op.SET, FILE_SOURCE, make_pod("web", "u1"), make_pod("web", "u2", namespace="kube"))
    )
    assert summary(out) == [(Op.ADD, FILE_SOURCE, ["u1", "u2"])]
    assert events == []


def test_name_clash_across_sources_shadows_until_the_holder_goes() -> None:
    storage, events = new_storage()
    file_pod = make_pod("web-node1", "file-uid")
    storage.merge(up(Op.SET, FILE_SOURCE, file_pod))
    # The http pod is stored but not emitted.
    assert storage.merge(up(Op.SET, HTTP_SOURCE, make_pod("web-node1", "http-uid"))) == [
        PodUpdate([], Op.ADD, HTTP_SOURCE)
    ]
    assert events == [
        (
            FAILED_VALIDATION,
            "default/web-node1",
            "duplicate pod default/web-node1 from source http: already provided by source file",
        )
    ]
    assert uids(storage.active_pods()) == ["file-uid"]
    assert uids(storage.source_pods(HTTP_SOURCE)) == ["http-uid"]
    assert not storage.is_active(HTTP_SOURCE, "http-uid")
    # Changes to a shadowed pod are tracked but not emitted, and not reported again.
    newer = make_pod("web-node1", "http-uid", image="v2", phase="Running")
    assert storage.merge(up(Op.SET, HTTP_SOURCE, newer)) == []
    assert storage.merge(up(Op.SET, HTTP_SOURCE, newer.model_copy(deep=True))) == []
    assert len(events) == 1
    # The holder goes: the shadowed pod, in its latest version, takes over.
    out = storage.merge(up(Op.SET, FILE_SOURCE))
    assert summary(out) == [
        (Op.REMOVE, FILE_SOURCE, ["file-uid"]),
        (Op.ADD, FILE_SOURCE, ["http-uid"]),
    ]
    promoted = out[1].pods[0]
    assert promoted.spec.containers[0].image == "v2"
    assert promoted.metadata.annotations[CONFIG_SOURCE] == HTTP_SOURCE
    assert uids(storage.active_pods()) == ["http-uid"]
    # It is the holder now: a new file pod of that name waits behind it.
    storage.merge(up(Op.SET, FILE_SOURCE, file_pod))
    assert uids(storage.active_pods()) == ["http-uid"]
    assert events[-1][2] == (
        "duplicate pod default/web-node1 from source file: already provided by source http"
    )


def test_the_oldest_shadowed_claimant_is_promoted() -> None:
    storage, _ = new_storage()
    storage.merge(up(Op.SET, FILE_SOURCE, make_pod("web", "f")))
    storage.merge(up(Op.SET, API_SOURCE, make_pod("web", "a")))
    storage.merge(up(Op.SET, HTTP_SOURCE, make_pod("web", "h")))
    assert summary(storage.merge(up(Op.REMOVE, FILE_SOURCE, uids=["f"]))) == [
        (Op.REMOVE, FILE_SOURCE, ["f"]),
        (Op.ADD, FILE_SOURCE, ["a"]),
    ]
    # Removing a shadowed pod emits nothing.
    assert storage.merge(up(Op.SET, HTTP_SOURCE)) == []
    assert summary(storage.merge(up(Op.SET, API_SOURCE))) == [(Op.REMOVE, API_SOURCE, ["a"])]
    assert storage.active_pods() == []


def test_a_second_uid_for_a_name_in_the_same_source_is_shadowed() -> None:
    storage, events = new_storage()
    storage.merge(up(Op.ADD, API_SOURCE, make_pod("web", "u1")))
    assert storage.merge(up(Op.ADD, API_SOURCE, make_pod("web", "u2"))) == []
    assert events[0][2] == (
        "duplicate pod default/web from source api: already provided by source api"
    )
    assert summary(storage.merge(up(Op.REMOVE, API_SOURCE, uids=["u1"]))) == [
        (Op.REMOVE, API_SOURCE, ["u1"]),
        (Op.ADD, API_SOURCE, ["u2"]),
    ]


def test_a_promoted_pod_changed_in_the_same_set_goes_out_once_as_add() -> None:
    storage, _ = new_storage()
    storage.merge(up(Op.ADD, API_SOURCE, make_pod("web", "u1"), make_pod("other", "u0")))
    storage.merge(up(Op.ADD, API_SOURCE, make_pod("web", "u2")))
    out = storage.merge(up(Op.SET, API_SOURCE, make_pod("web", "u2", image="v2")))
    assert summary(out) == [
        (Op.REMOVE, API_SOURCE, ["u1", "u0"]),
        (Op.ADD, API_SOURCE, ["u2"]),
    ]
    assert out[1].pods[0].spec.containers[0].image == "v2"


def test_an_edited_static_pod_swaps_uid_in_one_set() -> None:
    storage, events = new_storage()
    storage.merge(up(Op.SET, FILE_SOURCE, make_pod("web-node1", "old"), make_pod("db", "db")))
    out = storage.merge(
        up(Op.SET, FILE_SOURCE, make_pod("db", "db"), make_pod("web-node1", "new", image="v2"))
    )
    assert summary(out) == [(Op.REMOVE, FILE_SOURCE, ["old"]), (Op.ADD, FILE_SOURCE, ["new"])]
    assert events == []
    assert uids(storage.active_pods()) == ["db", "new"]


def test_the_same_uid_from_two_sources_is_active_once() -> None:
    storage, events = new_storage()
    storage.merge(up(Op.SET, FILE_SOURCE, make_pod("a", "same")))
    assert storage.merge(up(Op.ADD, HTTP_SOURCE, make_pod("b", "same"))) == []
    assert events[0][2] == (
        "duplicate pod uid same (default/b) from source http: already provided by source file"
    )
    assert summary(storage.merge(up(Op.SET, FILE_SOURCE))) == [
        (Op.REMOVE, FILE_SOURCE, ["same"]),
        (Op.ADD, FILE_SOURCE, ["same"]),
    ]
    assert [p.metadata.name for p in storage.active_pods()] == ["b"]


def test_a_pod_waits_only_while_an_active_pod_blocks_it() -> None:
    storage, _ = new_storage()
    storage.merge(up(Op.SET, FILE_SOURCE, make_pod("a", "u")))
    storage.merge(up(Op.SET, HTTP_SOURCE, make_pod("b", "v")))
    # Wants name a (held by file) and uid v (held by http).
    assert storage.merge(up(Op.SET, API_SOURCE, make_pod("a", "v"))) == [
        PodUpdate([], Op.ADD, API_SOURCE)
    ]
    assert summary(storage.merge(up(Op.SET, FILE_SOURCE))) == [(Op.REMOVE, FILE_SOURCE, ["u"])]
    # Name a is free, and the api pod waits on uid v only: a newcomer for name a may have it.
    assert summary(storage.merge(up(Op.ADD, FILE_SOURCE, make_pod("a", "w")))) == [
        (Op.ADD, FILE_SOURCE, ["w"])
    ]
    # Freeing uid v does not demote the file pod: the api pod waits on.
    assert summary(storage.merge(up(Op.SET, HTTP_SOURCE))) == [(Op.REMOVE, HTTP_SOURCE, ["v"])]
    assert summary(storage.merge(up(Op.SET, FILE_SOURCE))) == [
        (Op.REMOVE, FILE_SOURCE, ["w"]),
        (Op.ADD, FILE_SOURCE, ["v"]),
    ]
    assert [(p.metadata.name, p.uid) for p in storage.active_pods()] == [("a", "v")]


def test_a_mirror_pod_does_not_claim_its_static_pods_name() -> None:
    storage, events = new_storage()
    mirror = make_pod("web-node1", "m", annotations={CONFIG_MIRROR: "s"})
    storage.merge(up(Op.SET, API_SOURCE, mirror))
    out = storage.merge(up(Op.SET, FILE_SOURCE, make_pod("web-node1", "s")))
    assert summary(out) == [(Op.ADD, FILE_SOURCE, ["s"])]
    assert events == []
    assert uids(storage.active_pods()) == ["m", "s"]


def test_a_rename_under_the_same_uid_is_rejected() -> None:
    storage, events = new_storage()
    storage.merge(up(Op.SET, FILE_SOURCE, make_pod("web", "u1")))
    assert storage.merge(up(Op.SET, FILE_SOURCE, make_pod("other", "u1", image="v2"))) == []
    assert events[0][2] == (
        "pod uid u1 from source file changed its name from default/web to default/other: ignored"
    )
    [kept] = storage.active_pods()
    assert (kept.metadata.name, kept.spec.containers[0].image) == ("web", "nginx")


# --- notification modes --------------------------------------------------------------------------


def test_snapshot_mode_sends_the_merged_set_on_any_change() -> None:
    storage, _ = new_storage(SNAP)
    out = storage.merge(up(Op.SET, FILE_SOURCE, make_pod("a")))
    assert summary(out) == [(Op.SET, ALL_SOURCES, ["uid-a"])]
    assert summary(storage.merge(up(Op.SET, HTTP_SOURCE))) == [(Op.SET, ALL_SOURCES, ["uid-a"])]
    assert storage.merge(up(Op.SET, HTTP_SOURCE)) == []
    assert summary(storage.merge(up(Op.ADD, HTTP_SOURCE, make_pod("h")))) == [
        (Op.SET, ALL_SOURCES, ["uid-a", "uid-h"])
    ]
    for changed in (make_pod("h", image="v2"), make_pod("h", image="v2", phase="Running")):
        out = storage.merge(up(Op.UPDATE, HTTP_SOURCE, changed))
        assert summary(out) == [(Op.SET, ALL_SOURCES, ["uid-a", "uid-h"])]
        assert out[0].pods[1] == storage.active_pods()[1]
    same = make_pod("h", image="v2", phase="Running")
    assert storage.merge(up(Op.UPDATE, HTTP_SOURCE, same)) == []
    assert summary(storage.merge(up(Op.REMOVE, FILE_SOURCE, uids=["uid-a"]))) == [
        (Op.SET, ALL_SOURCES, ["uid-h"])
    ]


def test_snapshot_and_updates_mode() -> None:
    storage, _ = new_storage(SNAP_UPD)
    assert summary(storage.merge(up(Op.SET, FILE_SOURCE))) == [(Op.SET, ALL_SOURCES, [])]
    assert summary(storage.merge(up(Op.SET, FILE_SOURCE, make_pod("a"), make_pod("b")))) == [
        (Op.SET, ALL_SOURCES, ["uid-a", "uid-b"])
    ]
    out = storage.merge(up(Op.SET, FILE_SOURCE, make_pod("a", image="v2"), make_pod("b")))
    assert summary(out) == [(Op.UPDATE, FILE_SOURCE, ["uid-a"])]
    out = storage.merge(
        up(Op.SET, FILE_SOURCE, make_pod("a", image="v2", deleted=True), make_pod("c"))
    )
    assert summary(out) == [
        (Op.SET, ALL_SOURCES, ["uid-a", "uid-c"]),
        (Op.DELETE, FILE_SOURCE, ["uid-a"]),
    ]
    deleted = make_pod("a", image="v2", deleted=True)
    out = storage.merge(up(Op.SET, FILE_SOURCE, deleted, make_pod("c", phase="Running")))
    assert summary(out) == [(Op.RECONCILE, FILE_SOURCE, ["uid-c"])]


def test_sources_ready_needs_a_set_from_every_registered_source() -> None:
    storage, _ = new_storage()
    assert storage.all_sources_ready()
    storage.register(FILE_SOURCE)
    storage.register(HTTP_SOURCE)
    assert not storage.all_sources_ready()
    storage.merge(up(Op.SET, FILE_SOURCE))
    assert storage.seen_sources() == {FILE_SOURCE}
    storage.merge(up(Op.ADD, HTTP_SOURCE, make_pod()))
    storage.merge(up(Op.REMOVE, HTTP_SOURCE, uids=["uid-web"]))
    assert not storage.all_sources_ready()
    # An unregistered source is tracked but not waited for.
    storage.merge(up(Op.SET, API_SOURCE))
    assert not storage.all_sources_ready()
    storage.merge(up(Op.SET, HTTP_SOURCE))
    assert storage.all_sources_ready()
    assert storage.seen_sources() == {FILE_SOURCE, HTTP_SOURCE, API_SOURCE}


async def test_pod_config_channels_feed_the_queue_under_their_own_name() -> None:
    config = PodConfig(clock=Clock())
    to_file = config.channel(FILE_SOURCE)
    to_http = config.channel(HTTP_SOURCE)
    assert not config.all_sources_ready()
    to_file(up(Op.SET, FILE_SOURCE, make_pod("a")))
    # A source cannot speak for another one.
    to_http(up(Op.SET, FILE_SOURCE))
    assert config.all_sources_ready()
    assert config.seen_sources() == {FILE_SOURCE, HTTP_SOURCE}
    assert uids(config.storage.active_pods()) == ["uid-a"]
    got = [await asyncio.wait_for(config.updates.get(), 1) for _ in range(2)]
    assert summary(got) == [(Op.ADD, FILE_SOURCE, ["uid-a"]), (Op.ADD, HTTP_SOURCE, [])]
    assert config.updates.empty()


def test_a_large_resync_with_one_change_emits_only_that_change() -> None:
    storage, _ = new_storage()
    pods = [make_pod(f"p{i}") for i in range(2000)]
    storage.merge(up(Op.SET, API_SOURCE, *pods))
    pods[1234] = make_pod("p1234", image="v2")
    assert summary(storage.merge(up(Op.SET, API_SOURCE, *pods))) == [
        (Op.UPDATE, API_SOURCE, ["uid-p1234"])
    ]


# --- properties ----------------------------------------------------------------------------------

SOURCES = [FILE_SOURCE, HTTP_SOURCE, API_SOURCE]
PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def strip_local(pod: Pod) -> dict[str, Any]:
    data = pod.to_api()
    annotations = data["metadata"].get("annotations", {})
    data["metadata"]["annotations"] = {
        k: v for k, v in annotations.items() if k not in LOCAL_ANNOTATIONS
    }
    return data


VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "status": {"phase": "Running"},
    "spec": {"image": "v2"},
    "labels": {"labels": {"v": "1"}},
    "annotation": {"annotations": {"k": "1"}},
    "local-annotation": {"annotations": {CONFIG_SEEN: "then"}},
    "deleted": {"deleted": True},
}


@st.composite
def pod_variants(draw: st.DrawFn, name: str, uid: str) -> Pod:
    # The base pod or one change to it, so repeats (duplicates, reconciles) are common too.
    variant = draw(st.sampled_from(["base", "base", *VARIANTS]))
    return make_pod(name, uid, **VARIANTS[variant])


@st.composite
def own_name_pods(draw: st.DrawFn, source: str) -> Pod:
    """A pod whose name belongs to `source` and whose UID belongs to its name."""
    name = f"{source}-{draw(st.sampled_from('abc'))}"
    return draw(pod_variants(name, f"{name}-{draw(st.sampled_from('01'))}"))


@st.composite
def own_sets(draw: st.DrawFn) -> tuple[str, list[Pod]]:
    source = draw(st.sampled_from(SOURCES))
    return source, draw(st.lists(own_name_pods(source), max_size=5))


def dedupe(pods: list[Pod]) -> list[Pod]:
    keys: set[str] = set()
    seen_uids: set[str] = set()
    kept = []
    for pod in pods:
        if pod.key not in keys and pod.uid not in seen_uids:
            keys.add(pod.key)
            seen_uids.add(pod.uid)
            kept.append(pod)
    return kept


def by_uid(pods: list[Pod]) -> dict[str, dict[str, Any]]:
    result = {p.uid: strip_local(p) for p in pods}
    assert len(result) == len(pods)
    return result


@PROPERTY
@given(st.lists(own_sets(), min_size=1, max_size=12), st.sampled_from(list(NotificationMode)))
def test_active_state_is_the_union_of_each_sources_last_set(
    sets: list[tuple[str, list[Pod]]], mode: NotificationMode
) -> None:
    storage, events = new_storage(mode)
    last: dict[str, list[Pod]] = {}
    for source, pods in sets:
        storage.merge(PodUpdate(pods, Op.SET, source))
        last[source] = dedupe(pods)
        expected = [p for source_pods in last.values() for p in source_pods]
        assert by_uid(storage.active_pods()) == by_uid(expected)
        assert storage.seen_sources() == set(last)
    assert all("in one update" in message for _, _, message in events)


# Names and UIDs shared by all sources, so clashes, UID reuse and renames all happen. Each UID has
# a usual name (u and x share one), or else any name.
USUAL_NAME = {"u": "a", "v": "b", "w": "c", "x": "a"}


@st.composite
def shared_pods(draw: st.DrawFn) -> Pod:
    uid = draw(st.sampled_from("uvwx"))
    name = draw(st.sampled_from([USUAL_NAME[uid]] * 4 + list("abc")))
    return draw(pod_variants(name, uid))


@st.composite
def any_updates(draw: st.DrawFn) -> PodUpdate:
    source = draw(st.sampled_from(SOURCES))
    op = draw(st.sampled_from([Op.SET, Op.SET, Op.ADD, Op.UPDATE, Op.DELETE, Op.REMOVE]))
    pods = draw(st.lists(shared_pods(), max_size=4))
    removed = draw(st.lists(st.sampled_from("uvwx"), max_size=2)) if op is Op.REMOVE else []
    return PodUpdate(pods, op, source, removed)


def replay(state: dict[str, Pod], out: list[PodUpdate]) -> None:
    for update in out:
        if update.op is Op.SET:
            state.clear()
            state.update((p.uid, p) for p in update.pods)
        for pod in update.pods:
            if update.op is Op.REMOVE:
                del state[pod.uid]
            elif update.op is not Op.SET:
                state[pod.uid] = pod


def check_merged_state(storage: PodStorage) -> dict[str, Pod]:
    active = storage.active_pods()
    names = [p.key for p in active if CONFIG_MIRROR not in p.metadata.annotations]
    assert len(set(names)) == len(names)
    state = {p.uid: p for p in active}
    assert len(state) == len(active)
    # Shadowing is only for pods in conflict: one with a name and UID of its own is active.
    for source in SOURCES:
        for pod in storage.source_pods(source):
            if not storage.is_active(source, pod.uid):
                assert pod.key in names or pod.uid in state
    return state


INCREMENTAL_ORDER = [Op.REMOVE, Op.ADD, Op.UPDATE, Op.DELETE, Op.RECONCILE]


@PROPERTY
@given(st.lists(any_updates(), min_size=1, max_size=15), st.sampled_from([INC, SNAP_UPD]))
def test_replaying_the_stream_gives_the_merged_state(
    updates: list[PodUpdate], mode: NotificationMode
) -> None:
    storage, _ = new_storage(mode)
    state: dict[str, Pod] = {}
    for update in updates:
        before = [p.model_dump() for p in update.pods]
        out = storage.merge(update)
        assert [p.model_dump() for p in update.pods] == before
        if mode is INC:
            ops = [u.op for u in out]
            assert ops == sorted(ops, key=INCREMENTAL_ORDER.index)
            assert all(u.source == update.source for u in out)
        replay(state, out)
        active = check_merged_state(storage)
        assert state.keys() == active.keys()
        assert all(state[uid] is active[uid] for uid in state)


@PROPERTY
@given(st.lists(any_updates(), min_size=1, max_size=15))
def test_the_last_snapshot_is_the_merged_state(updates: list[PodUpdate]) -> None:
    storage, _ = new_storage(SNAP)
    last: list[Pod] = []
    for update in updates:
        out = storage.merge(update)
        assert len(out) <= 1
        if out:
            assert (out[0].op, out[0].source) == (Op.SET, ALL_SOURCES)
            last = out[0].pods
        assert {p.uid: id(p) for p in last} == {
            p.uid: id(p) for p in check_merged_state(storage).values()
        }


class MergerMachine(RuleBasedStateMachine):
    """Random traffic against a model of each source's pods (content only, not claims)."""

    def __init__(self) -> None:
        super().__init__()
        self.storage, _ = new_storage(INC)
        for source in SOURCES[:2]:
            self.storage.register(source)
        self.model: dict[str, dict[str, Pod]] = {s: {} for s in SOURCES}
        self.seen: set[str] = set()
        self.state: dict[str, Pod] = {}

    def _upsert(self, source: str, pods: list[Pod], into: dict[str, Pod]) -> None:
        old = self.model[source]
        for pod in dedupe(pods):
            stored = old.get(pod.uid)
            # A rename is rejected: the source keeps its old pod.
            into[pod.uid] = stored if stored is not None and stored.key != pod.key else pod

    @rule(source=st.sampled_from(SOURCES), pods=st.lists(shared_pods(), max_size=4))
    def set_pods(self, source: str, pods: list[Pod]) -> None:
        self.state_after(PodUpdate(pods, Op.SET, source))
        new: dict[str, Pod] = {}
        self._upsert(source, pods, new)
        self.model[source] = new
        self.seen.add(source)

    @rule(
        source=st.sampled_from(SOURCES),
        op=st.sampled_from([Op.ADD, Op.UPDATE, Op.DELETE]),
        pods=st.lists(shared_pods(), min_size=1, max_size=3),
    )
    def upsert_pods(self, source: str, op: Op, pods: list[Pod]) -> None:
        self.state_after(PodUpdate(pods, op, source))
        self._upsert(source, pods, self.model[source])

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def remove_pods(self, data: st.DataObject) -> None:
        source = data.draw(st.sampled_from([s for s in SOURCES if self.model[s]]))
        gone = data.draw(st.lists(st.sampled_from(sorted(self.model[source])), min_size=1))
        self.state_after(PodUpdate([], Op.REMOVE, source, gone))
        for uid in gone:
            self.model[source].pop(uid, None)

    def state_after(self, update: PodUpdate) -> None:
        replay(self.state, self.storage.merge(update))

    @invariant()
    def sources_match_the_model(self) -> None:
        for source in SOURCES:
            assert by_uid(self.storage.source_pods(source)) == by_uid(
                list(self.model[source].values())
            )

    @invariant()
    def the_stream_matches_the_merged_state(self) -> None:
        active = check_merged_state(self.storage)
        assert self.state.keys() == active.keys()

    @invariant()
    def readiness_follows_sets(self) -> None:
        assert self.storage.seen_sources() == self.seen
        assert self.storage.all_sources_ready() == set(SOURCES[:2]).issubset(self.seen)


TestMergerMachine = MergerMachine.TestCase
TestMergerMachine.settings = settings(
    max_examples=60,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


async def test_wait_listed_returns_once_the_source_sent_its_whole_state() -> None:
    config = PodConfig()
    push = config.channel(FILE_SOURCE)
    waiter = asyncio.create_task(config.wait_listed(FILE_SOURCE))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    push(PodUpdate([], Op.SET, FILE_SOURCE))  # an empty directory listed is a state too
    await asyncio.wait_for(waiter, 5)
    await asyncio.wait_for(config.wait_listed(FILE_SOURCE), 5)  # already listed: at once


# A pool of pod objects, some sharing a name or a UID, some renames and status-only changes of
# another: SETs drawn from it reuse objects, as the file source re-sends its unchanged pods.
_POOL = [
    make_pod("a"),
    make_pod("a", image="redis"),
    make_pod("a", "uid-a2"),
    make_pod("b"),
    make_pod("b", phase="Running"),
    make_pod("c"),
    make_pod("c", "uid-b"),
    make_pod("renamed", "uid-c"),
    make_pod("d", deleted=True),
    make_pod("d"),
    make_pod("e"),
    make_pod("e", labels={"x": "y"}),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from([FILE_SOURCE, HTTP_SOURCE]),
            # A whole new list of pods, or one position of the source's last list replaced.
            st.one_of(
                st.lists(st.integers(0, len(_POOL) - 1), min_size=4, max_size=8),
                st.tuples(st.integers(0, 7), st.integers(0, len(_POOL) - 1)),
            ),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_a_set_merged_by_its_changed_positions_is_the_whole_merge(
    steps: list[tuple[str, list[int] | tuple[int, int]]],
) -> None:
    # `fast` may merge a SET by the positions that changed since the source's last SET;
    # `whole` gets an empty UPDATE before each SET, which makes it merge the whole SET.
    fast, fast_events = new_storage()
    whole, whole_events = new_storage()
    last: dict[str, list[Pod]] = {}
    for source, step in steps:
        if isinstance(step, list):
            pods = [_POOL[i] for i in step]
        else:
            pods = list(last.get(source, []))
            if not pods:
                continue
            pods[step[0] % len(pods)] = _POOL[step[1]]
        last[source] = pods
        whole.merge(up(Op.UPDATE, source))
        expected = whole.merge(PodUpdate(list(pods), Op.SET, source))
        got = fast.merge(PodUpdate(list(pods), Op.SET, source))
        assert summary([u for u in got if u.pods]) == summary([u for u in expected if u.pods])
        assert [p.model_dump() for p in fast.active_pods()] == [
            p.model_dump() for p in whole.active_pods()
        ]
        assert fast_events == whole_events
