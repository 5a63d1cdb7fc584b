"""One cell's evidence: history, chart, kernel source, error, repro job."""

from __future__ import annotations

import json

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from django.template.defaultfilters import pluralize
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from matrix import queries, revisions
from matrix.cache import cache_seconds, cached_read, cell_version, read_key
from matrix.gate import significance
from matrix.models import Cell, DeviceType, KernelRevision, Result, Shape, Status
from matrix.page_cache import page_response
from matrix.serving import (
    serve_speedup_floor,
    serving_verdict,
    speed_class,
    speedup,
)
from matrix.views.charts import TimeSeries, speed_scatter, time_chart
from matrix.views.operators import operator_points

HISTORY = 100


def _cell_named(shape_id: int, device_type_id: int) -> tuple[Shape, DeviceType]:
    """The shape and device type a cell URL names, or 404."""
    shape = get_object_or_404(Shape.objects.select_related("operator"), pk=shape_id)
    return shape, get_object_or_404(DeviceType, pk=device_type_id)


def _cell_address(request, shape_id: int, device_type_id: int):
    """(shape, device type, filters, toolchains) a cell URL names, or 404."""
    shape, device_type = _cell_named(shape_id, device_type_id)
    toolchains = queries.toolchain_list()
    return (
        shape,
        device_type,
        queries.MatrixFilters.from_params(request.GET, toolchains),
        toolchains,
    )


def _cell_of(shape: Shape, device_type: DeviceType, filters) -> Cell | None:
    # The matrix is readable by everyone who can open the site; no per-user
    # restriction applies to a cell.
    if filters.toolchain is None:
        return None
    return (
        Cell.objects.select_related(
            "result__job", "result__source", "result__error", "revision", "toolchain"
        )
        .defer("revision__source")
        .filter(shape=shape, device_type=device_type, toolchain=filters.toolchain)
        .first()
    )


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
    toolchains, _ = queries.catalogue_lists()
    filters = queries.MatrixFilters.from_params(request.GET, toolchains)
    # The same for every reader until a result of this cell or of its
    # column, or the catalogue, changes: rendered once per cell version (a
    # long history's rows and charts took most of a 120 ms view at 1M
    # results). A page naming an unknown toolchain says so and is not kept,
    # so made-up values cannot fill the cache; an unknown cell is a 404,
    # never kept either.
    key = None
    if cache_seconds() and not filters.unknown:
        toolchain = filters.toolchain.pk if filters.toolchain else None
        key = read_key(
            "cell-page",
            shape_id,
            device_type_id,
            sorted(filters.as_params().items()),
            version=cell_version(shape_id, device_type_id, toolchain),
        )

    def page(frame: dict) -> str:
        shape, device_type = _cell_named(shape_id, device_type_id)

        def content() -> str:
            return render_to_string(
                "matrix/cell.html#page-content",
                cell_context(shape, device_type, filters, toolchains),
                request,
            )

        html = cached_read(key, content, cache_seconds()) if key else content()
        return render_to_string(
            "matrix/cell.html",
            {"shape": shape, "device_type": device_type, "content_html": html, **frame},
            request,
        )

    return page_response(request, key, page)


def cell_context(shape, device_type, filters, toolchains) -> dict:
    cell = _cell_of(shape, device_type, filters)
    # A revision's source is 11-27 KB: not shown per row of the history, nor
    # are a result's details and texts (its generated kernel is a blob the
    # rows do not join).
    history = list(
        Result.objects.filter(shape=shape, device_type=device_type)
        .select_related("toolchain", "revision", "receipt__runner")
        .defer("details", "revision__source")
        .order_by("-id")[:HISTORY]
    )
    for r in history:
        r.produced_at = queries.result_time(r)
    result = cell.result if cell else None
    if result is not None:
        # The same result as a history row, read with its receipt.
        listed = next((r for r in history if r.pk == result.pk), None)
        receipt = getattr(listed, "receipt", None)
        result.produced_at = listed.produced_at if listed else result.created_at
        result.signed_by = receipt.runner.name if receipt else ""
    details = result.details if result else {}
    # The revision current on this cell's backend, not anywhere.
    current_revision_id = revisions.current_id(shape.operator_id, device_type.backend)
    revision_current = bool(cell) and cell.revision_id == current_revision_id
    stale = bool(cell) and (filters.toolchain_stale or not revision_current)
    shared = (
        queries.signature_count(cell.error_signature, cell.toolchain) - 1
        if cell and cell.error_signature
        else 0
    )
    floor = serve_speedup_floor()
    value = speedup(cell.kernel_ms, cell.reference_ms) if cell else None
    status = cell.status if cell else queries.EMPTY
    context = {
        "shape": shape,
        "device_type": device_type,
        "filters": filters,
        "toolchains": toolchains,
        "cell": cell,
        "result": result,
        "stale": stale,
        "revision_current": revision_current,
        "superseded_revision": (
            _superseded_revision(cell, current_revision_id)
            if cell and not revision_current
            else None
        ),
        "label": queries.state_label(status),
        "kind": queries.status_kind(status),
        "speedup": value if status == Status.PASS else None,
        "speed_class": speed_class(value, floor) if status == Status.PASS else "",
        "verdict": serving_verdict(status, stale, value, floor),
        "floor": floor,
        "history": history,
        "time_chart": _time_chart(history),
        "error_chart": _error_chart(history),
        "shape_chart": _shape_chart(shape, device_type, filters, floor),
        "kernel_source": result.kernel_source if result else "",
        "tolerance": details.get("tolerance") or {},
        "distributions": details.get("distributions") or [],
        "sandbox": details.get("sandbox") or "",
        "timing_trust": details.get("timing_trust") or "",
        "since_previous": _since_previous(result) if status == Status.PASS else None,
        "fingerprint_components": details.get("fingerprint_components") or {},
        "shared": shared,
        "job_json": json.dumps(repro_job(shape, device_type, cell), indent=2),
        "labels": queries.STATE_LABELS,
    }
    return context


def _superseded_revision(cell, current_revision_id: int | None) -> dict:
    """Why a cell is stale by its revision: the one its result ran (as the
    runner checked the job's source hash) and the one current now, whose
    code its result says nothing about."""
    current = (
        KernelRevision.objects.filter(pk=current_revision_id)
        .values("source_sha256", "origin")
        .first()
    )
    return {"ran": cell.revision.source_sha256, "current": current}


def _since_previous(result):
    """The cell's pass against the pass before it on the same toolchain and
    revision, by the gate's rank test on their timing samples (see
    matrix/gate/significance.py), and whether the generated code is the
    same (the same source id: the same SHA-256); None where either has no
    samples."""
    details = result.details or {}
    previous = (
        Result.objects.filter(
            shape_id=result.shape_id,
            device_type_id=result.device_type_id,
            toolchain_id=result.toolchain_id,
            revision_id=result.revision_id,
            status=Status.PASS,
            id__lt=result.pk,
        )
        .order_by("-id")
        .values_list("pk", "details__kernel_ms_samples", "source_id")
        .first()
    )
    if previous is None:
        return None
    pk, samples, code = previous
    change = significance.compare(samples or [], details.get("kernel_ms_samples") or [])
    if change is None:
        return None
    same_code = bool(code) and code == result.source_id
    return {"result_id": pk, "change": change, "same_code": same_code}


def _time_chart(history):
    timed = [r for r in history if r.kernel_ms is not None]
    return time_chart(
        f"Kernel and reference time of {len(timed)} result{pluralize(len(timed))}",
        "ms",
        [
            TimeSeries(
                "kernel",
                "kernel",
                "circle",
                [(r.produced_at, r.kernel_ms) for r in timed],
            ),
            TimeSeries(
                "reference",
                "reference",
                "square",
                [
                    (r.produced_at, r.reference_ms)
                    for r in timed
                    if r.reference_ms is not None
                ],
            ),
        ],
    )


def _error_chart(history):
    measured = [r for r in history if r.rel_err is not None]
    return time_chart(
        f"Relative error of {len(measured)} result{pluralize(len(measured))}",
        "",
        [
            TimeSeries(
                "relative error",
                "error",
                "circle",
                [(r.produced_at, r.rel_err) for r in measured],
            )
        ],
    )


def _shape_chart(shape: Shape, device_type: DeviceType, filters, floor: float):
    """Every passing, timed shape of the operator on this device type and
    toolchain, this one marked: is this shape typical of the kernel?"""
    if filters.toolchain is None:
        return None
    points = operator_points(
        shape.operator, device_type, filters.toolchain, floor, highlight=shape.pk
    )
    return speed_scatter(
        f"Kernel against reference time across {len(points)} shapes of "
        f"{shape.operator.name} on {device_type}",
        points,
        floor,
    )


@require_GET
def cell_job(request, shape_id: int, device_type_id: int):
    """The repro job as a download: `python -m runners.harness job.json`."""
    shape, device_type, filters, _ = _cell_address(request, shape_id, device_type_id)
    cell = _cell_of(shape, device_type, filters)
    body = json.dumps(repro_job(shape, device_type, cell), indent=2) + "\n"
    response = HttpResponse(body, content_type="application/json")
    response["Content-Disposition"] = 'attachment; filename="job.json"'
    return response
