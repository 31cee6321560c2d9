"""ConfigMaps and Secrets through a watch of each object the desired pods name (the kubelet's
default `Watch` strategy, `cluster/watched_objects.py`), against the fixture API server over
HTTP: what is watched, what is read with no request, what a change, an immutable object, an
idle watch and an unreachable server do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pykubelet.api.model import Pod
from pykubelet.cluster.connection import ApiConnection
from pykubelet.cluster.watched_objects import WatchedObjects, pod_references
from pykubelet.pod.envvars import EnvError
from tests.fixtures.apiserver import ApiServer

Obj = dict[str, Any]


def pod(
    uid: str, config_maps: tuple[str, ...] = (), secrets: tuple[str, ...] = (), pull: str = ""
) -> Pod:
    volumes: list[Obj] = [{"name": f"cm-{n}", "configMap": {"name": n}} for n in config_maps]
    env = [
        {"name": f"S_{i}", "valueFrom": {"secretKeyRef": {"name": n, "key": "k"}}}
        for i, n in enumerate(secrets)
    ]
    spec: Obj = {
        "containers": [{"name": "c", "image": "i", "command": ["true"], "env": env}],
        "volumes": volumes,
    }
    if pull:
        spec["imagePullSecrets"] = [{"name": pull}]
    return Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p-{uid}", "namespace": "shop", "uid": uid},
            "spec": spec,
        }
    )


def config_map(name: str, **data: str) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


@pytest.fixture
async def connection(server: ApiServer, tmp_path: Path) -> AsyncIterator[ApiConnection]:
    conn = ApiConnection(server.write_kubeconfig(tmp_path / "kc"), "n1")
    task = asyncio.create_task(conn.run())
    await asyncio.wait_for(conn.connected.wait(), 10)
    yield conn
    task.cancel()
    await conn.close()


@pytest.fixture
async def objects(connection: ApiConnection) -> AsyncIterator[WatchedObjects]:
    watched = WatchedObjects(connection, 300.0)
    task = asyncio.create_task(watched.run())
    yield watched
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def object_requests(server: ApiServer, resource: str, name: str) -> list[str]:
    """The requests for one object: "get", "list" or "watch"."""
    out = []
    for r in server.requests():
        if not r.path.startswith(f"/api/v1/namespaces/shop/{resource}"):
            continue
        if r.path.endswith(f"/{resource}/{name}"):
            out.append("get")
        elif r.query.get("fieldSelector") == f"metadata.name={name}":
            out.append("watch" if r.watch else "list")
    return out


def test_a_pod_names_its_volumes_env_and_pull_secrets() -> None:
    refs = pod_references(pod("u", ("a",), ("s",), pull="regcred"))
    assert refs == {
        ("configmaps", "shop", "a"),
        ("secrets", "shop", "s"),
        ("secrets", "shop", "regcred"),
    }


async def test_reads_come_from_the_watch_and_see_changes(
    server: ApiServer, objects: WatchedObjects
) -> None:
    server.create("configmaps", config_map("app", mode="blue"), "shop")
    objects.register_pod(pod("u1", ("app",)))
    objects.register_pod(pod("u2", ("app",)))
    assert objects.watching() == [("configmaps", "shop", "app")]  # one watch for both pods
    assert await objects.config_map("shop", "app") == {"mode": "blue"}
    server.patch("configmaps", "app", {"data": {"mode": "green"}}, "shop")
    for _ in range(100):
        if await objects.config_map("shop", "app") == {"mode": "green"}:
            break
        await asyncio.sleep(0.05)
    assert await objects.config_map("shop", "app") == {"mode": "green"}
    for _ in range(10):
        await objects.config_map("shop", "app")
    # Twelve reads and a change: one list, one watch, no GET of the object.
    assert object_requests(server, "configmaps", "app") == ["list", "watch"]

    objects.unregister_pod("u1")
    assert objects.watching() == [("configmaps", "shop", "app")]
    objects.unregister_pod("u2")
    assert objects.watching() == []


async def test_a_missing_object_is_none_until_it_is_created(
    server: ApiServer, objects: WatchedObjects
) -> None:
    objects.register_pod(pod("u1", secrets=("later",)))
    assert await objects.secret("shop", "later") is None
    server.create(
        "secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "later"},
            "data": {"k": "eA=="},
        },
        "shop",
    )
    for _ in range(100):
        if await objects.secret("shop", "later") is not None:
            break
        await asyncio.sleep(0.05)
    assert await objects.typed_secret("shop", "later") == ("Opaque", {"k": b"x"})


async def test_a_changed_pod_moves_its_references(objects: WatchedObjects) -> None:
    objects.register_pod(
        pod(
            "u1",
            (
                "a",
                "b",
            ),
        )
    )
    objects.register_pod(
        pod(
            "u1",
            (
                "b",
                "c",
            ),
        )
    )
    assert objects.watching() == [("configmaps", "shop", "b"), ("configmaps", "shop", "c")]


async def test_an_object_no_pod_names_is_read_directly(
    server: ApiServer, objects: WatchedObjects
) -> None:
    server.create("configmaps", config_map("loose", k="v"), "shop")
    assert await objects.config_map("shop", "loose") == {"k": "v"}
    assert object_requests(server, "configmaps", "loose") == ["get"]
    assert objects.watching() == []


async def test_an_immutable_object_is_kept_and_no_longer_watched(
    server: ApiServer, objects: WatchedObjects
) -> None:
    server.create("configmaps", {**config_map("frozen", k="v"), "immutable": True}, "shop")
    objects.register_pod(pod("u1", ("frozen",)))
    assert await objects.config_map("shop", "frozen") == {"k": "v"}
    assert objects.watching() == []
    assert await objects.config_map("shop", "frozen") == {"k": "v"}
    assert "get" not in object_requests(server, "configmaps", "frozen")
    # The fixture refuses the change, as kube-apiserver does.
    with pytest.raises(Exception, match="field is immutable when `immutable` is set"):
        server.patch("configmaps", "frozen", {"data": {"k": "w"}}, "shop")


async def test_an_idle_watch_stops_and_the_next_read_starts_it_again(
    server: ApiServer, connection: ApiConnection
) -> None:
    server.create("configmaps", config_map("env", k="1"), "shop")
    objects = WatchedObjects(connection, 0.2, min_idle=0.2)
    objects.register_pod(pod("u1", ("env",)))
    assert await objects.config_map("shop", "env") == {"k": "1"}
    await asyncio.sleep(0.3)
    objects.recycle()
    assert objects.watching() == []
    server.patch("configmaps", "env", {"data": {"k": "2"}}, "shop")
    assert await objects.config_map("shop", "env") == {"k": "2"}  # listed again
    assert objects.watching() == [("configmaps", "shop", "env")]
    assert object_requests(server, "configmaps", "env")[:3] == ["list", "watch", "list"]
    objects.unregister_pod("u1")


async def test_a_read_waits_one_second_for_the_first_list_then_fails(
    server: ApiServer, connection: ApiConnection
) -> None:
    server.stop()
    objects = WatchedObjects(connection, 300.0, sync_wait=0.5)
    objects.register_pod(pod("u1", ("app",)))
    with pytest.raises(EnvError) as failed:
        await objects.config_map("shop", "app")
    message = str(failed.value)
    assert message.startswith(
        "failed to sync configmaps cache: timed out waiting for the condition"
    ), message
    objects.unregister_pod("u1")
