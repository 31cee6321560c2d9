"""bench/ab.py: the arms it builds and what it concludes from their rounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import ab


def test_the_sign_test_is_the_two_sided_binomial_tail() -> None:
    assert ab.sign_test(0, 0) == 1.0
    assert ab.sign_test(3, 3) == 1.0
    # 8 of 8 rounds lower: 2 * (1/2)^8.
    assert ab.sign_test(8, 0) == pytest.approx(2 / 256)
    assert ab.sign_test(0, 8) == pytest.approx(2 / 256)
    # 7 of 8: 2 * (1 + 8) / 256.
    assert ab.sign_test(7, 1) == pytest.approx(18 / 256)
    assert ab.sign_test(5, 3) > 0.5


def test_the_summary_gives_medians_ranges_and_rounds_lower_than_the_first_arm() -> None:
    runs: dict[str, list[ab.Round]] = {
        "base": [{"t": 2.0}, {"t": 2.2}, {"t": 1.9}, {"t": 2.1}],
        "new": [{"t": 1.5}, None, {"t": 1.6}, {"t": 2.5}],
    }
    lines = ab.summary(["base", "new"], runs)
    assert lines[0] == "base (4 runs):"
    assert lines[1] == "  t: median 2.05 (1.9-2.2)"
    assert lines[2] == "new (3 runs):"
    # The failed round is left out of the comparison: 2 lower of the 3 rounds both ran.
    assert lines[3] == (
        "  t: median 1.6 (1.5-2.5); lower than base in 2 of 3 rounds (sign test p 1.00)"
    )


def test_an_arm_with_no_run_says_so() -> None:
    lines = ab.summary(["a", "b"], {"a": [{"t": 1.0}], "b": [None]})
    assert lines[-1] == "b: no run finished"


def test_arms_are_labelled_by_name_or_by_what_they_are() -> None:
    assert ab.parse_arm("fast=HEAD~2", 0) == ("fast", "HEAD~2")
    assert ab.parse_arm("HEAD", 1) == ("HEAD", "HEAD")
    assert ab.parse_arm("/tmp/trees/lock", 2) == ("lock", "/tmp/trees/lock")
    assert ab.parse_arm("=HEAD", 3) == ("arm3", "HEAD")


def test_a_revision_becomes_its_pykubelet_package_alone(tmp_path: Path) -> None:
    tree = ab.export("HEAD", tmp_path, 0)
    assert sorted(p.name for p in tree.iterdir()) == ["pykubelet"]
    assert (tree / "pykubelet" / "__main__.py").is_file()


def test_a_directory_lends_its_pykubelet_package_and_nothing_else(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "pykubelet").mkdir(parents=True)
    (source / "bench").mkdir()  # would shadow this checkout's harness
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    tree = ab.export(str(source), scratch, 1)
    assert [p.name for p in tree.iterdir()] == ["pykubelet"]
    assert (tree / "pykubelet").resolve() == (source / "pykubelet").resolve()


def test_what_is_neither_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no-such-rev: neither a git revision"):
        ab.export("no-such-rev", tmp_path, 0)
