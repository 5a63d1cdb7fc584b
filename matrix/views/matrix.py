"""The coverage matrix, the home page.

Operators arrive collapsed, one summary row each; a row expands in place to
its shape × dtype rows through htmx (or ``?open=NAME`` without JavaScript), so
the page stays light at thousands of shapes: only one operator's cells are
rendered at a time, at most ``ROWS`` of them until asked for more.

The collapsed page, a page with an operator open and an operator's rows as
htmx fetches them are each the same for every visitor of the same filters
until a result arrives or the catalogue changes, so each is rendered once per
version and kept in the cache (one for every web process where
TILEMATRIX_CACHE_URL names it). A view then costs one query (the newest
result id): results show at once, catalogue edits (a new toolchain, device
type or shape import) within ``CATALOGUE_SECONDS``.
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass, field

from django.core.cache import cache
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.http import urlencode
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from matrix import queries, read_versions, revisions
from matrix.cache import cache_seconds, cached_read, read_key
from matrix.exports import spreadsheet_safe, unknown_toolchain
from matrix.links import cell_link_prefix
from matrix.models import Backend, DeviceType, Dtype, Operator, Toolchain
from matrix.page_cache import page_response
from matrix.serving import serve_speedup_floor
from matrix.views.matrix_html import (
    backend_headers,
    column_counts,
    device_headers,
    shape_rows,
    summary_cells,
)

ROWS = 100
MAX_ROWS = 2000
CATALOGUE_SECONDS = 5


@dataclass
class Catalogue:
    """What the matrix is drawn over: toolchains, device types, revisions and
    operators with their shape counts under the dtype / served filters."""

    toolchains: list[Toolchain]
    device_types: list[DeviceType]
    current: revisions.CurrentMap
    operators: list[Operator]
    operators_of: dict[int, int] = field(default_factory=dict)
    digest: str = ""

    def __post_init__(self) -> None:
        # Computed once, when read from the database, not on every view.
        parts = (
            [
                (t.pk, t.name, t.is_current, t.tilelang_version, t.rolled_out_baseline)
                for t in self.toolchains
            ],
            [(d.pk, str(d)) for d in self.device_types],
            sorted(self.current.items()),
            [(o.pk, o.name, o.shape_count) for o in self.operators],
            sorted(self.operators_of.items()),
        )
        self.digest = hashlib.sha256(repr(parts).encode()).hexdigest()


# Catalogues this process has read, by cache key and digest. The cache holds
# only the digest, so it still decides when a catalogue expires (and a test's
# cache.clear() empties it), while a view skips unpickling some hundred model
# instances on every request.
_catalogues: dict[tuple[str, str], Catalogue] = {}
CATALOGUES_KEPT = 32


def catalogue_read(params) -> Catalogue:
    seconds = CATALOGUE_SECONDS if cache_seconds() else 0
    # The filters that change which shapes each operator counts.
    shape_filters = repr(
        [params.get(name, "") for name in ("dtype", "served", "model", "operator", "q")]
    )
    key = "matrix-catalogue:" + hashlib.sha256(shape_filters.encode()).hexdigest()
    digest = cache.get(key) if seconds else None
    found = _catalogues.get((key, digest)) if digest else None
    if found is None:
        toolchains = queries.toolchain_list()
        filters = queries.MatrixFilters.from_params(params, toolchains)
        operators = queries.operator_list(filters)
        operators_of, current = queries.revisions_read()
        found = Catalogue(
            toolchains, list(DeviceType.objects.all()), current, operators, operators_of
        )
        if seconds:
            if len(_catalogues) >= CATALOGUES_KEPT:
                _catalogues.clear()
            _catalogues[key, found.digest] = found
            cache.set(key, found.digest, seconds)
    return found


@require_GET
@vary_on_headers("HX-Request")
def matrix_page(request):
    catalogue = catalogue_read(request.GET)
    filters = queries.MatrixFilters.from_params(request.GET, catalogue.toolchains)
    target = (request.htmx.target or "") if request.htmx else ""
    open_names = list(dict.fromkeys(request.GET.getlist("open")))
    limit = _row_limit(request.GET.get("rows"))
    # What the page shows is the same for every reader of these filters until
    # a result or the catalogue changes: rendered once per data version. A
    # page naming an unknown filter value says so and is not kept, nor is an
    # unknown operator opened, nor free search text kept, so made-up values
    # cannot fill the cache.
    names = {op.name for op in catalogue.operators}
    unknown_open = any(name not in names for name in open_names)
    cacheable = (
        bool(cache_seconds())
        and not filters.unknown
        and not filters.text
        and not unknown_open
    )
    parts = (
        sorted(filters.as_params().items()),
        catalogue.digest,
        tuple(open_names),
        limit,
    )

    if target.startswith("op-"):
        # One operator's tbody: expanded when `open` names it, else collapsed.
        name = target[3:]

        def body() -> str:
            opened = [name] if name in open_names else []
            context = matrix_context(filters, catalogue, opened, limit)
            row = next(
                (r for r in context["summary"].rows if r.operator.name == name), None
            )
            if row is None:
                return ""
            context["row"] = row
            return render_to_string(
                "matrix/matrix.html#operator-body", context, request
            )

        html = ""
        if name in names:
            html = (
                _rendered((*parts, name), body, _version(filters, catalogue))
                if cacheable
                else body()
            )
        if not html:
            raise Http404("no such operator under these filters")
        return HttpResponse(html)

    if not cacheable:
        context = matrix_context(filters, catalogue, open_names, limit)
        template = "matrix/matrix.html"
        if target == "matrix":
            template += "#matrix-table"
        return render(request, template, context)
    partial = "#matrix-table" if target == "matrix" else "#page-content"
    key = read_key(
        "matrix-page", (*parts, partial), version=_version(filters, catalogue)
    )

    def content() -> str:
        return cached_read(
            key,
            lambda: render_to_string(
                "matrix/matrix.html" + partial,
                matrix_context(filters, catalogue, open_names, limit),
                request,
            ),
            cache_seconds(),
        )

    if target == "matrix":
        return HttpResponse(content())
    return page_response(
        request,
        key,
        lambda frame: render_to_string(
            "matrix/matrix.html", {"content_html": content(), **frame}, request
        ),
    )


def _version(filters, catalogue: Catalogue):
    """What the page shows of the results: its toolchain's (or its device
    type's, or operator's) results, the newest in any case where the cache
    is one per process (``read_versions``)."""
    if filters.toolchain is None:
        return read_versions.scope_version()
    scope = {}
    if filters.device_type is not None:
        scope["device_type"] = filters.device_type.pk
    elif filters.operator:
        named = [op.pk for op in catalogue.operators if op.name == filters.operator]
        scope["operator"] = named[0] if named else None
    return read_versions.scope_version(filters.toolchain.pk, **scope)


def _rendered(parts: tuple, render_content, version) -> str:
    """``render_content()``, kept per data version (``parts`` name the rest of
    what it depends on) for every reader."""
    key = read_key("matrix-page", parts, version)
    return cached_read(key, render_content, cache_seconds())


def kept_cell_groups(filters, device_types, catalogue: Catalogue) -> list:
    """``queries.cell_groups``, kept per device type column under the newest
    result of that column: a result changes its own column's cells alone,
    so the first view after it counts one column again, not the matrix
    (31,417 cells at 1M results, 7 ms of a 20 ms view)."""
    if filters.toolchain is None or not device_types:
        return []
    newest = queries.column_versions(filters.toolchain.pk)
    # The shape filters, the toolchain and the catalogue (which shapes the
    # filters name) decide a column's counts; its newest result, when.
    parts = (catalogue.digest, filters.toolchain.pk, *_shape_filters(filters))
    keys = {
        d.id: read_key("cell-groups", *parts, d.id, version=newest.get(d.id))
        for d in device_types
    }
    found = cache.get_many(list(keys.values())) if keys else {}
    rows = [row for key in keys.values() for row in found.get(key, ())]
    missing = [column for column, key in keys.items() if key not in found]
    if missing:
        counted = {column: [] for column in missing}
        for row in queries.cell_group_rows(filters, missing):
            counted[row[0]].append(row)
        cache.set_many(
            {keys[column]: counted[column] for column in missing}, cache_seconds()
        )
        rows += [row for column in missing for row in counted[column]]
    return queries.with_operators(rows, catalogue.operators_of)


def _shape_filters(filters) -> tuple:
    """The filters choosing which shapes count (free text is never kept)."""
    return (filters.dtype, filters.served_only, filters.model, filters.operator)


def _row_limit(raw: str | None) -> int:
    try:
        return max(1, min(int(raw), MAX_ROWS))
    except (TypeError, ValueError):
        return ROWS


def matrix_context(
    filters, catalogue: Catalogue, open_names: list[str], limit: int, groups=None
) -> dict:
    """``open_names``: the operators shown expanded, in the URL's order.
    ``groups`` replaces the cell groups read from Cell (for the benchmark's
    baseline)."""
    device_types = queries.device_type_list(filters, catalogue.device_types)
    current = catalogue.current
    if groups is None:
        groups = (
            kept_cell_groups(filters, device_types, catalogue)
            if cache_seconds() and not filters.text and not filters.unknown
            else queries.cell_groups(filters, device_types, catalogue.operators_of)
        )
    summary = queries.matrix_summary(
        filters, device_types, current, catalogue.operators, groups
    )
    params = list(filters.as_params().items())
    query = urlencode(params)
    prefix = cell_link_prefix()
    shown = {row.operator.name for row in summary.rows}
    known = {op.name for op in catalogue.operators}
    notes_for = open_names
    # Links carry on only the names that can open (the notice names the rest).
    open_names = [name for name in open_names if name in known]
    for row in summary.rows:
        row.cells_html = summary_cells(row.cells)
        name = row.operator.name
        opened = name in open_names
        # The toggle keeps every other open operator open.
        toggled = (
            [n for n in open_names if n != name] if opened else [*open_names, name]
        )
        row.toggle_query = urlencode([*params, *(("open", n) for n in toggled)])
        if opened:
            rows, left = queries.operator_rows(
                row.operator, filters, device_types, current, limit
            )
            row.expanded = {
                "rows": rows,
                "rows_html": shape_rows(rows, prefix, query),
                "left": left,
                # Each "show more" doubles the rows shown, up to MAX_ROWS.
                "next": min(left, limit, MAX_ROWS - limit),
                "more_query": urlencode([*params, *(("open", n) for n in open_names)]),
            }
    open_notes = [
        f"No operator “{name}” to open: "
        + (
            "none has that name."
            if name not in known
            else "it has no rows under these filters."
        )
        for name in notes_for
        if name not in shown
    ]
    return {
        "filters": filters,
        "toolchains": catalogue.toolchains,
        "dtypes": Dtype.values,
        "backends": Backend.choices,
        "states": queries.STATE_FILTERS,
        "labels": queries.STATE_LABELS,
        "summary": summary,
        "backend_headers": backend_headers(
            queries.backend_groups(summary.device_types)
        ),
        "device_headers": device_headers(summary.device_types),
        "column_counts": column_counts(summary.columns),
        "open_names": [n for n in open_names if n in shown],
        "open_notes": open_notes,
        "limit": limit,
        "query": query,
        "speedup_floor": serve_speedup_floor(),
        "speedup_ceiling": 1 / serve_speedup_floor(),
    }


MATRIX_CSV_FIELDS = [
    "operator",
    "dims",
    "dtype",
    "served",
    "weight",
    "device_type",
    "backend",
    "status",
    "stale",
    "speedup",
    "serves",
    "kernel_ms",
    "reference_ms",
    "produced_at",
    "url",
]


@require_GET
def matrix_csv(request):
    """Every cell under the page's filters, never-run ones included, as the
    API's /matrix lists them."""
    from matrix.api_coverage import coverage_cells

    toolchains = queries.toolchain_list()
    filters = queries.MatrixFilters.from_params(request.GET, toolchains)
    refused = unknown_toolchain(request.GET, filters, toolchains)
    if refused:
        return refused
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="matrix.csv"'
    writer = csv.writer(response)
    writer.writerow(MATRIX_CSV_FIELDS)
    if filters.toolchain is None:
        return response
    for row in coverage_cells(filters):
        writer.writerow(
            [
                spreadsheet_safe(row["operator"]),
                spreadsheet_safe(row["dims_key"]),
                row["dtype"],
                int(row["served"]),
                f"{row['weight']:g}",
                spreadsheet_safe(row["device_type"]),
                spreadsheet_safe(row["backend"]),
                row["status"],
                int(row["stale"]),
                "" if row["speedup"] is None else f"{row['speedup']:.4g}",
                spreadsheet_safe(row["serves"]),
                "" if row["kernel_ms"] is None else f"{row['kernel_ms']:.6g}",
                "" if row["reference_ms"] is None else f"{row['reference_ms']:.6g}",
                row["produced_at"].isoformat() if row["produced_at"] else "",
                request.build_absolute_uri(row["url"]),
            ]
        )
    return response
