"""Control-worker tasks of the notifications: thin, they take ids and call a
service. A failed delivery is retried with exponential backoff; beat asks
``notifications.runners_watch`` to look for runners silent or waiting too
long."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from matrix.notifications import services, watch

log = logging.getLogger(__name__)

CONTROL = "control"
ROUTES = {
    services.DELIVER_TASK: {"queue": CONTROL},
    "notifications.runners_watch": {"queue": CONTROL},
}
WATCH_EVERY_S = 60.0


def retry_countdown(retries: int) -> float:
    """Seconds before the next attempt: base, 2 × base, 4 × base ... capped
    at an hour (TILEMATRIX_NOTIFY_RETRY_BASE_S, 30 s unless set)."""
    base = getattr(settings, "TILEMATRIX_NOTIFY_RETRY_BASE_S", 30.0)
    return min(base * 2**retries, 3600.0)


@shared_task(
    name=services.DELIVER_TASK,
    bind=True,
    acks_late=True,
    max_retries=services.MAX_ATTEMPTS - 1,
    ignore_result=True,
)
def deliver(self, delivery_id):
    outcome = services.delivery_attempt(delivery_id=delivery_id)
    if outcome.retry:
        log.warning("delivery %s failed (%s); retrying", delivery_id, outcome.detail)
        raise self.retry(countdown=retry_countdown(self.request.retries))


@shared_task(name="notifications.runners_watch", ignore_result=True)
def runners_watch():
    told = watch.runners_watch()
    if told:
        log.info("runner notifications published: %s", told)
