"""What a runner worker asks the server over HTTP, since it holds no database
credentials: claim the jobs of a message, recover after a (re)connect, learn
which of its unsent results are still awaited, and read its queues.

Each request is an envelope the runner signed: checked like a heartbeat
(known, unrevoked signer; signature; at most REQUEST_MAX_AGE_S old) and, in
the same transaction as what it does, its nonce is spent, so a replayed
request is refused (Conflict) and changes nothing.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from matrix.fleet import broker_access, ingest_queues
from matrix.fleet.models import Runner, SpentNonce
from matrix.fleet.services.envelopes import (
    REQUEST_MAX_AGE_S,
    envelope_runner,
    payload_verify,
)
from matrix.fleet.services.errors import Conflict
from matrix.fleet.services.liveness import job_claim, queued_republish, runner_recover
from matrix.models import JobState, ValidationJob

log = logging.getLogger(__name__)


def request_verify(envelope, *, kind: str) -> tuple[Runner, dict]:
    """The runner that signed a request of ``kind`` and its payload; spends
    the envelope's nonce. Call inside a transaction."""
    runner = envelope_runner(envelope)
    payload = payload_verify(envelope, runner, kind=kind, max_age_s=REQUEST_MAX_AGE_S)
    # Checked by envelope_verify already: ISO 8601 with a time zone.
    issued_at = datetime.fromisoformat(envelope["issued_at"])
    try:
        with transaction.atomic():
            SpentNonce.objects.create(
                nonce=envelope["nonce"], runner=runner, issued_at=issued_at
            )
    except IntegrityError:
        raise Conflict("replayed envelope: this nonce was already used") from None
    # Slack for clocks: an envelope may be issued up to 300 s ahead.
    SpentNonce.objects.filter(
        issued_at__lt=timezone.now() - timedelta(seconds=REQUEST_MAX_AGE_S + 300)
    ).delete()
    return runner, payload


def job_keys(payload: dict) -> list[tuple[int, int]]:
    """The (job, attempt) pairs a request names (checked by payload_verify)."""
    return [(job["job"], job["attempt"]) for job in payload["jobs"]]


def _pairs(keys) -> list[dict]:
    return [{"job": j, "attempt": a} for j, a in sorted(keys)]


@transaction.atomic
def jobs_claim(*, envelope) -> dict:
    """Claim the jobs a runner names, each atomically (only one delivery
    gets a job), and only on the runner's own queues. ``held`` lists those
    that were already running for this runner at that attempt: a runner
    whose earlier claim got no answer learns that it holds them. ``health``
    tells a runner in maintenance why it got nothing: its worker gives the
    messages back and waits."""
    runner, payload = request_verify(envelope, kind="claim")
    keys = job_keys(payload)
    queues = runner.queues()
    claimed = {
        (job, attempt)
        for job, attempt in dict.fromkeys(keys)
        if job_claim(job_id=job, attempt=attempt, runner=runner, queues=queues)
    }
    rest = set(keys) - claimed
    held = set()
    if rest:
        held = rest & set(
            ValidationJob.objects.filter(
                pk__in={j for j, _ in rest}, state=JobState.RUNNING, runner=runner
            ).values_list("pk", "attempt")
        )
    return {"claimed": _pairs(claimed), "held": _pairs(held), "health": runner.health}


@transaction.atomic
def runner_reconnect(*, envelope) -> dict:
    """What a runner's worker asks for when it connects to the broker: after
    a (re)start (``restarted``), its running jobs get another attempt and
    queued jobs on its queues are sent again; after a reconnect only the
    queued ones are sent again (the messages may be gone, running jobs are
    not)."""
    runner, payload = request_verify(envelope, kind="recover")
    counts = {"requeued": 0, "lost": 0, "republished": 0}
    if runner.has_no_queue:
        # It runs nothing and has no queue: the queues it claims to have
        # are another runner's, whose jobs it must not have sent again.
        return counts
    if payload["restarted"]:
        counts.update(runner_recover(runner=runner))
    else:
        counts["republished"] = queued_republish(runner=runner)
    return counts


@transaction.atomic
def outbox_pending(*, envelope) -> dict:
    """Of the (job, attempt) pairs whose signed results a runner keeps, the
    ones still running for it at that attempt: results to send again."""
    runner, payload = request_verify(envelope, kind="outbox")
    keys = set(job_keys(payload))
    running = set(
        ValidationJob.objects.filter(
            pk__in={j for j, _ in keys}, state=JobState.RUNNING, runner=runner
        ).values_list("pk", "attempt")
    )
    return {"running": _pairs(keys & running)}


@transaction.atomic
def runner_queues(*, envelope) -> dict:
    """The queues a runner's worker consumes, as the server sees them now,
    and whether it may take work from them (its health: ``pending`` until a
    runner admin approves it, with no queue)."""
    runner, _ = request_verify(envelope, kind="queues")
    # A pending runner is given no queue: what it claims is unapproved.
    if runner.has_no_queue:
        return {"name": runner.name, "queues": [], "health": runner.health}
    try:
        # Made at approval; made again here, so a broker that lost its users
        # (reset, restored) or a changed secret key heals at the next start.
        broker_access.access_grant(runner)
    except broker_access.BrokerAdminError as exc:
        log.warning("runner %s: broker user not refreshed: %s", runner.name, exc)
    return {
        "name": runner.name,
        "queues": runner.queues(),
        "health": runner.health,
        "broker": broker_access.login(runner),
        "ingest": ingest_queues.of_runner(runner.name),
    }
