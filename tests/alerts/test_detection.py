"""Alerts open when a served cell's confirmed verdict turns worse, one per
cause however many cells, and close by themselves when the cells pass
again. Results arrive through real ingest, signed by a registered runner."""

from __future__ import annotations

import pytest

from matrix.fleet import services
from matrix.models import AuditEvent, Cell, Status, ValidationJob
from matrix.models.alerts import Alert, AlertState, CauseKind

from .conftest import COMPILE_ERROR, claimed, ingest, new_revision

pytestmark = pytest.mark.django_db


def test_a_cell_that_never_passed_opens_no_alert(cpu_runner):
    from .conftest import served_shapes

    jobs = claimed(cpu_runner, served_shapes(3))

    ingest(cpu_runner, jobs, status="compile_error", **COMPILE_ERROR)

    assert not Alert.objects.exists()


def test_two_signatures_are_two_alerts(cpu_runner, green):
    shapes = green(4)
    new_revision()
    jobs = claimed(cpu_runner, shapes)

    ingest(cpu_runner, jobs[:2], status="compile_error", **COMPILE_ERROR)
    ingest(
        cpu_runner,
        jobs[2:],
        status="runtime_error",
        error={"message": "illegal address", "signature": "sig-other"},
    )

    assert sorted(Alert.objects.values_list("signature", "cell_count")) == [
        ("sig-other", 2),
        ("sig-release", 2),
    ]


def test_later_cells_of_the_same_cause_join_the_alert(cpu_runner, green):
    shapes = green(4)
    new_revision()
    jobs = claimed(cpu_runner, shapes)

    ingest(cpu_runner, jobs[:1], status="compile_error", **COMPILE_ERROR)
    ingest(cpu_runner, jobs[1:], status="compile_error", **COMPILE_ERROR)

    (alert,) = Alert.objects.all()
    assert alert.cell_count == 4
    # The first bad result is the first one stored.
    assert alert.first_bad_result.job_id == jobs[0].pk


def test_a_confirmed_failure_on_the_same_revision_opens_an_unchanged_alert(
    cpu_runner, register, green
):
    (shape,) = green(1)
    other = register(name="cpu-2")
    (job,) = claimed(cpu_runner, [shape])

    (failure,) = ingest(cpu_runner, [job], status="mismatch", **COMPILE_ERROR)
    assert not Alert.objects.exists()  # held until a rerun confirms it

    rerun = ValidationJob.objects.get(confirms=failure)
    assert services.job_claim(job_id=rerun.pk, attempt=1, runner=other.runner)
    rerun.refresh_from_db()
    ingest(other, [rerun], status="mismatch", **COMPILE_ERROR)

    (alert,) = Alert.objects.all()
    assert (alert.kind, alert.status, alert.cell_count) == (
        CauseKind.UNCHANGED,
        Status.MISMATCH,
        1,
    )


def test_the_alert_closes_when_every_cell_passes_again_and_reopens(cpu_runner, green):
    shapes = green(3)
    new_revision()
    ingest(
        cpu_runner,
        claimed(cpu_runner, shapes),
        status="compile_error",
        **COMPILE_ERROR,
    )
    (alert,) = Alert.objects.all()

    fix = new_revision()
    ingest(cpu_runner, claimed(cpu_runner, shapes[:2]))
    alert.refresh_from_db()
    assert (alert.state, alert.open_cells) == (AlertState.NEW, 1)

    ingest(cpu_runner, claimed(cpu_runner, shapes[2:]))
    alert.refresh_from_db()
    assert (alert.state, alert.open_cells) == (AlertState.FIXED, 0)
    assert alert.fixed_at is not None
    fixed = AuditEvent.objects.get(verb="alert.fixed")
    assert fixed.actor_label == "system"
    assert Cell.objects.filter(revision=fix, status=Status.PASS).count() == 3

    # The same revision change breaking the cells again is the same cause:
    # the alert reopens rather than a second one opening.
    alert.revision.current_on.all()  # the broken revision, current again
    from matrix.revisions import make_current

    make_current(alert.revision, ["c"])
    ingest(
        cpu_runner,
        claimed(cpu_runner, shapes[:1]),
        status="compile_error",
        **COMPILE_ERROR,
    )
    alert.refresh_from_db()
    assert Alert.objects.count() == 1
    assert (alert.state, alert.reopened, alert.open_cells) == (AlertState.NEW, 1, 1)
    assert AuditEvent.objects.filter(verb="alert.reopen").count() == 1


def test_owners_come_from_the_policys_backend_owners(cpu_runner, green):
    from matrix.models.gate import Policy

    Policy.objects.create(version=2, backend_owners={"c": ["carol"], "cuda": ["dan"]})
    shapes = green(2)
    new_revision()

    ingest(
        cpu_runner, claimed(cpu_runner, shapes), status="compile_error", **COMPILE_ERROR
    )

    (alert,) = Alert.objects.all()
    assert (alert.owners, alert.backends) == (["carol"], ["c"])


SAMPLES_FAST = [1.0, 1.01, 0.99, 1.02, 1.0, 0.98, 1.01, 1.0]


def timed(ms: list[float]) -> dict:
    median = sorted(ms)[len(ms) // 2]
    return {
        "timings": {"compile_s": 0.5, "kernel_ms": median, "reference_ms": 1.0},
        "timing_samples": {"kernel_ms": ms, "reference_ms": SAMPLES_FAST},
    }


def test_a_significantly_slower_pass_opens_a_slower_alert(cpu_runner):
    from .conftest import served_shapes

    shapes = served_shapes(2)
    ingest(cpu_runner, claimed(cpu_runner, shapes), **timed(SAMPLES_FAST))
    new_revision()

    jobs = claimed(cpu_runner, shapes)
    ingest(cpu_runner, jobs[:1], **timed([x * 1.5 for x in SAMPLES_FAST]))
    # Within noise: no alert for the other cell.
    ingest(cpu_runner, jobs[1:], **timed([x * 1.003 for x in SAMPLES_FAST]))

    (alert,) = Alert.objects.all()
    assert (alert.status, alert.kind, alert.cell_count) == ("slower", "revision", 1)


def test_a_fix_that_passes_slower_ends_the_failure_and_alerts_the_slowdown(
    cpu_runner,
):
    """A busy host can time the fixing run slower than the last pass: the
    compile error is over all the same, and the slowdown is its own cause."""
    from .conftest import served_shapes

    shapes = served_shapes(1)
    ingest(cpu_runner, claimed(cpu_runner, shapes), **timed(SAMPLES_FAST))
    new_revision()
    ingest(
        cpu_runner, claimed(cpu_runner, shapes), status="compile_error", **COMPILE_ERROR
    )
    (broken,) = Alert.objects.all()

    new_revision()
    ingest(
        cpu_runner,
        claimed(cpu_runner, shapes),
        **timed([x * 1.5 for x in SAMPLES_FAST]),
    )

    broken.refresh_from_db()
    assert (broken.state, broken.open_cells) == (AlertState.FIXED, 0)
    (slower,) = Alert.objects.exclude(pk=broken.pk)
    assert (slower.status, slower.state, slower.open_cells) == (
        "slower",
        AlertState.NEW,
        1,
    )
