"""A green cell turns red only once a rerun confirms the failure: on another
runner of its device type where one is online. A rerun that passes makes
the cell unstable, pointing at the failure; one that fails again makes the
failure the cell's answer."""

from __future__ import annotations

import pytest

from matrix.fleet import services
from matrix.models import Cell, JobState, Status, ValidationJob

from .test_result_ingest import _claimed_jobs

FAILED = {"error": {"message": "Y differs (on masked inputs)", "signature": "s1"}}


@pytest.fixture
def green_cell(cpu_runner):
    """A cell that passed, and a second job on it claimed by the runner."""
    _, (job,) = _claimed_jobs(cpu_runner, 1)
    services.results_ingest(envelopes=[cpu_runner.result(job)])
    again = services.sweep_plan(cells=[(job.shape, job.device_type, job.toolchain)])
    rerun = again.jobs.get()
    assert services.job_claim(job_id=rerun.pk, attempt=1, runner=cpu_runner.runner)
    rerun.refresh_from_db()
    return rerun


def cell_of(job) -> Cell:
    return Cell.objects.get(
        shape=job.shape, device_type=job.device_type, toolchain=job.toolchain
    )


def failed_once(runner, job):
    (outcome,) = services.results_ingest(
        envelopes=[runner.result(job, status="mismatch", **FAILED)]
    )
    assert outcome.status == "stored", outcome.reason
    return outcome.result


def test_a_failure_on_a_green_cell_waits_for_a_rerun_on_another_runner(
    cpu_runner, register, green_cell
):
    other = register(name="cpu-2")

    failure = failed_once(cpu_runner, green_cell)

    assert cell_of(green_cell).status == Status.PASS
    confirming = ValidationJob.objects.get(confirms=failure)
    assert confirming.state == JobState.QUEUED
    assert confirming.queue == other.runner.queue
    assert (confirming.shape_id, confirming.stage) == (green_cell.shape_id, "validate")


def test_only_one_runner_online_reruns_where_the_cells_jobs_go(cpu_runner, green_cell):
    failure = failed_once(cpu_runner, green_cell)

    confirming = ValidationJob.objects.get(confirms=failure)
    assert confirming.queue == green_cell.queue


def confirmed_by(runner, failure, **result):
    confirming = ValidationJob.objects.get(confirms=failure)
    assert services.job_claim(job_id=confirming.pk, attempt=1, runner=runner.runner)
    confirming.refresh_from_db()
    services.results_ingest(envelopes=[runner.result(confirming, **result)])
    return confirming


def test_a_failure_the_rerun_repeats_becomes_the_cells_answer(
    cpu_runner, register, green_cell
):
    other = register(name="cpu-2")
    failure = failed_once(cpu_runner, green_cell)

    confirmed_by(other, failure, status="mismatch", **FAILED)

    cell = cell_of(green_cell)
    assert cell.status == Status.MISMATCH
    # Confirmed once: no third run is planned.
    assert ValidationJob.objects.open().count() == 0


def test_a_rerun_that_passes_makes_the_cell_unstable_pointing_at_the_failure(
    cpu_runner, register, green_cell
):
    other = register(name="cpu-2")
    failure = failed_once(cpu_runner, green_cell)

    confirmed_by(other, failure)

    cell = cell_of(green_cell)
    assert (cell.status, cell.result_id) == (Status.UNSTABLE, failure.pk)
    assert cell.error_signature == failure.error_signature
    assert cell.kernel_ms is None


def test_a_failure_on_a_cell_that_was_not_green_counts_at_once(cpu_runner):
    _, (job,) = _claimed_jobs(cpu_runner, 1)

    failure = failed_once(cpu_runner, job)

    assert cell_of(job).status == Status.MISMATCH
    assert not ValidationJob.objects.filter(confirms=failure).exists()
