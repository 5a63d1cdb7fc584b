"""Liveness: signed heartbeats, claiming jobs, and giving the jobs of silent,
revoked or restarted runners another attempt (or ending them ``lost``)."""

from __future__ import annotations

import hashlib
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from matrix import read_versions
from matrix.fleet.models import Runner
from matrix.fleet.services.envelopes import (
    HEARTBEAT_MAX_AGE_S,
    envelope_runner,
    payload_verify,
)
from matrix.fleet.services.errors import Conflict
from matrix.fleet.services.planning import jobs_publish
from matrix.models import (
    AuditEvent,
    Blob,
    JobState,
    Result,
    Status,
    ValidationJob,
)

MAX_ATTEMPTS = 3
MISSED_HEARTBEATS = 3


def heartbeat_interval_s() -> float:
    return settings.TILEMATRIX_HEARTBEAT_S


def silent_cutoff(now=None):
    """A runner whose last heartbeat is older than this has missed
    MISSED_HEARTBEATS of them: the reaper marks it offline."""
    now = now or timezone.now()
    return now - timedelta(seconds=MISSED_HEARTBEATS * heartbeat_interval_s())


@transaction.atomic
def runner_heartbeat(*, envelope) -> Runner:
    """Record a signed heartbeat; its sequence must grow, so an old one
    replayed is refused."""
    runner = envelope_runner(envelope)
    payload = payload_verify(
        envelope, runner, kind="heartbeat", max_age_s=HEARTBEAT_MAX_AGE_S
    )
    sequence = payload["sequence"]
    runner = Runner.objects.select_for_update().get(pk=runner.pk)
    # Checked again under the lock: a revocation committed since the check
    # above would otherwise be undone by this heartbeat's "online".
    if runner.revoked_at is not None:
        state = "refused" if runner.is_refused else "revoked"
        raise PermissionDenied(f"runner {runner.name!r} is {state}")
    if sequence <= runner.last_sequence:
        raise Conflict(
            f"stale heartbeat: sequence {sequence} is not above {runner.last_sequence}"
        )
    runner.last_sequence = sequence
    runner.last_heartbeat = timezone.now()
    runner.save(update_fields=["last_sequence", "last_heartbeat"])
    if payload["state"] == Runner.State.BUSY:
        runner.go_busy()
    else:
        runner.go_online()
    return runner


def job_claim(
    *, job_id: int, attempt: int, runner: Runner, queues: list[str] | None = None
) -> bool:
    """Take a queued job for this runner; False when another delivery, another
    runner or a newer attempt has it, or the runner may not take work.
    ``queues``: only a job routed to one of these (the runner's own)."""
    if runner.revoked_at is not None or runner.health != Runner.Health.ACTIVE:
        return False
    jobs = ValidationJob.objects.filter(
        pk=job_id, attempt=attempt, state=JobState.QUEUED
    )
    if queues is not None:
        jobs = jobs.filter(queue__in=queues)
    claimed = bool(
        jobs.update(state=JobState.RUNNING, runner=runner, started_at=timezone.now())
    )
    if claimed and runner.state == Runner.State.ONLINE:
        # Busy from its first job, not from its next heartbeat (up to a
        # heartbeat's interval later, while the Runners page said online).
        Runner.objects.filter(pk=runner.pk, state=Runner.State.ONLINE).update(
            state=Runner.State.BUSY
        )
        runner.state = Runner.State.BUSY
    return claimed


def _infra_result(job: ValidationJob, message: Blob) -> Result:
    return Result(
        job=job,
        attempt=job.attempt,
        revision_id=job.revision_id,
        shape_id=job.shape_id,
        device_type_id=job.device_type_id,
        toolchain_id=job.toolchain_id,
        status=Status.INFRA_ERROR,
        stage_reached="",
        error_signature=hashlib.sha256(message.text.encode()).hexdigest()[:16],
        error=message,
    )


def jobs_lose(*, jobs: list[ValidationJob], reason: str) -> int:
    """End running jobs `lost`, each with an infra_error result."""
    if not jobs:
        return 0
    now = timezone.now()
    for job in jobs:
        job.state, job.finished_at = JobState.LOST, now
    ValidationJob.objects.bulk_update(jobs, ["state", "finished_at"])
    message = Blob.stored(reason)
    results = [_infra_result(job, message) for job in jobs]
    Result.objects.bulk_create(results, ignore_conflicts=True)
    # Their reads move as ingest's do (the gaps no longer show them queued).
    keys = read_versions.scopes_of(results)
    transaction.on_commit(lambda: read_versions.scopes_bump(keys))
    return len(jobs)


def bundle_jobs_lose(
    *, runner: Runner, reason: str, sweep_id: int | None = None
) -> int:
    """End a runner's open bundle jobs (one bundle's, given its sweep) `lost`
    with an infra_error result. Bundle jobs are never reaped: left running,
    a bundle that will not come home holds its cells from every later sweep
    and bundle. Returns how many jobs ended."""
    jobs = ValidationJob.objects.select_for_update().filter(
        runner=runner, state=JobState.RUNNING, queue=f"bundle.{runner.name}"
    )
    if sweep_id is not None:
        jobs = jobs.filter(sweep_id=sweep_id)
    return jobs_lose(jobs=list(jobs), reason=reason)


@transaction.atomic
def bundle_abandon(*, runner_name: str, sweep_id: int | None = None, by=None) -> int:
    """Give up a runner's bundles (one, given its sweep) that will not come
    home: its cells can be planned again, and its results, if they come
    after all, are refused as late. Returns how many jobs ended."""
    runner = Runner.objects.filter(name=runner_name).first()
    if runner is None:
        raise ValidationError(f"no runner named {runner_name!r}")
    ended = bundle_jobs_lose(
        runner=runner,
        reason=f"bundle for {runner.name} abandoned before it came home",
        sweep_id=sweep_id,
    )
    if ended:
        AuditEvent.record(
            actor=by,
            verb="bundle.abandon",
            obj=runner,
            after={"jobs": ended, "sweep": sweep_id},
        )
    return ended


def jobs_requeue(*, jobs: list[ValidationJob], reason: str) -> dict:
    """Give running jobs another attempt, or end them `lost` with an
    infra_error result once they have had MAX_ATTEMPTS."""
    retry, lost = [], []
    for job in jobs:
        if job.attempt >= MAX_ATTEMPTS:
            lost.append(job)
        else:
            job.attempt += 1
            job.state, job.runner, job.started_at = JobState.QUEUED, None, None
            retry.append(job)
    ValidationJob.objects.bulk_update(
        retry, ["attempt", "state", "runner", "started_at"]
    )
    jobs_lose(jobs=lost, reason=f"lost after {MAX_ATTEMPTS} attempts: {reason}")
    if retry:
        jobs_publish(
            list(
                ValidationJob.objects.filter(
                    pk__in=[j.pk for j in retry]
                ).select_related(
                    "revision__operator", "shape", "device_type", "toolchain"
                )
            )
        )
    return {"requeued": len(retry), "lost": len(lost)}


@transaction.atomic
def runner_reap(*, now=None) -> dict:
    """Mark runners silent for MISSED_HEARTBEATS intervals offline and give
    their running jobs to someone else."""
    now = now or timezone.now()
    cutoff = silent_cutoff(now)
    silent = list(
        Runner.objects.select_for_update()
        .exclude(state=Runner.State.OFFLINE)
        .filter(Q(last_heartbeat__lt=cutoff) | Q(last_heartbeat__isnull=True))
    )
    totals = {"offline": 0, "requeued": 0, "lost": 0}
    for runner in silent:
        runner.go_offline()
        totals["offline"] += 1
    # Revoked or silent runners' running jobs, whether just marked or earlier.
    jobs = list(
        ValidationJob.objects.select_for_update()
        .filter(state=JobState.RUNNING)
        .filter(
            Q(runner__state=Runner.State.OFFLINE) | Q(runner__revoked_at__isnull=False)
        )
        .exclude(queue__startswith="bundle.")
    )
    counts = jobs_requeue(jobs=jobs, reason="runner went offline")
    totals["requeued"], totals["lost"] = counts["requeued"], counts["lost"]
    return totals


@transaction.atomic
def runner_recover(*, runner: Runner) -> dict:
    """After a runner's worker (re)starts: nothing it was running survives,
    so those jobs get another attempt; queued jobs on its queues are sent
    again because a broker without acknowledgements (the embedded one) drops
    messages a killed worker had prefetched. A duplicate is harmless: only
    one delivery can claim a job."""
    running = list(
        ValidationJob.objects.select_for_update().filter(
            state=JobState.RUNNING, runner=runner
        )
    )
    counts = jobs_requeue(jobs=running, reason=f"worker of {runner.name} restarted")
    republished = queued_republish(runner=runner, exclude={j.pk for j in running})
    return {**counts, "republished": republished}


@transaction.atomic
def runner_health_set(*, runner: Runner, health: str, by=None) -> int:
    """Put a runner in maintenance or take it out of it; returns how many
    queued jobs were sent again. A worker left running in maintenance gives
    back the first messages it receives and stops reading its runner queues
    until maintenance ends, so the other runners on them take those jobs.
    Ending maintenance still sends its queued jobs again, as a reconnect
    does: a message lost meanwhile would leave its job queued for good. A
    revoked runner stays revoked: its health is not set."""
    if runner.revoked_at is not None:
        raise ValidationError("a revoked runner stays revoked")
    if runner.health == Runner.Health.PENDING or health == Runner.Health.PENDING:
        raise ValidationError(
            f"runner {runner.name!r} is waiting for approval: approve or refuse it"
            if runner.health == Runner.Health.PENDING
            else "a runner is pending only until it is approved"
        )
    was = runner.health
    runner.set_health(health, by=by)
    if was != Runner.Health.ACTIVE and health == Runner.Health.ACTIVE:
        return queued_republish(runner=runner)
    return 0


def queued_republish(*, runner: Runner, exclude: set[int] = frozenset()) -> int:
    """Send again the queued jobs on a runner's queues (after its worker
    restarts or reconnects, when a broker may have lost them)."""
    queued = list(
        ValidationJob.objects.filter(state=JobState.QUEUED, queue__in=runner.queues())
        .exclude(pk__in=exclude)
        .select_related("revision__operator", "shape", "device_type", "toolchain")
    )
    jobs_publish(queued)
    return len(queued)
