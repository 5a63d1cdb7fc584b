"""A library revision changes when any code its kernel runs changes, and
only then: the server and the runners name it the same way."""

from __future__ import annotations

import hashlib
import shutil

from runners.kernels.revision import (
    PACKAGE,
    library_sha256,
    library_source,
    operator_module,
)


def digest(name, package):
    return hashlib.sha256(library_source(name, package).encode()).hexdigest()


def test_an_edit_to_the_module_a_kernel_borrows_changes_its_revision(tmp_path):
    package = tmp_path / "kernels"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    before = {name: digest(name, package) for name in ("attention_causal", "gemm")}

    attention = package / "attention.py"
    attention.write_text(attention.read_text() + "\n# a tile size changed\n")

    assert digest("attention_causal", package) != before["attention_causal"]
    assert digest("gemm", package) == before["gemm"]  # it does not use attention

    common = package / "common.py"
    common.write_text(common.read_text() + "\n# shared tile arithmetic changed\n")
    assert digest("gemm", package) != before["gemm"]


def test_the_runner_and_the_catalogue_name_the_same_revision(catalog):
    from matrix.models import Operator

    for op in Operator.objects.all():
        assert library_sha256(op.name) == op.current_revision("c").source_sha256
        assert op.current_revision("c").source == library_source(op.name)


def test_no_path_outside_the_library_names_a_revision():
    assert library_source("../../etc/passwd") is None
    assert library_source("no_such_operator") is None
    assert library_sha256("../base") is None


def test_a_library_revision_yields_its_operator_module_for_a_diff():
    own = (PACKAGE / "attention_causal.py").read_text()
    assert operator_module(library_source("attention_causal")) == own
    assert operator_module("def program(): ...\n") == "def program(): ...\n"
