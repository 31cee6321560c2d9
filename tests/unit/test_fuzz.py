"""A bounded run of the atheris fuzzer of decoding (tests/fuzz/fuzz_decode.py)."""

from __future__ import annotations

import importlib.util
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    importlib.util.find_spec("atheris") is None,
    reason=f"atheris has no wheel for {platform.machine()} (pyproject installs it on x86_64)",
)
def test_coverage_guided_fuzzing_of_decoding_finds_no_crash(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "tests" / "corpus" / "bad", corpus)
    for example in (ROOT / "examples" / "manifests").glob("*.yaml"):
        shutil.copy(example, corpus / example.name)
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "fuzz" / "fuzz_decode.py"),
            "-runs=30000",
            "-max_total_time=60",
            "-max_len=4096",
            "-rss_limit_mb=2048",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "Done" in proc.stderr or "DONE" in proc.stderr, proc.stderr[-2000:]
