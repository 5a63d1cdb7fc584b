"""The alerts' reaction to stored results (``matrix.events``), connected when
the app is ready."""

from __future__ import annotations

import logging

from django.db import transaction
from django.dispatch import receiver

from matrix.alerts.detection import alerts_from_results
from matrix.alerts.services import alert_bisection_record
from matrix.events import alerts_changed, bisection_concluded, results_stored

log = logging.getLogger(__name__)


@receiver(results_stored, dispatch_uid="alerts.results_stored")
def alerts_touched(sender, *, results, **_):
    """Ingest stored results: alerts open, grow, reopen or close with the
    cells they wrote, in ingest's transaction. In a savepoint of its own:
    a fault here is logged and the batch is stored all the same (a lost
    alert is bad; lost results are worse)."""
    try:
        with transaction.atomic():
            changes = alerts_from_results(results=results)
    except Exception:
        log.exception("alerts: results %s were not checked", [r.pk for r in results])
        return
    if changes.opened or changes.reopened:
        alerts_changed.send(
            sender=type(results[0]), opened=changes.opened, reopened=changes.reopened
        )


@receiver(bisection_concluded, dispatch_uid="alerts.bisection_concluded")
def bisection_written(sender, *, bisection, **_):
    """A bisection ended: the alerts holding its cell take its conclusion.
    In a savepoint: a fault here is logged, the bisection ends all the same."""
    try:
        alert_bisection_record(bisection=bisection)
    except Exception:
        log.exception("alerts: bisection %s was not written", bisection.pk)
