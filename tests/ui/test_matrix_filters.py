"""Search and filters kept in the URL, several open operators, unknown
values named alike on every page, speed-ups and compile-only progress in
the matrix, and its CSV export."""

from __future__ import annotations

import csv
import io

import pytest
from django.urls import reverse

from matrix.models import DeviceType, ServedCall, Shape, Status
from tests.ui.conftest import record

pytestmark = pytest.mark.django_db


def expanded(body: str) -> list[str]:
    """The names of the operators shown open."""
    return [
        part.split('"', 1)[0]
        for part in body.split('<tbody id="op-')[1:]
        if part.split(">", 1)[0].endswith(' open"')
    ]


def test_a_permalink_opens_every_operator_it_names(client, results):
    body = client.get("/?open=gemm&open=softmax").content.decode()
    assert expanded(body) == ["gemm", "softmax"]
    # Each toggle keeps the others open: closing gemm leaves softmax open.
    assert 'href="/?toolchain=tl-0.1.15&amp;open=softmax"' in body
    # Opening rmsnorm adds it to both.
    assert (
        'href="/?toolchain=tl-0.1.15&amp;open=gemm&amp;open=softmax&amp;open=rmsnorm"'
        in (body)
    )


def test_the_filter_form_keeps_the_open_operators(client, results):
    body = client.get("/?open=gemm&open=softmax").content.decode()
    assert '<input type="hidden" name="open" value="gemm">' in body
    assert '<input type="hidden" name="open" value="softmax">' in body


def test_an_operator_that_cannot_open_is_named(client, results):
    body = client.get("/?open=gemm&open=conv").content.decode()
    assert expanded(body) == ["gemm"]
    assert "No operator “conv” to open: none has that name." in body


@pytest.mark.parametrize(
    ("params", "note"),
    [
        ({"status": "bogus"}, "Unknown status “bogus”: showing every status instead."),
        ({"toolchain": "nope"}, "Unknown toolchain “nope”: showing tl-0.1.15 instead."),
        ({"model": "gpt-9"}, "Unknown model “gpt-9”: showing every model instead."),
        (
            {"operator": "conv"},
            "Unknown operator “conv”: showing every operator instead.",
        ),
        (
            {"device": "77"},
            "Unknown device type “77”: showing every device type instead.",
        ),
        ({"dtype": "fp4"}, "Unknown dtype “fp4”: showing every dtype instead."),
        (
            {"served": "maybe"},
            "Unknown served “maybe”: showing every shape, served or not",
        ),
        (
            {"q": "M" * 201},
            "is longer than 200 characters: showing every shape instead.",
        ),
    ],
)
@pytest.mark.parametrize(
    "page", ["matrix", "gaps", "models", "operator", "matrix-csv", "errors"]
)
def test_an_unknown_filter_value_is_named_on_every_page(
    client, results, page, params, note
):
    url = reverse(page, args=["gemm"]) if page == "operator" else reverse(page)
    response = client.get(url, params)
    body = response.content.decode()
    if page == "matrix-csv" and "toolchain" in params:
        # A script asking for a toolchain must not get another one's rows.
        assert response.status_code == 404
        assert "no toolchain named 'nope'" in body
        return
    assert response.status_code == 200
    if page == "matrix-csv":
        # A file has no notice: the unknown value is dropped, as on the page.
        assert body.startswith("operator,dims,dtype")
    elif page == "errors" and "toolchain" not in params:
        # The error groups read only the toolchain.
        assert note not in body
    elif page == "operator" and "operator" in params:
        # The operator page is the operator's: the filter does not apply.
        assert note not in body
    else:
        assert note in body


def test_operator_and_shape_text_filter_the_rows(client, results):
    response = client.get("/", {"operator": "gemm", "q": "M=1,", "open": "gemm"})
    body = response.content.decode()
    assert [r.operator.name for r in response.context["summary"].rows] == ["gemm"]
    shapes = [
        r.shape.dims_key
        for r in next(
            r for r in response.context["summary"].rows if r.operator.name == "gemm"
        ).expanded["rows"]
    ]
    assert shapes and all(s.startswith("M=1,") for s in shapes)
    assert 'value="M=1,"' in body  # the search box keeps its text


def test_the_model_filter_keeps_the_models_shapes(client, results):
    top = results["top"]
    ServedCall.objects.create(source="alpha", shape=top, tokens=1, calls=3)
    response = client.get("/", {"model": "alpha", "open": top.operator.name})
    rows = response.context["summary"].rows
    assert [(r.operator.name, r.shape_count) for r in rows] == [(top.operator.name, 1)]


def test_the_device_filter_keeps_one_column(client, results, device_types):
    response = client.get("/", {"device": device_types["hip"].pk})
    assert [d.backend for d in response.context["summary"].device_types] == ["hip"]


def test_a_passing_cell_shows_its_speed_up_marked_without_colour(
    client, results, device_types, toolchains
):
    _, current = toolchains
    slow = results["third"]
    record(
        slow, device_types["c"], current, Status.PASS, kernel_ms=1.0, reference_ms=0.69
    )
    body = client.get("/", {"open": "gemm", "backend": "c"}).content.decode()
    assert (
        '<span class="sp sp-faster"><span aria-hidden="true">▲</span>2.25×</span>'
        in body
    )
    assert (
        '<span class="sp sp-slower"><span aria-hidden="true">▼</span>0.69×</span>'
        in body
    )
    assert (
        "0.69× the reference&#x27;s speed (1 ms against 0.69 ms); production keeps the reference"
        in body
    )


def test_a_ratio_just_below_the_floor_does_not_round_up_to_it():
    from matrix.serving import ratio_text

    assert ratio_text(0.9499, 0.95) == "0.9499×"
    assert ratio_text(0.9449, 0.95) == "0.94×"
    assert ratio_text(0.95, 0.95) == "0.95×"
    assert ratio_text(1.0412, 0.95) == "1.04×"


def test_an_operator_row_counts_every_status(client, results, device_types, toolchains):
    _, current = toolchains
    metal = device_types["metal"]
    for s in Shape.objects.filter(operator__name="softmax"):
        record(s, metal, current, Status.UNSUPPORTED)
    for s in Shape.objects.filter(operator__name="rmsnorm"):
        record(s, device_types["hip"], current, Status.LOWERED)
    body = client.get("/", {"backend": "metal"}).content.decode()
    softmax = body.split('id="op-softmax"')[1].split("</tbody>")[0]
    assert 'title="5 unsup."' in softmax
    assert "5/5 unsup." in softmax and "0/5" not in softmax
    body = client.get("/", {"backend": "hip"}).content.decode()
    rmsnorm = body.split('id="op-rmsnorm"')[1].split("</tbody>")[0]
    assert "5/5 lowered" in rmsnorm and 'title="5 lowered"' in rmsnorm


def test_a_column_reads_compile_only_progress_as_such(
    client, results, device_types, toolchains
):
    _, current = toolchains
    hip = device_types["hip"]
    for s in Shape.objects.all():
        record(s, hip, current, Status.LOWERED)
    response = client.get("/", {"backend": "hip"})
    counts = response.context["column_counts"]
    assert f"{Shape.objects.count()}/{Shape.objects.count()} lowered" in counts


def test_the_matrix_exports_csv_and_links_json(client, results, device_types):
    body = client.get("/", {"backend": "c"}).content.decode()
    assert 'href="/matrix.csv?toolchain=tl-0.1.15&amp;backend=c"' in body
    assert (
        'href="/api/v1/matrix?toolchain=tl-0.1.15&amp;backend=c&amp;limit=5000"' in body
    )
    response = client.get(reverse("matrix-csv"), {"backend": "c", "status": "pass"})
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert len(rows) == 1
    (row,) = rows
    assert (
        row["operator"],
        row["dims"],
        row["status"],
        row["speedup"],
        row["serves"],
    ) == (
        "gemm",
        results["top"].dims_key,
        "pass",
        "2.25",
        "tilelang",
    )
    assert row["url"].startswith("http://testserver/cells/")


def test_the_matrix_csv_quotes_names_that_look_like_formulas(
    client, results, device_types, toolchains
):
    DeviceType.objects.filter(pk=device_types["c"].pk).update(vendor="=HYPERLINK(1)")
    response = client.get(reverse("matrix-csv"), {"backend": "c"})
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert rows and all(r["device_type"].startswith("'=HYPERLINK(1)") for r in rows)
    for line in response.content.decode().splitlines()[1:]:
        assert not line.startswith(("=", "+", "-", "@"))


@pytest.mark.parametrize("name", ["matrix-csv", "models-csv", "gaps-csv"])
def test_a_csv_of_a_toolchain_this_server_lacks_is_a_404_naming_it(
    client, results, name
):
    response = client.get(reverse(name), {"toolchain": "nope"})
    assert response.status_code == 404
    body = response.content.decode()
    assert "no toolchain named 'nope'" in body and "tl-0.1.15" in body
