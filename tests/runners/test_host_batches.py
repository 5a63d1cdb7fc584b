"""How many harness children a runner host starts for a batch: library
kernels for a device compile side by side (they take the device in turn);
CPU timings and submitted kernels run one child at a time."""

from __future__ import annotations

import pytest

from runners.host import batch_workers

CUDA = {"kind": "cuda", "arch": "sm_90a"}


def job(target=CUDA, stage="validate", library=True) -> dict:
    return {"target": target, "stage": stage, "library": library}


@pytest.fixture(autouse=True)
def four_cores(monkeypatch):
    monkeypatch.setenv("TILEMATRIX_COMPILE_WORKERS", "4")


def test_device_library_jobs_compile_across_the_cores():
    assert batch_workers([job() for _ in range(20)]) == 4
    assert batch_workers([job(), job()]) == 2


def test_compile_only_jobs_run_side_by_side_even_for_the_cpu():
    jobs = [job({"kind": "c"}, stage="build"), job({"kind": "hip"}, stage="lower")]
    assert batch_workers(jobs * 3) == 4


def test_a_cpu_timing_or_a_submitted_kernel_runs_alone():
    assert batch_workers([job(), job({"kind": "c"})]) == 1
    assert batch_workers([job(), job(library=False)]) == 1
