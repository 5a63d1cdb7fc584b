"""The matrix page's reads kept per data version: an operator opened, its
rows fetched by htmx and the table swapped by a filter are rendered once
for every reader and shown again fresh after the next result."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from matrix.models import Status
from tests.ui.conftest import record

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


def htmx_rows(name: str) -> dict:
    """Headers of htmx fetching one operator's rows."""
    return {**HTMX, "HTTP_HX_TARGET": f"op-{name}"}


def shape_row(body: str, shape) -> str:
    """The expanded row of one shape × dtype."""
    dtype = f'class="dtype">{shape.dtype}<'
    return next(
        r
        for r in body.split('class="shape-row"')[1:]
        if shape.dims_key in r and dtype in r
    )


def cell_reads(client, *args, **kwargs) -> tuple[str, list[str]]:
    """The matrix the request shows (the page's CSRF token differs every
    time), and the queries it made that read cells."""
    with CaptureQueriesContext(connection) as ctx:
        body = client.get(*args, **kwargs).content.decode()
    if '<div id="matrix"' in body:
        body = body[body.index('<div id="matrix"') : body.index("</table>")]
    return body, [q["sql"] for q in ctx.captured_queries if "matrix_cell" in q["sql"]]


@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx rows"])
def test_an_open_operator_is_kept_and_shows_a_new_result_at_once(
    client, results, device_types, toolchains, htmx
):
    second = results["second"]
    name = second.operator.name
    extra = htmx_rows(name) if htmx else {}
    url = reverse("matrix")
    first, reads = cell_reads(client, url, {"open": name}, **extra)
    assert reads and "k-fail" in shape_row(first, second)
    again, reads = cell_reads(client, url, {"open": name}, **extra)
    assert again == first and reads == []
    record(second, device_types["cuda"], toolchains[1], Status.PASS)
    after, reads = cell_reads(client, url, {"open": name}, **extra)
    assert reads and "k-fail" not in shape_row(after, second)


def test_a_filtered_table_swap_is_kept_until_a_result(
    client, results, device_types, toolchains
):
    params = {"status": "pass"}
    extra = {**HTMX, "HTTP_HX_TARGET": "matrix"}
    first, _ = cell_reads(client, reverse("matrix"), params, **extra)
    assert first.lstrip().startswith('<div id="matrix"')
    again, reads = cell_reads(client, reverse("matrix"), params, **extra)
    assert again == first and reads == []
    record(results["second"], device_types["c"], toolchains[1], Status.PASS)
    after, reads = cell_reads(client, reverse("matrix"), params, **extra)
    assert reads and after != first


def test_an_unknown_operator_opens_nothing_and_fills_no_cache(client, results):
    collapsed, _ = cell_reads(client, reverse("matrix"))
    made_up, _ = cell_reads(client, reverse("matrix"), {"open": "no-such-op"})
    # Named, as every unknown filter value is, and otherwise the same page.
    notice = (
        '<p class="notice" role="status">'
        "No operator “no-such-op” to open: none has that name.</p>"
    )
    assert notice in made_up and made_up.replace(notice, "") == collapsed
    # Like an unknown status, it is not kept: made-up names cannot fill the
    # cache, and the known page is still read from it.
    again, reads = cell_reads(client, reverse("matrix"))
    assert again == collapsed and reads == []
    response = client.get(reverse("matrix"), **htmx_rows("no-such-op"))
    assert response.status_code == 404
