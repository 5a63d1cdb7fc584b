"""One cell's evidence: history, chart, kernel source, error, repro job."""

from __future__ import annotations

import json

from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from matrix import queries
from matrix.models import Cell, DeviceType, Result, Shape
from matrix.views.charts import history_chart

HISTORY = 100


def _get_cell_for_user(request, shape_id: int, device_type_id: int):
    # The matrix is readable by everyone who can open the site; no per-user
    # restriction applies to a cell.
    shape = get_object_or_404(Shape.objects.select_related("operator"), pk=shape_id)
    device_type = get_object_or_404(DeviceType, pk=device_type_id)
    toolchains = queries.toolchain_list()
    filters = queries.MatrixFilters.from_params(request.GET, toolchains)
    cell = None
    if filters.toolchain is not None:
        cell = (
            Cell.objects.select_related("result__job", "revision", "toolchain")
            .defer("revision__source")
            .filter(shape=shape, device_type=device_type, toolchain=filters.toolchain)
            .first()
        )
    return shape, device_type, filters, toolchains, cell


def repro_job(shape: Shape, device_type: DeviceType, cell: Cell | None) -> dict:
    """The job that reproduces this cell with `python -m runners.harness`."""
    job = cell.result.job if cell is not None else None
    return {
        "operator": shape.operator.name,
        "shape": shape.dims,
        "dtype": shape.dtype,
        "target": device_type.target,
        "stage": job.stage if job else "validate",
        "seed": job.seed if job else 0,
    }


@require_GET
def cell_page(request, shape_id: int, device_type_id: int):
    shape, device_type, filters, toolchains, cell = _get_cell_for_user(
        request, shape_id, device_type_id
    )
    # A revision's source is 11-27 KB and a result's details hold its
    # generated kernel: neither is shown per row of the history.
    history = list(
        Result.objects.filter(shape=shape, device_type=device_type)
        .select_related("toolchain", "revision")
        .defer("details", "error_message", "revision__source")
        .order_by("-created_at")[:HISTORY]
    )
    history.reverse()
    result = cell.result if cell else None
    details = result.details if result else {}
    revisions = queries.current_revisions()
    stale = bool(cell) and (
        filters.toolchain_stale or cell.revision_id != revisions.get(shape.operator_id)
    )
    shared = (
        queries.signature_count(cell.error_signature, cell.toolchain) - 1
        if cell and cell.error_signature
        else 0
    )
    context = {
        "shape": shape,
        "device_type": device_type,
        "filters": filters,
        "toolchains": toolchains,
        "cell": cell,
        "result": result,
        "stale": stale,
        "label": queries.state_label(cell.status if cell else queries.EMPTY),
        "kind": queries.status_kind(cell.status if cell else queries.EMPTY),
        "history": list(reversed(history)),
        "chart": history_chart(history),
        "kernel_source": details.get("kernel_source") or "",
        "tolerance": details.get("tolerance") or {},
        "fingerprint_components": details.get("fingerprint_components") or {},
        "shared": shared,
        "job_json": json.dumps(repro_job(shape, device_type, cell), indent=2),
        "labels": queries.STATE_LABELS,
    }
    return render(request, "matrix/cell.html", context)


@require_GET
def cell_job(request, shape_id: int, device_type_id: int):
    """The repro job as a download: `python -m runners.harness job.json`."""
    shape, device_type, _, _, cell = _get_cell_for_user(
        request, shape_id, device_type_id
    )
    body = json.dumps(repro_job(shape, device_type, cell), indent=2) + "\n"
    response = HttpResponse(body, content_type="application/json")
    response["Content-Disposition"] = 'attachment; filename="job.json"'
    return response
