"""Kernels that try to forge their verdict or their timing: none of them
passes wrongly. A submitted module runs only in the builder, which hands
over nothing but its PrimFunc; the kernel runs and is timed in an executor
that never imported it, and a judge that never ran it decides, on two input
sets (the second seed drawn by the supervisor)."""

from __future__ import annotations

import pytest

from runners.harness import tensors
from runners.harness.sandbox import SUBMITTED_TIMING, run_batch
from runners.kernels import elementwise_add
from tests.security.helpers import attack_job

SHAPE = {"M": 6, "N": 9}
SEED = 11


def cached_stores(shape: dict, seed: int) -> str:
    """TileLang stores of elementwise_add's outputs for the inputs ``seed``
    draws, one element a line."""
    operator = elementwise_add.OPERATOR
    specs = [tensors.spec_dict(s) for s in operator.inputs(shape, "float32")]
    a, b = tensors.seeded_inputs(specs, seed, "cpu")
    total = a + b
    lines = [
        f"C[{i}, {j}] = T.float32({float(total[i, j])!r})"
        for i in range(shape["M"])
        for j in range(shape["N"])
    ]
    return ("\n" + " " * 12).join(lines)


@pytest.fixture(scope="module")
def forged():
    jobs = {
        "good_add": attack_job("good_add"),
        "patch_tensors": attack_job("patch_tensors"),
        "patch_timer": attack_job("patch_timer"),
        "cache_outputs": attack_job("cache_outputs"),
        "replay_known_seed": attack_job(
            "replay_known_seed",
            fill={"T.evaluate(0)  # CACHED_STORES": cached_stores(SHAPE, SEED)},
        ),
        "forge_protocol": attack_job("forge_protocol"),
        "call_reference": attack_job("call_reference"),
        "fake_compile": attack_job("fake_compile"),
        "background_thread": attack_job("background_thread"),
    }
    results = run_batch(list(jobs.values()), cache_dir="unused", workers=2)
    return dict(zip(jobs, results, strict=True))


def _message(result: dict) -> str:
    return (result["error"] or {}).get("message") or ""


def test_the_honest_control_passes_with_its_timing_marked(forged):
    result = forged["good_add"]
    assert result["status"] == "pass"
    assert result["metrics"]["rel_err"] == 0.0
    assert result["timings"]["kernel_ms"] > 0
    assert result["timing_trust"] == SUBMITTED_TIMING


def test_patching_the_harness_tensors_through_a_reexport_is_a_mismatch(forged):
    # The forger of the report: it got pass, rel_err 0, when the harness
    # drew inputs and wrote outputs in the process that imported it.
    result = forged["patch_tensors"]
    assert result["status"] == "mismatch"
    assert result["metrics"]["rel_err"] > 1.0
    assert "(on the first input set)" in _message(result)


def test_stopping_the_clock_does_not_reach_the_timing(forged):
    # A stopped perf_counter would have timed the kernel at 0 ms.
    result = forged["patch_timer"]
    assert result["status"] == "pass"
    assert result["timings"]["kernel_ms"] > 0


def test_a_call_replaced_by_python_arithmetic_is_a_mismatch(forged):
    result = forged["cache_outputs"]
    assert result["status"] == "mismatch"
    assert "relative error" in _message(result)


def test_outputs_cached_for_the_known_seed_fail_on_the_second_input_set(forged):
    result = forged["replay_known_seed"]
    assert result["status"] == "mismatch"
    assert "(on the second input set)" in _message(result)


def test_printing_pass_and_forging_the_reporting_channel_is_a_mismatch(forged):
    # The forged "pass" reached the supervisor from the builder, whose word
    # counts for nothing: its program still subtracts.
    result = forged["forge_protocol"]
    assert result["status"] == "mismatch"
    assert "relative error" in _message(result)


def test_the_operator_library_is_not_there_to_import(forged):
    result = forged["call_reference"]
    assert result["status"] == "compile_error"
    assert "No module named 'runners.kernels'" in _message(result)


def test_a_python_kernel_in_place_of_tilelang_is_a_mismatch(forged):
    result = forged["fake_compile"]
    assert result["status"] == "mismatch"
    assert "relative error" in _message(result)


def test_a_thread_rewriting_the_outputs_is_a_mismatch(forged):
    result = forged["background_thread"]
    assert result["status"] == "mismatch"
    assert "relative error" in _message(result)
