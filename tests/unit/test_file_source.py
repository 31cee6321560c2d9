"""The file source on a real directory: listing rules, last-good pods, inotify latency."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from pykubelet.common.events import EventRecorder
from pykubelet.config.file import FileSource, ManifestDirectory, is_manifest_name
from pykubelet.config.types import Op, PodUpdate


def manifest(name: str, image: str = "busybox") -> str:
    return (
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\n"
        f"spec:\n  containers: [{{name: c, image: {image}}}]\n"
    )


def names(pods: list) -> list[str]:  # type: ignore[type-arg]
    return [p.metadata.name for p in pods]


def test_listing_rules(tmp_path: Path) -> None:
    for filename in [
        "b.yaml",
        "a.yml",
        "c.json",
        "notes.txt",
        ".hidden.yaml",
        "x.yaml~",
        "y.yaml.swp",
        "z.yaml.bak",
        "#w.yaml#",
        "4913",
    ]:
        pod = filename.strip(".#~").split(".")[0] or "n"
        text = manifest(pod)
        if filename.endswith(".json"):
            doc = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            }
            text = json.dumps(doc)
        (tmp_path / filename).write_text(text)
    (tmp_path / "sub.yaml").mkdir()  # not a regular file
    os.symlink(tmp_path / "b.yaml", tmp_path / "link.yaml")  # a link to one is fine
    result = ManifestDirectory(tmp_path, "n1").scan()
    assert names(result.pods) == ["a-n1", "b-n1", "c-n1", "b-n1"]
    assert len({p.uid for p in result.pods}) == 4  # same content, two paths: two UIDs
    assert is_manifest_name("web.yaml") and not is_manifest_name("web.yaml~")


def test_single_file_and_missing_path(tmp_path: Path) -> None:
    path = tmp_path / "only.conf"
    assert ManifestDirectory(path, "n1").scan().pods == []
    path.write_text(manifest("solo"))
    assert names(ManifestDirectory(path, "n1").scan().pods) == ["solo-n1"]


def test_bad_file_reported_once_and_last_good_kept(tmp_path: Path) -> None:
    directory = ManifestDirectory(tmp_path, "n1")
    (tmp_path / "good.yaml").write_text(manifest("good"))
    (tmp_path / "bad.yaml").write_text("kind: Pod\napiVersion: v1\nmetadata: {name: bad}\n")
    first = directory.scan()
    assert names(first.pods) == ["good-n1"]
    assert [e.location for e in first.new_errors] == [str(tmp_path / "bad.yaml")]
    assert "spec.containers: required" in first.new_errors[0].describe()
    assert directory.scan().new_errors == []  # unchanged: not reported again

    good_pod = first.pods[0]
    (tmp_path / "good.yaml").write_text("this: [is broken")
    turned = directory.scan()
    assert turned.pods == [good_pod]  # the last good pod stays
    assert str(tmp_path / "good.yaml") in turned.kept_stale
    (tmp_path / "good.yaml").unlink()
    assert directory.scan().pods == []


def test_unchanged_files_are_not_reparsed(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(manifest("a"))
    directory = ManifestDirectory(tmp_path, "n1")
    first = directory.scan().pods[0]
    assert directory.scan().pods[0] is first


def test_a_scan_of_named_files_equals_a_full_scan(tmp_path: Path) -> None:
    for name in ("b", "d", "f"):
        (tmp_path / f"{name}.yaml").write_text(manifest(name))
    partial = ManifestDirectory(tmp_path, "node1")
    full = ManifestDirectory(tmp_path, "node1")
    partial.scan()
    kept = partial.scan().pods
    (tmp_path / "d.yaml").write_text(manifest("d", image="v2"))
    (tmp_path / "f.yaml").unlink()
    (tmp_path / "a.yaml").write_text(manifest("a"))
    (tmp_path / "e.yaml").write_text("kind: [")
    result = partial.scan_names({"d.yaml", "f.yaml", "a.yaml", "e.yaml", "notes.txt"})
    expected = full.scan()
    assert names(expected.pods) == ["a-node1", "b-node1", "d-node1"]
    assert names(result.pods) == ["b-node1", "d-node1", "a-node1"]  # new ones last
    assert sorted(p.uid for p in result.pods) == sorted(p.uid for p in expected.pods)
    assert result.pods[0] is kept[0]  # b.yaml was not looked at again
    assert [e.location for e in result.new_errors] == [str(tmp_path / "e.yaml")]
    assert partial.scan_names({"e.yaml"}).new_errors == []  # reported once


async def test_inotify_makes_changes_visible_at_once(tmp_path: Path) -> None:
    updates: asyncio.Queue[tuple[float, PodUpdate]] = asyncio.Queue()
    source = FileSource(
        tmp_path,
        "n1",
        3600.0,
        lambda u: updates.put_nowait((time.monotonic(), u)),
        EventRecorder(),
    )
    task = asyncio.create_task(source.run())
    try:
        _, initial = await asyncio.wait_for(updates.get(), 5)
        assert initial.op is Op.SET and initial.pods == []
        await asyncio.sleep(0.1)  # let the watch be armed

        async def change(action: str) -> PodUpdate:
            started = time.monotonic()
            if action == "create":
                (tmp_path / "web.yaml").write_text(manifest("web"))
            elif action == "rename":
                (tmp_path / ".tmp").write_text(manifest("web", image="nginx"))
                os.replace(tmp_path / ".tmp", tmp_path / "web.yaml")
            else:
                (tmp_path / "web.yaml").unlink()
            at, update = await asyncio.wait_for(updates.get(), 5)
            # Well under the 100 ms the issue asks for, with room for a noisy machine.
            assert at - started < 1.0, (action, at - started)
            return update

        assert names((await change("create")).pods) == ["web-n1"]
        renamed = await change("rename")
        assert renamed.pods[0].spec.containers[0].image == "nginx"
        assert (await change("delete")).pods == []
    finally:
        task.cancel()


async def test_directory_created_later_is_picked_up(tmp_path: Path) -> None:
    path = tmp_path / "later"
    updates: asyncio.Queue[PodUpdate] = asyncio.Queue()
    source = FileSource(path, "n1", 0.2, updates.put_nowait, EventRecorder())
    task = asyncio.create_task(source.run())
    try:
        assert (await asyncio.wait_for(updates.get(), 5)).pods == []
        path.mkdir()
        (path / "a.yaml").write_text(manifest("a"))
        update = await asyncio.wait_for(updates.get(), 5)
        assert names(update.pods) == ["a-n1"]
    finally:
        task.cancel()


async def test_directory_created_later_is_watched_at_once(tmp_path: Path) -> None:
    path = tmp_path / "later"
    updates: asyncio.Queue[PodUpdate] = asyncio.Queue()
    source = FileSource(path, "n1", 3600.0, updates.put_nowait, EventRecorder())  # no re-list
    task = asyncio.create_task(source.run())
    try:
        assert (await asyncio.wait_for(updates.get(), 5)).pods == []
        await asyncio.sleep(0.1)
        path.mkdir()
        await asyncio.sleep(0.2)  # the watch moves to the new directory
        (path / "a.yaml").write_text(manifest("a"))
        update = await asyncio.wait_for(updates.get(), 2)
        assert names(update.pods) == ["a-n1"]
    finally:
        task.cancel()
