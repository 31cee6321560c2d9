"""The import contract of `.importlinter` (run by `make lint`) holds for the tree, and fails
when an import breaks a layer, joins two runtime backends, or closes a cycle: each case adds one
import to a copy of the package and runs the real `lint-imports` on it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(tree / ".importlinter")],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "pykubelet", tmp_path / "pykubelet", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def add_import(tree: Path, module: str, line: str) -> None:
    path = tree / (module.replace(".", "/") + ".py")
    text = path.read_text()
    marker = "from __future__ import annotations\n"
    assert marker in text, f"{module} has no __future__ import to add after"
    path.write_text(text.replace(marker, f"{marker}\n{line}\n", 1))


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    result = lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # The kubelet reaching up into the cluster layer: a layer and the cluster rule.
        (
            "pykubelet.kubelet.kubelet",
            "import pykubelet.cluster.cluster  # noqa",
            "Layers: each folder imports only the folders below it BROKEN",
        ),
        (
            "pykubelet.pod.sync",
            "import pykubelet.cluster.node  # noqa",
            "Only the composition root builds the cluster layer BROKEN",
        ),
        # One backend using another's module.
        (
            "pykubelet.runtime.process.runtime",
            "import pykubelet.runtime.docker.oom  # noqa",
            "Runtime backends are independent of each other BROKEN",
        ),
        # Shared runtime code depending on a backend.
        (
            "pykubelet.runtime.base",
            "import pykubelet.runtime.process.statefile  # noqa",
            "Runtime: the backends sit on the shared sandbox core",
        ),
        # A cycle between two modules of one folder, through a type-only import.
        (
            "pykubelet.common.metrics",
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    import pykubelet.common.events",
            "No import cycles",
        ),
    ],
)
def test_a_bad_import_breaks_its_contract(
    tree: Path, module: str, line: str, contract: str
) -> None:
    if module == "pykubelet.common.metrics":
        add_import(tree, "pykubelet.common.events", "import pykubelet.common.metrics  # noqa")
    add_import(tree, module, line)
    result = lint(tree)
    assert result.returncode != 0, result.stdout
    assert contract in result.stdout, result.stdout
