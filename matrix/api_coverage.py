"""GET /api/v1/matrix and GET /api/v1/gaps: the coverage the matrix and gaps
pages show, as JSON for scripts, e.g. a CI step that refuses to ship while a
served cell of its device type has a gap.

Read as the pages are: by a signed-in user with a role, or by anyone where
anonymous reading is on. Filters are those of the pages, but checked: an
unknown dtype, backend or status is a 400 naming the allowed ones, an unknown
operator or toolchain a 404 (the operator's naming the known ones): never
silently dropped."""

from __future__ import annotations

import json
from base64 import urlsafe_b64decode, urlsafe_b64encode
from datetime import datetime

from django.conf import settings
from django.db.models import Count, Exists, OuterRef, Q, Subquery
from django.urls import reverse
from django.utils.http import urlencode
from ninja import Field, Query, Router, Schema
from ninja.errors import HttpError

from matrix import queries
from matrix.api_errors import Problem
from matrix.cache import data_version, json_answer, read_key
from matrix.models import Backend, Cell, Dtype, KernelRevision, Operator, Shape
from runners.roles import has_role


def coverage_reader(request):
    """The pages' read rule, for the API (where RoleMiddleware lets all in)."""
    if getattr(settings, "TILEMATRIX_ANONYMOUS_READ", False):
        return True
    if has_role(request.user):
        return request.user
    if request.user.is_authenticated:
        raise HttpError(403, "your account has no role; ask an admin for one")
    return None  # 401: sign in


router = Router(tags=["coverage"], auth=coverage_reader)


class CoverageFilters(Schema):
    toolchain: str | None = Field(
        None,
        description="name or fingerprint; default: the current one, as on the pages",
    )
    operator: str | None = None
    dtype: str | None = Field(None, description=", ".join(Dtype.values))
    backend: str | None = Field(None, description=", ".join(Backend.values))
    status: str | None = Field(None, description=", ".join(queries.STATE_FILTERS))
    served: bool = Field(False, description="served shapes only (the matrix)")
    limit: int = Field(500, ge=1, le=5000)
    offset: int = Field(0, ge=0)


class ToolchainOut(Schema):
    name: str
    fingerprint: str
    current: bool


class CellOut(Schema):
    operator: str
    dims: dict[str, int]
    dtype: str
    served: bool
    weight: float
    device_type: str
    backend: str
    arch: str
    status: str = Field(description="a status of the ladder, or empty: never run")
    stale: bool = Field(description="its kernel revision or toolchain is superseded")
    revision: str | None = Field(description="sha256 of the kernel revision it ran")
    kernel_ms: float | None
    reference_ms: float | None
    error_signature: str
    updated_at: datetime | None
    url: str


class GapOut(Schema):
    operator: str
    dims: dict[str, int]
    dtype: str
    weight: float
    device_type: str
    backend: str
    status: str
    reasons: list[str]
    score: float
    runnable: bool = Field(
        description="a fresh run would help and a runner would take it now"
    )
    url: str


class GapsOut(Schema):
    toolchain: ToolchainOut
    count: int
    runnable: int
    reasons: dict[str, int]
    gaps: list[GapOut]


def _checked(params: CoverageFilters) -> queries.MatrixFilters:
    """The pages' filters, after refusing what the pages would quietly drop."""
    toolchains = queries.toolchain_list()
    chosen = ""
    if params.toolchain:
        found = [t for t in toolchains if params.toolchain in (t.name, t.fingerprint)]
        if not found:
            raise HttpError(
                404, f"no toolchain named or fingerprinted {params.toolchain!r}"
            )
        chosen = found[0].name
    for name, allowed in (
        ("dtype", Dtype.values),
        ("backend", Backend.values),
        ("status", queries.STATE_FILTERS),
    ):
        value = getattr(params, name)
        if value and value not in allowed:
            raise HttpError(400, f"{name} must be one of {', '.join(allowed)}")
    if params.operator:
        known = list(Operator.objects.order_by("name").values_list("name", flat=True))
        if params.operator not in known:
            raise HttpError(
                404,
                f"no operator named {params.operator!r}; known: {', '.join(known)}",
            )
    filters = queries.MatrixFilters.from_params(
        {
            "toolchain": chosen,
            "dtype": params.dtype or "",
            "backend": params.backend or "",
            "status": params.status or "",
            "served": "1" if params.served else "",
        },
        toolchains,
    )
    if filters.toolchain is None:
        raise HttpError(404, "no toolchain has reported yet")
    return filters


def _toolchain(filters: queries.MatrixFilters) -> dict:
    tc = filters.toolchain
    return {"name": tc.name, "fingerprint": tc.fingerprint, "current": tc.is_current}


def _cell_url(shape, device_type, filters) -> str:
    url = reverse("cell", args=[shape.pk, device_type.pk])
    return f"{url}?{urlencode({'toolchain': filters.toolchain.name})}"


def _shape_fields(shape: Shape, device_type, filters) -> dict:
    return {
        "operator": shape.operator.name,
        "dims": shape.dims,
        "dtype": shape.dtype,
        "weight": shape.weight,
        "device_type": str(device_type),
        "backend": device_type.backend,
        "url": _cell_url(shape, device_type, filters),
    }


# Not signed in (401), no role (403), a filter value not allowed (400), an
# unknown toolchain or operator, or no toolchain yet (404).
REFUSED = {code: Problem for code in (400, 401, 403, 404)}


class MatrixParams(CoverageFilters):
    cursor: str | None = Field(
        None,
        description="the `next` of the previous page: the page that follows it, "
        "however the cells changed in between",
    )


class MatrixOut(Schema):
    toolchain: ToolchainOut
    count: int
    next: str | None = Field(
        None, description="pass as `cursor` for the next page; null on the last"
    )
    cells: list[CellOut]


# The matrix's order: operators by name, served shapes first by weight.
SHAPE_ORDER = ("operator__name", "-served", "-weight", "dims_key", "dtype", "id")
CURSOR_TYPES = (str, bool, (int, float), str, str, int, int)


def _cursor_make(shape: Shape, device_type_id: int) -> str:
    key = [shape.operator.name, shape.served, shape.weight, shape.dims_key]
    key += [shape.dtype, shape.pk, device_type_id]
    return urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


def _cursor_read(text: str | None) -> list | None:
    if not text:
        return None
    try:
        key = json.loads(urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except ValueError:
        key = None
    if not (
        isinstance(key, list)
        and len(key) == len(CURSOR_TYPES)
        and all(
            isinstance(v, t) and not (t is int and isinstance(v, bool))
            for v, t in zip(key, CURSOR_TYPES, strict=True)
        )
    ):
        raise HttpError(400, "cursor is not one this API gave out; start without it")
    return key


def _from_cursor(key: list) -> Q:
    """Shapes at the cursor's shape (while its place in the order holds) or
    after it, in SHAPE_ORDER."""
    fields = [
        ("operator__name", "gt"),
        ("served", "lt"),
        ("weight", "lt"),
        ("dims_key", "gt"),
        ("dtype", "gt"),
        ("pk", "gt"),
    ]
    after, equal = Q(), {}
    for (field, beyond), value in zip(fields, key, strict=False):
        after |= Q(**equal, **{f"{field}__{beyond}": value})
        equal[field] = value
    return after | Q(**equal)


def _row_filter(filters: queries.MatrixFilters, dt_ids: list[int]) -> Q:
    """Shapes with at least one cell in the filtered state, so that every
    shape read gives the page at least one row."""
    cells = Cell.objects.filter(
        shape=OuterRef("pk"), toolchain=filters.toolchain, device_type_id__in=dt_ids
    )
    if filters.status == queries.EMPTY:
        return ~Q(pk__in=queries.complete_shapes(filters, dt_ids))
    if filters.status == queries.STALE:
        if filters.toolchain_stale:
            return Q(Exists(cells))
        return Q(Exists(cells.exclude(revision_id=OuterRef("current_revision"))))
    return Q(Exists(cells.filter(status=filters.status)))


def _matrix_count(filters, shapes, dt_ids: list[int], current: dict) -> int:
    total = shapes.count() * len(dt_ids)
    if not filters.status or not dt_ids:
        return total
    cells = Cell.objects.filter(
        toolchain=filters.toolchain,
        device_type_id__in=dt_ids,
        shape__in=shapes.order_by().values("pk"),
    )
    if filters.status == queries.EMPTY:
        return total - cells.count()
    if filters.status != queries.STALE:
        return cells.filter(status=filters.status).count()
    if filters.toolchain_stale:
        return cells.count()
    return sum(
        n
        for op, rev, n in cells.values_list("shape__operator_id", "revision_id")
        .annotate(n=Count("id"))
        .order_by()
        if rev != current.get(op)
    )


def _matrix_page(filters, params: MatrixParams, device_types) -> dict:
    """One page of the matrix's cells: only the shapes it needs are read
    (at most offset + limit + 2 of them), with their cells, in five
    queries whatever the size of the matrix."""
    dt_ids = [d.pk for d in device_types]
    shapes = Shape.objects.filter(filters.shape_q())
    if params.operator:
        shapes = shapes.filter(operator__name=params.operator)
    cursor = _cursor_read(params.cursor)
    page = shapes.select_related("operator").order_by(*SHAPE_ORDER)
    if cursor is not None:
        page = page.filter(_from_cursor(cursor))
    wanted = params.offset + params.limit + 1
    if filters.status:
        current_rev = KernelRevision.objects.filter(
            operator=OuterRef("operator"), is_current=True
        ).values("id")[:1]
        page = page.annotate(current_revision=Subquery(current_rev)).filter(
            _row_filter(filters, dt_ids)
        )
        page = list(page[: wanted + 1])
    else:
        page = list(page[: -(-wanted // max(1, len(dt_ids))) + 1])
    found = {
        (row[0], row[1]): row
        for row in Cell.objects.filter(
            toolchain=filters.toolchain,
            shape__in=[s.pk for s in page],
            device_type_id__in=dt_ids,
        ).values_list(
            "shape_id",
            "device_type_id",
            "revision_id",
            "status",
            "kernel_ms",
            "reference_ms",
            "error_signature",
            "updated_at",
        )
    }
    revisions = KernelRevision.objects.filter(
        Q(is_current=True) | Q(pk__in={row[2] for row in found.values()})
    ).values_list("pk", "operator_id", "is_current", "source_sha256")
    current = {op: pk for pk, op, is_current, _ in revisions if is_current}
    sha = {pk: digest for pk, _, _, digest in revisions}
    rows, skip = [], params.offset
    for shape in page:
        start = 0
        if cursor is not None and shape.pk == cursor[5] and cursor[6] in dt_ids:
            start = dt_ids.index(cursor[6]) + 1
        for dt in device_types[start:]:
            cell = found.get((shape.pk, dt.pk))
            status = cell[3] if cell else queries.EMPTY
            stale = cell is not None and (
                filters.toolchain_stale or cell[2] != current.get(shape.operator_id)
            )
            if not queries.matches(filters.status, status, stale):
                continue
            if skip:
                skip -= 1
                continue
            rows.append((shape, dt, cell, status, stale))
        if len(rows) > params.limit:
            break
    more = len(rows) > params.limit
    rows = rows[: params.limit]
    return {
        "toolchain": _toolchain(filters),
        "count": _matrix_count(filters, shapes, dt_ids, current),
        "next": _cursor_make(rows[-1][0], rows[-1][1].pk) if more else None,
        "cells": [
            {
                **_shape_fields(shape, dt, filters),
                "served": shape.served,
                "arch": dt.arch,
                "status": status,
                "stale": stale,
                "revision": sha.get(cell[2]) if cell else None,
                "kernel_ms": cell[4] if cell else None,
                "reference_ms": cell[5] if cell else None,
                "error_signature": cell[6] if cell else "",
                "updated_at": cell[7] if cell else None,
            }
            for shape, dt, cell, status, stale in rows
        ],
    }


@router.get(
    "/matrix",
    response={200: MatrixOut, 304: None, **REFUSED},
    url_name="coverage_matrix",
)
def coverage_matrix(request, params: Query[MatrixParams]):
    """Every (shape, device type) cell under the filters for one toolchain,
    never-run cells included, in the matrix's order (operators by name,
    served shapes first by weight, device types by backend priority), a page
    at a time: follow `next` (or use `offset`). Computed once per data
    version for every reader; send the `ETag` back in `If-None-Match` and
    an unchanged matrix answers 304 with no body."""
    filters = _checked(params)
    key = read_key(
        "api-matrix",
        sorted(filters.as_params().items()),
        params.operator,
        params.limit,
        params.offset,
        params.cursor,
        data_version(),
    )
    return json_answer(
        request,
        key,
        lambda: _matrix_page(filters, params, queries.device_type_list(filters)),
        MatrixOut,
    )


@router.get("/gaps", response={200: GapsOut, **REFUSED}, url_name="coverage_gaps")
def coverage_gaps(request, params: Query[CoverageFilters]):
    """The served gaps of one toolchain, ranked as the gaps page ranks them:
    no result, a stale or failing one, or no online runner with the device
    type and toolchain. An empty list: every served cell passes, current."""
    filters = _checked(params)
    gaps = queries.served_gaps(filters)
    if params.operator:
        gaps = [g for g in gaps if g.shape.operator.name == params.operator]
    page = gaps[params.offset : params.offset + params.limit]
    return {
        "toolchain": _toolchain(filters),
        "count": len(gaps),
        "runnable": sum(g.runnable for g in gaps),
        "reasons": queries.reason_counts(gaps),
        "gaps": [
            {
                **_shape_fields(g.shape, g.device_type, filters),
                "status": g.status,
                "reasons": g.reasons,
                "score": g.score,
                "runnable": g.runnable,
            }
            for g in page
        ],
    }
