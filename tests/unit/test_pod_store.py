"""The desired pods' store: by UID and name, and its index of the static pods."""

from __future__ import annotations

from pykubelet.kubelet.pod_store import PodStore, is_static
from tests.fakes.pods import sourced_pod as pod


def test_the_static_pods_are_those_of_the_file_and_http_sources() -> None:
    store = PodStore()
    web, feed, api = pod("web", "file"), pod("feed", "http"), pod("api", "api")
    for p in (web, feed, api):
        store.put(p)
    assert [is_static(p) for p in (web, feed, api)] == [True, True, False]
    assert {p.metadata.name for p in store.static()} == {"web", "feed"}
    # A new version replaces the old one in the index too.
    newer = web.model_copy(update={"spec": web.spec.model_copy()})
    store.replace(newer)
    assert any(p is newer for p in store.static())
    store.remove(feed.uid)
    assert [p.metadata.name for p in store.static()] == ["web"]
    store.remove(web.uid)
    store.remove(api.uid)
    assert store.static() == [] and len(store) == 0
