"""Bisect from an alert: who may, what it bisects (the alert's first bad
cell between its last good and first bad toolchain), and the conclusion
written back onto the alert when the bisection ends, whether at once from
stored results or later, when a runner's result for its step comes through
ingest."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from matrix.models import AuditEvent, Bisection, ValidationJob
from matrix.models.alerts import Alert

from .conftest import COMPILE_ERROR, claimed, ingest, new_revision, run, served_shapes

pytestmark = pytest.mark.django_db


@pytest.fixture
def reviewing(reviewer):
    reviewer.groups.add(Group.objects.get(name="reviewer"))
    return reviewer


def current_alert(lab, *, middle: str | None):
    """A served cell failing on the current 0.1.13, passing on 0.1.15, and
    on 0.1.14 as ``middle`` says (None: no result there yet)."""
    hand, toolchains = lab
    shapes = served_shapes(1)
    run(hand, shapes, toolchains["0.1.13"], "compile_error", **COMPILE_ERROR)
    if middle:
        run(hand, shapes, toolchains["0.1.14"], middle, **COMPILE_ERROR)
    run(hand, shapes, toolchains["0.1.15"])
    return Alert.objects.get()


def test_bisect_is_offered_to_those_who_may_bisect_only(
    client, lab, reviewing, outsider
):
    alert = current_alert(lab, middle="compile_error")
    page = reverse("alert", args=[alert.pk])
    url = reverse("alert-bisect", args=[alert.pk])

    client.force_login(outsider)
    assert url not in client.get(page).content.decode()
    assert client.post(url).status_code == 403
    client.force_login(reviewing)
    assert f'action="{url}"' in client.get(page).content.decode()
    assert client.get(url).status_code == 405
    assert not Bisection.objects.exists()


def test_stored_results_name_the_release_on_the_alert_at_once(client, lab, reviewing):
    alert = current_alert(lab, middle="compile_error")
    client.force_login(reviewing)

    response = client.post(reverse("alert-bisect", args=[alert.pk]))

    bisection = Bisection.objects.get()
    assert response.url == reverse("bisection", args=[bisection.pk])
    assert (bisection.shape, bisection.last_good, bisection.first_bad) == (
        alert.first_bad_result.shape,
        alert.good_toolchain,
        alert.toolchain,
    )
    assert bisection.state == Bisection.State.FOUND
    alert.refresh_from_db()
    assert alert.bisection["release"] == "tilelang-0.1.15-cpu"
    assert alert.bisection["summary"].startswith("First good release: TileLang 0.1.15")
    body = client.get(reverse("alert", args=[alert.pk])).content.decode()
    assert f'href="/bisections/{bisection.pk}/"' in body
    assert "first good release: <strong" in body and "TileLang 0.1.15" in body
    assert AuditEvent.objects.filter(verb="alert.bisected").count() == 1


def test_a_step_answered_by_ingest_writes_the_conclusion_onto_the_alert(
    client, lab, reviewing
):
    hand, _ = lab
    alert = current_alert(lab, middle=None)
    client.force_login(reviewing)

    client.post(reverse("alert-bisect", args=[alert.pk]))

    bisection = Bisection.objects.get()
    assert bisection.is_running
    alert.refresh_from_db()
    assert alert.bisection["state"] == "running"
    body = client.get(reverse("alert", args=[alert.pk])).content.decode()
    assert f"bisection #{bisection.pk}</a>: running" in body
    # The runner hosting 0.1.14 validates the step's job; ingest stores it.
    job = ValidationJob.objects.get(bisection_steps__bisection=bisection)
    ValidationJob.objects.filter(pk=job.pk).update(state="running", runner=hand.runner)
    job.refresh_from_db()
    ingest(hand, [job])

    alert.refresh_from_db()
    assert alert.bisection["state"] == "found"
    assert alert.bisection["release"] == "tilelang-0.1.14-cpu"


def test_a_kernel_revisions_alert_is_bisected_over_the_hosted_releases(
    client, lab, reviewing
):
    """A new revision fails to compile on the current 0.1.13, where the one
    before passed: Bisect asks which hosted release runs the revision that
    failed, between the newest (0.1.15) and 0.1.13, and names the first."""
    hand, toolchains = lab
    shapes = served_shapes(1)
    run(hand, shapes, toolchains["0.1.13"])
    revision = new_revision()
    run(hand, shapes, toolchains["0.1.13"], "compile_error", **COMPILE_ERROR)
    alert = Alert.objects.get()
    assert (alert.kind, alert.revision) == ("revision", revision)
    client.force_login(reviewing)
    url = reverse("alert-bisect", args=[alert.pk])
    page = client.get(reverse("alert", args=[alert.pk])).content.decode()
    assert f'action="{url}"' in page

    client.post(url)

    bisection = Bisection.objects.get()
    assert (bisection.revision, bisection.last_good, bisection.first_bad) == (
        revision,
        toolchains["0.1.15"],
        toolchains["0.1.13"],
    )
    # The runner validates each step planned: 0.1.14 fails as 0.1.13 does,
    # 0.1.15 passes.
    while bisection.is_running:
        jobs = list(
            ValidationJob.objects.filter(
                bisection_steps__bisection=bisection, state="queued"
            )
        )
        assert jobs, bisection.ladder
        for job in jobs:
            ValidationJob.objects.filter(pk=job.pk).update(
                state="running", runner=hand.runner
            )
            job.refresh_from_db()
            if job.toolchain == toolchains["0.1.15"]:
                ingest(hand, [job])
            else:
                ingest(hand, [job], status="compile_error", **COMPILE_ERROR)
        bisection.refresh_from_db()
    alert.refresh_from_db()
    assert alert.bisection["state"] == "found"
    assert alert.bisection["release"] == "tilelang-0.1.15-cpu"
    assert alert.bisection["summary"].startswith("First good release: TileLang 0.1.15")


def test_a_kernel_revisions_alert_with_no_other_release_hosted_is_not_bisected(
    client, cpu_runner, green, reviewing
):
    shapes = green(1)
    new_revision()
    ingest(
        cpu_runner, claimed(cpu_runner, shapes), status="compile_error", **COMPILE_ERROR
    )
    alert = Alert.objects.get()
    client.force_login(reviewing)

    url = reverse("alert-bisect", args=[alert.pk])
    assert url not in client.get(reverse("alert", args=[alert.pk])).content.decode()
    response = client.post(url, follow=True)

    assert "can be bisected across toolchains" in response.content.decode()
    assert not Bisection.objects.exists()
