"""Failures grouped by error signature across the matrix."""

from __future__ import annotations

from django.shortcuts import render
from django.views.decorators.http import require_GET

from matrix import queries


@require_GET
def errors_page(request):
    toolchains = queries.toolchain_list()
    filters = queries.MatrixFilters.from_params(request.GET, toolchains)
    groups = queries.error_groups(filters.toolchain)
    return render(
        request,
        "matrix/errors.html",
        {
            "filters": filters,
            "toolchains": toolchains,
            "groups": groups,
            "labels": queries.STATE_LABELS,
        },
    )
