"""The gate's reactions to what happens in the rest of the server
(``matrix.events``), connected when the app is ready."""

from __future__ import annotations

from django.dispatch import receiver

from matrix.events import results_stored
from matrix.gate.services import proposals_reevaluation_request


@receiver(results_stored, dispatch_uid="gate.results_stored")
def proposals_touched(sender, *, results, **_):
    """Ingest stored results: the open proposals whose cells they touch are
    marked, and re-evaluated in the background once they are committed."""
    proposals_reevaluation_request(results=results)
