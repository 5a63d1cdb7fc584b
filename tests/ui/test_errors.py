from __future__ import annotations

import pytest
from django.urls import reverse

from matrix import error_groups
from matrix.models import Shape, Status
from tests.ui.conftest import SIGNATURE, record

pytestmark = pytest.mark.django_db


def test_failures_are_grouped_by_signature_with_the_cells_they_touch(client, results):
    response = client.get(reverse("errors"))
    assert response.status_code == 200
    (group,) = response.context["groups"]
    assert group.signature == SIGNATURE and group.count == 2
    touched = {c.shape_id for c in group.cells}
    assert touched == {results["second"].pk, results["third"].pk}
    body = response.content.decode()
    assert f'id="sig-{SIGNATURE}"' in body
    assert "tile shape does not divide M" in body


def test_an_older_toolchain_has_no_failures(client, results):
    response = client.get(reverse("errors"), {"toolchain": "tl-0.1.13"})
    assert response.context["groups"] == []
    assert "No failing cells" in response.content.decode()


def test_errors_page_stays_within_eleven_queries(
    client, results, django_assert_max_num_queries
):
    # The cache is empty here: the toolchains and device types (kept a few
    # seconds for every page) are read too.
    with django_assert_max_num_queries(11):
        client.get(reverse("errors"))


def test_an_outsider_can_read_error_groups(client, outsider, results):
    client.force_login(outsider)
    assert client.get(reverse("errors")).status_code == 200


def test_it_refuses_post(client, owner):
    client.force_login(owner)
    assert client.post(reverse("errors")).status_code == 405


def test_an_unknown_toolchain_is_named_and_the_current_ones_errors_shown(
    client, results
):
    response = client.get(reverse("errors"), {"toolchain": "tl-9", "dtype": "fp4"})
    body = response.content.decode()
    assert "Unknown toolchain “tl-9”: showing tl-0.1.15 instead." in body
    # The page filters nothing by dtype, so it says nothing about one.
    assert "fp4" not in body
    assert response.context["groups"][0].signature == SIGNATURE


def test_a_group_names_every_operator_it_touches_not_only_those_listed(
    results, toolchains, device_types
):
    _, current = toolchains
    rmsnorm = Shape.objects.filter(operator__name="rmsnorm", served=True).first()
    record(
        rmsnorm,
        device_types["cuda"],
        current,
        Status.COMPILE_ERROR,
        error_signature=SIGNATURE,
        error_message="error: tile shape does not divide M",
    )
    failing, _ = error_groups.error_pages(current, per_group=2)
    (group,) = failing.groups
    assert (group.count, len(group.cells)) == (3, 2)
    assert group.operators == ["gemm", "rmsnorm"]


def test_unsupported_cells_are_apart_from_failures_in_plain_words(
    client, results, toolchains, device_types
):
    _, current = toolchains
    shape = Shape.objects.filter(operator__name="rmsnorm", served=True).first()
    record(
        shape,
        device_types["hip"],
        current,
        Status.UNSUPPORTED,
        error_signature="sig-dtype",
        error_message="rmsnorm supports ['float16', 'float32'], not bfloat16",
    )
    response = client.get(reverse("errors"))
    assert [g.signature for g in response.context["groups"]] == [SIGNATURE]
    body = response.content.decode()
    failing, apart = body.split('id="unsupported-heading"')
    assert "sig-dtype" not in failing
    assert "rmsnorm supports float16 and float32, not bfloat16" in apart
    assert "[" not in apart.split('class="error-message">')[1].split("</pre>")[0]
    # Its groups sit under its heading in the outline.
    assert '<h3 id="h-sig-dtype">' in apart


@pytest.fixture
def many_groups(results, toolchains, device_types):
    """Besides the shared two-cell group: three one-cell failing groups and
    two unsupported ones."""
    _, current = toolchains
    shapes = iter(Shape.objects.exclude(pk__in=[r.pk for r in results.values()]))
    for i in range(3):
        record(
            next(shapes), device_types["cuda"], current, Status.MISMATCH,
            error_signature=f"sig-{i}", error_message=f"mismatch number {i}",
        )  # fmt: skip
    for i in range(2):
        record(
            next(shapes), device_types["metal"], current, Status.UNSUPPORTED,
            error_signature=f"declared-{i}", error_message=f"no metal kernel {i}",
        )  # fmt: skip


def walk(client, cursor_name, section, params=None):
    """Signatures of a section page after page, following its next link."""
    seen, cursor = [], ""
    for _ in range(10):
        query = {**(params or {}), **({cursor_name: cursor} if cursor else {})}
        page = client.get(reverse("errors"), query).context[section]
        seen += [g.signature for g in page.groups]
        if page.next is None:
            return seen
        cursor = page.next
    raise AssertionError("the pages never ended")


def test_error_groups_come_a_page_at_a_time_largest_first(
    client, many_groups, monkeypatch
):
    monkeypatch.setattr(error_groups, "GROUPS_PER_PAGE", 2)
    first = client.get(reverse("errors"))
    page = first.context["failing"]
    assert [g.signature for g in page.groups] == [SIGNATURE, "sig-0"]
    assert (page.signatures, page.cells, page.left) == (4, 5, 2)
    body = first.content.decode()
    assert "5 failing cells in 4 groups, groups 1–2 shown" in body
    assert "after=" in body and "(2 left)" in body
    assert walk(client, "after", "failing") == [SIGNATURE, "sig-0", "sig-1", "sig-2"]
    assert walk(client, "unsupported_after", "unsupported") == [
        "declared-0",
        "declared-1",
    ]


def test_a_page_cursor_holds_its_place_when_groups_grow(
    client, many_groups, monkeypatch, toolchains, device_types
):
    monkeypatch.setattr(error_groups, "GROUPS_PER_PAGE", 2)
    cursor = client.get(reverse("errors")).context["failing"].next
    # sig-2 grows past everything before the cursor was taken.
    _, current = toolchains
    for shape in Shape.objects.filter(cells__isnull=True)[:3]:
        record(
            shape, device_types["hip"], current, Status.MISMATCH,
            error_signature="sig-2", error_message="mismatch number 2",
        )  # fmt: skip
    later = client.get(reverse("errors"), {"after": cursor}).context["failing"]
    assert [g.signature for g in later.groups] == ["sig-1"]


def test_a_made_up_cursor_shows_the_first_page(client, many_groups):
    page = client.get(reverse("errors"), {"after": "not a cursor"})
    assert page.status_code == 200
    assert page.context["failing"].groups[0].signature == SIGNATURE


def test_a_new_failure_shows_on_the_next_errors_request(
    client, results, toolchains, device_types
):
    assert [g.signature for g in client.get(reverse("errors")).context["groups"]] == [
        SIGNATURE
    ]
    _, current = toolchains
    record(
        results["top"], device_types["hip"], current, Status.RUNTIME_ERROR,
        error_signature="sig-new", error_message="illegal address",
    )  # fmt: skip
    groups = client.get(reverse("errors")).context["groups"]
    assert {g.signature for g in groups} == {SIGNATURE, "sig-new"}


def test_a_repeated_errors_request_reads_no_cell(
    client, many_groups, django_assert_max_num_queries
):
    client.get(reverse("errors"))
    # The toolchains and the data version: the groups come from the cache.
    with django_assert_max_num_queries(2):
        client.get(reverse("errors"))


def test_a_signature_failing_and_unsupported_is_two_groups_each_with_its_own_cells(
    results, toolchains, device_types
):
    _, current = toolchains
    shape = Shape.objects.filter(operator__name="rmsnorm", served=True).first()
    record(
        shape,
        device_types["hip"],
        current,
        Status.UNSUPPORTED,
        error_signature=SIGNATURE,
        error_message="rmsnorm has no hip kernel",
    )
    failing, unsupported = error_groups.error_pages(current)
    (fails,) = failing.groups
    (declared,) = unsupported.groups
    assert fails.signature == declared.signature == SIGNATURE
    assert (fails.count, declared.count) == (2, 1)
    assert {c.shape_id for c in fails.cells} == {
        results["second"].pk,
        results["third"].pk,
    }
    assert [(c.shape_id, c.status) for c in declared.cells] == [
        (shape.pk, Status.UNSUPPORTED)
    ]
    assert fails.operators == ["gemm"] and declared.operators == ["rmsnorm"]
    assert Status.UNSUPPORTED not in fails.statuses
    assert declared.statuses == [Status.UNSUPPORTED]
    assert declared.message == "rmsnorm has no hip kernel"
