"""The batched state-file writer: every write lands, one bad file fails alone."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest

from pykubelet.runtime.process.statewriter import StateWriter


async def test_concurrent_writes_all_land_and_their_markers_go(tmp_path: Path) -> None:
    writer = StateWriter()
    dirs = [tmp_path / f"pod{i}" for i in range(40)]
    for d in dirs:
        d.mkdir()
        (d / "c.starting").touch()
    await asyncio.gather(
        *(writer.write(d / "c.json", {"n": i}, d / "c.starting") for i, d in enumerate(dirs))
    )
    for i, d in enumerate(dirs):
        assert json.loads((d / "c.json").read_text()) == {"n": i}
        assert sorted(p.name for p in d.iterdir()) == ["c.json"]  # no marker, no temporary
    # And again, after the flushers have ended.
    await writer.write(dirs[0] / "c.json", {"n": "again"})
    assert json.loads((dirs[0] / "c.json").read_text()) == {"n": "again"}


async def test_a_bad_file_fails_alone(tmp_path: Path) -> None:
    writer = StateWriter()
    good = [tmp_path / f"{i}.json" for i in range(10)]
    results = await asyncio.gather(
        *(writer.write(p, {"ok": True}) for p in good),
        writer.write(tmp_path / "missing" / "x.json", {}),
        return_exceptions=True,
    )
    assert results[:10] == [None] * 10
    assert isinstance(results[10], FileNotFoundError)
    assert all(json.loads(p.read_text()) == {"ok": True} for p in good)
    with pytest.raises(FileNotFoundError):
        await writer.write(tmp_path / "missing" / "y.json", {})


async def test_a_large_batch_split_among_threads_gives_each_file_its_own_result(
    tmp_path: Path,
) -> None:
    writer = StateWriter()
    paths = [tmp_path / ("missing" if i % 37 == 5 else f"pod{i}") / f"{i}.json" for i in range(300)]
    for p in paths:
        if p.parent.name != "missing":
            p.parent.mkdir(exist_ok=True)
    results = await asyncio.gather(
        *(writer.write(p, {"n": i}) for i, p in enumerate(paths)), return_exceptions=True
    )
    for i, (p, result) in enumerate(zip(paths, results, strict=True)):
        if p.parent.name == "missing":
            assert isinstance(result, FileNotFoundError), (i, result)
        else:
            assert result is None, (i, result)
            assert json.loads(p.read_text()) == {"n": i}
    await asyncio.to_thread(writer.close)


class FsyncLog:
    """os.fsync, recording the path of each fd it syncs (the disk is outside the unit); a new
    content is synced in its temporary file, recorded as "<path> (new)"."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self._fsync = os.fsync

    def __call__(self, fd: int) -> None:
        directory, name = os.path.split(os.readlink(f"/proc/self/fd/{fd}"))
        if name.startswith(".") and name.endswith(".tmp"):
            name = name[1:].rsplit(".", 3)[0] + " (new)"
        self.paths.append(os.path.join(directory, name))
        self._fsync(fd)


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> FsyncLog:
    log = FsyncLog()
    monkeypatch.setattr(os, "fsync", log)
    return log


async def test_an_unsynced_file_is_synced_by_the_next_durable_write_in_its_directory(
    tmp_path: Path, fsyncs: FsyncLog
) -> None:
    writer = StateWriter()
    pod, other = tmp_path / "pod", tmp_path / "other"
    await writer.write(pod / "sandbox.json", {"id": "s"}, make_dir=True, durable=False)
    await writer.write(other / "sandbox.json", {"id": "o"}, make_dir=True, durable=False)
    # In place at once (an agent that dies now finds it), and nothing synced yet.
    assert json.loads((pod / "sandbox.json").read_text()) == {"id": "s"}
    assert fsyncs.paths == []

    await writer.write(pod / "c.json", {"n": 1})
    # The new file, the unsynced one beside it, then their directory; not the other pod's.
    assert fsyncs.paths == [f"{pod / 'c.json'} (new)", str(pod / "sandbox.json"), str(pod)]
    fsyncs.paths.clear()
    await writer.write(pod / "c.json", {"n": 2})
    assert fsyncs.paths == [f"{pod / 'c.json'} (new)", str(pod)]  # synced once is enough

    # A directory removed before anything durable was written there is forgotten.
    (other / "sandbox.json").unlink()
    other.rmdir()
    writer.forget(other)
    fsyncs.paths.clear()
    await writer.write(other / "c.json", {"n": 3}, make_dir=True)
    assert fsyncs.paths == [f"{other / 'c.json'} (new)", str(other)]
    await asyncio.to_thread(writer.close)


async def test_an_unsynced_file_gone_before_the_durable_write_does_not_fail_it(
    tmp_path: Path,
) -> None:
    writer = StateWriter()
    await writer.write(tmp_path / "sandbox.json", {"id": "s"}, durable=False)
    (tmp_path / "sandbox.json").unlink()
    await writer.write(tmp_path / "c.json", {"n": 1})
    assert json.loads((tmp_path / "c.json").read_text()) == {"n": 1}
    await asyncio.to_thread(writer.close)


async def test_a_file_found_maybe_unsynced_is_synced_by_the_next_durable_write(
    tmp_path: Path, fsyncs: FsyncLog
) -> None:
    writer = StateWriter()
    pod = tmp_path / "pod"
    pod.mkdir()
    # As a restarted agent finds a sandbox record the agent before it wrote unsynced.
    (pod / "sandbox.json").write_text('{"id": "s"}')
    writer.unsynced(pod / "sandbox.json")
    await writer.write(pod / "c.json", {"n": 1})
    assert fsyncs.paths == [f"{pod / 'c.json'} (new)", str(pod / "sandbox.json"), str(pod)]
    await asyncio.to_thread(writer.close)


async def test_an_unsynced_write_returns_without_waiting_for_its_batch_to_be_durable(
    tmp_path: Path, fsyncs: FsyncLog
) -> None:
    writer = StateWriter()
    release = threading.Event()

    def held() -> dict[str, int]:
        # Called in the writer's thread as the durable file is written: the disk is slow.
        release.wait(30)
        return {"n": 1}

    # Both queued before the flusher runs: one batch.
    durable = asyncio.ensure_future(writer.write(tmp_path / "pod" / "c.json", held, make_dir=True))
    unsynced = asyncio.ensure_future(
        writer.write(tmp_path / "other" / "sandbox.json", {"id": "s"}, make_dir=True, durable=False)
    )
    failed = asyncio.ensure_future(
        writer.write(tmp_path / "missing" / "x" / "sandbox.json", {}, durable=False)
    )
    try:
        await asyncio.wait_for(unsynced, 10)
        assert json.loads((tmp_path / "other" / "sandbox.json").read_text()) == {"id": "s"}
        with pytest.raises(FileNotFoundError):
            await asyncio.wait_for(failed, 10)
        assert not durable.done()
    finally:
        release.set()
    await durable
    assert json.loads((tmp_path / "pod" / "c.json").read_text()) == {"n": 1}
    # The unsynced file is remembered: the next durable write beside it syncs it.
    fsyncs.paths.clear()
    await writer.write(tmp_path / "other" / "c.json", {"n": 2})
    assert str(tmp_path / "other" / "sandbox.json") in fsyncs.paths
    await asyncio.to_thread(writer.close)


def test_a_batch_whose_loop_has_closed_still_writes_its_durable_files(tmp_path: Path) -> None:
    # The agent stopped (its loop closed) while a batch was on the disk: nobody is left to tell
    # that the unsynced file is in place, and the durable one is written all the same.
    release = threading.Event()

    def held() -> dict[str, str]:
        release.wait(30)
        return {"id": "s"}

    writer = StateWriter()
    loop = asyncio.new_event_loop()

    async def queue_and_stop() -> None:
        writes = [
            asyncio.ensure_future(
                writer.write(
                    tmp_path / "other" / "sandbox.json", held, make_dir=True, durable=False
                )
            ),
            asyncio.ensure_future(
                writer.write(tmp_path / "pod" / "c.json", {"n": 1}, make_dir=True)
            ),
        ]
        await asyncio.sleep(0.2)  # the batch is in the writer's thread, held
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()
        await asyncio.gather(*writes, return_exceptions=True)

    try:
        loop.run_until_complete(queue_and_stop())
    finally:
        loop.close()
    release.set()
    writer.close()  # waits for the thread
    assert json.loads((tmp_path / "other" / "sandbox.json").read_text()) == {"id": "s"}
    assert json.loads((tmp_path / "pod" / "c.json").read_text()) == {"n": 1}
