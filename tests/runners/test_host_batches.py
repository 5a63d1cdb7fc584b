"""How many harness children a runner host starts for a batch: library
kernels for a device compile side by side (they take the device in turn),
each child on a few jobs; CPU timings and submitted kernels run one child
at a time."""

from __future__ import annotations

import pytest

from runners.host import JOBS_PER_CHILD, batch_workers, share_cores, work_processes

CUDA = {"kind": "cuda", "arch": "sm_90a"}


def job(target=CUDA, stage="validate", library=True) -> dict:
    return {"target": target, "stage": stage, "library": library}


@pytest.fixture(autouse=True)
def four_cores(monkeypatch):
    monkeypatch.setenv("TILEMATRIX_COMPILE_WORKERS", "4")


def test_device_library_jobs_compile_across_the_cores():
    assert batch_workers([job() for _ in range(20)]) == 4


def test_each_child_gets_a_few_jobs_so_its_start_is_spread_over_them():
    assert batch_workers([job(), job()]) == 1
    assert batch_workers([job()] * (2 * JOBS_PER_CHILD)) == 2
    assert batch_workers([job()] * (2 * JOBS_PER_CHILD + 1)) == 3


def test_compile_only_jobs_run_side_by_side_even_for_the_cpu():
    jobs = [job({"kind": "c"}, stage="build"), job({"kind": "hip"}, stage="lower")]
    assert batch_workers(jobs * 6) == 4


def test_a_cpu_timing_or_a_submitted_kernel_runs_alone():
    assert batch_workers([job(), job({"kind": "c"})]) == 1
    assert batch_workers([job(), job(library=False)]) == 1


def test_worker_processes_share_the_cores_unless_the_host_set_a_number(monkeypatch):
    monkeypatch.delenv("TILEMATRIX_COMPILE_WORKERS")
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    share_cores(2)
    assert batch_workers([job()] * 48) == 8
    monkeypatch.setenv("TILEMATRIX_COMPILE_WORKERS", "3")
    share_cores(2)
    assert batch_workers([job()] * 48) == 3


def test_a_gpu_host_runs_several_messages_at_once_a_cpu_host_one(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.setattr("runners.harness.isolation.gpu_nodes", lambda kind: [])
    assert work_processes() == 1
    monkeypatch.setattr(
        "runners.harness.isolation.gpu_nodes",
        lambda kind: ["/dev/nvidia0"] if kind == "cuda" else [],
    )
    assert work_processes() == 8
    monkeypatch.delenv("TILEMATRIX_COMPILE_WORKERS")
    share_cores(work_processes())
    # Eight messages of 24 jobs: 16 children in all, 12 jobs each.
    assert batch_workers([job()] * 24) == 2
