from __future__ import annotations

import re
from unittest import mock

import pytest
from django.urls import reverse

from matrix.models import JobState, Shape, Status, Sweep, ValidationJob
from matrix.services import toolchain_register
from tests.ui.conftest import record

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


def test_gaps_page_stays_within_eleven_queries(
    client, results, cpu_runner, django_assert_max_num_queries, sweeper
):
    client.force_login(sweeper)
    # Five read the gaps, one their open jobs (reading the sweep running
    # them only when there is one), three the filter form's choices (shared
    # by every page for a few seconds), the rest are the session, the user
    # and their permissions.
    with django_assert_max_num_queries(14):
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
    assert "None can be run now" in body and "Run missing" not in body
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


@pytest.fixture
def host_toolchain(toolchains, cpu_runner):
    """The CPU runner's own toolchain: the current TileLang release under
    another torch and Python, so another fingerprint; not the current one."""
    toolchain = toolchain_register(
        name="tl-0.1.15-cpu", components={"tilelang": "0.1.15", "torch": "2.13.0+cpu"}
    )
    cpu_runner.runnertoolchain_set.update(toolchain=toolchain)
    return toolchain


def test_run_missing_on_a_runner_hosts_own_toolchain_closes_the_gaps(
    client, results, host_toolchain, sweeper
):
    client.force_login(sweeper)
    params = {"toolchain": host_toolchain.name, "backend": "c"}
    before = client.get(reverse("gaps"), params)
    assert before.context["gap_count"] == Shape.objects.served().count()
    assert "Run missing" in before.content.decode()
    client.post(reverse("gaps-run"), params, HTTP_HX_REQUEST="true")
    # The runner answers every job it was sent with a pass.
    for job in Sweep.objects.get().jobs.all():
        record(job.shape, job.device_type, job.toolchain, Status.PASS)
    after = client.get(reverse("gaps"), params)
    assert after.context["gap_count"] == 0
    body = after.content.decode()
    assert "No gaps" in body and "Run missing" not in body


def test_an_older_toolchain_is_superseded_and_offers_no_run_missing(
    client, results, cpu_runner, sweeper, toolchains
):
    old, current = toolchains
    cpu_runner.runnertoolchain_set.update(toolchain=old)
    client.force_login(sweeper)
    params = {"toolchain": old.name, "backend": "c"}
    response = client.get(reverse("gaps"), params)
    body = response.content.decode()
    assert response.context["gap_count"] and response.context["runnable"] == []
    assert "Run missing" not in body
    assert f"{old.name} is superseded by {current.name}" in body
    assert f'href="/gaps/?toolchain={current.name}&amp;backend=c"' in body
    client.post(reverse("gaps-run"), params, HTTP_HX_REQUEST="true")
    without_htmx = client.post(reverse("gaps-run"), params, follow=True)
    assert "Nothing to run" in without_htmx.content.decode()
    assert not Sweep.objects.exists()


def test_a_second_run_missing_plans_no_empty_sweep_and_shows_the_running_one(
    client, results, cpu_runner, sweeper
):
    client.force_login(sweeper)
    client.post(reverse("gaps-run"), {"backend": "c"}, HTTP_HX_REQUEST="true")
    sweep = Sweep.objects.get()
    again = client.post(reverse("gaps-run"), {"backend": "c"}, HTTP_HX_REQUEST="true")
    assert Sweep.objects.get() == sweep and sweep.total > 0
    body = again.content.decode()
    link = f'<a href="/sweeps/{sweep.pk}/">sweep {sweep.pk}</a>'
    assert f"already queued in {link}" in body
    # The running sweep's own progress, still polling, so the gap list
    # refreshes when it ends.
    assert f'id="sweep-{sweep.pk}"' in body and 'hx-trigger="every 2s"' in body
    assert f"{sweep.total} in all" in body


def test_a_second_run_missing_without_htmx_leads_to_the_running_sweep(
    client, results, cpu_runner, sweeper
):
    client.force_login(sweeper)
    client.post(reverse("gaps-run"), {"backend": "c"})
    sweep = Sweep.objects.get()
    response = client.post(reverse("gaps-run"), {"backend": "c"}, follow=True)
    assert Sweep.objects.get() == sweep
    assert response.redirect_chain[-1][0] == reverse("sweep", args=[sweep.pk])
    assert f"already queued in sweep {sweep.pk}" in response.content.decode()


def test_the_run_button_is_disabled_while_its_request_is_in_flight(
    client, results, cpu_runner, sweeper
):
    client.force_login(sweeper)
    body = client.get(reverse("gaps")).content.decode()
    form = body[body.index('action="/gaps/run/"') :].split("</form>")[0]
    assert 'hx-disabled-elt="find button"' in form


def test_the_summary_says_which_gaps_a_run_only_lowers_or_builds(
    client, results, cpu_runner, sweeper
):
    client.force_login(sweeper)
    response = client.get(reverse("gaps"))
    runnable = response.context["runnable"]
    compile_only = [g for g in runnable if "no runner" in g.reasons]
    validated = [g for g in runnable if "no runner" not in g.reasons]
    assert compile_only and validated
    # The CPU runner has only the CPU column's device.
    assert {g.device_type.backend for g in validated} == {"c"}
    summary = response.content.decode().split('id="gap-summary">')[1].split("</p>")[0]
    assert f"{len(validated)} can be run now and validated" in summary
    assert (
        f"{len(compile_only)} can only be lowered or built: "
        "no online runner has that device"
    ) in summary
    assert f"{len(runnable)} can be run now" not in summary


def test_a_finished_sweep_links_back_to_its_toolchain_and_filters(client, results):
    sweep = Sweep.objects.create(filters={"toolchain": "tl-0.1.13", "backend": "c"})
    body = client.get(reverse("sweep", args=[sweep.pk])).content.decode()
    assert 'href="/?toolchain=tl-0.1.13&amp;backend=c">See the matrix' in body
    assert 'href="/gaps/?toolchain=tl-0.1.13&amp;backend=c">remaining gaps' in body


def test_an_unknown_filter_value_is_named_with_what_is_shown_instead(client, results):
    response = client.get(reverse("gaps"), {"dtype": "fp8", "backend": "c"})
    assert response.status_code == 200
    body = response.content.decode()
    assert "Unknown dtype “fp8”: showing every dtype instead." in body
    assert response.context["filters"].backend == "c"


def test_gaps_already_queued_show_the_sweep_running_them(
    client, results, cpu_runner, sweeper
):
    client.force_login(sweeper)
    fresh = client.get(reverse("gaps"), {"backend": "c"}).content.decode()
    assert "Already queued" not in fresh
    client.post(reverse("gaps-run"), {"backend": "c"}, HTTP_HX_REQUEST="true")
    sweep = Sweep.objects.get()
    body = client.get(reverse("gaps"), {"backend": "c"}).content.decode()
    slot = body[body.index('id="sweep-slot"') : body.index('id="gap-list"')]
    assert "Already queued" in slot
    assert f'id="sweep-{sweep.pk}"' in slot and 'hx-trigger="every 2s"' in slot
    assert f"{sweep.total} queued" in slot


def test_cells_with_a_job_on_its_way_are_not_counted_or_offered_again(
    client, results, cpu_runner, sweeper
):
    client.force_login(sweeper)
    client.post(reverse("gaps-run"), {"backend": "c"}, HTTP_HX_REQUEST="true")
    response = client.get(reverse("gaps"), {"backend": "c"})
    assert response.context["runnable"] == []
    body = response.content.decode()
    summary = body.split('id="gap-summary">')[1].split("</p>")[0]
    assert re.search(r"\d+ can be run now", summary) is None
    queued = Sweep.objects.get().total
    assert f"{queued} already have a job queued or running" in summary
    assert "Run missing" not in body


def test_already_queued_counts_the_listed_gaps_not_the_whole_sweep(
    client, results, cpu_runner, sweeper
):
    client.force_login(sweeper)
    # One sweep over every backend, then a look at the CPU column only.
    client.post(reverse("gaps-run"), {}, HTTP_HX_REQUEST="true")
    sweep = Sweep.objects.get()
    response = client.get(reverse("gaps"), {"backend": "c"})
    listed = response.context["gap_count"]
    on_cpu = sweep.jobs.filter(device_type__backend="c").count()
    assert on_cpu < sweep.total
    note = response.content.decode().split('id="already-queued">')[1].split("</p>")[0]
    assert f"Already queued: {on_cpu} of the {listed} gaps listed here" in note
    assert f"all {sweep.total} of its jobs" in note


def test_run_missing_reloads_the_list_so_it_stops_offering_the_cells(
    client, results, cpu_runner, sweeper
):
    client.force_login(sweeper)
    response = client.post(
        reverse("gaps-run"), {"backend": "c"}, HTTP_HX_REQUEST="true"
    )
    assert response["HX-Trigger"] == "sweep-planned"
    body = client.get(reverse("gaps"), {"backend": "c"}).content.decode()
    assert 'hx-trigger="sweep-finished from:body, sweep-planned from:body"' in body


def test_an_empty_catalogue_says_what_is_missing_not_that_all_pass(client, db):
    body = client.get(reverse("gaps")).content.decode()
    assert "No gaps" not in body
    note = body.split('id="nothing-served">')[1].split("</div>")[0]
    assert "Nothing is served yet" in note and "import_shapes" in note
    assert "No device types yet" in note and 'href="/runners/"' in note
