"""Refused results, counted by reason, for ``tilematrix_results_refused_total``.

Ingest answers a refusal in words ("bad signature: ...", "job 7 attempt 1 is
no longer running ..."); a Prometheus label must come from a short, fixed
list, so each refusal is filed under one of ``REASONS`` by the words that
start its sentence, and anything not recognised under ``other``.

``refusals_count`` hears ingest's ``results_checked`` (``matrix.events``)
inside its transaction: a batch the database rolls back and ingest tries
again message by message is counted once, not twice."""

from __future__ import annotations

from collections import Counter

from django.db.models import F
from django.dispatch import receiver

from matrix.events import results_checked
from matrix.observability.models import IngestRefusal

# (label, words that mark it), tried in order; the first match files it.
REASON_WORDS = (
    ("bad_signature", ("bad signature", "public key is not a valid key")),
    ("expired", ("expired envelope", "issued in the future")),
    ("malformed", ("malformed envelope", "an envelope must be", "expected a result")),
    ("unknown_runner", ("unknown runner",)),
    ("revoked_runner", ("is revoked", "is refused")),
    ("not_assigned", ("is not assigned to runner", "names a different runner")),
    ("replay", ("replayed envelope",)),
    ("no_job", ("no job ",)),
    ("job_lost", ("was given up (lost)",)),
    ("attempt_superseded", ("is no longer running",)),
)
# A 400 no words above name is the payload or the result failing its checks
# (a job id that is no number, a status off the ladder, a pass outside its
# tolerance, a non-finite timing).
INVALID_RESULT = "invalid_result"
OTHER = "other"
REASONS = (*(label for label, _ in REASON_WORDS), INVALID_RESULT, OTHER)


def refusal_reason(*, reason: str, code: int) -> str:
    """The label of one refusal, from its sentence and HTTP-like code."""
    for label, words in REASON_WORDS:
        if any(w in reason for w in words):
            return label
    return INVALID_RESULT if code == 400 else OTHER


@receiver(results_checked, dispatch_uid="observability.refusals_count")
def refusals_count(sender=None, *, outcomes, **_) -> None:
    """Add ingest's refusals to their reasons' rows. ``outcomes``: ingest's
    ``Outcome`` list (``status``, ``reason``, ``code``). No statement when
    nothing was refused, which is nearly always."""
    refused = Counter(
        refusal_reason(reason=o.reason, code=o.code)
        for o in outcomes
        if o.status == "refused"
    )
    # In one order, so two control workers lock the rows the same way round.
    for reason in sorted(refused):
        counted = IngestRefusal.objects.filter(reason=reason).update(
            count=F("count") + refused[reason]
        )
        if not counted:
            # Rows are made by the migration; a reason added since gets one.
            IngestRefusal.objects.get_or_create(reason=reason)
            IngestRefusal.objects.filter(reason=reason).update(
                count=F("count") + refused[reason]
            )


def refusals_counted() -> dict[str, int]:
    """Every reason's count, zero where none was refused yet."""
    counts = dict.fromkeys(REASONS, 0)
    counts.update(IngestRefusal.objects.values_list("reason", "count"))
    return counts
