"""The coverage matrix, the home page.

Operators arrive collapsed, one summary row each; a row expands in place to
its shape × dtype rows through htmx (or ``?open=NAME`` without JavaScript), so
the page stays light at thousands of shapes: only one operator's cells are
rendered at a time, at most ``ROWS`` of them until asked for more.

The collapsed table is the same for every visitor until a cell or the
catalogue changes, so it is rendered once per version and kept in the cache:
a page view then costs five small queries and no aggregation.
"""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.core.cache import cache
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.http import urlencode
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from matrix import queries
from matrix.models import Backend, Dtype
from matrix.views.matrix_html import cell_link_prefix, shape_cells, summary_cells

ROWS = 100
MAX_ROWS = 2000


def cache_seconds() -> int:
    return int(getattr(settings, "TILEMATRIX_MATRIX_CACHE_S", 300))


@require_GET
@vary_on_headers("HX-Request")
def matrix_page(request):
    toolchains = queries.toolchain_list()
    filters = queries.MatrixFilters.from_params(request.GET, toolchains)
    device_types = queries.device_type_list(filters)
    revisions = queries.current_revisions()
    operators = queries.operator_list(filters)
    target = (request.htmx.target or "") if request.htmx else ""
    open_name = request.GET.get("open", "")
    limit = _row_limit(request.GET.get("rows"))

    if target.startswith("op-"):
        # One operator's tbody: expanded when `open` names it, else collapsed.
        name = target[3:]
        summary = queries.matrix_summary(filters, device_types, revisions, operators)
        row = next((r for r in summary.rows if r.operator.name == name), None)
        if row is None:
            raise Http404("no such operator under these filters")
        opened = open_name if open_name == name else ""
        context = matrix_context(filters, toolchains, summary, revisions, opened, limit)
        context["row"] = row
        return render(request, "matrix/matrix.html#operator-body", context)

    if open_name or not cache_seconds():
        summary = queries.matrix_summary(filters, device_types, revisions, operators)
        context = matrix_context(
            filters, toolchains, summary, revisions, open_name, limit
        )
        template = "matrix/matrix.html"
        if target == "matrix":
            template += "#matrix-table"
        return render(request, template, context)

    key = _table_key(filters, device_types, revisions, operators)
    table = cache.get(key)
    if table is None:
        summary = queries.matrix_summary(filters, device_types, revisions, operators)
        context = matrix_context(filters, toolchains, summary, revisions, "", limit)
        table = render_to_string("matrix/matrix.html#matrix-table", context, request)
        cache.set(key, table, cache_seconds())
    if target == "matrix":
        return HttpResponse(table)
    context = page_context(filters, toolchains)
    context["table_html"] = table
    return render(request, "matrix/matrix.html", context)


def _table_key(filters, device_types, revisions, operators) -> str:
    """Everything the collapsed table shows depends on, in one digest."""
    parts = (
        sorted(filters.as_params().items()),
        filters.toolchain.is_current if filters.toolchain else None,
        [(d.pk, str(d)) for d in device_types],
        sorted(revisions.operator_of.items()),
        sorted(revisions.items()),
        [(o.pk, o.name, o.shape_count) for o in operators],
        queries.cells_version(),
    )
    return "matrix-table:" + hashlib.sha256(repr(parts).encode()).hexdigest()


def _row_limit(raw: str | None) -> int:
    try:
        return max(1, min(int(raw), MAX_ROWS))
    except (TypeError, ValueError):
        return ROWS


def page_context(filters, toolchains) -> dict:
    return {
        "filters": filters,
        "toolchains": toolchains,
        "dtypes": Dtype.values,
        "backends": Backend.choices,
        "states": queries.STATE_FILTERS,
        "labels": queries.STATE_LABELS,
    }


def matrix_context(filters, toolchains, summary, revisions, open_name, limit):
    expanded = {}
    query = urlencode(filters.as_params())
    for row in summary.rows:
        row.cells_html = summary_cells(row.cells)
        if row.operator.name == open_name:
            rows, more = queries.operator_rows(
                row.operator, filters, summary.device_types, revisions, limit
            )
            prefix = cell_link_prefix()
            for r in rows:
                r.cells_html = shape_cells(r.shape.id, r.cells, prefix, query)
            expanded = {"name": open_name, "rows": rows, "more": more}
    return {
        **page_context(filters, toolchains),
        "summary": summary,
        "groups": queries.backend_groups(summary.device_types),
        "expanded": expanded,
        "limit": limit,
        "more_limit": min(limit * 2, MAX_ROWS),
        "query": query,
    }
