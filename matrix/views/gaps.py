"""Ranked gaps, "Run missing", and a sweep's live progress."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from matrix import queries
from matrix.models import Backend, DeviceType, Dtype, Shape, Sweep
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
    queued = [g for g in gaps if g.queued]
    # Every gap shares the toolchain, so either all are takeable or none is:
    # then point at the toolchains the online runners do host. On a
    # superseded toolchain no runner would help: the page says so instead.
    unhosted = (
        bool(gaps)
        and not gaps[0].takeable
        and filters.toolchain is not None
        and filters.superseded_by is None
    )
    hosted = []
    if unhosted:
        online = {t.pk for t in queries.toolchains_online()}
        current = queries.current_toolchain(toolchains)
        hosted = [
            (
                t,
                _query_with(filters, toolchain=t.name),
                queries.toolchain_superseded(t, current),
            )
            for t in toolchains
            if t.pk in online
        ]
    superseded_by = filters.superseded_by
    # With no gaps, "every served cell passes" is only true when there are
    # served cells and device types to place them on.
    catalogue_missing = []
    if not gaps:
        if not Shape.objects.served().exists():
            catalogue_missing.append("shapes")
        if not DeviceType.objects.exists():
            catalogue_missing.append("device types")
    return {
        "filters": filters,
        "toolchains": toolchains,
        "gaps": gaps[:SHOWN],
        "gap_count": len(gaps),
        "runnable": runnable,
        "queued": queued,
        # Run missing validates these, and only lowers or builds the rest.
        "validating": sum(not g.compile_only for g in runnable),
        "compile_only": sum(g.compile_only for g in runnable),
        "reasons": list(queries.reason_counts(gaps).items()),
        "dtypes": Dtype.values,
        "backends": Backend.choices,
        "states": queries.STATE_FILTERS,
        "query": urlencode(filters.as_params()),
        "can_run": can_run_sweeps(request.user),
        "unhosted": unhosted,
        "catalogue_missing": catalogue_missing,
        "hosted": hosted,
        "superseded_query": (
            _query_with(filters, toolchain=superseded_by.name) if superseded_by else ""
        ),
    }


def _query_with(filters, **changed) -> str:
    return urlencode({**filters.as_params(), **changed})


@require_GET
@vary_on_headers("HX-Request")
def gaps_page(request):
    context = _gaps_context(request)
    template = "matrix/gaps.html"
    if request.htmx and request.htmx.target == "gap-list":
        template += "#gap-list"
    else:
        # Coming back to gaps already queued shows the sweep running them.
        sweep = _open_sweep_for(context["queued"])
        if sweep is not None:
            context.update(_progress_context(sweep))
            context["queued_elsewhere"] = any(
                g.sweep_id != sweep.pk for g in context["queued"]
            )
    return render(request, template, context)


@login_required
@require_POST
def gaps_run(request):
    """Plan one sweep for exactly the runnable gaps under the posted filters
    that have no job queued or running yet."""
    if not can_run_sweeps(request.user):
        raise PermissionDenied("running sweeps needs the matrix.add_sweep permission")
    context = _gaps_context(request)
    filters = context["filters"]
    cells = [(g.shape, g.device_type, filters.toolchain) for g in context["runnable"]]
    sweep = None
    if filters.toolchain is not None and cells:
        sweep = _plan_new_work(
            cells=cells, created_by=request.user, filters=filters.as_params()
        )
    if sweep is None:
        return _nothing_new_to_run(request, context)
    if not request.htmx:
        return redirect("sweep", sweep.pk)
    response = _render_progress(request, sweep, focus=True)
    # The list reloads so its count and button no longer offer these cells.
    response["HX-Trigger"] = "sweep-planned"
    return response


def _plan_new_work(*, cells, created_by, filters: dict) -> Sweep | None:
    """A sweep of the cells that can get a new job; None, and no sweep
    saved, when none can: mostly because each has one queued or running
    already (a second click, a second tab)."""
    with transaction.atomic():
        sweep = sweep_plan(cells=cells, created_by=created_by, filters=filters)
        if sweep.total:
            return sweep
        transaction.set_rollback(True)
    return None


def _nothing_new_to_run(request, context) -> HttpResponse:
    """Point at the sweep already working on these gaps, or say there is
    nothing to run."""
    sweep = _open_sweep_for(context["queued"])
    if request.htmx:
        if sweep is not None:
            context.update(_progress_context(sweep))
        return render(request, "matrix/gaps.html#nothing-to-run", context)
    if sweep is not None:
        messages.info(
            request,
            f"Nothing new to plan: these cells are already queued in sweep {sweep.pk}.",
        )
        return redirect("sweep", sweep.pk)
    messages.info(request, "Nothing to run: no gap here that a fresh run would close.")
    return redirect(f"{reverse('gaps')}?{context['query']}")


def _open_sweep_for(queued) -> Sweep | None:
    """The newest sweep with a queued or running job for one of these gaps."""
    sweep_ids = {g.sweep_id for g in queued if g.sweep_id}
    if not sweep_ids:
        return None
    return Sweep.objects.filter(pk=max(sweep_ids)).first()


def _get_sweep_for_user(request, pk: int) -> Sweep:
    # Sweeps are coverage evidence, readable by everyone who can read the matrix.
    return get_object_or_404(Sweep, pk=pk)


def _progress_context(sweep: Sweep) -> dict:
    # The filters the sweep was planned under carry over to its links back
    # to the matrix and the gaps; other keys (an offline bundle's runner)
    # are not filters. In the pages' own order: PostgreSQL's jsonb returns
    # keys sorted, SQLite as written.
    links = [(k, sweep.filters[k]) for k in queries.FILTER_PARAMS if k in sweep.filters]
    return {"sweep": sweep, "p": sweep.progress(), "links_query": urlencode(links)}


@require_GET
@vary_on_headers("HX-Request")
def sweep_page(request, pk: int):
    sweep = _get_sweep_for_user(request, pk)
    if request.htmx:
        return _render_progress(request, sweep)
    return render(request, "matrix/sweep.html", _progress_context(sweep))


def _render_progress(request, sweep: Sweep, *, focus: bool = False) -> HttpResponse:
    context = _progress_context(sweep)
    # Only the answer to Run missing takes focus: the button pressed is
    # replaced, while a poll must not pull the keyboard away every 2 s.
    context["focus"] = focus
    response = render(request, "matrix/sweep.html#sweep-progress", context)
    if context["p"]["finished"] and request.htmx and request.method == "GET":
        response.status_code = STOP_POLLING
        # The gap list on the page reloads itself on this event.
        response["HX-Trigger"] = "sweep-finished"
    return response
