"""The coverage matrix, the home page.

Operators arrive collapsed, one summary row each; a row expands in place to
its shape × dtype rows through htmx (or ``?open=NAME`` without JavaScript), so
the page stays light at thousands of shapes: only one operator's cells are
rendered at a time, at most ``ROWS`` of them until asked for more.
"""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import render
from django.utils.http import urlencode
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from matrix import queries
from matrix.models import Backend, Dtype
from matrix.views.matrix_html import cell_link_prefix, shape_cells, summary_cells

ROWS = 100
MAX_ROWS = 2000


@require_GET
@vary_on_headers("HX-Request")
def matrix_page(request):
    toolchains = queries.toolchain_list()
    filters = queries.MatrixFilters.from_params(request.GET, toolchains)
    device_types = queries.device_type_list(filters)
    revisions = queries.current_revisions()
    summary = queries.matrix_summary(filters, device_types, revisions)
    target = (request.htmx.target or "") if request.htmx else ""
    open_name = request.GET.get("open", "")
    limit = _row_limit(request.GET.get("rows"))
    if target.startswith("op-"):
        # One operator's tbody: expanded when `open` names it, else collapsed.
        name = target[3:]
        row = next((r for r in summary.rows if r.operator.name == name), None)
        if row is None:
            raise Http404("no such operator under these filters")
        context = matrix_context(
            filters,
            toolchains,
            summary,
            revisions,
            open_name if open_name == name else "",
            limit,
        )
        context["row"] = row
        return render(request, "matrix/matrix.html#operator-body", context)
    context = matrix_context(filters, toolchains, summary, revisions, open_name, limit)
    template = "matrix/matrix.html"
    if target == "matrix":
        template += "#matrix-table"
    return render(request, template, context)


def _row_limit(raw: str | None) -> int:
    try:
        return max(1, min(int(raw), MAX_ROWS))
    except (TypeError, ValueError):
        return ROWS


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
        "filters": filters,
        "toolchains": toolchains,
        "summary": summary,
        "groups": queries.backend_groups(summary.device_types),
        "expanded": expanded,
        "limit": limit,
        "more_limit": min(limit * 2, MAX_ROWS),
        "query": query,
        "dtypes": Dtype.values,
        "backends": Backend.choices,
        "states": queries.STATE_FILTERS,
        "labels": queries.STATE_LABELS,
    }
