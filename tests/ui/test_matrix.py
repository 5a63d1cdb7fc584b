from __future__ import annotations

import pytest
from django.urls import reverse

from matrix.models import Shape

pytestmark = pytest.mark.django_db


def test_it_shows_every_operator_with_counts_per_device_type(client, results):
    response = client.get(reverse("matrix"))
    assert response.status_code == 200
    body = response.content.decode()
    for name in Shape.objects.values_list("operator__name", flat=True).distinct():
        assert f'id="op-{name}"' in body
    assert 'scope="colgroup"' in body and 'scope="col"' in body
    assert response["Vary"] and "HX-Request" in response["Vary"]


def test_an_expanded_operator_shows_its_served_shapes_first_with_status_text(
    client, results
):
    top = results["top"]
    response = client.get(reverse("matrix"), {"open": top.operator.name})
    body = response.content.decode()
    rows = body.split('class="shape-row"')
    assert len(rows) > 1
    assert top.dims_key in rows[1]
    # Colour and text: the first cell carries both the pass class and its
    # words, and its speed-up over the reference (0.9 ms / 0.40 ms).
    assert "k-pass" in rows[1] and "</span> pass " in rows[1]
    assert '<span aria-hidden="true">▲</span>2.25×' in rows[1]


def test_stale_cells_read_as_stale(client, results):
    fourth = results["fourth"]
    response = client.get(
        reverse("matrix"), {"open": fourth.operator.name, "status": "stale"}
    )
    body = response.content.decode()
    assert "stale-mark" in body
    assert fourth.dims_key in body


def test_the_htmx_expand_returns_only_that_operators_rows(client, results):
    top = results["top"]
    response = client.get(
        reverse("matrix"),
        {"open": top.operator.name},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET=f"op-{top.operator.name}",
    )
    body = response.content.decode()
    assert body.lstrip().startswith("<tbody")
    assert body.count("<tbody") == 1
    assert "<html" not in body


def test_a_filter_change_returns_the_table_only(client, results):
    response = client.get(
        reverse("matrix"),
        {"backend": "cuda", "dtype": "float16"},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="matrix",
    )
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="matrix"')
    assert "MI300X" not in body and "H200" in body


def test_status_filter_keeps_only_rows_with_that_status(client, results):
    second = results["second"]
    response = client.get(
        reverse("matrix"), {"open": second.operator.name, "status": "compile_error"}
    )
    body = response.content.decode()
    shape_rows = body.count('class="shape-row"')
    assert shape_rows >= 1
    assert shape_rows < Shape.objects.filter(operator=second.operator).count()


def test_the_page_stays_within_eleven_queries(
    client, results, django_assert_max_num_queries, viewer
):
    """Signing in (3), the catalogue (4), the data version the page is kept
    under, the newest result of each column and the page's own (4); a
    repeat view costs signing in and the data version."""
    client.force_login(viewer)
    # Three more read the filter form's choices, shared by every page for
    # a few seconds (the cache is empty here), and one the data version
    # the page is kept under; a repeat view reads the page from the cache.
    params = {"open": results["top"].operator.name}
    with django_assert_max_num_queries(15):
        client.get(reverse("matrix"), params)
    with django_assert_max_num_queries(4):
        client.get(reverse("matrix"), params)


def test_an_outsider_sees_the_matrix_read_only(client, outsider, results):
    client.force_login(outsider)
    response = client.get(reverse("matrix"))
    assert response.status_code == 200
    assert "Run missing" not in response.content.decode()


def test_it_refuses_post(client, owner):
    client.force_login(owner)
    assert client.post(reverse("matrix")).status_code == 405


def test_a_new_result_shows_at_once_despite_the_cached_table(
    client, results, device_types, toolchains
):
    from tests.ui.conftest import record

    def table():
        page = client.get(reverse("matrix")).content.decode()
        return page[page.index('<div id="matrix"') : page.index("</table>")]

    before = table()
    assert table() == before
    record(results["fourth"], device_types["metal"], toolchains[1], "pass")
    after = table()
    assert after != before
    # One more passing cell in the page-wide count.
    passing = before.split('class="count">', 2)[2].split(" /")[0]
    assert after.split('class="count">', 2)[2].split(" /")[0] == str(int(passing) + 1)


def test_a_repeat_view_reads_no_cell_or_catalogue_table(client, results, viewer):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.force_login(viewer)
    client.get(reverse("matrix"))
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(reverse("matrix"))
    tables = ("matrix_cell", "matrix_operator", "matrix_shape", "matrix_devicetype")
    read = [
        q["sql"] for q in ctx.captured_queries if any(t in q["sql"] for t in tables)
    ]
    assert read == []
    assert 'id="op-gemm"' in response.content.decode()


def test_a_signed_in_repeat_view_costs_three_queries(
    client, results, viewer, django_assert_num_queries, settings
):
    """Session, the user with its role check, the data version: the table
    itself comes from the cache, and the navigation asks nothing more."""
    settings.TILEMATRIX_ANONYMOUS_READ = False  # as deployed
    client.force_login(viewer)
    client.get(reverse("matrix"))
    with django_assert_num_queries(3):
        response = client.get(reverse("matrix"))
    assert 'id="op-gemm"' in response.content.decode()


def test_only_the_admin_role_is_offered_the_admin_site(
    client, results, viewer, django_user_model
):
    from django.contrib.auth.models import Group

    client.force_login(viewer)
    admin_url = reverse("admin:index")
    assert f'href="{admin_url}"' not in client.get(reverse("matrix")).content.decode()
    admin = django_user_model.objects.create_user("an-admin", password="x-pass-123")
    admin.groups.add(Group.objects.get(name="admin"))
    client.force_login(admin)
    assert f'href="{admin_url}"' in client.get(reverse("matrix")).content.decode()


def test_catalogue_names_in_the_table_are_escaped(client, results):
    from matrix.models import DeviceType

    DeviceType.objects.create(
        vendor="<b>Acme</b>", model='X"1', arch="<i>a</i>", backend="cuda"
    )
    body = client.get(reverse("matrix")).content.decode()
    assert "&lt;b&gt;Acme&lt;/b&gt; X&quot;1" in body
    assert "<small>&lt;i&gt;a&lt;/i&gt;</small>" in body
    assert "<b>Acme</b>" not in body


def test_signed_in_pages_still_render_while_the_session_cache_is_down(
    client, results, viewer, settings
):
    settings.TILEMATRIX_ANONYMOUS_READ = False
    settings.SESSION_ENGINE = "matrix.sessions"
    settings.SESSION_CACHE_ALIAS = "sessions"
    settings.CACHES = {
        **settings.CACHES,
        "sessions": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    client.force_login(viewer)
    # Then the cache goes away: nothing listens on port 1.
    settings.CACHES = {
        **settings.CACHES,
        "sessions": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"socket_connect_timeout": 0.5},
        },
    }
    response = client.get(reverse("matrix"))
    assert response.status_code == 200
    assert viewer.username in response.content.decode()


def test_cell_groups_name_the_operator_of_a_revision_the_catalogue_lacks(results):
    from matrix import queries
    from matrix.models import Cell, DeviceType

    filters = queries.MatrixFilters.from_params({}, queries.toolchain_list())
    groups = queries.cell_groups(filters, list(DeviceType.objects.all()), {})
    cells = Cell.objects.filter(toolchain=filters.toolchain)
    assert sum(n for *_, n in groups) == cells.count()
    assert {(op, rev) for op, rev, *_ in groups} == {
        (c.revision.operator_id, c.revision_id) for c in cells
    }


def shape_row(body: str, shape) -> str:
    """The expanded row of one shape × dtype."""
    return next(r for r in body.split('class="shape-row"')[1:] if shape.dims_key in r)


@pytest.mark.parametrize(
    ("tilelang", "stale"),
    [
        ("0.1.9", True),  # older: 9 < 15, though "0.1.9" > "0.1.15" as text
        ("0.1.15", False),  # another host's build of the current release
        ("0.1.16", False),  # an upgrade candidate: newer, not superseded
    ],
)
def test_only_an_older_toolchain_makes_its_results_stale_on_every_page(
    client, results, device_types, toolchains, cpu_runner, tilelang, stale
):
    from matrix.services import toolchain_register
    from tests.ui.conftest import record

    top = results["top"]
    other = toolchain_register(
        name=f"tl-{tilelang}-host", components={"tilelang": tilelang, "host": "b"}
    )
    cpu_runner.runnertoolchain_set.update(toolchain=other)
    record(top, device_types["c"], other, "pass")
    params = {"toolchain": other.name, "backend": "c"}

    page = client.get(reverse("matrix"), {**params, "open": top.operator.name})
    assert ("stale-mark" in shape_row(page.content.decode(), top)) is stale
    gaps = client.get(reverse("gaps"), params).context["gaps"]
    assert any(g.shape_id == top.pk for g in gaps) is stale
    api = client.get("/api/v1/matrix", {**params, "operator": top.operator.name})
    cell = next(
        c for c in api.json()["cells"] if c["url"].startswith(f"/cells/{top.pk}/")
    )
    assert cell["stale"] is stale


def test_the_baseline_of_a_rolled_out_upgrade_is_superseded(
    client, results, device_types, toolchains, django_user_model
):
    from django.core.cache import cache

    from matrix.models import UpgradeProposal
    from matrix.services import toolchain_register
    from tests.ui.conftest import record

    old, current = toolchains
    top = results["top"]
    # The current release, upgraded away from all the same (a new CUDA, say).
    baseline = toolchain_register(
        name="tl-0.1.15-cuda12", components={"tilelang": "0.1.15", "cuda": "12"}
    )
    record(top, device_types["c"], baseline, "pass")
    params = {"toolchain": baseline.name, "open": top.operator.name, "backend": "c"}
    assert "stale-mark" not in shape_row(
        client.get(reverse("matrix"), params).content.decode(), top
    )
    UpgradeProposal.objects.create(
        baseline=baseline,
        candidate=current,
        proposer=django_user_model.objects.create_user("proposer"),
        state=UpgradeProposal.State.ROLLED_OUT,
    )
    cache.clear()  # the catalogue, toolchains included, is kept for seconds
    assert "stale-mark" in shape_row(
        client.get(reverse("matrix"), params).content.decode(), top
    )


def test_a_backend_without_device_types_says_so(client, results):
    response = client.get(reverse("matrix"), {"backend": "npu"})
    assert response.status_code == 200
    body = response.content.decode()
    assert "No device types for this backend." in body
    assert '<table class="matrix"' not in body


def test_a_status_filter_matching_nothing_shows_the_empty_note(client, results):
    body = client.get(reverse("matrix"), {"status": "timeout"}).content.decode()
    assert "No shapes match these filters." in body
    assert 'id="op-' not in body


def test_a_status_filter_keeps_only_the_operators_with_such_cells(client, results):
    body = client.get(reverse("matrix"), {"status": "compile_error"}).content.decode()
    assert 'id="op-gemm"' in body
    assert 'id="op-rmsnorm"' not in body and 'id="op-softmax"' not in body


def test_a_summary_shows_the_pass_glyph_only_where_something_passes(client, results):
    body = client.get(reverse("matrix"), {"backend": "c"}).content.decode()
    gemm = body.split('id="op-gemm"')[1].split("</tbody>")[0]
    rmsnorm = body.split('id="op-rmsnorm"')[1].split("</tbody>")[0]
    # gemm's top shape passes on the CPU; nothing of rmsnorm has run.
    assert "✓1/5" in gemm
    assert "✓0/" not in rmsnorm and "</svg>0/5</span>" in rmsnorm
    assert "operator rows: ✓3/16 = 3 of 16 cells pass" in body


def test_show_more_says_how_many_rows_are_left(client, results):
    gemm = results["top"].operator.name
    some_left = client.get(reverse("matrix"), {"open": gemm, "rows": 2})
    assert "Show 2 more of the 3 left" in some_left.content.decode()
    last_ones = client.get(reverse("matrix"), {"open": gemm, "rows": 3})
    body = last_ones.content.decode()
    assert "Show the other 2 rows" in body and "rows=5" in body
    assert "showing the first 3 of 5" in body
    everything = client.get(reverse("matrix"), {"open": gemm, "rows": 5})
    assert "Show" not in everything.content.decode().split('id="op-gemm"')[1]


def test_an_unknown_toolchain_is_named_and_the_current_one_shown(client, results):
    response = client.get(reverse("matrix"), {"toolchain": "nope"})
    assert response.status_code == 200
    assert "Unknown toolchain “nope”: showing tl-0.1.15 instead." in (
        response.content.decode()
    )
    # The cached page without the unknown value carries no such notice.
    assert "Unknown toolchain" not in client.get(reverse("matrix")).content.decode()


def test_a_new_result_counts_its_own_column_again_and_no_other(
    client, results, device_types, toolchains, monkeypatch
):
    from matrix import queries
    from tests.ui.conftest import record

    counted = []
    count = queries.cell_group_rows

    def counting(filters, columns=None):
        counted.append(sorted(columns))
        return count(filters, columns)

    monkeypatch.setattr(queries, "cell_group_rows", counting)
    client.get(reverse("matrix"))
    assert counted == [
        sorted(device_types[b].pk for b in ("c", "cuda", "hip", "metal"))
    ]
    counted.clear()
    metal = device_types["metal"]
    record(results["fourth"], metal, toolchains[1], "pass")
    page = client.get(reverse("matrix")).content.decode()
    assert counted == [[metal.pk]]
    # The cell shows in its operator's metal column: 1 pass where none was.
    row = page[page.index(f'id="op-{results["fourth"].operator.name}"') :]
    assert "1 pass" in row[: row.index("</tbody>")]


def test_counts_kept_by_column_are_the_counts_of_the_cells(
    results, device_types, toolchains
):
    from matrix import queries
    from matrix.views.matrix import catalogue_read, kept_cell_groups
    from tests.ui.conftest import record

    # One catalogue for every filter: what a column's counts are kept by
    # must name the filters themselves.
    catalogue = catalogue_read({})

    def both(params):
        filters = queries.MatrixFilters.from_params(params, catalogue.toolchains)
        columns = queries.device_type_list(filters, catalogue.device_types)
        kept = kept_cell_groups(filters, columns, catalogue)
        return sorted(kept), sorted(queries.cell_groups(filters, columns))

    # One after another, so that counts kept for one filter would show
    # under the next if the filters were not part of what they are kept by.
    filters = [
        {},
        {"dtype": "float32"},
        {"served": "1"},
        {"backend": "cuda"},
        {"operator": results["fourth"].operator.name},
    ]
    counts = []
    for params in filters:
        kept, fresh = both(params)
        assert kept == fresh
        counts.append(fresh)
    # Filters that count differently, each after one that does not.
    assert all(a != b for a, b in zip(counts, counts[1:], strict=False))
    for shape in (results["top"], results["second"]):
        record(shape, device_types["cuda"], toolchains[1], "mismatch")
    record(results["third"], device_types["c"], toolchains[1], "pass")
    for params in filters:
        kept, fresh = both(params)
        assert kept == fresh
