"""GET /api/v1/matrix, /api/v1/gaps and /api/v1/models: the coverage the
matrix, gaps and models pages show, as JSON for scripts, e.g. a CI step that
refuses to ship while a served cell of its device type has a gap, or while
less than 90% of a model's calls run validated TileLang.

Read as the pages are: by a signed-in user with a role, or by anyone where
anonymous reading is on. Filters are those of the pages, but checked: an
unknown dtype, backend or status is a 400 naming the allowed ones, an unknown
operator, model, device type or toolchain a 404 (the operator's and model's
naming the known ones): never silently dropped."""

from __future__ import annotations

import json
from base64 import urlsafe_b64decode, urlsafe_b64encode
from datetime import datetime
from functools import lru_cache

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, Subquery
from django.urls import reverse
from django.utils.http import urlencode
from ninja import Field, Query, Router, Schema
from ninja.errors import HttpError
from pydantic import BaseModel

from matrix import gaps, queries, read_versions, revisions
from matrix.accounts.roles import has_role
from matrix.api_errors import Problem
from matrix.cache import current_toolchain_in, data_version, json_answer, read_key
from matrix.fleet.models import Receipt
from matrix.fleet.services import capabilities_online
from matrix.links import cell_link_prefix
from matrix.models import (
    ID_MAX,
    Backend,
    Cell,
    DeviceType,
    Dtype,
    KernelRevision,
    Operator,
    Shape,
    Status,
)
from matrix.served_models import mark_passing_elsewhere, model_coverage
from matrix.serving import serve_speedup_floor, serving_verdict, speedup


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
    model: str | None = Field(
        None, description="a served model: a profile or trace name (see /models)"
    )
    device: int | None = Field(None, description="a device type id")
    q: str | None = Field(
        None, max_length=200, description="text within a shape's dims, e.g. M=1,"
    )
    dtype: str | None = Field(None, description=", ".join(Dtype.values))
    backend: str | None = Field(None, description=", ".join(Backend.values))
    status: str | None = Field(None, description=", ".join(queries.STATE_FILTERS))
    served: bool = Field(False, description="served shapes only (the matrix)")
    limit: int = Field(500, ge=1, le=5000)
    # A trillion rows is past any table; a larger offset is a typing error
    # (and past PostgreSQL's bigint, a server error).
    offset: int = Field(0, ge=0, le=10**12)


class Answer(BaseModel):
    """An answer the API builds as plain data and keeps: checked by pydantic
    alone. Ninja's ``Schema`` wraps every value of a dict for attribute
    lookups, which was half the time of a page of 500 gaps."""


class ToolchainOut(Answer):
    name: str
    fingerprint: str
    current: bool


class CellOut(Answer):
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
    speedup: float | None = Field(
        description="reference time / kernel time of a pass; above 1 is faster"
    )
    serves: str = Field(
        description="what production runs there: tilelang (passes, fast enough), "
        "reference (unsupported, failing, or passing but slower) or unvalidated"
    )
    error_signature: str
    updated_at: datetime | None = Field(
        description="when this server stored the result (an import's time)"
    )
    produced_at: datetime | None = Field(
        description="when the runner signed the result: when it was produced"
    )
    url: str


class GapsQuery(CoverageFilters):
    cursor: str | None = Field(
        None,
        description="the page after this cursor, as the `next` link of the page "
        "before gives it: stable while gaps open and close, unlike `offset`",
    )


class GapOut(Answer):
    operator: str
    dims: dict[str, int]
    dtype: str
    weight: float
    device_type: str
    backend: str
    status: str = Field(description="a status of the ladder, or empty: never run")
    kind: str = Field(description=", ".join(gaps.KINDS))
    reasons: list[str] = Field(
        description=f"its kind, then {gaps.NO_RUNNER!r} where no online runner "
        "with the device hosts the toolchain"
    )
    score: float
    runnable: bool = Field(
        description="Run missing plans a job for it now: no job is on its way, "
        "a runner would take it, and the run would add evidence"
    )
    stage: str | None = Field(
        description="the stage of that job (validate, build, lower); null: none"
    )
    queued: bool = Field(description="a job for it is queued or running already")
    url: str


class GapsOut(Answer):
    toolchain: ToolchainOut
    count: int = Field(description="gaps under the filters, on every page")
    runnable: int = Field(description="of them, those Run missing plans a job for")
    reasons: dict[str, int] = Field(
        description="gaps per reason: the kinds (missing, stale, failing, not "
        "validated) add up to count; 'no runner' overlaps them"
    )
    next: str | None = Field(
        description="URL of the next page (a stable cursor); null on the last"
    )
    gaps: list[GapOut]


def _checked(params: CoverageFilters, current_id: int | None) -> queries.MatrixFilters:
    """The pages' filters, after refusing what the pages would quietly drop.
    ``current_id``: the current toolchain as the answer's version query read
    it (the toolchains come from the lists kept a few seconds; building
    their query took about 40% of a kept answer's time)."""
    toolchains = queries.toolchains_as_of(current_id)
    chosen = ""
    if params.toolchain:
        found = queries.find_toolchain(toolchains, params.toolchain)
        if found is None:
            raise HttpError(
                404, f"no toolchain named or fingerprinted {params.toolchain!r}"
            )
        chosen = found.name
        if found not in toolchains:  # newer than the kept lists
            toolchains = [*toolchains, found]
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
    if params.model and not queries.model_exists(params.model):
        known = queries.model_names()
        raise HttpError(
            404,
            f"no served model named {params.model!r}; known: "
            + (", ".join(known) or "none imported yet"),
        )
    if params.device is not None and not (
        0 < params.device <= ID_MAX
        and DeviceType.objects.filter(pk=params.device).exists()
    ):
        raise HttpError(404, f"no device type with id {params.device}")
    filters = queries.MatrixFilters.from_params(
        {
            "toolchain": chosen,
            "dtype": params.dtype or "",
            "backend": params.backend or "",
            "status": params.status or "",
            "served": "1" if params.served else "",
            "model": params.model or "",
            "device": str(params.device) if params.device is not None else "",
            "operator": params.operator or "",
            "q": params.q or "",
        },
        toolchains,
    )
    if filters.toolchain is None:
        raise HttpError(404, "no toolchain has reported yet")
    return filters


def _toolchain(filters: queries.MatrixFilters) -> dict:
    tc = filters.toolchain
    return {"name": tc.name, "fingerprint": tc.fingerprint, "current": tc.is_current}


@lru_cache(maxsize=64)
def _toolchain_query(name: str) -> str:
    # Once per toolchain, not once per cell of a page (500 by default).
    return urlencode({"toolchain": name})


def _cell_url(shape_id: int, device_type_id: int, filters) -> str:
    query = _toolchain_query(filters.toolchain.name)
    return f"{cell_link_prefix()}{shape_id}/{device_type_id}/?{query}"


def _shape_fields(shape: Shape, device_type, filters) -> dict:
    return {
        "operator": shape.operator.name,
        "dims": shape.dims,
        "dtype": shape.dtype,
        "weight": shape.weight,
        "device_type": str(device_type),
        "backend": device_type.backend,
        "url": _cell_url(shape.pk, device_type.pk, filters),
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


class MatrixOut(Answer):
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
        return Q(Exists(cells.exclude(revisions.is_current_cell())))
    return Q(Exists(cells.filter(status=filters.status)))


def _matrix_count(filters, shapes, dt_ids: list[int]) -> int:
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
    return cells.exclude(revisions.is_current_cell()).count()


CELL_COLUMNS = (
    "shape_id",
    "device_type_id",
    "revision_id",
    "status",
    "kernel_ms",
    "reference_ms",
    "error_signature",
    "updated_at",
    "issued_at",
)


def _cells_found(filters, shape_ids, dt_ids) -> dict:
    """(shape id, device type id) -> the cell's columns (CELL_COLUMNS)."""
    return {
        (row[0], row[1]): row
        for row in Cell.objects.filter(
            toolchain=filters.toolchain,
            shape__in=shape_ids,
            device_type_id__in=dt_ids,
        )
        # The receipt by the cell's result id, not through the result: one
        # index lookup a cell instead of two (a page of 430 cells at 1M
        # results: 1.5 ms against 2.5).
        .annotate(
            issued_at=Subquery(
                Receipt.objects.filter(result_id=OuterRef("result_id")).values(
                    "issued_at"
                )
            )
        )
        .values_list(*CELL_COLUMNS)
    }


def _revisions(found: dict) -> tuple[revisions.CurrentMap, dict]:
    """((operator id, backend) -> its current revision id, revision id ->
    sha256) for the revisions the cells were run on."""
    # One query: a current revision comes once per backend it is current on.
    rows = KernelRevision.objects.filter(
        Q(pk__in={row[2] for row in found.values()}) | Q(is_current=True)
    ).values_list(
        "pk", "source_sha256", "current_on__operator_id", "current_on__backend"
    )
    current = {(op, backend): pk for pk, _, op, backend in rows if backend}
    return current, {pk: digest for pk, digest, _, _ in rows}


def _cell_row(shape, dt, cell, status, stale, sha, filters, floor) -> dict:
    value = (
        speedup(cell[4], cell[5])
        if cell is not None and status == Status.PASS
        else None
    )
    return {
        **_shape_fields(shape, dt, filters),
        "served": shape.served,
        "arch": dt.arch,
        "status": status,
        "stale": stale,
        "revision": sha.get(cell[2]) if cell else None,
        "kernel_ms": cell[4] if cell else None,
        "reference_ms": cell[5] if cell else None,
        "speedup": value,
        "serves": serving_verdict(status, stale, value, floor).outcome,
        "error_signature": cell[6] if cell else "",
        "updated_at": cell[7] if cell else None,
        "produced_at": queries.issued_time(cell[8], cell[7]) if cell else None,
        "dims_key": shape.dims_key,
    }


def _stale(filters, cell, shape, dt, current: revisions.CurrentMap) -> bool:
    return cell is not None and (
        filters.toolchain_stale
        or cell[2] != current.get((shape.operator_id, dt.backend))
    )


def coverage_cells(filters: queries.MatrixFilters) -> list[dict]:
    """Every (shape, device type) cell under the filters on their toolchain,
    never-run cells included, in the matrix's order (operators by name,
    served shapes first by weight, device types by backend priority): what
    the matrix's CSV export writes (the API pages through the same rows)."""
    shapes = list(
        Shape.objects.filter(filters.shape_q())
        .select_related("operator")
        .order_by(*SHAPE_ORDER)
    )
    device_types = queries.device_type_list(filters)
    found = _cells_found(filters, [s.pk for s in shapes], [d.pk for d in device_types])
    current, sha = _revisions(found)
    floor = serve_speedup_floor()
    rows = []
    for shape in shapes:
        for dt in device_types:
            cell = found.get((shape.pk, dt.pk))
            status = cell[3] if cell else queries.EMPTY
            stale = _stale(filters, cell, shape, dt, current)
            if queries.matches(filters.status, status, stale):
                rows.append(
                    _cell_row(shape, dt, cell, status, stale, sha, filters, floor)
                )
    return rows


def _matrix_page(filters, params: MatrixParams, device_types) -> dict:
    """One page of the matrix's cells: only the shapes it needs are read
    (at most offset + limit + 2 of them), with their cells, in a fixed
    number of queries whatever the size of the matrix."""
    dt_ids = [d.pk for d in device_types]
    shapes = Shape.objects.filter(filters.shape_q())
    cursor = _cursor_read(params.cursor)
    page = shapes.select_related("operator").order_by(*SHAPE_ORDER)
    if cursor is not None:
        page = page.filter(_from_cursor(cursor))
    wanted = params.offset + params.limit + 1
    if filters.status:
        page = page.filter(_row_filter(filters, dt_ids))
        page = list(page[: wanted + 1])
    else:
        page = list(page[: -(-wanted // max(1, len(dt_ids))) + 1])
    found = _cells_found(filters, [s.pk for s in page], dt_ids)
    current, sha = _revisions(found)
    floor = serve_speedup_floor()
    rows, skip = [], params.offset
    for shape in page:
        start = 0
        if cursor is not None and shape.pk == cursor[5] and cursor[6] in dt_ids:
            start = dt_ids.index(cursor[6]) + 1
        for dt in device_types[start:]:
            cell = found.get((shape.pk, dt.pk))
            status = cell[3] if cell else queries.EMPTY
            stale = _stale(filters, cell, shape, dt, current)
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
        "count": _matrix_count(filters, shapes, dt_ids),
        "next": _cursor_make(rows[-1][0], rows[-1][1].pk) if more else None,
        "cells": [
            _cell_row(shape, dt, cell, status, stale, sha, filters, floor)
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
    version = data_version()
    filters = _checked(params, current_toolchain_in(version))
    version += read_versions.filters_version(filters)
    key = read_key(
        "api-matrix",
        sorted(filters.as_params().items()),
        params.operator,
        params.limit,
        params.offset,
        params.cursor,
        version=version,
    )
    return json_answer(
        request,
        key,
        lambda: _matrix_page(filters, params, queries.device_type_list(filters)),
        MatrixOut,
    )


@router.get(
    "/gaps", response={200: GapsOut, 304: None, **REFUSED}, url_name="coverage_gaps"
)
def coverage_gaps(request, params: Query[GapsQuery]):
    """The served gaps of one toolchain, ranked and counted as the gaps page
    ranks and counts them: cells with no result, a stale or failing one, or
    evidence only (lowered or built). A current pass is never a gap. An
    empty list: every served cell passes (or is unsupported), current.
    Follow ``next`` to the last page. Computed once per data version and
    set of online runners for every reader; send the `ETag` back in
    `If-None-Match` and an unchanged list answers 304 with no body."""
    version = gaps.gaps_version()
    filters = _checked(params, gaps.current_toolchain_in(version))
    after = None
    if params.cursor:
        if params.offset:
            raise HttpError(400, "give a cursor or an offset, not both")
        after = gaps.cursor_decode(params.cursor)
        if after is None:
            raise HttpError(
                400, "cursor is not one this API gave out: start from the first page"
            )
    capabilities = capabilities_online()
    key = read_key(
        "api-gaps",
        sorted(filters.as_params().items()),
        params.limit,
        params.offset,
        params.cursor,
        # The next link is absolute; the runners online decide "no runner"
        # and what is runnable.
        request.build_absolute_uri("/"),
        *(sorted(part) for part in vars(capabilities).values()),
        version=version,
    )
    return json_answer(
        request,
        key,
        lambda: _gaps_page(request, filters, params, after, capabilities, version),
        GapsOut,
    )


def _gaps_page(request, filters, params, after, capabilities, version) -> dict:
    scope = gaps.GapScope(
        filters,
        capabilities,
        {d.pk: d for d in DeviceType.objects.all()},
        version=version,
    )
    summary = gaps.gap_summary(scope)
    # One row more than asked for says whether there is a next page.
    page = gaps.gap_page(
        scope, limit=params.limit + 1, offset=params.offset, after=after
    )
    more, page = len(page) > params.limit, page[: params.limit]
    following = None
    if more:
        # The toolchain by name: the next page stays on the toolchain of
        # this one, even if another becomes current meanwhile.
        query = {
            **filters.as_params(),
            "limit": params.limit,
            "cursor": page[-1].cursor,
        }
        following = request.build_absolute_uri(
            reverse("api:coverage_gaps") + "?" + urlencode(query)
        )
    return {
        "toolchain": _toolchain(filters),
        "count": summary.total,
        "runnable": summary.runnable,
        "reasons": summary.reasons,
        "next": following,
        "gaps": [
            {
                "operator": g.operator,
                "dims": g.dims,
                "dtype": g.dtype,
                "weight": g.weight,
                "device_type": str(g.device_type),
                "backend": g.device_type.backend,
                "url": _cell_url(g.shape_id, g.device_type.pk, filters),
                "status": g.status,
                "kind": g.kind,
                "reasons": g.reasons,
                "score": g.score,
                "runnable": g.runnable,
                "stage": g.stage,
                "queued": g.queued,
            }
            for g in page
        ],
    }


class ModelFilters(CoverageFilters):
    pieces: int = Field(
        10, ge=0, le=1000, description="missing pieces listed per device type"
    )


class OutcomeCalls(Schema):
    tilelang: float = Field(description="pass, and fast enough against the reference")
    reference: float = Field(
        description="falls back: unsupported, failing, or passing but slower"
    )
    unvalidated: float = Field(
        description="never run, stale, only lowered or built, infrastructure error"
    )


class StepOut(Schema):
    tokens: int = Field(description="tokens in the forward step; 0: not recorded")
    calls: OutcomeCalls
    percent: OutcomeCalls


class PieceOut(Schema):
    operator: str
    dims: dict[str, int]
    dtype: str
    calls: float = Field(description="calls per forward step, over its step sizes")
    status: str
    serves: str
    reason: str
    rerun_helps: bool = Field(description="a fresh run (Run missing) could close it")
    passes_on: str | None = Field(
        description="a toolchain on which the kernel revision failing here passes "
        "(same device type): an upgrade closes it; a run here does not, unless "
        "that revision is an older one than the current (rerun_helps says)"
    )
    upgrade: int | None = Field(description="the open proposal that brings it")
    speedup: float | None
    url: str


class DeviceCoverageOut(Schema):
    device_type: str
    device_type_id: int
    backend: str
    calls: OutcomeCalls
    percent: OutcomeCalls
    steps: list[StepOut]
    missing: int = Field(description="cells not serving TileLang")
    pieces: list[PieceOut] = Field(description="the biggest missing pieces first")
    run_missing_url: str = Field(
        description="the gaps page with exactly this model's cells on this device"
    )


class ModelOut(Schema):
    name: str
    shapes: int
    calls_per_step: float = Field(
        description="calls per forward step, summed over the step sizes imported"
    )
    tokens: list[int]
    devices: list[DeviceCoverageOut]


class ModelsOut(Schema):
    toolchain: ToolchainOut
    speedup_floor: float = Field(
        description="the lowest reference / kernel time ratio served with TileLang"
    )
    models: list[ModelOut]


def _outcomes(shares) -> tuple[dict, dict]:
    return dict(shares.calls), shares.percents


@router.get("/models", response={200: ModelsOut, **REFUSED}, url_name="coverage_models")
def coverage_models(request, params: Query[ModelFilters]):
    """Per served model (a profile or captured trace) and device type, on one
    toolchain: its operator calls per forward step that would run validated
    TileLang, fall back to the reference, or are not validated yet, in all
    and per step size, with the biggest missing pieces, as the Models page
    shows them."""
    version = data_version()
    filters = _checked(params, current_toolchain_in(version))
    # Kept per version of what it shows: 84% of an answer was Python in
    # model_coverage. Pieces name cells passing on other toolchains, so
    # every result's counter too.
    key = read_key(
        "api-models",
        sorted(filters.as_params().items()),
        params.pieces,
        version=(*version, *read_versions.filters_version(filters, everywhere=True)),
    )
    return json_answer(request, key, lambda: _models_answer(filters, params), ModelsOut)


def _models_answer(filters, params) -> dict:
    models = model_coverage(filters)
    listed = {
        (m.name, d.device_type.pk): d.top(params.pieces)
        for m in models
        for d in m.devices
    }
    mark_passing_elsewhere(
        (p for pieces in listed.values() for p in pieces), filters.toolchain
    )
    out = []
    base = filters.as_params()
    for model in models:
        devices = []
        for device in model.devices:
            calls, percent = _outcomes(device.shares)
            devices.append(
                {
                    "device_type": str(device.device_type),
                    "device_type_id": device.device_type.pk,
                    "backend": device.device_type.backend,
                    "calls": calls,
                    "percent": percent,
                    "steps": [
                        dict(zip(("calls", "percent"), _outcomes(s), strict=True))
                        | {"tokens": t}
                        for t, s in device.steps
                    ],
                    "missing": device.missing,
                    "pieces": [
                        {
                            **_shape_fields(p.shape, device.device_type, filters),
                            "calls": p.calls,
                            "status": p.status,
                            "serves": p.verdict.outcome,
                            "reason": p.verdict.reason,
                            "rerun_helps": p.rerun_helps,
                            "passes_on": p.passes_on.toolchain if p.passes_on else None,
                            "upgrade": p.passes_on.proposal if p.passes_on else None,
                            "speedup": p.speedup,
                        }
                        for p in listed[model.name, device.device_type.pk]
                    ],
                    "run_missing_url": reverse("gaps")
                    + "?"
                    + urlencode(
                        {**base, "model": model.name, "device": device.device_type.pk}
                    ),
                }
            )
        out.append(
            {
                "name": model.name,
                "shapes": model.shape_count,
                "calls_per_step": model.calls,
                "tokens": model.tokens,
                "devices": devices,
            }
        )
    return {
        "toolchain": _toolchain(filters),
        "speedup_floor": serve_speedup_floor(),
        "models": out,
    }
