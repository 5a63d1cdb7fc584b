"""Control-worker tasks of the upgrade gate: thin, they take ids and call a
service. Results ask for ``gate.reevaluate`` (``matrix.gate.services.
proposals_reevaluation_request``); beat resends the requests a lost message
left waiting."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import DatabaseError

from matrix.gate import services

log = logging.getLogger(__name__)

CONTROL = "control"
# A request still marked this long after it was made lost its message.
RESEND_AFTER_S = 60.0
ROUTES = {
    "gate.reevaluate": {"queue": CONTROL},
    "gate.reevaluation_resend": {"queue": CONTROL},
}


@shared_task(
    name=services.REEVALUATE_TASK,
    autoretry_for=(DatabaseError,),
    retry_backoff=True,
    max_retries=5,
)
def proposal_reevaluate_task(proposal_id):
    proposal = services.proposal_reevaluate_requested(proposal_id=proposal_id)
    if proposal is not None:
        log.info("re-evaluated %s: %s", proposal, proposal.state)


@shared_task(name="gate.reevaluation_resend")
def reevaluation_resend():
    resent = services.proposals_reevaluation_resend(older_than_s=RESEND_AFTER_S)
    if resent:
        log.warning("re-evaluations resent for proposals %s", resent)
