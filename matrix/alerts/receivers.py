"""The alerts' reaction to stored results (``matrix.events``), connected when
the app is ready."""

from __future__ import annotations

import logging

from django.db import transaction
from django.dispatch import receiver

from matrix.alerts.detection import alerts_from_results, alerts_rolled_out
from matrix.alerts.services import alert_bisection_record
from matrix.events import (
    alerts_changed,
    bisection_concluded,
    proposal_state_changed,
    results_stored,
)
from matrix.models.gate import ProposalState

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


@receiver(proposal_state_changed, dispatch_uid="alerts.proposal_state_changed")
def upgrade_rolled_out(sender, *, proposal, **_):
    """An upgrade rolled out: the alerts it fixes close. In a savepoint: a
    fault here is logged, the rollout stands."""
    if proposal.state != ProposalState.ROLLED_OUT:
        return
    try:
        with transaction.atomic():
            alerts_rolled_out(proposal=proposal)
    except Exception:
        log.exception("alerts: rollout of upgrade %s was not checked", proposal.pk)
