"""The control worker's tasks about runners: thin wrappers that take a JSON
envelope and call a service. ``runners.ingest_result``,
``runners.heartbeat`` and ``runners.reap`` run on the control worker (queue
``control``); the runner's own task, ``runners.execute_job``, is the
agent's (``runners.jobs``). A message that cannot be trusted or understood
is dropped with a log line: raising would only make the broker deliver it
again.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter

from celery import shared_task
from celery.signals import task_received
from celery_batches import Batches
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import DatabaseError, InterfaceError, OperationalError, connection

from matrix.fleet import services
from matrix.fleet.broker_access import BrokerAdminError
from runners.protocol import CONTROL, HEARTBEAT, INGEST_RESULT, REAP

log = logging.getLogger(__name__)

# Runner tasks carry their queue at send time (it depends on the cell);
# control tasks always go to the control worker.
ROUTES = {name: {"queue": CONTROL} for name in (INGEST_RESULT, HEARTBEAT, REAP)}


# Result messages are stored several at a time: the messages a control
# worker holds (up to INGEST_BATCH_MESSAGES, or what came within
# INGEST_FLUSH_S) go through one ingest, one transaction and one set of
# statements, where one each cost twice as much a result. The worker
# prefetches enough messages to fill a batch per process (``control work``).
INGEST_BATCH_MESSAGES = 32
INGEST_FLUSH_S = 0.1
# A batch the database could not take is sent again, message by message,
# with a growing delay; after that the runner's outbox sends it again.
INGEST_RETRIES = 5


def again_if_the_connection_was_cut(work):
    """Run ``work`` once more, on a new connection, when the database ended
    its connection mid-task (a restart, a failover, an operator's
    ``pg_terminate_backend``). The check before each task (matrix.celery)
    finds a connection cut between tasks, not one cut during a task; without
    this such a task fails, or waits for a retry, for a cause that is gone by
    the next statement. Every task wrapped is safe to run twice: ingest finds
    what it already stored, a heartbeat or a reap is the same again. Any
    other database error, or one inside a caller's transaction, is raised."""

    @functools.wraps(work)
    def run(*args, **kwargs):
        try:
            return work(*args, **kwargs)
        except (OperationalError, InterfaceError) as exc:
            if connection.in_atomic_block or not _connection_was_cut(exc):
                raise
            log.warning(
                "%s: the database ended its connection mid-task; run again "
                "on a new one",
                work.__name__,
            )
            connection.close()
            return work(*args, **kwargs)

    return run


# SQLSTATEs of a connection the server ended: a connection exception (class
# 08), or a shutdown by an operator, a crash or a start-up (57P01-57P03; not
# 57014, a statement's own timeout).
CUT_STATES = ("57P01", "57P02", "57P03")


def _connection_was_cut(exc: Exception) -> bool:
    """Told by the error, not by the connection: by the time it reaches the
    task, Django's transaction has already opened a new one."""
    if connection.vendor != "postgresql":
        return False  # SQLite's file has no connection to cut
    state = getattr(exc.__cause__, "sqlstate", None)
    if state is None:
        return True  # psycopg's own: the socket closed with no message
    return state.startswith("08") or state in CUT_STATES


@shared_task(
    name=INGEST_RESULT,
    base=Batches,
    flush_every=INGEST_BATCH_MESSAGES,
    flush_interval=INGEST_FLUSH_S,
)
def ingest_result(requests):
    messages = [(r.args[0] if r.args else None, r.kwargs or {}) for r in requests]
    log.info("ingesting %d result messages", len(messages))
    counted = Counter()
    try:
        counted = ingest_messages([envelopes for envelopes, _ in messages])
    except DatabaseError as exc:
        # One message the database refuses must not hold back the others:
        # each is tried alone, and only what fails alone is sent again.
        if len(messages) == 1:
            _ingest_again(*messages[0], exc)
        else:
            for envelopes, options in messages:
                try:
                    counted += ingest_messages([envelopes])
                except DatabaseError as alone:
                    _ingest_again(envelopes, options, alone)
    log.info(
        "ingested %d result messages: %s",
        len(messages),
        ", ".join(f"{n} {COUNTED[what]}" for what, n in counted.items()) or "nothing",
    )


# An ingest's line of counts, by outcome.
COUNTED = {
    "stored": "stored",
    "duplicate": "already stored",
    "refused": "refused",
    "dropped": "messages dropped",
}


@task_received.connect
def _ingest_received(request=None, **_):
    # A batched task's message skips the worker's own "received" line: it is
    # said here, so the log shows which result messages the worker holds.
    if request is not None and request.name == ingest_result.name:
        log.info("result message %s received", request.id)


def _ingest_again(envelopes, options: dict, exc: Exception) -> None:
    retries = options.get("retries", 0)
    if retries >= INGEST_RETRIES:
        log.error(
            "dropped a result message after %d retries (the runner's outbox "
            "sends it again): %s",
            retries,
            exc,
        )
        return
    log.warning("result message to be retried (retry %d): %s", retries + 1, exc)
    ingest_result.apply_async(
        args=[envelopes],
        kwargs={"retries": retries + 1},
        countdown=min(60, 2**retries),
        queue=CONTROL,
    )


@again_if_the_connection_was_cut
def ingest_messages(messages: list) -> Counter:
    """Store the results of several messages in one ingest, and count the
    outcomes. A message that is not a list of envelopes is dropped with a
    log line, not the others with it; a refused result is logged."""
    counted = Counter()
    everything = []
    for envelopes in messages:
        if isinstance(envelopes, dict):
            envelopes = [envelopes]
        if not isinstance(envelopes, list):
            log.warning("dropped result message: expected a list of result envelopes")
            counted["dropped"] += 1
            continue
        everything += envelopes
    if not everything:
        return counted
    outcomes = services.results_ingest(envelopes=everything)
    for envelope, outcome in zip(everything, outcomes, strict=True):
        counted[outcome.status] += 1
        # Stored results are logged by ingest, a line each with its job.
        if outcome.status == "refused":
            log.warning(
                "refused result from %r: %s",
                _signer(envelope),
                outcome.reason,
                extra={"job_id": _job_of(envelope), "runner": _signer(envelope)},
            )
    return counted


@shared_task(
    name=HEARTBEAT,
    autoretry_for=(DatabaseError,),
    retry_backoff=True,
    max_retries=3,
)
@again_if_the_connection_was_cut
def heartbeat(envelope):
    try:
        services.runner_heartbeat(envelope=envelope)
    except (PermissionDenied, ValidationError) as exc:
        reason = "; ".join(getattr(exc, "messages", [])) or str(exc)
        log.warning("refused heartbeat from %r: %s", _signer(envelope), reason)


@shared_task(name=REAP)
@again_if_the_connection_was_cut
def reap():
    counts = services.runner_reap()
    if any(counts.values()):
        log.info("reaper: %s", counts)
    try:
        pruned = services.broker_users_prune()
    except BrokerAdminError as exc:
        log.warning("reaper: broker users not checked: %s", exc)
    else:
        if pruned:
            log.warning("reaper: deleted %d broker users of revoked runners", pruned)


def _signer(envelope) -> str:
    return envelope.get("signer", "?") if isinstance(envelope, dict) else "?"


def _job_of(envelope) -> int | None:
    """The job id an envelope claims to be about (unchecked: for the log)."""
    payload = envelope.get("payload") if isinstance(envelope, dict) else None
    job = payload.get("job") if isinstance(payload, dict) else None
    return job if isinstance(job, int) and not isinstance(job, bool) else None
