from __future__ import annotations

from unittest import mock

import pytest
from django.urls import reverse

from matrix.models import JobState, Shape, Sweep, ValidationJob

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_broker():
    """Planning publishes on commit; these tests look at the plan only."""
    with mock.patch("runners.services.planning.jobs_publish"):
        yield


def test_gaps_rank_heavier_served_cells_on_priority_backends_first(client, results):
    response = client.get(reverse("gaps"))
    assert response.status_code == 200
    gaps = response.context["gaps"]
    scores = [g.score for g in gaps]
    assert scores == sorted(scores, reverse=True)
    assert gaps[0].device_type.backend == "cuda"
    assert all(g.shape.served for g in gaps)


def test_gaps_name_each_reason(client, results, cpu_runner):
    gaps = client.get(reverse("gaps")).context["gaps"]
    by_cell = {(g.shape.pk, g.device_type.backend): g.reasons for g in gaps}
    assert "failing" in by_cell[results["second"].pk, "cuda"]
    assert "stale" in by_cell[results["fourth"].pk, "hip"]
    assert "missing" in by_cell[results["second"].pk, "c"]
    assert by_cell[results["top"].pk, "cuda"] == ["no runner"]
    # The top shape passes on the CPU column and a runner is online for it.
    assert (results["top"].pk, "c") not in by_cell


def test_gaps_page_stays_within_ten_queries(
    client, results, cpu_runner, django_assert_max_num_queries, sweeper
):
    client.force_login(sweeper)
    with django_assert_max_num_queries(10):
        client.get(reverse("gaps"))


def test_run_missing_plans_exactly_the_runnable_gaps(
    client, results, cpu_runner, sweeper
):
    client.force_login(sweeper)
    gaps = client.get(reverse("gaps"), {"backend": "c"}).context["runnable"]
    response = client.post(
        reverse("gaps-run"), {"backend": "c"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    sweep = Sweep.objects.get()
    planned = set(sweep.jobs.values_list("shape_id", "device_type_id"))
    assert planned == {(g.shape.pk, g.device_type.pk) for g in gaps}
    assert sweep.created_by == sweeper
    body = response.content.decode()
    assert "<progress" in body and 'hx-trigger="every 2s"' in body


def test_cells_no_online_runner_hosts_the_toolchain_for_wait_and_are_not_run(
    client, results, cpu_runner, sweeper, toolchains
):
    old, current = toolchains
    cpu_runner.runnertoolchain_set.update(toolchain=old)
    client.force_login(sweeper)
    response = client.get(reverse("gaps"), {"backend": "c"})
    gaps = response.context["gaps"]
    missing = [g for g in gaps if "missing" in g.reasons]
    assert missing and all("no runner" in g.reasons for g in missing)
    assert response.context["runnable"] == []
    body = response.content.decode()
    assert "0 can be run now" in body and "Run missing" not in body
    # The page names the toolchain the online runner does host, as a link.
    assert f"No online runner hosts {current.name}" in body
    assert f"?toolchain={old.name}" in body
    client.post(reverse("gaps-run"), {"backend": "c"}, HTTP_HX_REQUEST="true")
    assert not Sweep.objects.exists()


def test_a_host_of_the_toolchain_without_the_device_takes_compile_only_work(
    client, results, cpu_runner
):
    runnable = client.get(reverse("gaps"), {"backend": "hip"}).context["runnable"]
    assert runnable
    # Lowered on the CPU host: evidence, not validation, so still a gap.
    assert all("no runner" in g.reasons for g in runnable)


def test_run_missing_needs_the_add_sweep_permission(client, results, outsider):
    client.force_login(outsider)
    response = client.post(reverse("gaps-run"), {"backend": "c"})
    assert response.status_code == 403
    assert not Sweep.objects.exists()


def test_run_missing_asks_anonymous_users_to_log_in(client, results):
    response = client.post(reverse("gaps-run"))
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_run_missing_refuses_get(client, sweeper):
    client.force_login(sweeper)
    assert client.get(reverse("gaps-run")).status_code == 405


def test_the_run_button_is_confirmed_and_hidden_from_outsiders(
    client, results, cpu_runner, sweeper, outsider
):
    client.force_login(sweeper)
    assert "hx-confirm" in client.get(reverse("gaps")).content.decode()
    client.force_login(outsider)
    assert "Run missing" not in client.get(reverse("gaps")).content.decode()


def test_progress_polling_stops_with_286_when_the_sweep_ends(client, results):
    shape = Shape.objects.first()
    sweep = Sweep.objects.create(total=1)
    job = ValidationJob.objects.create(
        revision=shape.operator.revisions.get(is_current=True),
        shape=shape,
        device_type_id=results["top"].cells.first().device_type_id,
        toolchain_id=results["top"].cells.first().toolchain_id,
        sweep=sweep,
    )
    url = reverse("sweep", args=[sweep.pk])
    running = client.get(url, HTTP_HX_REQUEST="true")
    assert running.status_code == 200
    assert 'hx-trigger="every 2s"' in running.content.decode()
    ValidationJob.objects.filter(pk=job.pk).update(state=JobState.DONE)
    done = client.get(url, HTTP_HX_REQUEST="true")
    assert done.status_code == 286
    assert done["HX-Trigger"] == "sweep-finished"
    body = done.content.decode()
    assert "finished" in body and "1 done" in body and "every 2s" not in body


def test_the_sweep_page_renders_in_full_without_htmx(client, results):
    sweep = Sweep.objects.create(total=0)
    response = client.get(reverse("sweep", args=[sweep.pk]))
    assert response.status_code == 200
    assert "<html" in response.content.decode()


def test_sweep_page_refuses_post(client, owner):
    client.force_login(owner)
    sweep = Sweep.objects.create(total=0)
    assert client.post(reverse("sweep", args=[sweep.pk])).status_code == 405
    assert client.post(reverse("gaps")).status_code == 405


def test_before_any_toolchain_is_current_passing_cells_are_not_stale(
    client, results, cpu_runner
):
    from matrix.models import Toolchain

    Toolchain.objects.update(is_current=False)
    gaps = client.get(reverse("gaps"), {"toolchain": "tl-0.1.15"}).context["gaps"]
    reasons = {(g.shape.pk, g.device_type.backend): g.reasons for g in gaps}
    assert (results["top"].pk, "c") not in reasons
    # A revision that is no longer current still is.
    assert "stale" in reasons[results["fourth"].pk, "hip"]
