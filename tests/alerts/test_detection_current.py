"""A served cell failing on the current toolchain, where it never passed,
while a newer TileLang release passes it with the same kernel revision: one
alert per error signature and toolchain (kind ``current``), whichever side
arrives first, shown "fixed on candidate". Results arrive through real
ingest, signed by a registered runner hosting both releases."""

from __future__ import annotations

import pytest

from matrix.alerts.reads import fixed_on_candidate
from matrix.gate.services import proposal_open
from matrix.models import DeviceType, Status, Toolchain
from matrix.models.alerts import Alert, AlertState, CauseKind

from .conftest import COMPILE_ERROR, new_revision, run, served_shapes

pytestmark = pytest.mark.django_db


def test_failures_on_the_current_toolchain_open_one_alert_once_a_newer_release_passes(
    lab,
):
    hand, toolchains = lab
    shapes = served_shapes(3)
    run(hand, shapes, toolchains["0.1.13"], "compile_error", **COMPILE_ERROR)
    # Nothing passes anywhere yet: a gap, not an alert.
    assert not Alert.objects.exists()

    run(hand, shapes, toolchains["0.1.15"])

    (alert,) = Alert.objects.all()
    assert (alert.kind, alert.status, alert.signature, alert.cell_count) == (
        CauseKind.CURRENT,
        Status.COMPILE_ERROR,
        "sig-release",
        3,
    )
    assert (alert.toolchain, alert.good_toolchain) == (
        toolchains["0.1.13"],
        toolchains["0.1.15"],
    )
    assert alert.title == "compile error (sig-release) on the current toolchain"
    candidate = fixed_on_candidate([alert])[alert.pk]
    assert (candidate.toolchain, candidate.proposal) == ("tilelang-0.1.15-cpu", None)


def test_the_order_results_arrive_in_does_not_matter_and_the_nearest_release_is_good(
    lab, admin_user
):
    hand, toolchains = lab
    shapes = served_shapes(2)
    run(hand, shapes, toolchains["0.1.15"])
    run(hand, shapes, toolchains["0.1.14"])

    run(hand, shapes, toolchains["0.1.13"], "compile_error", **COMPILE_ERROR)

    (alert,) = Alert.objects.all()
    assert (alert.kind, alert.cell_count) == (CauseKind.CURRENT, 2)
    assert alert.good_toolchain == toolchains["0.1.14"]
    proposal = proposal_open(
        baseline=toolchains["0.1.13"],
        candidate=toolchains["0.1.14"],
        device_types=[DeviceType.objects.get(backend="c")],
        by=admin_user,
    )
    assert fixed_on_candidate([alert])[alert.pk].proposal == proposal.pk


def test_an_older_release_failing_where_the_current_passes_opens_nothing(lab):
    """What a bisection's steps store: 0.1.14 fails, the current 0.1.15
    passes. The newer release fixed it; nothing to tell anyone."""
    hand, toolchains = lab
    Toolchain.objects.update(is_current=False)
    Toolchain.objects.filter(pk=toolchains["0.1.15"].pk).update(is_current=True)
    shapes = served_shapes(2)
    run(hand, shapes, toolchains["0.1.15"])

    run(hand, shapes, toolchains["0.1.14"], "compile_error", **COMPILE_ERROR)

    assert not Alert.objects.exists()


def test_unserved_cells_open_nothing(lab):
    hand, toolchains = lab
    shapes = served_shapes(2)
    for shape in shapes:
        shape.served = False
        shape.save(update_fields=["served"])
    run(hand, shapes, toolchains["0.1.13"], "compile_error", **COMPILE_ERROR)

    run(hand, shapes, toolchains["0.1.15"])

    assert not Alert.objects.exists()


def test_the_alert_closes_when_a_revision_passes_on_the_current_toolchain(lab):
    hand, toolchains = lab
    shapes = served_shapes(2)
    run(hand, shapes, toolchains["0.1.13"], "compile_error", **COMPILE_ERROR)
    run(hand, shapes, toolchains["0.1.15"])
    (alert,) = Alert.objects.all()

    new_revision()
    run(hand, shapes, toolchains["0.1.13"])

    alert.refresh_from_db()
    assert (alert.state, alert.open_cells) == (AlertState.FIXED, 0)
    # Passing on the current toolchain now, it is fixed, not "on candidate".
    assert fixed_on_candidate([alert]) == {}


def test_a_release_breaking_what_an_older_one_passed_is_a_toolchain_alert(lab):
    hand, toolchains = lab
    Toolchain.objects.update(is_current=False)
    shapes = served_shapes(2)
    run(hand, shapes, toolchains["0.1.14"])

    run(hand, shapes, toolchains["0.1.15"], "compile_error", **COMPILE_ERROR)

    (alert,) = Alert.objects.all()
    assert (alert.kind, alert.cell_count) == (CauseKind.TOOLCHAIN, 2)
    assert (alert.good_toolchain, alert.toolchain) == (
        toolchains["0.1.14"],
        toolchains["0.1.15"],
    )


def test_a_new_revision_failing_on_a_release_where_another_passed_is_no_toolchain_alert(
    lab,
):
    """What a bisection of a new revision stores on an older release: the
    revision changed as well as the toolchain, and nothing passed with it."""
    hand, toolchains = lab
    Toolchain.objects.update(is_current=False)
    shapes = served_shapes(2)
    run(hand, shapes, toolchains["0.1.13"])
    new_revision()

    run(hand, shapes, toolchains["0.1.14"], "compile_error", **COMPILE_ERROR)

    assert not Alert.objects.exists()
