"""Bisection pages: "Bisect" on an upgrade diff's row, and a bisection's
steps and conclusion, polled while it runs."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseClientRedirect

from matrix.bisection.services import bisection_from_diff_row
from matrix.models import ID_MAX, Bisection
from matrix.models.gate import DiffRow, UpgradeProposal

# htmx stops polling on this status.
STOP_POLLING = 286


def can_bisect(user) -> bool:
    """Bisecting plans jobs: reviewers and runner admins hold it by role."""
    return user.is_authenticated and user.has_perm("matrix.add_bisection")


def row_bisections(proposal: UpgradeProposal, rows) -> None:
    """Give each diff row its newest bisection started from this proposal
    (``row.bisection``, None where none), in one query."""
    cells = {(row.shape_id, row.device_type_id) for row in rows}
    newest = {}
    found = Bisection.objects.filter(
        proposal=proposal,
        shape_id__in={s for s, _ in cells},
        device_type_id__in={d for _, d in cells},
    ).order_by("-pk")
    for bisection in found.only("pk", "state", "shape_id", "device_type_id"):
        newest.setdefault((bisection.shape_id, bisection.device_type_id), bisection)
    for row in rows:
        row.bisection = newest.get((row.shape_id, row.device_type_id))


def rows_bisections_version(proposal: UpgradeProposal) -> tuple:
    """What the rows' bisection links move with."""
    latest = (
        Bisection.objects.filter(proposal=proposal)
        .order_by("-updated_at")
        .values_list("pk", "updated_at")
        .first()
    )
    return latest or ()


def _go(request, url: str):
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


@login_required
@require_POST
def upgrade_bisect(request, pk: int):
    """Bisect one row of the proposal's diff (``row``: its id)."""
    if not can_bisect(request.user):
        raise PermissionDenied("bisecting plans jobs: it takes the bisect permission")
    proposal = get_object_or_404(
        UpgradeProposal.objects.select_related("baseline", "candidate"), pk=pk
    )
    row_id = request.POST.get("row", "")
    if not (row_id.isascii() and row_id.isdigit() and 0 < int(row_id) <= ID_MAX):
        return HttpResponseBadRequest("which row? give its id as row=")
    row = (
        DiffRow.objects.filter(proposal=proposal, pk=int(row_id))
        .select_related("shape__operator", "device_type")
        .first()
    )
    if row is None:
        return HttpResponseBadRequest(
            f"proposal {proposal.pk} has no diff row {row_id}"
        )
    row.proposal = proposal
    try:
        bisection = bisection_from_diff_row(row=row, by=request.user)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return _go(request, reverse("upgrade", args=[proposal.pk]) + "#cells")
    return _go(request, reverse("bisection", args=[bisection.pk]))


def _get_bisection_for_user(user, pk: int) -> Bisection:
    """Every reader of the matrix may read a bisection."""
    return get_object_or_404(
        Bisection.objects.select_related(
            "shape__operator",
            "device_type",
            "revision",
            "last_good",
            "first_bad",
            "release",
            "proposal",
            "created_by",
        ),
        pk=pk,
    )


def _context(bisection: Bisection) -> dict:
    steps = {
        step.rung: step
        for step in bisection.steps.select_related("toolchain", "job", "result")
    }
    rungs = [
        {**rung, "place": i, "step": steps.get(i)}
        for i, rung in enumerate(bisection.ladder)
    ]
    repro = bisection.repro or {}
    return {
        "bisection": bisection,
        "rungs": rungs,
        "answered": sum(1 for step in steps.values() if step.verdict),
        "repro_job": json.dumps(repro["job"], indent=2) if repro.get("job") else "",
        "repro": repro,
    }


@login_required
@require_GET
@vary_on_headers("HX-Request")
def bisection_page(request, pk: int):
    bisection = _get_bisection_for_user(request.user, pk)
    context = _context(bisection)
    if request.htmx:
        response = render(request, "matrix/bisection.html#bisection-progress", context)
        if not bisection.is_running:
            response.status_code = STOP_POLLING
        return response
    return render(request, "matrix/bisection.html", context)
