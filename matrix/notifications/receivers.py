"""The notifications' reactions to the rest of the server (``matrix.events``),
connected when the app is ready. Each runs in the sender's transaction and
only writes rows; the sending waits for the commit (a Celery task). A fault
here is logged, never raised into ingest or a decision."""

from __future__ import annotations

import logging
from functools import wraps

from django.db import transaction
from django.dispatch import receiver

from matrix.events import alerts_changed, proposal_state_changed, results_stored
from matrix.models import ValidationJob
from matrix.notifications import messages

log = logging.getLogger(__name__)


def guarded(fn):
    @wraps(fn)
    def run(*args, **kwargs):
        try:
            with transaction.atomic():
                fn(*args, **kwargs)
        except Exception:
            log.exception("notifications: %s failed", fn.__name__)

    return run


@receiver(alerts_changed, dispatch_uid="notifications.alerts_changed")
@guarded
def alerts_told(sender, *, opened=(), reopened=(), **_):
    for alert in opened:
        messages.alert_publish(alert, reopened=False)
    for alert in reopened:
        messages.alert_publish(alert, reopened=True)


@receiver(proposal_state_changed, dispatch_uid="notifications.proposal")
@guarded
def proposal_told(sender, *, proposal, before, **_):
    messages.proposal_publish(proposal, before=before)


@receiver(results_stored, dispatch_uid="notifications.sweeps")
@guarded
def sweeps_told(sender, *, results, **_):
    sweeps = set(
        ValidationJob.objects.filter(
            pk__in={r.job_id for r in results}, sweep__isnull=False
        ).values_list("sweep_id", flat=True)
    )
    messages.sweeps_finished_publish(sweeps)
