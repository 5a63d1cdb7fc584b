"""The import contracts (pyproject.toml, [tool.importlinter]) hold on this
tree, and each fails when broken, on a copy of the tree: the runner agent
importing Django or the server, the fleet reaching up into the gate, and a
circle between two of the server's parts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_contracts_hold_on_this_tree():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    "module, source, broken",
    [
        (
            "runners/harness/leak.py",
            "from django.conf import settings\n",
            "runners.harness.leak -> django (l.1)",
        ),
        (
            "runners/leak.py",
            "from matrix.fleet import services\n",
            "runners.leak -> matrix.fleet.services (l.1)",
        ),
        (
            "matrix/fleet/leak.py",
            "from matrix.gate import services\n",
            "matrix.fleet.leak -> matrix.gate.services (l.1)",
        ),
        (
            "matrix/models/leak.py",
            "from matrix import queries\n",
            "No cycles are allowed in matrix",
        ),
    ],
    ids=[
        "agent-imports-django",
        "agent-imports-the-server",
        "fleet-reaches-up",
        "circle",
    ],
)
def test_a_broken_contract_fails_naming_the_import(tmp_path, module, source, broken):
    for name in ("runners", "matrix"):
        shutil.copytree(
            ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / module).write_text(source)

    done = lint_imports(tmp_path)

    assert done.returncode == 1
    assert broken in done.stdout
    assert "3 kept" not in done.stdout
