from __future__ import annotations

import pytest
from django.urls import reverse

from matrix import queries
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


def test_errors_page_stays_within_ten_queries(
    client, results, django_assert_max_num_queries
):
    with django_assert_max_num_queries(10):
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
    (group,) = queries.error_groups(current, per_group=2)
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
