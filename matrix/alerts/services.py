"""Triage of an alert by people: acknowledge it, send it upstream with a
TileLang issue, or decide not to fix it, with a reason. Fixed is the
system's word alone (every cell passes again), so is reopening."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import URLValidator
from django.db import transaction

from matrix.accounts.roles import REVIEWER, has_role
from matrix.models import AuditEvent
from matrix.models.alerts import Alert, AlertState

# Where a person may move an alert from each state.
TRANSITIONS = {
    AlertState.NEW: (AlertState.ACKNOWLEDGED, AlertState.UPSTREAM, AlertState.WONT_FIX),
    AlertState.ACKNOWLEDGED: (AlertState.UPSTREAM, AlertState.WONT_FIX),
    AlertState.UPSTREAM: (AlertState.ACKNOWLEDGED, AlertState.WONT_FIX),
    AlertState.WONT_FIX: (AlertState.ACKNOWLEDGED,),
    AlertState.FIXED: (),
}
https_url = URLValidator(schemes=["http", "https"])


def can_triage(user, alert: Alert) -> bool:
    """Reviewers (and admins), and the owners the policy names for the
    alert's backends."""
    if not user.is_authenticated:
        return False
    return has_role(user, REVIEWER) or user.get_username() in alert.owners


@transaction.atomic
def alert_triage(
    *, alert: Alert, state: str, by, upstream_url: str = "", reason: str = ""
) -> Alert:
    """Move ``alert`` to ``state`` for ``by``, audited; refused with the
    reason when ``by`` may not, or when the state cannot follow."""
    alert = Alert.objects.select_for_update().get(pk=alert.pk)
    if not can_triage(by, alert):
        raise PermissionDenied(
            "only reviewers and the owners of the alert's backends triage it"
        )
    if state not in AlertState.values:
        raise ValidationError(
            f"unknown state {state!r}; one of {', '.join(AlertState.values)}"
        )
    allowed = TRANSITIONS[alert.state]
    if state not in allowed:
        offered = ", ".join(AlertState(s).label for s in allowed) or "nothing"
        raise ValidationError(
            f"a {AlertState(alert.state).label} alert cannot become "
            f"{AlertState(state).label}; it can become: {offered}"
        )
    before = alert.snapshot()
    upstream_url = (upstream_url or "").strip()
    reason = (reason or "").strip()
    if state == AlertState.UPSTREAM:
        if not upstream_url:
            raise ValidationError("upstream needs the link to the TileLang issue")
        try:
            https_url(upstream_url)
        except ValidationError:
            raise ValidationError(
                f"{upstream_url!r} is no http(s) link to an issue"
            ) from None
        alert.upstream_url = upstream_url
    if state == AlertState.WONT_FIX:
        if not reason:
            raise ValidationError("won't fix needs a reason")
        alert.wont_fix_reason = reason
    alert.state = state
    alert.save(update_fields=["state", "upstream_url", "wont_fix_reason", "changed_at"])
    AuditEvent.record(
        actor=by,
        verb=f"alert.{state}",
        obj=alert,
        before=before,
        after=alert.snapshot(),
    )
    return alert
