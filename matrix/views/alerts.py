"""Alerts: the list by served weight touched, an alert with its cells,
first bad result and history, and its triage (reviewers and the owners of
its backends)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from matrix.alerts import reads
from matrix.alerts.services import (
    TRANSITIONS,
    alert_bisect,
    alert_bisectable,
    alert_triage,
    can_triage,
)
from matrix.models import Backend
from matrix.models.alerts import Alert, AlertState
from matrix.views.bisections import can_bisect

PAGE_SIZE = 50


def _get_alert_for_user(user, pk: int) -> Alert:
    """Every reader may see an alert; triage is checked per action."""
    return get_object_or_404(
        Alert.objects.select_related(
            "toolchain",
            "good_toolchain",
            "revision__operator",
            "good_revision",
            "first_bad_result__error",
            "first_bad_result__device_type",
            "first_bad_result__shape__operator",
        ),
        pk=pk,
    )


@login_required
@require_GET
@vary_on_headers("HX-Request")
def alerts_page(request):
    state = request.GET.get("state", "open")
    backend = request.GET.get("backend", "")
    problems = reads.filters_check(state=state, backend=backend)
    if problems:
        return HttpResponseBadRequest("; ".join(problems))
    alerts = list(reads.alert_list(state=state, backend=backend)[:PAGE_SIZE])
    candidates = reads.fixed_on_candidate(alerts)
    for alert in alerts:
        alert.candidate = candidates.get(alert.pk)
    context = {
        "alerts": alerts,
        "state": state,
        "backend": backend,
        "states": [("open", "open"), *AlertState.choices, ("", "all")],
        "backends": Backend.choices,
        "page_size": PAGE_SIZE,
    }
    template = "alerts/list.html#alert-rows" if request.htmx else "alerts/list.html"
    return render(request, template, context)


@login_required
@require_GET
def alert_page(request, pk: int):
    alert = _get_alert_for_user(request.user, pk)
    cells, count = reads.alert_cells(alert)
    candidate = reads.fixed_on_candidate([alert]).get(alert.pk)
    return render(
        request,
        "alerts/detail.html",
        {
            "alert": alert,
            "cells": cells,
            "cell_count": count,
            "candidate": candidate,
            "history": reads.alert_history(alert).select_related("actor")[:50],
            "notifications": alert.notifications.prefetch_related(
                "deliveries__subscription"
            )[:10],
            "can_triage": can_triage(request.user, alert),
            "can_bisect": alert_bisectable(alert) and can_bisect(request.user),
            "next_states": [AlertState(s) for s in TRANSITIONS[alert.state]],
        },
    )


@login_required
@require_POST
def alert_triage_view(request, pk: int):
    alert = _get_alert_for_user(request.user, pk)
    if not can_triage(request.user, alert):
        raise PermissionDenied(
            "only reviewers and the owners of the alert's backends triage it"
        )
    try:
        alert_triage(
            alert=alert,
            state=request.POST.get("state", ""),
            by=request.user,
            upstream_url=request.POST.get("upstream_url", ""),
            reason=request.POST.get("reason", ""),
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        messages.success(request, "Alert updated.")
    return redirect("alert", pk=alert.pk)


@login_required
@require_POST
def alert_bisect_view(request, pk: int):
    """Bisect the alert's first bad cell between its last good and first bad
    toolchain; to the bisection's page, which polls while it runs."""
    if not can_bisect(request.user):
        raise PermissionDenied("bisecting plans jobs: it takes the bisect permission")
    alert = _get_alert_for_user(request.user, pk)
    try:
        bisection = alert_bisect(alert=alert, by=request.user)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect("alert", pk=alert.pk)
    return redirect("bisection", pk=bisection.pk)
