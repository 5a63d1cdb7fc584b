from __future__ import annotations

import hashlib
import json
import re

import pytest
from django.urls import reverse

from matrix.models import Status
from tests.ui.conftest import SIGNATURE, record

pytestmark = pytest.mark.django_db


def cell_url(shape, backend, device_types, name="cell"):
    return reverse(name, args=[shape.pk, device_types[backend].pk])


def test_it_shows_the_evidence_of_the_latest_result(client, results, device_types):
    response = client.get(cell_url(results["top"], "c", device_types))
    assert response.status_code == 200
    body = response.content.decode()
    assert "k_main" in body  # generated kernel source
    assert "float16 accumulates in float32" in body  # tolerance reason
    assert "f" * 64 in body  # fingerprint
    assert "python -m runners.harness job.json" in body
    assert "<svg" in body and "<polyline" in body


def history_rows(body: str) -> list[str]:
    """The history table's rows, as their HTML."""
    table = body[body.index('<table class="list history">') :]
    table = table[: table.index("</table>")]
    return table.split('<tr><th scope="row">')[1:]


def test_history_spans_toolchains(client, results, device_types):
    response = client.get(cell_url(results["top"], "c", device_types))
    rows = history_rows(response.content.decode())
    assert len(rows) == 3
    assert {re.search(r"<td>TileLang ([\d.]+) ", r).group(1) for r in rows} == {
        "0.1.13",
        "0.1.15",
    }


def failing_with_the_signature(shape, device_type, toolchain):
    """Another cell failing with the fixture's error signature."""
    record(
        shape,
        device_type,
        toolchain,
        Status.COMPILE_ERROR,
        error_signature=SIGNATURE,
        error_message="error: tile shape does not divide M",
    )


def test_an_error_names_how_many_other_cells_share_its_signature(
    client, results, device_types
):
    response = client.get(cell_url(results["second"], "cuda", device_types))
    body = response.content.decode()
    assert "shared by" in body and "1 other cell" in body
    assert "tile shape does not divide M" in body


def test_the_shared_count_agrees_with_the_error_group_it_links(
    client, results, toolchains, device_types
):
    old, _ = toolchains
    failing_with_the_signature(results["fourth"], device_types["cuda"], old)
    cell = client.get(cell_url(results["second"], "cuda", device_types))
    assert "1 other cell</a>" in cell.content.decode()
    errors = client.get(reverse("errors"), {"toolchain": "tl-0.1.15"})
    assert f"<code>{SIGNATURE}</code> · 2 cells" in errors.content.decode()


def test_an_older_toolchain_reads_as_stale(client, results, device_types):
    response = client.get(
        cell_url(results["top"], "c", device_types), {"toolchain": "tl-0.1.13"}
    )
    assert "↻ stale</span>: its toolchain is superseded" in response.content.decode()


def test_a_cell_run_on_a_superseded_revision_names_both_revisions(
    client, results, device_types
):
    fourth = results["fourth"]
    current = fourth.operator.current_revision("hip").source_sha256
    response = client.get(cell_url(fourth, "hip", device_types))
    body = response.content.decode()
    ran = hashlib.sha256(b"old").hexdigest()
    assert (
        f"↻ stale</span>: it ran kernel revision <code>{ran[:12]}</code>, and the "
        f"one current on ROCm (HIP) is <code>{current[:12]}</code> (library)"
    ) in body
    assert "toolchain is superseded" not in body


def test_the_way_back_to_the_matrix_keeps_the_toolchain(client, results, device_types):
    top = results["top"]
    response = client.get(cell_url(top, "c", device_types), {"toolchain": "tl-0.1.13"})
    back = f'href="/?toolchain=tl-0.1.13&amp;open={top.operator.name}">Matrix</a>'
    assert back in response.content.decode()


def test_an_unknown_toolchain_is_named_and_the_current_one_shown(
    client, results, device_types
):
    response = client.get(
        cell_url(results["top"], "c", device_types), {"toolchain": "tl-9"}
    )
    body = response.content.decode()
    assert "Unknown toolchain “tl-9”: showing tl-0.1.15 instead." in body
    assert "Latest result on TileLang 0.1.15" in body


def test_the_job_download_reproduces_the_cell(client, results, device_types):
    top = results["top"]
    response = client.get(cell_url(top, "c", device_types, "cell-job"))
    assert response["Content-Disposition"] == 'attachment; filename="job.json"'
    job = json.loads(response.content)
    assert job["operator"] == top.operator.name
    assert job["shape"] == top.dims and job["dtype"] == top.dtype
    assert job["target"] == {"kind": "c"}


def test_a_cell_never_run_still_offers_a_job(client, results, device_types):
    response = client.get(cell_url(results["second"], "metal", device_types))
    assert response.status_code == 200
    assert "never been run" in response.content.decode()


def test_an_unknown_cell_is_404(client, results, device_types):
    assert client.get(reverse("cell", args=[999999, 1])).status_code == 404


def test_an_outsider_can_read_a_cell(client, outsider, results, device_types):
    client.force_login(outsider)
    assert client.get(cell_url(results["top"], "c", device_types)).status_code == 200


def test_it_refuses_post(client, owner, results, device_types):
    client.force_login(owner)
    assert client.post(cell_url(results["top"], "c", device_types)).status_code == 405
    url = cell_url(results["top"], "c", device_types, "cell-job")
    assert client.post(url).status_code == 405


def test_a_cell_page_stays_within_thirteen_queries(
    client, results, device_types, django_assert_max_num_queries
):
    # One reads the operator's other shapes for the across-shapes chart,
    # four the toolchains, device types, toolchains' hosts and the filter
    # choices (shared by every page for a few seconds; the cache is empty
    # here), one the data version the rendered page is kept under.
    with django_assert_max_num_queries(13):
        client.get(cell_url(results["second"], "cuda", device_types))


def test_a_failing_result_shows_its_source_and_error_within_the_same_queries(
    client, results, toolchains, device_types, django_assert_max_num_queries
):
    """Both texts, stored once each, are read with the cell's result."""
    _, current = toolchains
    record(
        results["fourth"],
        device_types["cuda"],
        current,
        Status.MISMATCH,
        error_signature="sig-mismatch",
        error_message="mismatch: 12 of 4096 elements outside tolerance",
        kernel_source="__global__ void k(float* A) { if (i < n) A[i] = 0; }",
    )
    with django_assert_max_num_queries(13):
        response = client.get(cell_url(results["fourth"], "cuda", device_types))
    body = response.content.decode()
    assert "mismatch: 12 of 4096 elements outside tolerance" in body
    assert "if (i &lt; n) A[i] = 0;" in body


def test_a_cell_page_is_rendered_once_per_data_version_and_a_new_result_shows(
    client, results, toolchains, device_types, django_assert_max_num_queries
):
    url = cell_url(results["top"], "c", device_types)
    first = client.get(url).content.decode()
    # Kept: only the address, the data version and the page's frame are read.
    with django_assert_max_num_queries(4):
        again = client.get(url).content.decode()
    # The same page, but for the frame's per-response CSRF token.
    token = re.compile(r'"X-CSRFToken": "\w+"')
    assert token.sub("", again) == token.sub("", first)
    _, current = toolchains
    record(
        results["top"],
        device_types["c"],
        current,
        Status.PASS,
        kernel_ms=0.3125,
        reference_ms=0.9,
    )
    after = client.get(url).content.decode()
    assert len(history_rows(after)) == len(history_rows(first)) + 1
    assert "<td>0.3125</td>" in history_rows(after)[0]


def test_a_result_in_another_column_leaves_a_kept_cell_page_as_it_was(
    client, results, toolchains, device_types, django_assert_max_num_queries
):
    # Under a sweep results arrive every few seconds, mostly elsewhere: a
    # page read again after each had cost most of the web workers' time.
    url = cell_url(results["top"], "c", device_types)
    client.get(url)
    _, current = toolchains
    record(results["fourth"], device_types["cuda"], current, Status.PASS)
    with django_assert_max_num_queries(4):
        client.get(url)


def test_a_result_of_another_shape_in_the_column_moves_the_cell_chart(
    client, results, toolchains, device_types
):
    # The chart places the cell among the operator's other shapes on its
    # device type and toolchain: one of them passing joins it.
    top = results["top"]
    url = cell_url(top, "c", device_types)
    chart = re.compile(r"across (\d+) shapes? of")
    before = int(chart.search(client.get(url).content.decode()).group(1))
    other = (
        type(top)
        .objects.filter(operator=top.operator)
        .exclude(pk=top.pk)
        .order_by("pk")
        .first()
    )
    _, current = toolchains
    record(
        other, device_types["c"], current, Status.PASS, kernel_ms=0.2, reference_ms=0.5
    )
    after = int(chart.search(client.get(url).content.decode()).group(1))
    assert after == before + 1


def test_a_kept_cell_page_counts_a_new_cell_sharing_its_signature(
    client, results, toolchains, device_types
):
    url = cell_url(results["second"], "cuda", device_types)
    assert "1 other cell</a>" in client.get(url).content.decode()
    _, current = toolchains
    failing_with_the_signature(results["fourth"], device_types["cuda"], current)
    assert "2 other cells</a>" in client.get(url).content.decode()


def receipt_for(result, runner, issued_at: str):
    from matrix.fleet.models import Receipt

    return Receipt.objects.create(
        result=result,
        runner=runner,
        nonce=f"n{result.pk}",
        signature="ab" * 64,
        issued_at=issued_at,
    )


def test_a_result_shows_when_its_runner_signed_it_not_when_it_was_stored(
    client, results, device_types, toolchains, cpu_runner
):
    """Evidence imported today from a run a day ago reads 'a day ago', with
    the signed time on hover."""
    from datetime import timedelta

    from django.utils import timezone

    _, current = toolchains
    signed = (timezone.now() - timedelta(days=1, hours=2)).replace(microsecond=0)
    result = record(
        results["second"],
        device_types["metal"],
        current,
        Status.PASS,
        kernel_ms=0.5,
        reference_ms=0.6,
    )
    receipt_for(result, cpu_runner, signed.isoformat())
    page = client.get(cell_url(results["second"], "metal", device_types))
    body = page.content.decode()
    stamp = signed.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f'title="{stamp}">1 d ago</time>, signed by cpu-host' in body
    assert "stored here" in body and ">just now</time>" in body
    # The history lists it by the same time.
    assert f'title="{stamp}">1 d ago</time>' in history_rows(body)[0]


def test_a_history_of_one_result_is_drawn_as_that_point(client, results, device_types):
    body = client.get(cell_url(results["top"], "cuda", device_types)).content.decode()
    # `top` on the H200 has one result, built only: no time to draw.
    assert "Kernel and reference time" not in body
    one = client.get(cell_url(results["fourth"], "hip", device_types)).content.decode()
    chart = one.split('aria-label="Kernel and reference time of 1 result"')[1]
    chart = chart.split("</svg>")[0]
    assert chart.count('<circle class="kernel mark"') == 1


def test_the_kernel_and_reference_times_share_one_chart(client, results, device_types):
    body = client.get(cell_url(results["top"], "c", device_types)).content.decode()
    chart = body.split('aria-label="Kernel and reference time of 3 results"')[1]
    chart = chart.split("</svg>")[0]
    # Three kernel points (circles), three reference points (squares).
    assert chart.count('<circle class="kernel mark"') == 3
    assert chart.count('<rect class="reference mark"') == 3
    assert 'polyline class="kernel"' in chart


def test_the_cell_is_marked_among_the_operators_shapes(
    client, results, device_types, toolchains
):
    _, current = toolchains
    cpu = device_types["c"]
    record(results["third"], cpu, current, Status.PASS, kernel_ms=2.0, reference_ms=1.0)
    body = client.get(cell_url(results["top"], "c", device_types)).content.decode()
    scatter = body.split('id="across-shapes"')[1].split("</svg>")[0]
    # This shape, faster, is the marked circle; the other, slower than the
    # floor, a downward triangle linking to its own cell.
    assert scatter.count('class="point faster this"') == 1
    assert scatter.count('class="point slower"') == 1
    assert (
        f'href="/cells/{results["third"].pk}/{cpu.pk}/?toolchain=tl-0.1.15"' in scatter
    )


def test_production_is_said_to_keep_the_reference_for_a_slow_pass(
    client, results, device_types, toolchains
):
    _, current = toolchains
    record(
        results["third"],
        device_types["c"],
        current,
        Status.PASS,
        kernel_ms=2.0,
        reference_ms=1.0,
    )
    body = client.get(cell_url(results["third"], "c", device_types)).content.decode()
    assert "▼</span>0.50×</span> the reference's speed" in body
    assert (
        "the PyTorch reference</strong> here: pass, but 0.50× of the reference" in body
    )


def test_the_cell_page_reads_one_kernel_source_and_no_revision_source(
    client, results, device_types
):
    """The latest result's kernel source is read with its cell, once; the
    history's rows and the revision (11-27 KB of library source) are not
    read whole."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        response = client.get(cell_url(results["top"], "c", device_types))
    assert response.status_code == 200
    assert len(history_rows(response.content.decode())) == 3
    sql = [q["sql"] for q in queries.captured_queries]
    assert not [s for s in sql if '"matrix_kernelrevision"."source"' in s]
    # Read whole (as a column, not two keys of it: the previous pass's
    # timing samples and code hash, for "since the pass before").
    whole = re.compile(r'"matrix_result"\."details"(,\s*"|\s+FROM)')
    assert len([s for s in sql if whole.search(s)]) == 1
    # The texts (source and error) are joined to the cell's own result, in
    # its one query: no query a text, none for the history's rows.
    texts = [s for s in sql if "matrix_blob" in s]
    assert len(texts) == 1 and 'FROM "matrix_cell"' in texts[0]
