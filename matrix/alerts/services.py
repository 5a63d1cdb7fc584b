"""Triage of an alert by people: acknowledge it, send it upstream with a
TileLang issue, or decide not to fix it, with a reason. Fixed is the
system's word alone (every cell passes again), so is reopening. An alert
whose cause is a toolchain pair is bisected across the releases between,
and the bisection's conclusion is written back onto it."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import URLValidator
from django.db import transaction
from django.utils import timezone

from matrix.accounts.roles import REVIEWER, has_role
from matrix.bisection.services import bisection_start, release_to_compare
from matrix.models import AuditEvent
from matrix.models.alerts import SLOWER, Alert, AlertState
from matrix.models.bisection import Bisection

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


def alert_bisect_ends(alert: Alert) -> tuple | None:
    """(last good, first bad) toolchains to bisect the alert's first bad
    cell between, or None. Where its cells passed on one toolchain and fail
    on another (a toolchain change, or the current toolchain failing where
    a newer one passes), those two. Where a kernel revision fails on the
    toolchain it passed on before (a revision change, or nothing pinned
    changed), that toolchain and another hosted release
    (``release_to_compare``): which release, if any, the revision passes on.
    A slowdown's cells pass: no verdict for a search to split."""
    if alert.good_toolchain_id and alert.good_toolchain_id != alert.toolchain_id:
        return alert.good_toolchain, alert.toolchain
    if alert.status == SLOWER or alert.first_bad_result_id is None:
        return None
    other = release_to_compare(
        toolchain=alert.toolchain, device_type=alert.first_bad_result.device_type
    )
    return None if other is None else (other, alert.toolchain)


def alert_bisectable(alert: Alert) -> bool:
    return alert_bisect_ends(alert) is not None


def alert_bisect(*, alert: Alert, by) -> Bisection:
    """Bisect the alert's first bad cell over the TileLang releases between
    its last good and its first bad toolchain, on the kernel revision that
    failed. Its conclusion comes back onto the alert
    (``alert_bisection_record``); while it runs, the alert links it."""
    ends = alert_bisect_ends(alert)
    if ends is None:
        raise ValidationError(
            "only an alert whose cells pass on one toolchain and fail on another, "
            "or whose failing kernel revision another hosted TileLang release "
            "could run, can be bisected across toolchains; this one is a "
            f"{alert.get_kind_display()} on {alert.toolchain.name}, and no online "
            "runner with its device type hosts another release"
        )
    first = alert.first_bad_result
    last_good, first_bad = ends
    bisection = bisection_start(
        shape=first.shape,
        device_type=first.device_type,
        last_good=last_good,
        first_bad=first_bad,
        revision=alert.revision,
        by=by,
    )
    if bisection.is_running:
        Alert.objects.filter(pk=alert.pk).update(
            bisection=bisection_said(bisection), changed_at=timezone.now()
        )
    return bisection


def bisection_said(bisection: Bisection) -> dict:
    """What an alert keeps of a bisection: enough for its page and the API
    without reading the bisection's rows."""
    release = bisection.release
    return {
        "id": bisection.pk,
        "state": bisection.state,
        "state_label": bisection.get_state_display(),
        "cell": f"{bisection.shape} on {bisection.device_type}",
        "summary": bisection.conclusion
        or f"Bisection {bisection.pk} is running: {bisection.sought} sought.",
        "sought": bisection.sought,
        "release": release.name if release else "",
        "release_version": release.tilelang_version if release else "",
        "needs": list(bisection.needs),
    }


@transaction.atomic
def alert_bisection_record(*, bisection: Bisection) -> list[int]:
    """A bisection ended: its conclusion goes onto the alerts holding its
    cell (on either of its toolchains), audited; their ids."""
    alerts = list(
        Alert.objects.filter(
            cells__shape_id=bisection.shape_id,
            cells__device_type_id=bisection.device_type_id,
            cells__toolchain_id__in=[bisection.last_good_id, bisection.first_bad_id],
        )
        .distinct()
        .order_by("pk")
    )
    said = bisection_said(bisection)
    for alert in alerts:
        alert.bisection = said
        alert.save(update_fields=["bisection", "changed_at"])
        AuditEvent.record(
            verb="alert.bisected",
            obj=alert,
            after={
                "state": alert.state,
                "bisection": bisection.pk,
                "why": f"bisection {bisection.pk}: {bisection.get_state_display()}",
            },
        )
    return [a.pk for a in alerts]
