from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from matrix.fleet import services
from matrix.models import JobStage, Sweep, ValidationJob


def sweep(*args, stderr=None) -> str:
    out = StringIO()
    call_command("sweep", *args, stdout=out, stderr=stderr or StringIO())
    return out.getvalue()


def test_sweep_plans_the_chosen_cells_and_returns_at_once(cpu_runner):
    out = sweep("--operator", "softmax", "--device-type", "c", "--no-wait")
    jobs = ValidationJob.objects.all()
    assert jobs.count() > 0
    assert f"{jobs.count()} jobs planned" in out
    assert set(jobs.values_list("shape__operator__name", flat=True)) == {"softmax"}
    assert set(jobs.values_list("stage", flat=True)) == {JobStage.VALIDATE}


def test_a_second_sweep_skips_cells_with_open_jobs_and_stores_no_sweep(cpu_runner):
    sweep("--operator", "gemm", "--device-type", "cuda", "--no-wait")
    out = sweep("--operator", "gemm", "--device-type", "cuda", "--no-wait")
    assert out.startswith("nothing to plan: each of the ")
    assert "open job already" in out
    assert set(ValidationJob.objects.values_list("stage", flat=True)) == {
        JobStage.LOWER
    }
    assert Sweep.objects.count() == 1


def test_sweep_shows_progress_and_gives_up_after_its_timeout(cpu_runner):
    out = StringIO()
    with pytest.raises(CommandError, match="not finished after 1 s"):
        call_command(
            "sweep",
            "--operator",
            "rmsnorm",
            "--served-only",
            "--timeout",
            "1",
            stdout=out,
        )
    assert "0% 0 done, 0 failed, 0 running" in out.getvalue()


def test_sweep_with_every_missing_cell_done_says_so(cpu_runner):
    sweep("--operator", "softmax", "--device-type", "c", "--no-wait")
    for job in ValidationJob.objects.all():
        services.job_claim(job_id=job.pk, attempt=job.attempt, runner=cpu_runner.runner)
        services.result_ingest(envelope=cpu_runner.result(job))
    out = sweep("--operator", "softmax", "--device-type", "c", "--missing-only")
    assert out == (
        "nothing to plan: every cell these filters choose has a result "
        "(--missing-only)\n"
    )
    assert Sweep.objects.count() == 1


@pytest.mark.parametrize(
    ("option", "allowed"),
    [
        ("--operator", r"--operator must be one of .*gemm.*softmax"),
        ("--device-type", r"--device-type takes .*\(NVIDIA H200 · sm_90a · cuda\)"),
        ("--toolchain", r"--toolchain must be one of tilelang-0\.1\.15-cpu"),
    ],
)
def test_an_unknown_filter_value_is_refused_naming_the_allowed_ones(
    cpu_runner, option, allowed
):
    with pytest.raises(CommandError, match=allowed):
        sweep(option, "nope", "--no-wait")
    assert not Sweep.objects.exists()


@pytest.mark.parametrize("timeout", ["-1", "nan"])
def test_a_timeout_below_zero_is_refused_before_planning(cpu_runner, timeout):
    with pytest.raises(CommandError, match="--timeout takes seconds, 0 or more"):
        sweep("--operator", "softmax", "--timeout", timeout)
    assert not ValidationJob.objects.exists() and not Sweep.objects.exists()


def test_sweep_says_when_its_jobs_wait_for_a_runner(cpu_runner):
    quiet = StringIO()
    sweep("--operator", "softmax", "--device-type", "c", "--no-wait", stderr=quiet)
    assert quiet.getvalue() == ""
    cpu_runner.runner.go_offline()
    told = StringIO()
    sweep("--operator", "gemm", "--device-type", "c", "--no-wait", stderr=told)
    planned = ValidationJob.objects.filter(shape__operator__name="gemm").count()
    assert planned and f"{planned} of them wait on queues no online runner" in (
        told.getvalue()
    )


@pytest.mark.parametrize("device_type", ["²", "99999999999999999999999"])
def test_a_device_type_of_digits_that_name_no_id_is_refused_with_the_allowed_ones(
    cpu_runner, device_type
):
    with pytest.raises(CommandError, match=r"--device-type takes .*\(x86-64 CPU · c\)"):
        sweep("--device-type", device_type, "--no-wait")
    assert not Sweep.objects.exists()


@pytest.mark.parametrize("option", ["--operator", "--device-type", "--toolchain"])
def test_an_empty_filter_value_is_refused_not_taken_for_every_cell(cpu_runner, option):
    with pytest.raises(CommandError, match=f"{option}: must not be empty"):
        sweep(option, "", "--no-wait")
    assert not Sweep.objects.exists() and not ValidationJob.objects.exists()


def test_sweep_lowers_cuda_cells_and_builds_them_only_with_build(register):
    from .conftest import cpu_inventory

    inventory = cpu_inventory()
    inventory["nvcc"] = True
    register(inventory=inventory)
    sweep("--operator", "softmax", "--device-type", "cuda", "--no-wait")
    assert set(ValidationJob.objects.values_list("stage", flat=True)) == {
        JobStage.LOWER
    }
    ValidationJob.objects.update(state="done")
    sweep("--operator", "softmax", "--device-type", "cuda", "--build", "--no-wait")
    built = Sweep.objects.order_by("pk").last()
    assert built.filters["build"] is True
    assert set(built.jobs.values_list("stage", flat=True)) == {JobStage.BUILD}


def test_build_without_an_nvcc_host_is_refused_and_plans_nothing(cpu_runner):
    with pytest.raises(CommandError, match="--build: no runner with nvcc is online"):
        sweep("--operator", "softmax", "--device-type", "cuda", "--build", "--no-wait")
    assert not Sweep.objects.exists()
