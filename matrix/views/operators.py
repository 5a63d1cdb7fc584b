"""One operator's speed: kernel time against the PyTorch reference across
its shapes on each device type, and over time."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from matrix import queries
from matrix.models import Backend, Cell, DeviceType, Dtype, Operator, Result, Status
from matrix.serving import serve_speedup_floor, speed_class
from matrix.views.charts import ScatterPoint, TimeSeries, speed_scatter, time_chart

# Results read for the over-time chart, newest first.
HISTORY = 2000
SLOWEST_SHOWN = 10
MARKERS = ("circle", "square", "triangle")


def operator_points(
    operator: Operator,
    device_type: DeviceType,
    toolchain,
    floor: float,
    *,
    highlight: int | None = None,
    cells=None,
) -> list[ScatterPoint]:
    """A point per passing, timed shape of ``operator`` on the device type
    and toolchain, linked to its cell. ``cells``: rows already read (see
    ``_timed_cells``); one query otherwise."""
    if cells is None:
        cells = _timed_cells(operator, [device_type], toolchain).get(device_type.pk, [])
    prefix = reverse("cell", args=[1, 1])[: -len("1/1/")]
    query = urlencode({"toolchain": toolchain.name})
    return [
        ScatterPoint(
            reference_ms=c["reference_ms"],
            kernel_ms=c["kernel_ms"],
            title=(
                f"{c['shape__dims_key']} {c['shape__dtype']}: "
                f"{c['reference_ms'] / c['kernel_ms']:.2f}× the reference "
                f"({c['kernel_ms']:.3g} ms against {c['reference_ms']:.3g} ms)"
            ),
            href=f"{prefix}{c['shape_id']}/{device_type.pk}/?{query}",
            slower=c["reference_ms"] / c["kernel_ms"] < floor,
            highlight=c["shape_id"] == highlight,
        )
        for c in cells
    ]


def _timed_cells(operator, device_types, toolchain, shape_q=None) -> dict:
    """device type id -> the passing cells with both times. One query."""
    cells = Cell.objects.filter(
        shape__operator=operator,
        toolchain=toolchain,
        device_type__in=device_types,
        status=Status.PASS,
        kernel_ms__gt=0,
        reference_ms__gt=0,
    )
    if shape_q:
        cells = cells.filter(shape_q)
    found = defaultdict(list)
    for row in cells.values(
        "shape_id",
        "device_type_id",
        "shape__dims_key",
        "shape__dtype",
        "shape__served",
        "shape__weight",
        "kernel_ms",
        "reference_ms",
        "revision_id",
    ).order_by("shape__dims_key", "shape__dtype"):
        found[row["device_type_id"]].append(row)
    return found


@dataclass
class DeviceSpeed:
    device_type: DeviceType
    cells: list[dict]
    counts: dict[str, int] = field(default_factory=dict)
    geomean: float | None = None
    scatter: str | None = None
    slowest: list[dict] = field(default_factory=list)


def _daily_speedups(operator, device_types) -> dict[int, list]:
    """device type id -> (day, geometric-mean speed-up of the passing
    results produced that day), over the newest ``HISTORY`` results on any
    toolchain. One query."""
    rows = (
        Result.objects.filter(
            shape__operator=operator,
            device_type__in=device_types,
            status=Status.PASS,
            kernel_ms__gt=0,
            reference_ms__gt=0,
        )
        .order_by("-id")
        .values_list(
            "device_type_id",
            "kernel_ms",
            "reference_ms",
            "created_at",
            "receipt__issued_at",
        )[:HISTORY]
    )
    logs: dict[int, dict] = defaultdict(lambda: defaultdict(list))
    for dt_id, kernel_ms, reference_ms, created_at, issued_at in rows:
        moment = queries.issued_time(issued_at, created_at)
        day = moment.replace(hour=12, minute=0, second=0, microsecond=0)
        logs[dt_id][day].append(math.log(reference_ms / kernel_ms))
    return {
        dt_id: sorted(
            (day, math.exp(sum(values) / len(values))) for day, values in days.items()
        )
        for dt_id, days in logs.items()
    }


@require_GET
@vary_on_headers("HX-Request")
def operator_page(request, name: str):
    operator = get_object_or_404(Operator, name=name)
    toolchains = queries.toolchain_list()
    filters = queries.MatrixFilters.from_params(request.GET, toolchains)
    # The page is the operator's: an operator filter would only empty it.
    filters.operator = ""
    filters.unknown.pop("operator", None)
    floor = serve_speedup_floor()
    device_types = queries.device_type_list(filters)
    shape_q = filters.shape_q("shape__")
    cells = (
        _timed_cells(operator, device_types, filters.toolchain, shape_q)
        if filters.toolchain is not None
        else {}
    )
    daily = _daily_speedups(operator, device_types)
    devices = []
    for dt in device_types:
        rows = cells.get(dt.pk, [])
        speed = DeviceSpeed(dt, rows)
        if rows:
            values = [r["reference_ms"] / r["kernel_ms"] for r in rows]
            for value in values:
                kind = speed_class(value, floor)
                speed.counts[kind] = speed.counts.get(kind, 0) + 1
            speed.geomean = math.exp(sum(map(math.log, values)) / len(values))
            speed.scatter = speed_scatter(
                f"Kernel against reference time across {len(rows)} shapes of "
                f"{operator.name} on {dt}",
                operator_points(operator, dt, filters.toolchain, floor, cells=rows),
                floor,
            )
            for row, value in zip(rows, values, strict=True):
                row["speedup"] = value
            speed.slowest = sorted(rows, key=lambda r: r["speedup"])[:SLOWEST_SHOWN]
        if rows or dt.pk in daily:
            devices.append(speed)
    over_time = time_chart(
        f"Geometric-mean speed-up of {operator.name} per day",
        "×",
        [
            TimeSeries(
                str(d.device_type),
                f"series-{i % 3}",
                MARKERS[i % 3],
                daily[d.device_type.pk],
            )
            for i, d in enumerate(devices)
            if d.device_type.pk in daily
        ],
    )
    context = {
        "operator": operator,
        "filters": filters,
        "toolchains": toolchains,
        "dtypes": Dtype.values,
        "backends": Backend.choices,
        "devices": devices,
        "over_time": over_time,
        "legend": [
            (str(d.device_type), f"series-{i % 3}", MARKERS[i % 3])
            for i, d in enumerate(devices)
            if d.device_type.pk in daily
        ],
        "floor": floor,
        "query": urlencode(filters.as_params()),
    }
    template = "matrix/operator.html"
    if request.htmx and request.htmx.target == "operator-body":
        template += "#operator-body"
    return render(request, template, context)
