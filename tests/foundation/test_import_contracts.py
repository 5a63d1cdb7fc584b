"""The import contracts (pyproject.toml, [tool.importlinter]) hold on this
tree, and a break of them fails: a harness module that imports Django, on
a copy of the tree, is named with its line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

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
    assert "1 kept, 0 broken" in done.stdout


def test_a_harness_module_that_imports_django_breaks_them(tmp_path):
    for name in ("runners", "matrix"):
        shutil.copytree(
            ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "runners/harness/leak.py").write_text(
        "from django.conf import settings\n"
    )

    done = lint_imports(tmp_path)

    assert done.returncode == 1
    assert "runners.harness.leak -> django (l.1)" in done.stdout
