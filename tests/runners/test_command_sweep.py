from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from matrix.models import JobStage, ValidationJob


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


def test_a_second_sweep_skips_cells_with_open_jobs(cpu_runner):
    sweep("--operator", "gemm", "--device-type", "cuda", "--no-wait")
    out = sweep("--operator", "gemm", "--device-type", "cuda", "--no-wait")
    assert "0 jobs planned" in out
    assert set(ValidationJob.objects.values_list("stage", flat=True)) == {
        JobStage.LOWER
    }


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


def test_sweep_with_nothing_to_do_says_so(cpu_runner):
    out = sweep("--operator", "no-such-operator")
    assert "0 jobs planned" in out


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
