"""Bisection's reactions to what happens in the rest of the server
(``matrix.events``), connected when the app is ready."""

from __future__ import annotations

from django.dispatch import receiver

from matrix.bisection.services import bisection_results_record
from matrix.events import results_stored


@receiver(results_stored, dispatch_uid="bisection.results_stored")
def steps_answered(sender, *, results, **_):
    """Ingest stored results: a bisection step waiting on one of their jobs
    takes its verdict, and its bisection plans the next step."""
    bisection_results_record(results=results)
