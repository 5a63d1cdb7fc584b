"""The neighbours of served shapes (each dim +1 and -1, 8 mod 16, a unit
leading dim, one trip of the last) become shapes of their own: the gaps
list them beside the served cells and Run missing plans them."""

from __future__ import annotations

from unittest import mock

import pytest
from django.core.management import call_command
from django.urls import reverse

from matrix.models import Shape, Sweep
from matrix.neighbours import neighbours

pytestmark = pytest.mark.django_db


def test_a_gemm_gets_its_boundaries_its_odd_sizes_a_unit_row_and_one_trip():
    assert neighbours("gemm", {"M": 4096, "N": 11008, "K": 4096}) == {
        "+1": {"M": 4097, "N": 11009, "K": 4097},
        "-1": {"M": 4095, "N": 11007, "K": 4095},
        "8 mod 16": {"M": 4088, "N": 11000, "K": 4088},
        "unit": {"M": 1, "N": 11008, "K": 4096},
        "one trip": {"M": 4096, "N": 11008, "K": 16},
    }


def test_attention_moves_only_its_batch_and_sequence():
    dims = {"B": 1, "H": 32, "HKV": 8, "S": 512, "D": 128}
    found = neighbours("attention_causal", dims)
    assert found["+1"] == {**dims, "B": 2, "S": 513}
    assert found["8 mod 16"] == {**dims, "S": 504}
    # B is 1 already: no unit neighbour; S of 512 within one trip is 16.
    assert "unit" not in found
    assert found["one trip"] == {**dims, "S": 16}
    assert all(n["H"] == 32 and n["D"] == 128 for n in found.values())


def test_a_neighbour_equal_to_its_shape_is_not_one():
    # M is 1 already, 8 is 8 mod 16 and within one trip.
    found = neighbours("softmax", {"M": 1, "N": 8})
    assert found == {"+1": {"M": 2, "N": 9}, "-1": {"M": 1, "N": 7}}


@pytest.fixture
def no_broker():
    with mock.patch("matrix.fleet.services.planning.jobs_publish"):
        yield


def test_the_gaps_list_the_neighbours_and_run_missing_plans_them(
    client, results, cpu_runner, sweeper, no_broker
):
    served = Shape.objects.served().count()
    before = client.get(reverse("gaps"), {"backend": "c"}).context["summary"].runnable

    call_command("shape_neighbours")
    again = Shape.objects.count()
    call_command("shape_neighbours")

    guards = Shape.objects.filter(guards=True)
    assert Shape.objects.count() == again  # a second run adds nothing
    assert guards.exists() and not guards.filter(served=True).exists()
    assert Shape.objects.served().count() == served
    shown = client.get(reverse("gaps"), {"backend": "c"}).context
    assert shown["summary"].runnable > before
    listed = {g.shape_id for g in shown["gaps"]}
    assert listed & set(guards.values_list("pk", flat=True))
    client.force_login(sweeper)
    client.post(reverse("gaps-run"), {"backend": "c"}, HTTP_HX_REQUEST="true")
    planned = set(Sweep.objects.get().jobs.values_list("shape_id", flat=True))
    assert planned & set(guards.values_list("pk", flat=True))
