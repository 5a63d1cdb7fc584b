"""Ranked gaps, "Run missing", and a sweep's live progress."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from matrix import queries
from matrix.models import Backend, Dtype, Sweep
from runners.services import sweep_plan

SHOWN = 500
# htmx stops polling when a response carries this status.
STOP_POLLING = 286


def can_run_sweeps(user) -> bool:
    # Reviewers and runner admins hold it through their role.
    return user.is_authenticated and user.has_perm("matrix.add_sweep")


def _gaps_context(request):
    toolchains = queries.toolchain_list()
    filters = queries.MatrixFilters.from_params(request.GET or request.POST, toolchains)
    gaps = queries.served_gaps(filters)
    runnable = [g for g in gaps if g.runnable]
    # Every gap shares the toolchain, so either all are takeable or none is:
    # then point at the toolchains the online runners do host.
    unhosted = bool(gaps) and not gaps[0].takeable and filters.toolchain is not None
    return {
        "filters": filters,
        "toolchains": toolchains,
        "gaps": gaps[:SHOWN],
        "gap_count": len(gaps),
        "runnable": runnable,
        "reasons": list(queries.reason_counts(gaps).items()),
        "dtypes": Dtype.values,
        "backends": Backend.choices,
        "states": queries.STATE_FILTERS,
        "query": urlencode(filters.as_params()),
        "can_run": can_run_sweeps(request.user),
        "unhosted": unhosted,
        "hosted": queries.toolchains_online() if unhosted else [],
    }


@require_GET
@vary_on_headers("HX-Request")
def gaps_page(request):
    context = _gaps_context(request)
    template = "matrix/gaps.html"
    if request.htmx and request.htmx.target == "gap-list":
        template += "#gap-list"
    return render(request, template, context)


@login_required
@require_POST
def gaps_run(request):
    """Plan one sweep for exactly the runnable gaps under the posted filters."""
    if not can_run_sweeps(request.user):
        raise PermissionDenied("running sweeps needs the matrix.add_sweep permission")
    context = _gaps_context(request)
    filters = context["filters"]
    cells = [(g.shape, g.device_type, filters.toolchain) for g in context["runnable"]]
    if filters.toolchain is None or not cells:
        return render(request, "matrix/gaps.html#nothing-to-run", context, status=200)
    sweep = sweep_plan(
        cells=cells, created_by=request.user, filters=filters.as_params()
    )
    if not request.htmx:
        return redirect("sweep", sweep.pk)
    return _render_progress(request, sweep)


def _get_sweep_for_user(request, pk: int) -> Sweep:
    # Sweeps are coverage evidence, readable by everyone who can read the matrix.
    return get_object_or_404(Sweep, pk=pk)


@require_GET
@vary_on_headers("HX-Request")
def sweep_page(request, pk: int):
    sweep = _get_sweep_for_user(request, pk)
    if request.htmx:
        return _render_progress(request, sweep)
    return render(request, "matrix/sweep.html", {"sweep": sweep, "p": sweep.progress()})


def _render_progress(request, sweep: Sweep) -> HttpResponse:
    progress = sweep.progress()
    response = render(
        request, "matrix/sweep.html#sweep-progress", {"sweep": sweep, "p": progress}
    )
    if progress["finished"] and request.htmx and request.method == "GET":
        response.status_code = STOP_POLLING
        # The gap list on the page reloads itself on this event.
        response["HX-Trigger"] = "sweep-finished"
    return response
