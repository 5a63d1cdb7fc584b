"""Every operator with a CPU (target c) kernel passes through the sandboxed
harness, on regular and ragged shapes, in one trusted batch."""

from __future__ import annotations

import time

import pytest

from runners import kernels
from runners.harness.sandbox import run_batch
from tests.harness.helpers import library_job

# Regular, size 1, not a multiple of any block, not a power of two.
SHAPES = {
    ("M", "N"): [
        {"M": 64, "N": 128},
        {"M": 1, "N": 1},
        {"M": 37, "N": 100},
        {"M": 3, "N": 1000},
    ],
    ("M", "N", "K"): [
        {"M": 64, "N": 64, "K": 64},
        {"M": 1, "N": 1, "K": 1},
        {"M": 33, "N": 47, "K": 19},
        {"M": 1, "N": 100, "K": 65},
    ],
    ("B", "H", "HKV", "S", "D"): [
        {"B": 1, "H": 4, "HKV": 2, "S": 16, "D": 8},
        {"B": 1, "H": 1, "HKV": 1, "S": 1, "D": 1},
        {"B": 2, "H": 3, "HKV": 1, "S": 13, "D": 5},
        {"B": 1, "H": 6, "HKV": 3, "S": 37, "D": 24},
    ],
}
CPU_OPERATORS = sorted(
    name for name, op in kernels.OPERATORS.items() if "c" in op.builders
)
CELLS = [
    (name, shape)
    for name in CPU_OPERATORS
    for shape in SHAPES.get(kernels.get(name).dims, [None])
]
CUDA = {"dtype": "float16", "target": {"kind": "cuda", "arch": "sm_90a"}}
HIP = {"dtype": "float16", "target": {"kind": "hip", "mcpu": "gfx942"}}
STAGE_JOBS = [
    library_job("softmax", {"M": 5, "N": 9}, stage="lower"),
    library_job("rmsnorm", {"M": 5, "N": 9}, stage="build"),
    # Compile-only evidence for GPUs, from this host without one.
    {**library_job("elementwise_add", {"M": 5, "N": 9}, stage="build"), **CUDA},
    {**library_job("elementwise_add", {"M": 5, "N": 9}, stage="lower"), **HIP},
    {**library_job("elementwise_add", {"M": 5, "N": 9}), **CUDA},
]
# A job that cannot finish in a millisecond: the child is killed mid-batch.
TIMED_OUT = library_job("row_sum", {"M": 8, "N": 8}, timeout_s=0.001)


@pytest.fixture(scope="module")
def batch(cache_dir):
    cells = [library_job(name, shape) for name, shape in CELLS if shape]
    heard = []
    results = run_batch(
        [TIMED_OUT, *cells, *STAGE_JOBS],
        cache_dir=cache_dir,
        workers=2,
        on_result=lambda i, result: heard.append((i, time.monotonic(), result)),
    )
    by_cell = {
        (r["operator"], tuple(r["shape"].values())): r
        for r in results[1 : len(cells) + 1]
    }
    return {
        "all": results,
        "cells": by_cell,
        "stages": results[-len(STAGE_JOBS) :],
        "heard": heard,
    }


def test_each_result_is_heard_as_its_job_ends(batch):
    results, heard = batch["all"], batch["heard"]
    assert sorted(i for i, _, _ in heard) == list(range(len(results)))
    assert all(result is results[i] for i, _, result in heard)
    heard_at = {i: at for i, at, _ in heard}
    # Each of the two children takes every other job, one after another:
    # its first result is heard while the rest of its jobs still run, not
    # with them at the end.
    for child in (0, 1):
        jobs = range(child, len(results), 2)
        spread = heard_at[jobs[-1]] - heard_at[jobs[0]]
        assert spread >= 0.99 * sum(results[i]["timings"]["wall_s"] for i in jobs[1:])


def test_the_library_has_cpu_kernels_for_the_issue_operators():
    assert {"elementwise_add", "row_sum", "softmax", "rmsnorm", "gemm"} <= set(
        CPU_OPERATORS
    )


@pytest.mark.parametrize(
    "name, shape",
    CELLS,
    ids=[f"{n}-{'x'.join(map(str, (s or {}).values()))}" for n, s in CELLS],
)
def test_every_cpu_kernel_passes(batch, name, shape):
    assert shape, f"{name}: no CPU test shapes for dims {kernels.get(name).dims}"
    result = batch["cells"][(name, tuple(shape.values()))]
    assert result["status"] == "pass", result["error"]
    assert result["stage_reached"] == "validate"
    assert result["metrics"]["rel_err"] <= result["tolerance"]["rel_err"]
    timings = result["timings"]
    assert timings["kernel_ms"] > 0 and timings["reference_ms"] > 0
    assert timings["gbps"] > 0
    # The samples the gate's rank test reads, around the medians shown.
    samples = result["timing_samples"]
    for key in ("kernel_ms", "reference_ms"):
        assert 5 <= len(samples[key]) <= 32
        assert min(samples[key]) * 0.99 <= timings[key] <= max(samples[key]) * 1.01


def test_lower_and_build_stop_at_their_rung(batch):
    lowered, built, cuda_built, hip_lowered, _ = batch["stages"]
    assert (lowered["status"], lowered["stage_reached"]) == ("lowered", "lower")
    assert (built["status"], built["stage_reached"]) == ("built", "build")
    assert "softmax" in lowered["kernel_source"]
    assert lowered["metrics"]["rel_err"] is None
    assert cuda_built["status"] == "built", cuda_built["error"]
    assert "__global__" in cuda_built["kernel_source"]
    assert hip_lowered["status"] == "lowered", hip_lowered["error"]


def test_validating_without_the_device_is_the_runners_fault(batch):
    no_gpu = batch["stages"][-1]
    assert no_gpu["status"] == "infra_error"
    assert no_gpu["error"]["message"] == "this runner has no cuda device"
    assert no_gpu["stage_reached"] == "validate"


def test_a_timeout_in_a_trusted_batch_costs_only_that_job(batch):
    timed_out, _, next_in_same_child = batch["all"][:3]
    assert timed_out["status"] == "timeout"
    assert "process group was killed" in timed_out["error"]["message"]
    # With two workers, job 2 followed job 0 in the killed child's share: it
    # ran in a fresh child.
    assert next_in_same_child["status"] == "pass", next_in_same_child["error"]
