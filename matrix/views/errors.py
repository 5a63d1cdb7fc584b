"""Failures grouped by error signature across the matrix, and apart from
them the cells their kernel does not support."""

from __future__ import annotations

import re

from django.shortcuts import render
from django.views.decorators.http import require_GET

from matrix import queries

# A Python list of quoted names as the kernel library words a declaration:
# "supports ['float16', 'float32'], not bfloat16".
_NAME_LIST = re.compile(r"\[((?:'[^'\]]*'(?:, )?)+)\]")


def readable_declaration(message: str) -> str:
    """The message with each list of quoted names written as words:
    "supports float16 and float32, not bfloat16"."""

    def words(match: re.Match) -> str:
        names = [n.strip("'") for n in match.group(1).split(", ")]
        return " and ".join(filter(None, [", ".join(names[:-1]), names[-1]]))

    return _NAME_LIST.sub(words, message)


@require_GET
def errors_page(request):
    toolchains = queries.toolchain_list()
    filters = queries.MatrixFilters.from_params(request.GET, toolchains)
    groups = queries.error_groups(filters.toolchain)
    unsupported = queries.error_groups(filters.toolchain, unsupported=True)
    for group in unsupported:
        group.message = readable_declaration(group.message)
    return render(
        request,
        "matrix/errors.html",
        {
            "filters": filters,
            "toolchains": toolchains,
            "groups": groups,
            "unsupported": unsupported,
            "labels": queries.STATE_LABELS,
        },
    )
