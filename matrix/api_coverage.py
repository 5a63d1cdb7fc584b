"""GET /api/v1/matrix and GET /api/v1/gaps: the coverage the matrix and gaps
pages show, as JSON for scripts, e.g. a CI step that refuses to ship while a
served cell of its device type has a gap.

Read as the pages are: by a signed-in user with a role, or by anyone where
anonymous reading is on. Filters are those of the pages, but checked: an
unknown dtype, backend or status is a 400 naming the allowed ones, an unknown
operator or toolchain a 404 (the operator's naming the known ones): never
silently dropped."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.urls import reverse
from django.utils.http import urlencode
from ninja import Field, Query, Router, Schema
from ninja.errors import HttpError

from matrix import gaps, queries
from matrix.api_errors import Problem
from matrix.models import (
    Backend,
    Cell,
    DeviceType,
    Dtype,
    KernelRevision,
    Operator,
    Shape,
)
from runners.roles import has_role
from runners.services import capabilities_online


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


class MatrixOut(Schema):
    toolchain: ToolchainOut
    count: int
    cells: list[CellOut]


class GapsQuery(CoverageFilters):
    cursor: str | None = Field(
        None,
        description="the page after this cursor, as the `next` link of the page "
        "before gives it: stable while gaps open and close, unlike `offset`",
    )


class GapOut(Schema):
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


class GapsOut(Schema):
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


def _cell_url(shape_id: int, device_type_id: int, filters) -> str:
    url = reverse("cell", args=[shape_id, device_type_id])
    return f"{url}?{urlencode({'toolchain': filters.toolchain.name})}"


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


@router.get("/matrix", response={200: MatrixOut, **REFUSED}, url_name="coverage_matrix")
def coverage_matrix(request, params: Query[CoverageFilters]):
    """Every (shape, device type) cell under the filters for one toolchain,
    never-run cells included, in the matrix's order (operators by name,
    served shapes first by weight, device types by backend priority)."""
    filters = _checked(params)
    shapes = Shape.objects.filter(filters.shape_q()).select_related("operator")
    if params.operator:
        shapes = shapes.filter(operator__name=params.operator)
    shapes = list(shapes)
    device_types = queries.device_type_list(filters)
    found = {
        (c.shape_id, c.device_type_id): c
        for c in Cell.objects.filter(
            toolchain=filters.toolchain,
            shape__in=[s.pk for s in shapes],
            device_type__in=[d.pk for d in device_types],
        ).only(
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
    current = queries.current_revisions()
    revisions = dict(
        KernelRevision.objects.filter(
            pk__in={c.revision_id for c in found.values()}
        ).values_list("pk", "source_sha256")
    )
    rows = []
    for shape in shapes:
        for dt in device_types:
            cell = found.get((shape.pk, dt.pk))
            status = cell.status if cell else queries.EMPTY
            stale = cell is not None and (
                filters.toolchain_stale
                or cell.revision_id != current.get(shape.operator_id)
            )
            if queries.matches(filters.status, status, stale):
                rows.append((shape, dt, cell, status, stale))
    page = rows[params.offset : params.offset + params.limit]
    return {
        "toolchain": _toolchain(filters),
        "count": len(rows),
        "cells": [
            {
                **_shape_fields(shape, dt, filters),
                "served": shape.served,
                "arch": dt.arch,
                "status": status,
                "stale": stale,
                "revision": revisions.get(cell.revision_id) if cell else None,
                "kernel_ms": cell.kernel_ms if cell else None,
                "reference_ms": cell.reference_ms if cell else None,
                "error_signature": cell.error_signature if cell else "",
                "updated_at": cell.updated_at if cell else None,
            }
            for shape, dt, cell, status, stale in page
        ],
    }


@router.get("/gaps", response={200: GapsOut, **REFUSED}, url_name="coverage_gaps")
def coverage_gaps(request, params: Query[GapsQuery]):
    """The served gaps of one toolchain, ranked and counted as the gaps page
    ranks and counts them: cells with no result, a stale or failing one, or
    evidence only (lowered or built). A current pass is never a gap. An
    empty list: every served cell passes (or is unsupported), current.
    Follow ``next`` to the last page."""
    filters = _checked(params)
    after = None
    if params.cursor:
        if params.offset:
            raise HttpError(400, "give a cursor or an offset, not both")
        after = gaps.cursor_decode(params.cursor)
        if after is None:
            raise HttpError(
                400, "cursor is not one this API gave out: start from the first page"
            )
    scope = gaps.GapScope(
        filters,
        capabilities_online(),
        {d.pk: d for d in DeviceType.objects.all()},
        operator=params.operator or "",
    )
    summary = gaps.gap_summary(scope)
    # One row more than asked for says whether there is a next page.
    page = gaps.gap_page(
        scope, limit=params.limit + 1, offset=params.offset, after=after
    )
    more, page = len(page) > params.limit, page[: params.limit]
    following = None
    if more:
        query = {
            "toolchain": filters.toolchain.name,
            "operator": params.operator,
            "dtype": params.dtype,
            "backend": params.backend,
            "status": params.status,
            "limit": params.limit,
            "cursor": page[-1].cursor,
        }
        following = request.build_absolute_uri(
            reverse("api:coverage_gaps")
            + "?"
            + urlencode({k: v for k, v in query.items() if v})
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
