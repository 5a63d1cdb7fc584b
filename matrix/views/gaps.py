"""Ranked gaps, paged and downloadable; "Run missing" with its preview; and a
sweep's live progress."""

from __future__ import annotations

import csv
import time

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import escape
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from matrix import gaps, queries
from matrix.cache import cache_seconds, cached_read, jobs_version, read_key
from matrix.exports import download_name, spreadsheet_safe, unknown_toolchain
from matrix.fleet.services import capabilities_online, sweep_plan
from matrix.models import (
    FAILURES,
    AuditEvent,
    Backend,
    Dtype,
    JobStage,
    Shape,
    Sweep,
)
from matrix.neighbours import neighbours_add
from matrix.page_cache import page_response

PAGE_SIZE = gaps.PAGE_SIZE
# Page links shown around the current one, besides the first and the last.
PAGE_LINKS_AROUND = 3
# htmx stops polling when a response carries this status.
STOP_POLLING = 286


def can_run_sweeps(user) -> bool:
    # Reviewers and runner admins hold it through their role.
    return user.is_authenticated and user.has_perm("matrix.add_sweep")


# Whether the page offers Run missing follows a grant within this long: it
# only shapes the page (gaps_run checks the permission on every POST), and
# reading every permission of a user and their groups cost two queries on
# each view of the page.
OFFER_RUN_SECONDS = 60


def _offers_run(user) -> bool:
    if not user.is_authenticated:
        return False
    return cache.get_or_set(
        f"offers-run:{user.pk}", lambda: can_run_sweeps(user), OFFER_RUN_SECONDS
    )


def _scope(params, *, fresh: bool = False) -> tuple[gaps.GapScope, list]:
    """The gap list the query string or form names, and the toolchains."""
    toolchains, device_types = queries.catalogue_lists(fresh=fresh)
    filters = queries.MatrixFilters.from_params(params, toolchains)
    scope = gaps.GapScope(
        filters,
        capabilities_online(),
        device_types,
        build=params.get("build") == "1",
    )
    return scope, toolchains


def _page_number(raw) -> int:
    try:
        return max(1, int(raw))
    except (TypeError, ValueError):
        return 1


def _page_links(page: int, last: int) -> list[int | None]:
    """Page numbers to link, None where a run of them is left out."""
    shown = {1, last, *range(page - PAGE_LINKS_AROUND, page + PAGE_LINKS_AROUND + 1)}
    links: list[int | None] = []
    for n in sorted(n for n in shown if 1 <= n <= last):
        if links and n - links[-1] > 1:
            links.append(None)
        links.append(n)
    return links


def _gaps_context(request, scope: gaps.GapScope, toolchains, can_run: bool) -> dict:
    filters = scope.filters
    query = urlencode(filters.as_params())
    summary = gaps.gap_summary(scope)
    last_page = max(1, -(-summary.total // PAGE_SIZE))
    page = min(_page_number(request.GET.get("page")), last_page)
    offset = (page - 1) * PAGE_SIZE
    rows = gaps.gap_page(scope, limit=PAGE_SIZE, offset=offset) if summary.total else []
    elsewhere = queries.passing_elsewhere(
        {(g.shape_id, g.device_type.pk) for g in rows if g.status in FAILURES},
        filters.toolchain,
    )
    for g in rows:
        g.passes_on = elsewhere.get((g.shape_id, g.device_type.pk))
    # What Run missing would plan, with the time it takes, and what the
    # build choice would plan instead where a runner with nvcc could.
    preview, build_stage = [], None
    if can_run and (summary.plan or summary.build_plan):
        durations = gaps.job_durations()
        plan = summary.build_plan if scope.build else summary.plan
        preview = gaps.plan_preview(plan, durations, scope.device_types)
        if scope.nvcc:
            with_builds = gaps.plan_preview(
                summary.build_plan, durations, scope.device_types
            )
            build_stage = next(
                (s for s in with_builds if s.stage == JobStage.BUILD), None
            )
    # No online runner hosts the toolchain: point at those the online
    # runners do host. On a superseded toolchain no runner would help: the
    # page says so instead.
    unhosted = (
        bool(summary.total)
        and not scope.hosted
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
    if not summary.total:
        if not Shape.objects.served().exists():
            catalogue_missing.append("shapes")
        if not scope.device_types:
            catalogue_missing.append("device types")
    return {
        "filters": filters,
        "toolchains": toolchains,
        "summary": summary,
        "kinds": [(kind, n) for kind, n in summary.kinds.items() if n],
        "gaps": rows,
        "gap_count": summary.total,
        "page": page,
        "last_page": last_page,
        "page_links": _page_links(page, last_page),
        "first_row": offset + 1,
        "last_row": offset + len(rows),
        "build": scope.build,
        "preview": preview,
        "plan_jobs": sum(stage.jobs for stage in preview),
        "plan_time": gaps.duration_text(sum(stage.seconds for stage in preview)),
        "build_stage": build_stage,
        # Shown where something can be planned now, or only with builds.
        "offer_run": bool(preview or build_stage) and filters.toolchain is not None,
        "dtypes": Dtype.values,
        "backends": Backend.choices,
        "states": queries.STATE_FILTERS,
        "query": query,
        "list_query": urlencode({**filters.as_params(), "page": page}),
        "can_run": can_run,
        "unhosted": unhosted,
        "catalogue_missing": catalogue_missing,
        "hosted": hosted,
        "superseded_query": (
            _query_with(filters, toolchain=superseded_by.name) if superseded_by else ""
        ),
    }


def gap_rows_html(rows: list[gaps.Gap], query: str) -> SafeString:
    """The table's rows, built in Python: through the template engine a
    page of 100 rows cost a few thousand variable lookups, most of a view's
    time. Every catalogue string (operator, shape key, device name) is
    escaped."""
    cell = reverse("cell", args=[0, 0]).replace("/0/0/", "/{}/{}/")
    parts = []
    for g in rows:
        icon, short, _ = g.label
        stale = " stale" if g.stale else ""
        if g.queued:
            run = "job queued"
        elif g.stage:
            run = g.stage
        else:
            run = '<span class="muted">—</span>'
        url = cell.format(g.shape_id, g.device_type.pk)
        why = escape(", ".join(g.reasons))
        if g.passes_on:
            name, proposal, older = g.passes_on
            upgrade = (
                f' (<a href="{reverse("upgrade", args=[proposal])}">upgrade '
                f"#{proposal}</a>)"
                if proposal
                else ""
            )
            # The toolchain of an open proposal from here: its candidate.
            where = "fixed on candidate" if proposal else "passes on"
            why += (
                f'<br><span class="passes-on">{where} {escape(name)}{upgrade}: '
                + (
                    "the revision that failed here passes there; a run tries "
                    "the current one"
                    if older
                    else "a run here fails the same way"
                )
                + "</span>"
            )
        parts.append(
            f"<tr><td>{g.rank}</td><td>{escape(g.operator)}</td>"
            f'<th scope="row"><a href="{url}?{escape(query)}">'
            f"{escape(g.dims_key)} {escape(g.dtype)}</a></th>"
            f"<td>{escape(g.device_type)}</td>"
            f'<td class="c k-{g.status_kind}{stale}"><span aria-hidden="true">'
            f"{icon}</span> {escape(short)}</td>"
            f"<td>{why}</td><td>{run}</td>"
            f"<td>{g.score:.2f}</td></tr>"
        )
    return mark_safe("\n".join(parts))


def _query_with(filters, **changed) -> str:
    return urlencode({**filters.as_params(), **changed})


def _gap_list_html(request, scope: gaps.GapScope, context: dict) -> str:
    """The list under the filters (counts, Run missing, the rows of a page),
    rendered from ``context``.

    For a signed-in reader who cannot run sweeps it is the same for every
    such reader until the gaps or the online runners change: rendered once
    per gap version (at 1M results its render took most of a 25 ms view, and
    every result arriving during a sweep had each web worker render it
    again). The Run missing form carries its user's CSRF token, and a
    visitor's page their own login link: those are rendered per view."""

    def render_list() -> str:
        rows = {"rows_html": gap_rows_html(context["gaps"], context["query"])}
        return render_to_string(
            "matrix/gaps.html#gap-list", {**context, **rows}, request
        )

    filters = scope.filters
    if (
        context["can_run"]
        or not request.user.is_authenticated
        or not cache_seconds()
        or filters.unknown
        or filters.text
    ):
        return render_list()
    capabilities = scope.capabilities
    key = read_key(
        "gaps-list",
        sorted(filters.as_params().items()),
        context["page"],
        scope.build,
        sorted(capabilities.validate),
        sorted(capabilities.hosted),
        sorted(capabilities.nvcc),
        scope.version or gaps.gaps_version(),
    )
    return cached_read(key, render_list, cache_seconds())


@require_GET
@vary_on_headers("HX-Request")
def gaps_page(request):
    scope, toolchains = _scope(request.GET)
    can_run = _offers_run(request.user)
    if request.htmx and request.htmx.target == "gap-list":
        context = _gaps_context(request, scope, toolchains, can_run)
        return HttpResponse(_gap_list_html(request, scope, context))

    def page(frame: dict) -> str:
        context = _gaps_context(request, scope, toolchains, can_run)
        context["gap_list_html"] = _gap_list_html(request, scope, context)
        # Coming back to gaps already queued shows the sweep running them.
        sweep = _newest_open_sweep(context["summary"])
        if sweep is not None:
            context.update(_progress_context(sweep))
        return render_to_string("matrix/gaps.html", {**context, **frame}, request)

    return page_response(request, _gaps_page_key(request, scope, can_run), page)


def _gaps_page_key(request, scope: gaps.GapScope, can_run: bool) -> str | None:
    """What the whole page of a reader who cannot run sweeps depends on: the
    gap list's own key, the page shown and the progress of the sweep the
    gaps are queued in. A reader who can run sees a plan whose durations
    follow the clock: their page is rendered per view."""
    filters = scope.filters
    if can_run or filters.unknown or filters.text:
        return None
    total, newest_sweep = gaps.gap_extent(scope)
    last_page = max(1, -(-total // PAGE_SIZE))
    sweep = None
    if newest_sweep:
        sweep = (
            newest_sweep,
            jobs_version(newest_sweep),
            int(time.time() // PROGRESS_KEPT_S),
        )
    capabilities = scope.capabilities
    return read_key(
        "gaps-page",
        sorted(filters.as_params().items()),
        min(_page_number(request.GET.get("page")), last_page),
        scope.build,
        sorted(capabilities.validate),
        sorted(capabilities.hosted),
        sorted(capabilities.nvcc),
        sweep,
        version=scope.version or gaps.gaps_version(),
    )


CSV_COLUMNS = (
    "rank",
    "operator",
    "dims",
    "dtype",
    "weight",
    "device_type",
    "backend",
    "status",
    "gap",
    "no_runner",
    "job_queued",
    "run_missing_stage",
    "score",
    "url",
)


class _Echo:
    """A file that hands back what is written, for a streamed csv.writer."""

    def write(self, value: str) -> str:
        return value


@require_GET
def gaps_csv(request):
    """Every gap under the page's filters, in its order, as CSV."""
    scope, _ = _scope(request.GET)
    if scope.filters.toolchain is None:
        return HttpResponse("no toolchain has reported yet\n", status=404)
    refused = unknown_toolchain(request.GET, scope.filters, queries.toolchain_list())
    if refused:
        return refused
    query = urlencode({"toolchain": scope.filters.toolchain.name})
    writer = csv.writer(_Echo())

    def lines():
        yield writer.writerow(CSV_COLUMNS)
        for g in gaps.gaps_all(scope):
            cell = reverse("cell", args=[g.shape_id, g.device_type.pk])
            yield writer.writerow(
                (
                    g.rank,
                    spreadsheet_safe(g.operator),
                    spreadsheet_safe(g.dims_key),
                    g.dtype,
                    g.weight,
                    spreadsheet_safe(str(g.device_type)),
                    g.device_type.backend,
                    g.status,
                    g.kind,
                    int(g.no_runner),
                    int(g.queued),
                    g.stage or "",
                    f"{g.score:.4g}",
                    request.build_absolute_uri(f"{cell}?{query}"),
                )
            )

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    name = download_name("gaps", scope.filters.toolchain.name)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


def _run_refusal(scope: gaps.GapScope) -> str:
    """Why Run missing cannot be carried out under these filters, in one
    sentence; empty when it can."""
    filters = scope.filters
    for name, value in filters.unknown.items():
        return f"Unknown {name} “{value}”: nothing was planned."
    if filters.toolchain is None:
        return "No toolchain is registered yet, so there is nothing to run."
    if filters.superseded_by is not None:
        return (
            f"{filters.toolchain} is superseded by {filters.superseded_by}: a fresh "
            "result on it would be stale too, so nothing was planned."
        )
    if not scope.hosted:
        return (
            f"No online runner hosts {filters.toolchain}, so nothing was planned: "
            "these cells wait for a runner with that toolchain to come online."
        )
    if scope.build and not scope.nvcc:
        return (
            f"No online runner with nvcc hosts {filters.toolchain}, so nothing was "
            "planned: run without “build with nvcc” to lower these cells instead."
        )
    return ""


@login_required
@require_POST
def gaps_neighbours(request):
    """Add the neighbours of every served shape (matrix/neighbours.py) as
    shapes of their own: the gaps list them and Run missing plans them."""
    if not can_run_sweeps(request.user):
        raise PermissionDenied(
            "adding shapes to run needs the matrix.add_sweep permission"
        )
    added = neighbours_add()
    served = Shape.objects.served().count()
    if added:
        AuditEvent.record(
            actor=request.user,
            verb="shapes.neighbours",
            # The newest neighbour stands for the batch it closes.
            obj=Shape.objects.filter(guards=True).latest("pk"),
            after={"added": added, "served": served},
        )
        messages.success(
            request,
            f"{added} neighbour shapes added around the {served} served ones: the "
            "gaps list them and Run missing plans them.",
        )
    else:
        messages.info(
            request, "Every neighbour of the served shapes is a shape already."
        )
    return redirect("gaps")


@login_required
@require_POST
def gaps_run(request):
    """Plan one sweep for exactly the gaps under the posted filters that Run
    missing offers (see GapScope.stage), none of them with a job queued or
    running yet; or say in one sentence why nothing was planned."""
    if not can_run_sweeps(request.user):
        raise PermissionDenied("running sweeps needs the matrix.add_sweep permission")
    scope, _ = _scope(request.POST, fresh=True)
    refusal = _run_refusal(scope)
    sweep = None
    if not refusal:
        toolchain = scope.filters.toolchain
        cells = [(s, d, toolchain.pk) for s, d in gaps.runnable_cells(scope)]
        if cells:
            filters = scope.filters.as_params()
            if scope.build:
                filters["build"] = True
            sweep = _plan_new_work(
                cells=cells, created_by=request.user, filters=filters, build=scope.build
            )
    if sweep is None:
        return _nothing_new_to_run(request, scope, refusal)
    if not request.htmx:
        return redirect("sweep", sweep.pk)
    response = _render_progress(request, sweep, focus=True)
    # The list reloads so its count and button no longer offer these cells.
    response["HX-Trigger"] = "sweep-planned"
    return response


def _plan_new_work(*, cells, created_by, filters: dict, build: bool) -> Sweep | None:
    """A sweep of the cells that can get a new job; None, and no sweep
    saved, when none can: mostly because each has one queued or running
    already (a second click, a second tab)."""
    with transaction.atomic():
        sweep = sweep_plan(
            cells=cells, created_by=created_by, filters=filters, build=build
        )
        if sweep.total:
            return sweep
        transaction.set_rollback(True)
    return None


def _nothing_new_to_run(request, scope: gaps.GapScope, refusal: str) -> HttpResponse:
    """Say why nothing was planned: the refusal, the sweep already working
    on these gaps, or that none can be run."""
    sweep = None
    reason = refusal
    if not reason:
        summary = gaps.gap_summary(scope)
        sweep = _newest_open_sweep(summary)
        if sweep is None:
            reason = _nothing_to_run(summary)
    if request.htmx:
        context = {"reason": reason}
        if sweep is not None:
            context.update(_progress_context(sweep))
        return render(request, "matrix/gaps.html#nothing-to-run", context)
    if sweep is not None:
        messages.info(
            request,
            f"Nothing new to plan: these cells are already queued in sweep {sweep.pk}.",
        )
        return redirect("sweep", sweep.pk)
    messages.info(request, reason)
    query = urlencode(scope.filters.as_params())
    return redirect(f"{reverse('gaps')}?{query}")


def _nothing_to_run(summary: gaps.GapSummary) -> str:
    if not summary.total:
        return "Nothing to run: there are no gaps under these filters."
    return (
        f"Nothing to run: the {summary.total} gap{'s' if summary.total != 1 else ''} "
        "under these filters need a runner with their device type, as a "
        "compile-only run would add nothing to them."
    )


def _newest_open_sweep(summary: gaps.GapSummary) -> Sweep | None:
    """The newest sweep with a queued or running job for one of the gaps."""
    if not summary.newest_sweep:
        return None
    return Sweep.objects.filter(pk=summary.newest_sweep).first()


def _get_sweep_for_user(request, pk: int) -> Sweep:
    # Sweeps are coverage evidence, readable by everyone who can read the matrix.
    return get_object_or_404(Sweep, pk=pk)


# While nothing in a sweep changes, its ETA still follows the clock: the
# progress is read again at least this often.
PROGRESS_KEPT_S = 10


def _sweep_progress(sweep: Sweep) -> dict:
    """``Sweep.progress``, kept for every reader until a job of the sweep is
    claimed, a job is planned or a result stored, and at most
    PROGRESS_KEPT_S: counting a sweep's jobs reads every one of them (8 ms
    of PostgreSQL at 16,000), on the gaps page and on every poll of an open
    sweep's page. A job given another attempt after its runner went silent
    shows as queued again within those seconds."""
    durations = gaps.job_durations().per_stage()
    if not cache_seconds():
        return sweep.progress(stage_seconds=durations)
    key = read_key(
        "sweep-progress",
        sweep.pk,
        sweep.total,
        jobs_version(sweep.pk),
        sorted(durations.items()),
        int(time.time() // PROGRESS_KEPT_S),
    )
    return cached_read(
        key, lambda: sweep.progress(stage_seconds=durations), PROGRESS_KEPT_S
    )


def _progress_context(sweep: Sweep) -> dict:
    # The filters the sweep was planned under carry over to its links back
    # to the matrix and the gaps; other keys (an offline bundle's runner)
    # are not filters. In the pages' own order: PostgreSQL's jsonb returns
    # keys sorted, SQLite as written.
    links = [(k, sweep.filters[k]) for k in queries.FILTER_PARAMS if k in sweep.filters]
    progress = _sweep_progress(sweep)
    progress["eta"] = gaps.duration_text(progress["eta_s"])
    return {"sweep": sweep, "p": progress, "links_query": urlencode(links)}


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
