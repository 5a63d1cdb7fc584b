"""Kernels that try to forge their verdict: none of them passes. The verdict
comes from a judge child that runs no submitted code, on two input sets (the
second seed drawn by the supervisor)."""

from __future__ import annotations

import pytest

from runners.harness.sandbox import run_batch
from tests.security.helpers import attack_job


@pytest.fixture(scope="module")
def forged():
    names = (
        "forge_protocol",
        "patch_timer",
        "cache_outputs",
        "call_reference",
        "fake_compile",
        "background_thread",
        "good_add",
    )
    results = run_batch(
        [attack_job(name) for name in names], cache_dir="unused", workers=2
    )
    return dict(zip(names, results, strict=True))


def test_the_honest_control_passes_with_advisory_timing(forged):
    result = forged["good_add"]
    assert result["status"] == "pass"
    assert result["metrics"]["rel_err"] == 0.0
    assert result["timing_trust"].startswith("advisory")


def test_printing_pass_and_forging_the_reporting_channel_is_a_mismatch(forged):
    result = forged["forge_protocol"]
    # The forged "pass" reached the supervisor first: it only meant "outputs
    # written", and the judge found none.
    assert result["status"] == "mismatch"
    assert "never written" in result["error"]["message"]


def test_patching_the_timer_is_refused(forged):
    result = forged["patch_timer"]
    assert result["status"] == "runtime_error"
    assert "time.perf_counter" in result["error"]["message"]


def test_replaying_cached_outputs_is_refused(forged):
    result = forged["cache_outputs"]
    assert result["status"] == "runtime_error"
    assert "JITKernel.__call__" in result["error"]["message"]


def test_the_reference_module_cannot_be_imported(forged):
    result = forged["call_reference"]
    assert result["status"] == "compile_error"
    assert (
        "runners.kernels is not available to submitted kernels"
        in (result["error"]["message"])
    )


def test_a_python_kernel_in_place_of_tilelang_is_refused(forged):
    result = forged["fake_compile"]
    assert result["status"] == "runtime_error"
    assert "tilelang.compile" in result["error"]["message"]


def test_a_thread_rewriting_the_outputs_is_refused(forged):
    result = forged["background_thread"]
    assert result["status"] == "runtime_error"
    assert "a Python thread was started" in result["error"]["message"]
