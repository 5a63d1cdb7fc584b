"""Failures grouped by error signature across the matrix, and apart from
them the cells their kernel does not support."""

from __future__ import annotations

import re

from django.template.loader import render_to_string
from django.utils.http import urlencode
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET

from matrix import error_groups, queries, read_versions
from matrix.cache import cached_read, data_version, derived_key, read_key
from matrix.page_cache import page_response

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
    """A page of failing groups and a page of unsupported ones, each with its
    own cursor (``after``, ``unsupported_after``); rendered once per data
    version, toolchain and pair of pages, for every reader (hundreds of rows
    through the template engine cost more than reading them)."""
    toolchains, _ = queries.catalogue_lists()
    filters = queries.MatrixFilters.from_params(request.GET, toolchains)
    toolchain = filters.toolchain
    version = data_version() + read_versions.filters_version(filters)

    def counts() -> dict:
        return cached_read(
            read_key("error-counts", toolchain and toolchain.pk, version),
            lambda: error_groups.error_counts(toolchain),
        )

    # Keyed by where the pages start, so a made-up cursor adds no entry. The
    # first pages start at the top: their key needs no counts, so a reader
    # arriving while another computes them is not kept waiting for those.
    cursors = (request.GET.get("after", ""), request.GET.get("unsupported_after", ""))
    starts = tuple(
        error_groups.page_start(counts()[unsupported], cursor) if cursor else 0
        for unsupported, cursor in zip((False, True), cursors, strict=True)
    )
    query = urlencode({"toolchain": toolchain.name} if toolchain else {})
    key = read_key(
        "error-pages",
        toolchain and toolchain.pk,
        starts,
        sorted(filters.as_params().items()),
        version=version,
    )

    def pages():
        failing, unsupported = error_groups.error_pages(
            toolchain, counts=counts(), starts=starts
        )
        for group in unsupported.groups:
            group.message = readable_declaration(group.message)
        return failing, unsupported

    def page(frame: dict) -> str:
        failing, unsupported = cached_read(key, pages)
        context = {
            "groups": failing.groups,
            "failing": failing,
            "unsupported": unsupported,
            "query": query,
        }
        content_html = cached_read(
            derived_key(key, "html"),
            lambda: render_to_string(
                "matrix/errors.html#error-pages", context, request
            ),
        )
        return render_to_string(
            "matrix/errors.html",
            {
                "filters": filters,
                "toolchains": toolchains,
                "content_html": mark_safe(content_html),
                **context,
                **frame,
            },
            request,
        )

    return page_response(request, None if filters.unknown else key, page)
