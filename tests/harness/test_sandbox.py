"""The sandbox's own guarantees: what the child's environment holds, a
toolchain that cannot start, and what happens on a host that cannot give
the whole sandbox."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from runners.harness import isolation
from runners.harness.children import REPO_ROOT, child_environment
from runners.harness.sandbox import copy_child_file, run_batch
from tests.harness.helpers import PLANTED, library_job, submitted_job


def test_the_child_environment_is_an_allow_list(monkeypatch, tmp_path):
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "canary-aws-123456")
    # What importing TileLang sets in the supervisor, pointing at its own
    # install: a child of another toolchain must find its own.
    monkeypatch.setenv("TVM_LIBRARY_PATH", "/supervisor/tilelang/lib")
    monkeypatch.setenv("TL_TEMPLATE_PATH", "/supervisor/tilelang/src")
    env = child_environment(str(tmp_path), str(tmp_path / "cache"))
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["HOME"] == str(tmp_path) and env["TMPDIR"].startswith(str(tmp_path))
    assert env["TILELANG_CACHE_DIR"] == str(tmp_path / "cache")
    assert env["PYTHONPATH"] == REPO_ROOT
    assert "DJANGO_SETTINGS_MODULE" not in env
    leaked = [v for v in env.values() if "canary" in v]
    assert not leaked
    assert not {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SECRET_KEY"} & set(env)
    assert not {"TVM_LIBRARY_PATH", "TL_TEMPLATE_PATH"} & set(env)


def test_a_toolchain_that_cannot_start_is_an_infra_error_for_every_job(tmp_path):
    # A toolchain lives where the children's uid may enter, as on a runner.
    toolchain = Path(tempfile.mkdtemp(prefix="tm-toolchain-"))
    toolchain.chmod(0o755)
    broken = toolchain / "python"
    broken.write_text("#!/bin/sh\necho 'No module named tilelang' >&2\nexit 3\n")
    broken.chmod(0o755)
    jobs = [
        library_job("softmax", {"M": 2, "N": 3}),
        library_job("row_sum", {"M": 2, "N": 3}),
    ]
    try:
        results = run_batch(
            jobs, interpreter=str(broken), cache_dir=str(tmp_path / "c")
        )
    finally:
        shutil.rmtree(toolchain)
    for result in results:
        assert result["status"] == "infra_error"
        assert "failed to start: exit status 3" in result["error"]["message"]
        assert "No module named tilelang" in result["error"]["message"]


def test_cells_the_kernel_does_not_declare_are_unsupported(cache_dir):
    jobs = [
        library_job("softmax", {"M": 2, "N": 3}, dtype="float16"),
        library_job("gemm", {"M": 2, "N": 3, "K": 4}, dtype="bfloat16"),
    ]
    for job, result in zip(jobs, run_batch(jobs, cache_dir=cache_dir), strict=True):
        assert result["status"] == "unsupported"
        assert result["stage_reached"] is None and result["kernel_source"] is None
        assert job["dtype"] in result["error"]["message"]


def test_where_the_sandbox_is_missing_library_kernels_run_and_say_so(
    monkeypatch, tmp_path
):
    # This host has the whole sandbox; the double stands for one without
    # bubblewrap or root, where the child really runs unconfined.
    missing = isolation.Confinement(
        isolation.NONE, (isolation.NO_BWRAP, isolation.NO_ROOT)
    )
    monkeypatch.setattr(isolation, "confinement", lambda: missing)
    job = library_job("elementwise_add", {"M": 2, "N": 3})
    (result,) = run_batch([job], cache_dir=str(tmp_path / "cache"))
    assert result["status"] == "pass"
    assert result["sandbox"] == missing.describe()
    assert result["sandbox"].startswith("none: no working bubblewrap (bwrap)")


def test_where_the_sandbox_is_not_whole_submitted_kernels_are_refused(monkeypatch):
    no_root = isolation.Confinement(isolation.NAMESPACES, (isolation.NO_ROOT,))
    monkeypatch.setattr(isolation, "confinement", lambda: no_root)
    (result,) = run_batch([submitted_job("wrong_add")], cache_dir="unused")
    assert result["status"] == "infra_error"
    assert result["error"]["message"] == (
        "this runner does not run submitted kernels: its sandbox is namespaces: "
        + isolation.NO_ROOT
    )
    assert result["sandbox"] == no_root.describe()


def test_a_file_a_child_left_is_copied_only_when_regular_and_reached_directly(
    tmp_path,
):
    base = tmp_path / "base"
    out = base / "home" / "out"
    out.mkdir(parents=True)
    (out / "program.json").write_text("{}")
    names = ("home", "out", "program.json")
    copy = tmp_path / "copy"
    assert copy_child_file(str(base), names, copy, cap=16)
    assert copy.read_text() == "{}"
    copy.unlink()
    assert not copy_child_file(str(base), names, copy, cap=1)
    assert not copy_child_file(str(base), names, copy, size=3)
    # What the child may put in the way: its out/ as a link to a directory
    # of the host, the file as a link, or a FIFO that would block a reader.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "program.json").write_text("secret")
    shutil.rmtree(out)
    out.symlink_to(elsewhere)
    assert not copy_child_file(str(base), names, copy, cap=16)
    out.unlink()
    out.mkdir()
    (out / "program.json").symlink_to(elsewhere / "program.json")
    assert not copy_child_file(str(base), names, copy, cap=16)
    (out / "program.json").unlink()
    os.mkfifo(out / "program.json")
    assert not copy_child_file(str(base), names, copy, cap=16)
    assert not copy.exists()
