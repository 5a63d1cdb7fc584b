"""GET /api/v1/matrix and /api/v1/gaps: what the pages show, as JSON."""

from __future__ import annotations

import pytest
from django.urls import reverse

from matrix.models import DeviceType, Shape, Status
from tests.ui.conftest import record

pytestmark = pytest.mark.django_db

MATRIX = "/api/v1/matrix"
GAPS = "/api/v1/gaps"


@pytest.fixture
def reader(client, viewer, settings):
    settings.TILEMATRIX_ANONYMOUS_READ = False  # as deployed
    client.force_login(viewer)
    return client


def cells_by_key(body):
    return {
        (c["operator"], tuple(sorted(c["dims"].items())), c["dtype"], c["backend"]): c
        for c in body["cells"]
    }


def key(shape, backend):
    return (
        shape.operator.name,
        tuple(sorted(shape.dims.items())),
        shape.dtype,
        backend,
    )


def test_the_matrix_lists_every_cell_never_run_ones_included(reader, results):
    body = reader.get(MATRIX).json()
    assert body["toolchain"]["name"] == "tl-0.1.15" and body["toolchain"]["current"]
    assert body["count"] == Shape.objects.count() * DeviceType.objects.count()
    cells = cells_by_key(body)
    top = cells[key(results["top"], "c")]
    # The latest of the three results on this toolchain.
    assert top["status"] == "pass" and top["kernel_ms"] == 0.40
    assert not top["stale"] and len(top["revision"]) == 64
    assert top["url"].startswith(f"/cells/{results['top'].pk}/")
    assert cells[key(results["fourth"], "hip")]["stale"]
    never = cells[key(results["top"], "metal")]
    assert never["status"] == "empty" and never["revision"] is None


def test_the_matrix_takes_the_pages_filters(reader, results):
    passing = reader.get(MATRIX, {"backend": "c", "status": "pass"}).json()
    assert [(c["backend"], c["status"]) for c in passing["cells"]] == [("c", "pass")]
    stale = reader.get(MATRIX, {"status": "stale"}).json()["cells"]
    assert [(c["operator"], c["backend"]) for c in stale] == [
        (results["fourth"].operator.name, "hip")
    ]
    served = reader.get(MATRIX, {"served": "true", "operator": "gemm"}).json()
    assert served["cells"] and all(
        c["served"] and c["operator"] == "gemm" for c in served["cells"]
    )
    # An older toolchain: everything it ran is superseded.
    old = reader.get(MATRIX, {"toolchain": "tl-0.1.13", "backend": "c"}).json()
    ran = [c for c in old["cells"] if c["status"] != "empty"]
    assert ran and all(c["stale"] for c in ran)


def test_the_matrix_pages_through_the_cells(reader, results):
    whole = reader.get(MATRIX).json()
    page = reader.get(MATRIX, {"limit": 7, "offset": 5}).json()
    assert page["count"] == whole["count"]
    assert page["cells"] == whole["cells"][5:12]


def test_the_gaps_are_the_gaps_pages_in_its_order(reader, results, cpu_runner):
    shown = reader.get(reverse("gaps")).context
    body = reader.get(GAPS).json()
    assert body["count"] == shown["gap_count"] == len(shown["gaps"])
    assert [(g["url"], g["reasons"], g["stage"]) for g in body["gaps"]] == [
        (
            f"/cells/{g.shape_id}/{g.device_type.pk}/?toolchain=tl-0.1.15",
            g.reasons,
            g.stage,
        )
        for g in shown["gaps"]
    ]
    assert body["runnable"] == shown["summary"].runnable
    assert body["reasons"]["no runner"] == sum(g.no_runner for g in shown["gaps"])
    # The kinds add up to the count; "no runner" overlaps them.
    kinds = ("missing", "stale", "failing", "not validated")
    assert sum(body["reasons"][k] for k in kinds) == body["count"]
    assert body["next"] is None


def test_the_next_link_pages_through_every_gap_once(reader, results, cpu_runner):
    whole = reader.get(GAPS).json()
    url, seen, pages = f"{GAPS}?limit=7", [], 0
    while url:
        page = reader.get(url).json()
        assert page["count"] == whole["count"]
        seen += page["gaps"]
        pages += 1
        url = page["next"]
        if url:
            assert url.startswith("http://testserver/api/v1/gaps?")
            assert "toolchain=tl-0.1.15" in url and "limit=7" in url
    assert seen == whole["gaps"] and pages == -(-whole["count"] // 7)


def test_a_cursor_stays_put_while_earlier_gaps_close(
    reader, results, cpu_runner, toolchains
):
    from tests.ui.conftest import record

    first = reader.get(GAPS, {"limit": 5, "backend": "c"}).json()
    # The first gap listed passes now: an offset would skip a row.
    top = first["gaps"][0]
    shape = Shape.objects.get(
        operator__name=top["operator"], dtype=top["dtype"], dims=top["dims"]
    )
    record(shape, DeviceType.objects.get(backend="c"), toolchains[1], "pass")
    second = reader.get(first["next"]).json()
    whole = reader.get(GAPS, {"backend": "c"}).json()["gaps"]
    assert second["gaps"] == whole[4:9]


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"cursor": "nope"}, "cursor is not one this API gave out"),
        ({"cursor": "WyJOYU4iXQ=="}, "cursor is not one this API gave out"),
        # A key of the right shape holding NaN, which compares with nothing.
        (
            {"cursor": "W05hTiwiYSIsImIiLCJjIiwxLjAsInYiLCJtIiwxXQ=="},
            "cursor is not one this API gave out",
        ),
        ({"cursor": "W10=", "offset": 3}, "give a cursor or an offset, not both"),
    ],
)
def test_a_bad_cursor_is_refused_in_one_sentence(reader, results, params, says):
    response = reader.get(GAPS, params)
    assert response.status_code == 400
    assert says in response.json()["detail"]


def test_the_schema_declares_paging(reader):
    schema = reader.get("/api/v1/openapi.json").json()
    operation = schema["paths"]["/api/v1/gaps"]["get"]
    assert "cursor" in {p["name"] for p in operation["parameters"]}
    gaps_out = schema["components"]["schemas"]["GapsOut"]["properties"]
    assert {"next", "count", "runnable", "reasons", "gaps"} <= set(gaps_out)


def test_a_covered_device_type_has_no_gaps(reader, results, cpu_runner):
    # Only the CPU column's top served shape passes; filtered to it, the
    # list names every other served cell of the column and not that one.
    body = reader.get(GAPS, {"backend": "c"}).json()
    assert body["count"] == Shape.objects.served().count() - 1
    assert all(g["backend"] == "c" for g in body["gaps"])


@pytest.mark.parametrize(
    ("params", "status", "says"),
    [
        ({"dtype": "fp8"}, 400, "dtype must be one of float16"),
        ({"backend": "cuda11"}, 400, "backend must be one of"),
        ({"status": "green"}, 400, "status must be one of"),
        ({"toolchain": "tl-9"}, 404, "no toolchain named"),
        (
            {"operator": "conv"},
            404,
            "no operator named 'conv'; known: gemm, rmsnorm, softmax",
        ),
        ({"limit": 0}, 422, "greater than or equal to 1"),
    ],
)
@pytest.mark.parametrize("url", [MATRIX, GAPS])
def test_bad_filters_get_a_clear_error(reader, results, url, params, status, says):
    response = reader.get(url, params)
    assert response.status_code == status
    assert says in response.content.decode()


@pytest.mark.parametrize("url", [MATRIX, GAPS])
def test_it_reads_as_the_pages_do(client, results, django_user_model, settings, url):
    settings.TILEMATRIX_ANONYMOUS_READ = False
    assert client.get(url).status_code == 401
    nobody = django_user_model.objects.create_user("norole", password="pw-123456")
    client.force_login(nobody)
    assert client.get(url).status_code == 403
    settings.TILEMATRIX_ANONYMOUS_READ = True
    client.logout()
    assert client.get(url).status_code == 200


@pytest.mark.parametrize("url", [MATRIX, GAPS])
def test_it_refuses_post(reader, url):
    assert reader.post(url).status_code == 405


@pytest.mark.parametrize("url", [MATRIX, GAPS])
def test_the_lists_stay_within_a_fixed_number_of_queries(
    reader, results, cpu_runner, django_assert_max_num_queries, url
):
    with django_assert_max_num_queries(10):
        assert reader.get(url).status_code == 200


def test_no_gap_of_a_superseded_toolchain_is_runnable(
    reader, results, cpu_runner, toolchains
):
    old, _ = toolchains
    cpu_runner.runnertoolchain_set.update(toolchain=old)
    body = reader.get(GAPS, {"toolchain": old.name, "backend": "c"}).json()
    assert body["count"] and body["runnable"] == 0
    assert not any(g["runnable"] for g in body["gaps"])


def all_pages(reader, params):
    """Every page of the matrix, following `next`."""
    pages, cursor = [], None
    while True:
        body = reader.get(MATRIX, {**params, **({"cursor": cursor} if cursor else {})})
        assert body.status_code == 200, body.content
        pages.append(body.json())
        cursor = pages[-1]["next"]
        if cursor is None:
            return pages


@pytest.mark.parametrize(
    "params", [{}, {"status": "pass"}, {"status": "empty"}, {"status": "stale"}]
)
def test_following_next_walks_the_whole_matrix_once(reader, results, params):
    whole = reader.get(MATRIX, {**params, "limit": 5000}).json()
    pages = all_pages(reader, {**params, "limit": 4})
    walked = [cell for page in pages for cell in page["cells"]]
    assert walked == whole["cells"]
    assert all(page["count"] == len(walked) for page in pages)
    assert whole["next"] is None


def test_a_cursor_holds_its_place_when_the_matrix_changes(
    reader, results, toolchains, device_types
):
    first = reader.get(MATRIX, {"limit": 6}).json()
    # A new served shape that sorts first, and a changed cell, between pages.
    gemm = results["top"].operator
    Shape.objects.create(
        operator=gemm, dims={"M": 8, "N": 8, "K": 8}, dtype="float16", served=True,
        weight=1e6,
    )  # fmt: skip
    record(results["top"], device_types["cuda"], toolchains[1], Status.MISMATCH)
    second = reader.get(MATRIX, {"limit": 6, "cursor": first["next"]}).json()
    before = [
        (c["operator"], c["dims"], c["dtype"], c["device_type"]) for c in first["cells"]
    ]
    after = [
        (c["operator"], c["dims"], c["dtype"], c["device_type"])
        for c in second["cells"]
    ]
    assert not set(map(repr, before)) & set(map(repr, after))
    whole = reader.get(MATRIX, {"limit": 5000}).json()["cells"]
    keys = [(c["operator"], c["dims"], c["dtype"], c["device_type"]) for c in whole]
    # The second page starts right where the first ended.
    assert keys[keys.index(before[-1]) + 1] == after[0]


def test_a_made_up_cursor_is_refused_in_words(reader, results):
    response = reader.get(MATRIX, {"cursor": "bm90LWEtY3Vyc29y"})
    assert response.status_code == 400
    assert "cursor" in response.json()["detail"]


def test_a_new_result_shows_on_the_next_matrix_request(
    reader, results, toolchains, device_types
):
    def status_of(body):
        return cells_by_key(body)[key(results["second"], "c")]["status"]

    assert status_of(reader.get(MATRIX, {"limit": 5000}).json()) == "empty"
    record(results["second"], device_types["c"], toolchains[1], Status.PASS)
    assert status_of(reader.get(MATRIX, {"limit": 5000}).json()) == "pass"


def test_an_unchanged_matrix_answers_304_until_a_result_arrives(
    reader, results, toolchains, device_types
):
    first = reader.get(MATRIX)
    etag = first["ETag"]
    again = reader.get(MATRIX, headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    record(results["second"], device_types["c"], toolchains[1], Status.PASS)
    changed = reader.get(MATRIX, headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed["ETag"] != etag
    assert changed.json()["cells"] != first.json()["cells"]


def test_a_repeated_matrix_request_is_answered_from_the_cache(
    reader, results, django_assert_max_num_queries
):
    reader.get(MATRIX)
    # The session, its user and their role; the toolchains and the data
    # version: nothing of the matrix itself.
    with django_assert_max_num_queries(5):
        assert reader.get(MATRIX).status_code == 200


def test_while_another_request_computes_a_new_matrix_a_reader_gets_the_one_before(
    reader, results, toolchains, device_types, monkeypatch
):
    """Under load: the answer to the version before, with that answer's own
    ETag, so the client asks again and gets the new one once it is kept."""
    from django.core.cache import cache

    from matrix import cache as reads

    first = reader.get(MATRIX)
    record(results["second"], device_types["c"], toolchains[1], Status.PASS)
    real_add = cache.add
    monkeypatch.setattr(
        cache,
        "add",
        lambda key, *a, **k: (
            False if key.endswith(":computing") else real_add(key, *a, **k)
        ),
    )
    monkeypatch.setattr(reads, "COMPUTE_WAIT_S", 0.05)
    earlier = reader.get(MATRIX)
    assert earlier.status_code == 200
    assert earlier.content == first.content and earlier["ETag"] == first["ETag"]
    monkeypatch.undo()
    fresh = reader.get(MATRIX, headers={"If-None-Match": first["ETag"]})
    assert fresh.status_code == 200 and fresh["ETag"] != first["ETag"]
    assert fresh.json()["cells"] != first.json()["cells"]


@pytest.mark.parametrize("url", [MATRIX, GAPS])
def test_the_next_request_after_a_new_current_toolchain_reads_it(
    reader, results, toolchains, url
):
    from matrix.models import Toolchain

    old, current = toolchains
    # The toolchains are read from lists kept a few seconds: warm them.
    assert reader.get(url).json()["toolchain"]["name"] == current.name
    Toolchain.objects.filter(pk=current.pk).update(is_current=False)
    Toolchain.objects.filter(pk=old.pk).update(is_current=True)
    toolchain = reader.get(url).json()["toolchain"]
    assert toolchain == {**toolchain, "name": old.name, "current": True}
