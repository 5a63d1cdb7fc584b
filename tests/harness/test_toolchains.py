"""Two TileLang versions validated side by side on one host, each in its own
interpreter and kernel cache: the 0.1.13 CPU backend cannot compile the
library's softmax (it has no reduce, and no lowering for ``tl.infinity``, which
the serial CPU kernel uses instead), and 0.1.15 validates it."""

from __future__ import annotations

import importlib.util
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from runners.harness.sandbox import run_job
from tests.harness.helpers import CACHE_ROOT, TOOLCHAIN_0113, library_job

SOFTMAX = library_job("softmax", {"M": 4, "N": 33})


@pytest.fixture(scope="module")
def interpreter_0113() -> str:
    python = TOOLCHAIN_0113 / "bin" / "python"
    if not python.exists():
        message = (
            f"no TileLang 0.1.13 toolchain at {TOOLCHAIN_0113}: run "
            f"scripts/make-toolchain-venv 0.1.13 {TOOLCHAIN_0113} "
            "(or point TM_TOOLCHAIN_0113 at one)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return str(python)


def test_the_same_job_fails_on_0113_and_passes_on_0115(interpreter_0113, monkeypatch):
    # As in a supervisor that imported TileLang 0.1.15 itself: its libraries
    # are named in the environment, and 0.1.13 must still load its own.
    own = importlib.util.find_spec("tilelang").submodule_search_locations[0]
    monkeypatch.setenv("TVM_LIBRARY_PATH", os.path.join(own, "lib"))
    toolchains = {
        "0.1.13": (interpreter_0113, CACHE_ROOT / "tests-tilelang-0.1.13"),
        "0.1.15": (sys.executable, CACHE_ROOT / "tests-tilelang-0.1.15"),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            version: pool.submit(
                run_job, SOFTMAX, interpreter=python, cache_dir=str(cache)
            )
            for version, (python, cache) in toolchains.items()
        }
        old, new = (futures[v].result() for v in ("0.1.13", "0.1.15"))

    assert old["fingerprint"]["components"].get("tilelang") == "0.1.13", old["error"]
    assert new["fingerprint"]["components"]["tilelang"] == "0.1.15"
    assert old["fingerprint"]["hash"] != new["fingerprint"]["hash"]
    assert new["status"] == "pass", new["error"]
    assert old["status"] == "compile_error", old["error"]
    assert old["error"]["signature"]
