"""The batched state-file writer: every write lands, one bad file fails alone."""

from __future__ import annotations

import asyncio
import json
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
