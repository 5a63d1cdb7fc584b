from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from matrix.fleet import services
from matrix.fleet.models import Runner
from matrix.models import Cell, JobState, Result, Status


def silence(hand, seconds):
    Runner.objects.filter(pk=hand.runner.pk).update(
        last_heartbeat=timezone.now() - timedelta(seconds=seconds)
    )


def test_a_runner_silent_for_three_heartbeats_goes_offline_and_its_jobs_are_requeued(
    cpu_runner, running_job
):
    silence(cpu_runner, 3 * services.heartbeat_interval_s() + 1)
    counts = services.runner_reap()
    assert counts == {"offline": 1, "requeued": 1, "lost": 0}
    assert Runner.objects.get().state == Runner.State.OFFLINE
    running_job.refresh_from_db()
    assert (running_job.state, running_job.attempt, running_job.runner) == (
        JobState.QUEUED,
        2,
        None,
    )


def test_a_runner_that_missed_fewer_heartbeats_keeps_its_jobs(cpu_runner, running_job):
    silence(cpu_runner, 2 * services.heartbeat_interval_s())
    assert services.runner_reap() == {"offline": 0, "requeued": 0, "lost": 0}
    running_job.refresh_from_db()
    assert running_job.state == JobState.RUNNING


def test_after_three_attempts_a_job_ends_lost_with_an_infra_error_result(
    cpu_runner, running_job
):
    for attempt in (2, 3):
        silence(cpu_runner, 3600)
        services.runner_reap()
        services.runner_heartbeat(envelope=cpu_runner.heartbeat())
        assert services.job_claim(
            job_id=running_job.pk, attempt=attempt, runner=cpu_runner.runner
        )
    silence(cpu_runner, 3600)
    assert services.runner_reap()["lost"] == 1
    running_job.refresh_from_db()
    assert running_job.state == JobState.LOST
    result = Result.objects.get(job=running_job)
    assert (result.attempt, result.status) == (3, Status.INFRA_ERROR)
    assert "lost after 3 attempts" in result.error_message
    assert running_job.sweep.progress()["finished"]
    assert not Cell.objects.exists()


def test_a_revoked_runner_loses_its_running_jobs_to_others(cpu_runner, running_job):
    services.runner_revoke(name=cpu_runner.name)
    assert services.runner_reap()["requeued"] == 1


def test_a_restarted_worker_gives_its_running_jobs_another_attempt(
    cpu_runner, running_job
):
    counts = services.runner_recover(runner=cpu_runner.runner)
    assert counts["requeued"] == 1
    running_job.refresh_from_db()
    assert (running_job.state, running_job.attempt) == (JobState.QUEUED, 2)


def test_only_one_delivery_claims_a_job(cpu_runner, register, cpu_cells):
    other = register(name="cpu-2")
    job = services.sweep_plan(cells=cpu_cells()[:1]).jobs.get()
    assert services.job_claim(job_id=job.pk, attempt=1, runner=cpu_runner.runner)
    assert not services.job_claim(job_id=job.pk, attempt=1, runner=cpu_runner.runner)
    assert not services.job_claim(job_id=job.pk, attempt=1, runner=other.runner)
    job.refresh_from_db()
    assert job.runner == cpu_runner.runner


def test_a_runner_in_maintenance_claims_nothing(cpu_runner, cpu_cells, admin_user):
    job = services.sweep_plan(cells=cpu_cells()[:1]).jobs.get()
    cpu_runner.runner.set_health(Runner.Health.MAINTENANCE, by=admin_user)
    assert not services.job_claim(job_id=job.pk, attempt=1, runner=cpu_runner.runner)


def test_revoking_a_runner_frees_the_cells_of_its_bundle_for_another_sweep(
    cpu_runner, register, cpu_cells
):
    bundle, _ = services.bundle_plan(runner_name=cpu_runner.name, cells=cpu_cells())
    register(name="cpu-2")
    assert services.sweep_plan(cells=cpu_cells()).total == 0
    services.runner_revoke(name=cpu_runner.name)
    services.runner_reap()
    assert bundle.progress()["finished"]
    result = Result.objects.filter(job__sweep=bundle).first()
    assert result.status == Status.INFRA_ERROR
    assert "revoked before its bundle came home" in result.error_message
    assert services.sweep_plan(cells=cpu_cells()).total == bundle.total


def test_a_result_that_comes_after_its_bundle_was_abandoned_is_refused(
    cpu_runner, cpu_cells
):
    bundle, _ = services.bundle_plan(runner_name=cpu_runner.name, cells=cpu_cells())
    job = bundle.jobs.first()
    assert services.bundle_abandon(runner_name=cpu_runner.name) == bundle.total
    job.refresh_from_db()
    (outcome,) = services.results_ingest(envelopes=[cpu_runner.result(job)])
    assert (outcome.status, outcome.code) == ("refused", 409)
    assert outcome.reason == (
        f"job {job.pk} was given up (lost) before this result came: plan the cell again"
    )
    assert Result.objects.get(job=job).status == Status.INFRA_ERROR
