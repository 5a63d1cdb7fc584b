"""Real compile failures, run through the sandbox: each run compiles in temp
directories of its own, yet the same failure keeps one message and one
signature from run to run, different failures differ, and a long compiler
message keeps the compiler's own error lines."""

from __future__ import annotations

import re

import pytest

from runners.harness.result import MESSAGE_CAP
from runners.harness.sandbox import run_batch
from tests.harness.helpers import library_job, submitted_job

RANDOM_TEMP_NAME = re.compile(r"tmp[a-z0-9_]{8}(?![a-z0-9_])")


def cuda_build(operator: str, shape: dict, arch: str, dtype: str = "float32"):
    # No nvcc builds for sm_10 or sm_20: the device compiler itself fails.
    job = library_job(operator, shape, stage="build", dtype=dtype)
    return {**job, "target": {"kind": "cuda", "arch": arch}}


def refused_extern(fill: dict | None = None) -> dict:
    # The executor refuses it before building (an extern call is not TIR's
    # own operator), as it would a validate job; a build job starts no judge,
    # which would only draw inputs for a kernel that never runs.
    return submitted_job("undefined_extern_add", fill=fill, stage="build")


JOBS = {
    "extern": refused_extern(),
    "extern_again": refused_extern(),
    "other_extern": refused_extern({"tm_no_such_function": "tm_other_function"}),
    "sm_10": cuda_build("softmax", {"M": 3, "N": 37}, "sm_10"),
    "sm_10_again": cuda_build("softmax", {"M": 3, "N": 37}, "sm_10"),
    "sm_20": cuda_build("softmax", {"M": 3, "N": 37}, "sm_20"),
    # Its generated source alone is longer than a stored message.
    "gemm_sm_10": cuda_build(
        "gemm", {"M": 256, "N": 256, "K": 256}, "sm_10", "float16"
    ),
}


@pytest.fixture(scope="module")
def results(cache_dir):
    outcome = run_batch(list(JOBS.values()), cache_dir=cache_dir, workers=2)
    return dict(zip(JOBS, outcome, strict=True))


@pytest.mark.parametrize("name", JOBS)
def test_a_compile_failure_names_no_temp_directory(results, name):
    result = results[name]
    assert result["status"] == "compile_error", result["error"]
    message = result["error"]["message"]
    assert not RANDOM_TEMP_NAME.search(message), message
    assert "tm-harness-" not in message


def test_the_same_failure_in_two_runs_shares_one_signature(results):
    extern, again = results["extern"]["error"], results["extern_again"]["error"]
    assert "T.call_extern 'tm_no_such_function'" in extern["message"]
    assert extern == again
    sm_10, again = results["sm_10"]["error"], results["sm_10_again"]["error"]
    assert "Unsupported gpu architecture 'sm_10'" in sm_10["message"]
    assert sm_10 == again


def test_different_failures_have_different_signatures(results):
    signatures = {name: r["error"]["signature"] for name, r in results.items()}
    assert signatures["extern"] != signatures["other_extern"]
    assert signatures["sm_10"] != signatures["sm_20"]
    assert signatures["extern"] != signatures["sm_10"]


def test_a_long_compiler_message_keeps_the_compilers_error(results):
    message = results["gemm_sm_10"]["error"]["message"]
    assert "lines cut]" in message  # longer than a stored message
    assert len(message.encode()) <= MESSAGE_CAP
    assert "nvcc fatal   : Unsupported gpu architecture 'sm_10'" in message
    assert message.startswith("RuntimeError: ")
    assert "Command: " in message
