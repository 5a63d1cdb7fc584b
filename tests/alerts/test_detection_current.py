"""A served cell failing on the current toolchain, where it never passed,
while a newer TileLang release passes it with the same kernel revision: one
alert per error signature and toolchain (kind ``current``), whichever side
arrives first, shown "fixed on candidate". Results arrive through real
ingest, signed by a registered runner hosting both releases."""

from __future__ import annotations

import pytest
from django.utils import timezone

from matrix.alerts.reads import fixed_on_candidate
from matrix.fleet import services
from matrix.gate.services import proposal_open
from matrix.models import DeviceType, JobState, Status, Toolchain, ValidationJob
from matrix.models.alerts import Alert, AlertState, CauseKind
from tests.runners.conftest import CPU_COMPONENTS, cpu_inventory

from .conftest import COMPILE_ERROR, ingest, new_revision, served_shapes

pytestmark = pytest.mark.django_db

RELEASES = ("0.1.13", "0.1.14", "0.1.15")


@pytest.fixture
def lab(register):
    """A CPU runner hosting TileLang 0.1.13 (the current toolchain), 0.1.14
    and 0.1.15; the toolchains by release."""
    inventory = cpu_inventory()
    inventory["toolchains"] = [
        {
            "name": f"tilelang-{version}-cpu",
            "interpreter": f"/opt/tilelang-{version}/bin/python",
            "components": {**CPU_COMPONENTS, "tilelang": version},
            "fingerprint": str(i) * 64,
        }
        for i, version in enumerate(RELEASES, start=1)
    ]
    hand = register(name="cpu-lab", inventory=inventory)
    toolchains = {t.tilelang_version: t for t in hand.runner.toolchains.all()}
    assert set(toolchains) == set(RELEASES)
    Toolchain.objects.filter(pk=toolchains["0.1.13"].pk).update(is_current=True)
    return hand, toolchains


def run(hand, shapes, toolchain, status=None, **fields):
    cpu = DeviceType.objects.get(backend="c")
    sweep = services.sweep_plan(cells=[(s, cpu, toolchain) for s in shapes])
    ValidationJob.objects.filter(sweep=sweep).update(
        state=JobState.RUNNING, runner=hand.runner, started_at=timezone.now()
    )
    return ingest(hand, list(sweep.jobs.order_by("pk")), status=status, **fields)


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
