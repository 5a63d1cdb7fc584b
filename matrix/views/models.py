"""The Models page: how much of each served model's forward step would run
validated TileLang, per device type, on one toolchain; what falls back to
the reference; what was never validated; and the biggest missing pieces,
each linked to its cell, with the way to run the ones a run can close."""

from __future__ import annotations

import csv

from django.http import HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.http import urlencode
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from matrix import queries, read_versions
from matrix.cache import answer_read, cache_seconds, data_version, read_key
from matrix.exports import spreadsheet_safe, unknown_toolchain
from matrix.models import Backend, Dtype
from matrix.page_cache import page_response
from matrix.served_models import mark_passing_elsewhere, model_coverage
from matrix.serving import OUTCOME_LABELS, OUTCOMES, serve_speedup_floor

PIECES_SHOWN = 15
PIECES_MAX = 1000


def _models_context(request, filters, toolchains) -> dict:
    models = model_coverage(filters)
    # Only a chosen model's devices list pieces (and count those a run can
    # close, which depends on where they pass).
    detailed = [m for m in models if filters.model or len(models) == 1]
    mark_passing_elsewhere(
        (p for m in detailed for d in m.devices for p in d.pieces), filters.toolchain
    )
    pieces = PIECES_MAX if request.GET.get("pieces") == "all" else PIECES_SHOWN
    params = filters.as_params()
    for model in detailed:
        for device in model.devices:
            device.shown = device.pieces[:pieces]
    for model in models:
        for device in model.devices:
            # Run missing on the gaps page, for exactly this model's cells
            # on this device type under these filters.
            device.gaps_query = urlencode(
                {
                    **params,
                    "model": model.name,
                    "device": device.device_type.pk,
                }
            )
            device.detail_query = urlencode(
                {**params, "model": model.name, "device": device.device_type.pk}
            )
    device_types = models[0].devices if models else []
    return {
        "filters": filters,
        "toolchains": toolchains,
        "dtypes": Dtype.values,
        "backends": Backend.choices,
        "models": models,
        "columns": [d.device_type for d in device_types],
        "detailed": detailed,
        "outcomes": [(o, OUTCOME_LABELS[o]) for o in OUTCOMES],
        "floor": serve_speedup_floor(),
        "query": urlencode(params),
        "all_pieces": pieces == PIECES_MAX,
    }


@require_GET
@vary_on_headers("HX-Request")
def models_page(request):
    """Rendered once per version of what it shows for every reader (about
    110 ms of Python at 1M results when computed each view)."""
    toolchains = queries.toolchain_list()
    filters = queries.MatrixFilters.from_params(request.GET, toolchains)
    template = "matrix/models.html"
    if request.htmx and request.htmx.target == "models-body":
        template += "#models-body"
    if filters.unknown or not cache_seconds():
        return render(request, template, _models_context(request, filters, toolchains))
    version = data_version() + read_versions.filters_version(filters, everywhere=True)
    key = read_key(
        "models-page",
        sorted(filters.as_params().items()),
        request.GET.get("pieces") == "all",
        template,
        version=version,
    )

    def page(frame: dict) -> str:
        context = _models_context(request, filters, toolchains)
        return render_to_string(template, {**context, **frame}, request)

    if template.endswith("#models-body"):
        _, html = answer_read(key, lambda: page({}), cache_seconds())
        return HttpResponse(html)
    return page_response(request, key, page)


CSV_FIELDS = [
    "model",
    "device_type",
    "backend",
    "toolchain",
    "tokens",
    "calls_per_step",
    *(f"{o}_calls" for o in OUTCOMES),
    *(f"{o}_percent" for o in OUTCOMES),
]


@require_GET
def models_csv(request):
    """Per model and device type, the calls per forward step by outcome:
    over every step size imported ('all'), then per step size."""
    toolchains = queries.toolchain_list()
    filters = queries.MatrixFilters.from_params(request.GET, toolchains)
    refused = unknown_toolchain(request.GET, filters, toolchains)
    if refused:
        return refused
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="models.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_FIELDS)
    toolchain = filters.toolchain.name if filters.toolchain else ""
    for model in model_coverage(filters):
        for device in model.devices:
            for tokens, shares in [("all", device.shares), *device.steps]:
                writer.writerow(
                    [
                        spreadsheet_safe(model.name),
                        spreadsheet_safe(device.device_type),
                        spreadsheet_safe(device.device_type.backend),
                        spreadsheet_safe(toolchain),
                        tokens,
                        f"{shares.total:g}",
                        *(f"{shares.calls[o]:g}" for o in OUTCOMES),
                        *(f"{shares.percent(o):.1f}" for o in OUTCOMES),
                    ]
                )
    return response
