"""The runner agent's Celery task: ``runners.execute_job`` runs on a runner
worker, on the queues the server gave the runner. A job message whose claim the server cannot answer (unreachable, timeout,
5xx) is retried; one that cannot be trusted is dropped with a log line.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.exceptions import Reject
from celery.utils.time import get_exponential_backoff_interval

from runners import client, host, signing
from runners import config as agent_config
from runners.broker_login import RETRY_ROUTE
from runners.protocol import EXECUTE_JOB
from runners.worker import jobs_pause_from_task, jobs_stop_from_task

log = logging.getLogger(__name__)


# While the server cannot answer a claim, the message is sent again to its
# queue with a growing delay (up to a minute) for about two hours; after that
# the job stays queued and the runner's next broker (re)connect republishes it.
CLAIM_RETRIES = 120
RETRY_BACKOFF_S = 2
RETRY_BACKOFF_MAX_S = 60


@shared_task(
    name=EXECUTE_JOB,
    bind=True,
    acks_late=True,
    max_retries=CLAIM_RETRIES,
)
def execute_job(self, envelope):
    try:
        config = host.HostConfig.load(host.runner_dir())
    except host.HostError as exc:
        log.error("dropped job message on a worker that is not a runner: %s", exc)
        return
    try:
        outcome = host.jobs_execute(
            envelope=envelope,
            config=config,
            # Inside the message's soft limit, so the harness reports a
            # timeout itself.
            timeout_s=agent_config.job_budget_s(),
            retried=bool(self.request.retries),
        )
    except signing.EnvelopeError as exc:
        log.warning("dropped job message: %s", exc)
        return
    except client.ServerRefused as exc:
        if exc.status == 403:
            # The server no longer takes this runner (revoked, or a key it
            # does not know): the job is not this runner's to drop. Its
            # message goes back to the queue for the other runners, and the
            # worker takes no more jobs rather than take it again.
            log.error(
                "runner %s is refused (%s): its job message goes back to the "
                "queue and this worker takes no more jobs",
                config.name,
                exc.detail,
            )
            if not (self.request.called_directly or self.request.is_eager):
                jobs_stop_from_task()
            raise Reject(str(exc), requeue=True) from None
        log.warning("dropped job message: claim %s", exc)
        return
    except host.RunnerPaused as health:
        # Not this runner's job to drop either: the message goes back for
        # the other runners on the queue, and this worker stops reading its
        # runner queues until the server says the runner is active again
        # (RunnerHost reads them again then).
        log.warning(
            "runner %s is in %s: its job message goes back to the queue and "
            "this worker reads its runner queues again when that ends",
            config.name,
            health,
        )
        if not (self.request.called_directly or self.request.is_eager):
            jobs_pause_from_task(self.app, self.request.hostname)
        raise Reject(f"runner in {health}", requeue=True) from None
    except host.RunnerShortOfDisk as short:
        # As in maintenance: its jobs go back for the other runners, and
        # this worker reads its runner queues again once there is room
        # (RunnerHost looks on each heartbeat).
        log.warning(
            "runner %s: %s; its job message goes back to the queue and this "
            "worker reads its runner queues again once there is room",
            config.name,
            short,
        )
        if not (self.request.called_directly or self.request.is_eager):
            jobs_pause_from_task(self.app, self.request.hostname)
        raise Reject(str(short), requeue=True) from None
    except client.ServerUnavailable as exc:
        log.warning(
            "claim not answered, message to be retried (retry %s of %s): %s",
            self.request.retries + 1,
            CLAIM_RETRIES,
            exc,
        )
        # On a runner's own broker login it may publish only to its own
        # queue's exchange: the retried message comes back to it there
        # (runners.broker_login); elsewhere to the queue it came from.
        raise self.retry(
            exc=exc,
            countdown=get_exponential_backoff_interval(
                factor=RETRY_BACKOFF_S,
                retries=self.request.retries,
                maximum=RETRY_BACKOFF_MAX_S,
                full_jitter=True,
            ),
            **(self.app.conf.get(RETRY_ROUTE) or {}),
        ) from None
    log.info("%s", outcome)
