from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from unittest import mock

import pytest
from django.urls import reverse
from django.utils import timezone

from matrix import gaps
from matrix.gaps import duration_text
from matrix.models import (
    DeviceType,
    JobStage,
    JobState,
    Result,
    Shape,
    Status,
    Sweep,
    Toolchain,
    ValidationJob,
)
from matrix.services import toolchain_register
from tests.ui.conftest import record

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_broker():
    """Planning publishes on commit; these tests look at the plan only."""
    with mock.patch("matrix.fleet.services.planning.jobs_publish"):
        yield


def summary_of(response) -> str:
    body = response.content.decode()
    text = re.sub(r"<[^>]+>", "", body.split('id="gap-summary">')[1].split("</p>")[0])
    return " ".join(text.split())


def reasons_by_cell(response) -> dict:
    return {
        (g.shape_id, g.device_type.backend): g.reasons for g in response.context["gaps"]
    }


def test_gaps_rank_heavier_served_cells_on_priority_backends_first(client, results):
    response = client.get(reverse("gaps"))
    assert response.status_code == 200
    gaps = response.context["gaps"]
    scores = [g.score for g in gaps]
    assert scores == sorted(scores, reverse=True)
    assert gaps[0].device_type.backend == "cuda"
    served = set(Shape.objects.served().values_list("pk", flat=True))
    assert {g.shape_id for g in gaps} <= served


def test_gaps_name_each_reason(client, results, cpu_runner):
    by_cell = reasons_by_cell(client.get(reverse("gaps")))
    assert by_cell[results["second"].pk, "cuda"] == ["failing", "no runner"]
    assert by_cell[results["fourth"].pk, "hip"] == ["stale", "no runner"]
    assert by_cell[results["second"].pk, "c"] == ["missing"]
    # Built, never run on the device: evidence, not validation.
    assert by_cell[results["top"].pk, "cuda"] == ["not validated", "no runner"]
    # The top shape passes on the CPU column.
    assert (results["top"].pk, "c") not in by_cell


def test_a_current_pass_is_never_a_gap_whatever_runners_are_online(
    client, results, toolchains, device_types
):
    # No runner is online at all, and the H200 column gets a current pass.
    record(results["third"], device_types["cuda"], toolchains[1], Status.PASS)
    response = client.get(reverse("gaps"))
    by_cell = reasons_by_cell(response)
    assert (results["top"].pk, "c") not in by_cell
    assert (results["third"].pk, "cuda") not in by_cell
    # Every other gap needs work of its own; "no runner" never stands alone.
    assert all(reasons[0] != "no runner" for reasons in by_cell.values())


def test_a_current_unsupported_cell_is_an_answer_not_a_gap(
    client, results, toolchains, device_types
):
    record(results["third"], device_types["metal"], toolchains[1], Status.UNSUPPORTED)
    by_cell = reasons_by_cell(client.get(reverse("gaps")))
    assert (results["third"].pk, "metal") not in by_cell


def test_the_headline_counts_add_up_to_the_rows(client, results, cpu_runner):
    response = client.get(reverse("gaps"))
    served = Shape.objects.served().count()
    types = DeviceType.objects.count()
    total = served * types - 1  # the top shape's CPU pass
    # Built on cuda (1), compile errors on cuda (2), a stale revision on hip (1).
    missing = total - 4
    no_runner = served * (types - 1)
    assert summary_of(response).startswith(
        f"{total} gaps: {missing} missing, 1 stale, 2 failing, 1 not validated; "
        f"{no_runner} of them have no online runner with the device."
    )
    assert response.context["gap_count"] == len(response.context["gaps"]) == total


def test_the_gaps_honour_every_filter_of_the_pages(
    client, results, cpu_runner, device_types
):
    from matrix.models import ServedCall

    top = results["top"]
    ServedCall.objects.create(source="alpha", shape=top, tokens=1, calls=3)

    def listed(**params):
        response = client.get(reverse("gaps"), params)
        assert response.context["gap_count"] == len(response.context["gaps"])
        return response.context["gaps"]

    assert {g.shape_id for g in listed(model="alpha")} == {top.pk}
    hip = listed(device=device_types["hip"].pk)
    assert hip and {g.device_type.backend for g in hip} == {"hip"}
    norms = listed(operator="rmsnorm")
    assert norms and {g.operator for g in norms} == {"rmsnorm"}
    # Shape text as the matrix searches it: case aside, literally.
    decode = listed(q="m=1,")
    assert decode and all(g.dims_key.startswith("M=1,") for g in decode)
    assert listed(q="%") == [] and listed(q="_") == []
    api = client.get("/api/v1/gaps", {"q": "M=1,", "operator": "gemm"}).json()
    assert api["count"] == len(listed(q="M=1,", operator="gemm")) > 0


@pytest.fixture
def small_pages(monkeypatch):
    monkeypatch.setattr("matrix.views.gaps.PAGE_SIZE", 10)


def test_the_list_pages_to_its_last_row(client, results, cpu_runner, small_pages):
    first = client.get(reverse("gaps"))
    total, last = first.context["gap_count"], first.context["last_page"]
    assert last == -(-total // 10) > 1
    body = first.content.decode()
    assert f"Page 1 of {last}" in body
    assert f'page={last}">{last}</a>' in body and 'rel="next"' in body
    seen = []
    for page in range(1, last + 1):
        response = client.get(reverse("gaps"), {"page": page})
        seen += [
            (g.rank, g.shape_id, g.device_type.pk) for g in response.context["gaps"]
        ]
    assert [rank for rank, _, _ in seen] == list(range(1, total + 1))
    assert len({(s, d) for _, s, d in seen}) == total
    # Past the end, or not a number: the last page, and the first.
    beyond = client.get(reverse("gaps"), {"page": last + 5}).context
    assert beyond["page"] == last and beyond["gaps"][-1].rank == total
    assert client.get(reverse("gaps"), {"page": "x"}).context["page"] == 1


def test_the_csv_holds_every_row_of_every_page_in_order(
    client, results, cpu_runner, small_pages
):
    page = client.get(reverse("gaps"), {"backend": "c"})
    link = 'href="/gaps.csv?toolchain=tl-0.1.15&amp;backend=c"'
    assert link in page.content.decode()
    response = client.get(
        reverse("gaps-csv"), {"toolchain": "tl-0.1.15", "backend": "c"}
    )
    assert response["Content-Type"].startswith("text/csv")
    assert 'filename="gaps-tl-0.1.15.csv"' in response["Content-Disposition"]
    rows = list(
        csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode()))
    )
    assert len(rows) == page.context["gap_count"] == Shape.objects.served().count() - 1
    assert [int(r["rank"]) for r in rows] == list(range(1, len(rows) + 1))
    first = page.context["gaps"][0]
    assert (rows[0]["operator"], rows[0]["dims"], rows[0]["gap"]) == (
        first.operator,
        first.dims_key,
        first.kind,
    )
    assert {r["run_missing_stage"] for r in rows} == {"validate"}
    assert rows[0]["url"].startswith("http://testserver/cells/")


def test_a_device_name_that_looks_like_a_formula_is_quoted_in_the_csv(
    client, results, device_types
):
    DeviceType.objects.filter(pk=device_types["c"].pk).update(vendor="=HYPERLINK(1)")
    response = client.get(reverse("gaps-csv"), {"backend": "c"})
    rows = list(
        csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode()))
    )
    assert rows and all(r["device_type"].startswith("'=HYPERLINK(1)") for r in rows)


def test_the_gaps_page_reads_in_a_fixed_number_of_queries(
    client, results, cpu_runner, django_assert_num_queries, sweeper, small_pages
):
    from django.core.cache import cache

    client.force_login(sweeper)
    client.get(reverse("gaps"))
    cache.clear()
    # Session, user, permissions (2), roles, toolchains, what the online
    # runners host, device types, the data version, the counts, one page of
    # rows, the job durations and the filter form's choices (3): however many
    # gaps.
    with django_assert_num_queries(15):
        client.get(reverse("gaps"), {"page": 2})
    # Again at the same data version: the session, the user with its role,
    # what the online runners host and the gap version. The toolchains and
    # device types and the form's choices (kept for seconds), whether Run
    # missing is offered (a minute), the counts, the rows and the job
    # durations come from the cache.
    with django_assert_num_queries(4):
        client.get(reverse("gaps"), {"page": 2})


def test_a_new_result_a_new_job_or_a_served_shape_shows_on_the_next_view(
    client, results, cpu_runner, sweeper, toolchains, device_types
):
    client.force_login(sweeper)
    before = client.get(reverse("gaps"), {"backend": "c"}).context
    first = before["gaps"][0]
    shape = Shape.objects.get(pk=first.shape_id)
    record(shape, device_types["c"], toolchains[1], Status.PASS)
    after = client.get(reverse("gaps"), {"backend": "c"}).context
    assert after["gap_count"] == before["gap_count"] - 1
    assert first.shape_id not in {g.shape_id for g in after["gaps"]}
    client.post(reverse("gaps-run"), {"backend": "c"}, HTTP_HX_REQUEST="true")
    queued = client.get(reverse("gaps"), {"backend": "c"}).context
    assert queued["summary"].queued == after["gap_count"]
    Shape.objects.filter(pk=after["gaps"][0].shape_id).update(served=False)
    fewer = client.get(reverse("gaps"), {"backend": "c"}).context
    assert fewer["gap_count"] == after["gap_count"] - 1


def test_run_missing_plans_exactly_the_runnable_gaps(
    client, results, cpu_runner, sweeper
):
    client.force_login(sweeper)
    shown = client.get(reverse("gaps"), {"backend": "c"}).context
    response = client.post(
        reverse("gaps-run"), {"backend": "c"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    sweep = Sweep.objects.get()
    planned = set(sweep.jobs.values_list("shape_id", "device_type_id"))
    assert planned == {(g.shape_id, g.device_type.pk) for g in shown["gaps"]}
    assert len(planned) == shown["summary"].runnable
    assert sweep.created_by == sweeper
    body = response.content.decode()
    assert "<progress" in body and 'hx-trigger="every 2s"' in body


def paced_run(shape, device_type, toolchain, runner, *, jobs: int, each_s: float):
    """A finished sweep's run on ``runner``: ``jobs`` validations, side by
    side, each started before the one before it ended, the last finishing
    ``jobs * each_s`` seconds after the first started (its pace: ``each_s``
    a job)."""
    sweep = Sweep.objects.create(total=jobs)
    start = timezone.now() - timedelta(hours=1)
    for i in range(jobs):
        result = record(
            shape, device_type, toolchain, Status.PASS, wall_s=each_s * jobs
        )
        ValidationJob.objects.filter(pk=result.job_id).update(
            sweep=sweep,
            runner=runner,
            state=JobState.DONE,
            started_at=start + timedelta(seconds=each_s * i / 2),
            finished_at=start + timedelta(seconds=each_s * (i + 1)),
        )


def preview_rows(response) -> dict[str, tuple[str, str, str]]:
    body = response.content.decode()
    table = body.split('id="run-missing"')[1].split("</tbody>")[0]
    cells = re.findall(
        r'<tr><th scope="row">(\w+)</th><td class="num">(\d+)</td>'
        r'<td class="num">about ([^<]+)</td><td>([^<]+)</td></tr>',
        table,
    )
    return {stage: (jobs, time, basis) for stage, jobs, time, basis in cells}


def test_the_preview_says_how_many_jobs_of_each_stage_and_how_long(
    client, results, cpu_runner, sweeper, toolchains, device_types
):
    served = Shape.objects.served().count()
    # Measured: CPU validations at 3, 4 and 5 s a job (three earlier runs,
    # median 4) on this toolchain; no lowering measured yet.
    shape = Shape.objects.filter(served=False).first()
    for each_s in (3.0, 4.0, 5.0):
        paced_run(
            shape, device_types["c"], toolchains[0], cpu_runner, jobs=6, each_s=each_s
        )
    client.force_login(sweeper)
    response = client.get(reverse("gaps"))
    rows = preview_rows(response)
    summary = response.context["summary"]
    assert rows["validate"] == (
        str(summary.validating),
        f"{4 * summary.validating} s",
        "median of 3 recent runs",
    )
    # Lowered where no runner has the device: the missing and stale cells,
    # not the failing ones (a lowering would hide the device's verdict) nor
    # the built one.
    lower = served * 3 - 3
    assert rows["lower"] == (
        str(lower),
        duration_text(0.5 * lower),
        "nothing measured yet: 0.5 s a job assumed",
    )
    assert "build" not in rows
    button = f"Run missing ({summary.validating + lower})"
    assert button in response.content.decode()


def test_the_estimate_follows_a_runners_measured_pace_not_one_jobs_time(
    client, results, cpu_runner, sweeper, toolchains, device_types
):
    """A runner runs validations side by side: 12 jobs of 60 s each that
    one runner finished within 60 s take 5 s of its time each, and the
    preview says so (one job's wall time put it twelve times too long)."""
    shape = Shape.objects.filter(served=False).first()
    paced_run(shape, device_types["c"], toolchains[0], cpu_runner, jobs=12, each_s=5)
    client.force_login(sweeper)
    response = client.get(reverse("gaps"))
    validating = response.context["summary"].validating
    assert preview_rows(response)["validate"] == (
        str(validating),
        f"{5 * validating} s"
        if 5 * validating < 90
        else f"{round(5 * validating / 60)} min",
        "median of 1 recent run",
    )


def test_no_nvcc_build_is_planned_unless_chosen(
    client, results, cpu_runner, sweeper, toolchains
):
    cpu_runner.inventory = {**cpu_runner.inventory, "nvcc": True}
    cpu_runner.save()
    client.force_login(sweeper)
    params = {"backend": "cuda"}
    default = client.get(reverse("gaps"), params)
    assert set(preview_rows(default)) == {"lower"}
    body = default.content.decode()
    assert 'name="build" value="1"' in body and "Build cuda cells with nvcc" in body
    # Ticking the box shows the plan with builds before anything is queued.
    chosen = client.get(
        reverse("gaps"), {**params, "build": "1"}, HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="gap-list",
    )  # fmt: skip
    assert chosen.content.decode().lstrip().startswith('<div id="gap-list"')
    # Each row says it too: the missing cells are built.
    assert chosen.content.decode().count("<td>build</td>") == 9
    # The missing cells are built instead of lowered; the built one is not
    # built again, and the failing ones need the device.
    assert set(preview_rows(chosen)) == {"build"}
    assert "checked" in chosen.content.decode()
    client.post(reverse("gaps-run"), params, HTTP_HX_REQUEST="true")
    lowered = Sweep.objects.get()
    assert set(lowered.jobs.values_list("stage", flat=True)) == {JobStage.LOWER}
    ValidationJob.objects.update(state=JobState.DONE)
    client.post(reverse("gaps-run"), {**params, "build": "1"}, HTTP_HX_REQUEST="true")
    built = Sweep.objects.exclude(pk=lowered.pk).get()
    assert built.total == lowered.total
    assert set(built.jobs.values_list("stage", "queue")) == {
        (JobStage.BUILD, f"compile.tc{toolchains[1].pk}.nvcc")
    }
    assert built.filters["build"] is True


def test_a_lowered_cuda_cell_is_offered_only_as_an_nvcc_build(
    client, results, cpu_runner, sweeper, toolchains, device_types
):
    cpu_runner.inventory = {**cpu_runner.inventory, "nvcc": True}
    cpu_runner.save()
    record(results["third"], device_types["cuda"], toolchains[1], Status.LOWERED)
    client.force_login(sweeper)
    params = {"backend": "cuda", "status": "lowered"}
    default = client.get(reverse("gaps"), params)
    body = default.content.decode()
    # Lowering it again would add nothing; building it would.
    assert "Nothing here to validate or lower" in body
    assert 'name="build"' in body and "Run missing (" not in body
    chosen = client.get(reverse("gaps"), {**params, "build": "1"})
    assert preview_rows(chosen)["build"][0] == "1"
    client.post(reverse("gaps-run"), {**params, "build": "1"}, HTTP_HX_REQUEST="true")
    job = Sweep.objects.get().jobs.get()
    assert (job.shape_id, job.stage) == (results["third"].pk, JobStage.BUILD)


def test_a_failing_cell_without_its_device_is_not_rerun_compile_only(
    client, results, cpu_runner
):
    gaps = client.get(reverse("gaps"), {"backend": "cuda"}).context["gaps"]
    failing = [g for g in gaps if g.kind == "failing"]
    assert failing and all(g.stage is None for g in failing)
    missing = [g for g in gaps if g.kind == "missing"]
    assert missing and all(g.stage == JobStage.LOWER for g in missing)


@pytest.mark.parametrize(
    ("params", "says"),
    [
        (
            {"toolchain": "tl-9.9"},
            "Unknown toolchain “tl-9.9”: nothing was planned.",
        ),
        (
            {"toolchain": "tl-0.1.13"},
            "tl-0.1.13 is superseded by tl-0.1.15: a fresh result on it would be "
            "stale too, so nothing was planned.",
        ),
        (
            {"build": "1"},
            "No online runner with nvcc hosts tl-0.1.15, so nothing was planned: "
            "run without “build with nvcc” to lower these cells instead.",
        ),
        (
            {"backend": "cuda", "status": "compile_error"},
            "Nothing to run: the 2 gaps under these filters need a runner with "
            "their device type, as a compile-only run would add nothing to them.",
        ),
        (
            {"backend": "c", "status": "timeout"},
            "Nothing to run: there are no gaps under these filters.",
        ),
    ],
)
def test_a_run_missing_that_cannot_be_carried_out_says_why_and_plans_nothing(
    client, results, cpu_runner, sweeper, params, says
):
    client.force_login(sweeper)
    response = client.post(reverse("gaps-run"), params, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert f'id="nothing-planned">{says}</p>' in response.content.decode()
    without_htmx = client.post(reverse("gaps-run"), params, follow=True)
    assert says in without_htmx.content.decode()
    assert (
        not Sweep.objects.exists()
        and not ValidationJob.objects.filter(state=JobState.QUEUED).exists()
    )


def test_cells_no_online_runner_hosts_the_toolchain_for_wait_and_are_not_run(
    client, results, cpu_runner, sweeper, toolchains
):
    old, current = toolchains
    cpu_runner.runnertoolchain_set.update(toolchain=old)
    client.force_login(sweeper)
    response = client.get(reverse("gaps"), {"backend": "c"})
    assert response.context["summary"].runnable == 0
    body = response.content.decode()
    assert "None can be run now" in body and "Run missing" not in body
    # The page names the toolchain the online runner does host, as a link.
    assert f"No online runner hosts {current.name}" in body
    assert f"?toolchain={old.name}" in body
    post = client.post(reverse("gaps-run"), {"backend": "c"}, HTTP_HX_REQUEST="true")
    assert (
        f"No online runner hosts {current.name}, so nothing was planned"
        in post.content.decode()
    )
    assert not Sweep.objects.exists()


def test_a_host_of_the_toolchain_without_the_device_takes_compile_only_work(
    client, results, cpu_runner
):
    response = client.get(reverse("gaps"), {"backend": "hip"})
    runnable = [g for g in response.context["gaps"] if g.runnable]
    assert runnable and all(g.stage == JobStage.LOWER for g in runnable)
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


def test_the_gaps_csv_refuses_post(client, sweeper):
    client.force_login(sweeper)
    assert client.post(reverse("gaps-csv")).status_code == 405


def test_the_run_button_is_confirmed_and_hidden_from_outsiders(
    client, results, cpu_runner, sweeper, outsider
):
    client.force_login(sweeper)
    assert "hx-confirm" in client.get(reverse("gaps")).content.decode()
    client.force_login(outsider)
    body = client.get(reverse("gaps")).content.decode()
    assert "Run missing" not in body and "add sweep" in body


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
    # The job ends with its result, as ingest ends it.
    ValidationJob.objects.filter(pk=job.pk).update(state=JobState.DONE)
    Result.objects.create(
        job=job,
        attempt=1,
        revision=job.revision,
        shape=shape,
        device_type_id=job.device_type_id,
        toolchain_id=job.toolchain_id,
        status=Status.PASS,
    )
    done = client.get(url, HTTP_HX_REQUEST="true")
    assert done.status_code == 286
    assert done["HX-Trigger"] == "sweep-finished"
    body = done.content.decode()
    assert "finished" in body and "1 done" in body and "every 2s" not in body
    assert "ETA" not in body


def sweep_of(jobs: int, results, stage=JobStage.VALIDATE) -> Sweep:
    cell = results["top"].cells.first()
    sweep = Sweep.objects.create(total=jobs)
    shape = results["top"]
    ValidationJob.objects.bulk_create(
        ValidationJob(
            revision=shape.operator.revisions.get(is_current=True),
            shape=shape,
            device_type_id=cell.device_type_id,
            toolchain_id=cell.toolchain_id,
            sweep=sweep,
            stage=stage,
        )
        for _ in range(jobs)
    )
    return sweep


def test_each_poll_shows_the_claims_and_results_since_the_last(client, results):
    """Progress is kept between polls, until a job of the sweep is claimed
    or a result comes."""
    sweep = sweep_of(3, results)
    url = reverse("sweep", args=[sweep.pk])

    def counts() -> str:
        body = client.get(url, HTTP_HX_REQUEST="true").content.decode()
        return re.search(r"\d+ running · \d+ queued", body)[0]

    assert counts() == "0 running · 3 queued"
    first, second, _ = sweep.jobs.order_by("pk")
    ValidationJob.objects.filter(pk=first.pk).update(
        state=JobState.RUNNING, started_at=timezone.now()
    )
    assert counts() == "1 running · 2 queued"
    ValidationJob.objects.filter(pk=second.pk).update(
        state=JobState.RUNNING, started_at=timezone.now() + timedelta(seconds=1)
    )
    assert counts() == "2 running · 1 queued"
    ValidationJob.objects.filter(pk=first.pk).update(state=JobState.DONE)
    record(first.shape, first.device_type, first.toolchain, Status.PASS)
    assert counts() == "1 running · 1 queued"


def test_the_eta_follows_the_recent_pace_not_the_sweeps_age(
    client, results, cpu_runner
):
    from django.core.cache import cache

    sweep = sweep_of(16, results)
    now = timezone.now()
    # Planned an hour ago, its first job started 2 minutes ago (no runner
    # was online before), 6 done since: too few for a pace (a runner's
    # first results come after a compile, many jobs at once), nothing was
    # measured before, and the sweep's own first results are no measured
    # run: no ETA is made up.
    Sweep.objects.filter(pk=sweep.pk).update(created_at=now - timedelta(hours=1))
    jobs = list(sweep.jobs.order_by("pk"))
    ValidationJob.objects.filter(pk__in=[j.pk for j in jobs]).update(
        started_at=now - timedelta(minutes=2)
    )
    ValidationJob.objects.filter(pk__in=[j.pk for j in jobs]).update(runner=cpu_runner)
    for job in jobs[:6]:
        Result.objects.create(
            job=job,
            attempt=1,
            revision=job.revision,
            shape=job.shape,
            device_type=job.device_type,
            toolchain=job.toolchain,
            status=Status.PASS,
        )
    ValidationJob.objects.filter(pk__in=[j.pk for j in jobs[:6]]).update(
        state=JobState.DONE, finished_at=now - timedelta(seconds=10)
    )
    durations = gaps.job_durations().per_stage()
    assert durations == {}
    assert (
        Sweep.objects.get(pk=sweep.pk).progress(stage_seconds=durations)["eta_s"]
        is None
    )
    body = client.get(reverse("sweep", args=[sweep.pk])).content.decode()
    assert "ETA once a few jobs are done (nothing measured yet)" in body
    # The first result a minute after the start (a compile), then one every
    # 6 s: 6 s a job, 6 to go. The first minute is not paid again per job.
    for i, job in enumerate(jobs[:10]):
        ValidationJob.objects.filter(pk=job.pk).update(
            state=JobState.DONE, finished_at=now - timedelta(seconds=60 - 6 * i)
        )
    progress = Sweep.objects.get(pk=sweep.pk).progress()
    assert progress["eta_basis"] == "pace"
    assert 33 <= progress["eta_s"] <= 40
    cache.clear()  # the page keeps its progress until a result comes through ingest
    body = client.get(reverse("sweep", args=[sweep.pk])).content.decode()
    assert "ETA about 36 s, at the pace of the last few minutes" in body


def test_before_any_result_the_eta_comes_from_measured_job_times(
    client, results, toolchains, device_types, cpu_runner
):
    shape = Shape.objects.filter(served=False).first()
    for each_s in (20.0, 30.0, 40.0):
        paced_run(
            shape, device_types["c"], toolchains[0], cpu_runner, jobs=6, each_s=each_s
        )
    sweep = sweep_of(6, results)
    body = client.get(reverse("sweep", args=[sweep.pk])).content.decode()
    # Six validations at the 30 s median.
    assert "ETA about 3 min, estimated from measured job times" in body


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
    response = client.get(reverse("gaps"), {"toolchain": "tl-0.1.15"})
    reasons = reasons_by_cell(response)
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
    assert response.context["gap_count"] and response.context["summary"].runnable == 0
    # Every result on it is stale, the current pass included.
    assert all(g.kind in ("stale", "missing") for g in response.context["gaps"])
    assert "Run missing" not in body
    assert f"{old.name} is superseded by {current.name}" in body
    assert f'href="/gaps/?toolchain={current.name}&amp;backend=c"' in body


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


def test_the_summary_says_which_gaps_a_run_only_lowers(
    client, results, cpu_runner, sweeper
):
    client.force_login(sweeper)
    response = client.get(reverse("gaps"))
    runnable = [g for g in response.context["gaps"] if g.runnable]
    compile_only = [g for g in runnable if "no runner" in g.reasons]
    validated = [g for g in runnable if "no runner" not in g.reasons]
    assert compile_only and validated
    # The CPU runner has only the CPU column's device.
    assert {g.device_type.backend for g in validated} == {"c"}
    summary = summary_of(response)
    assert f"{len(validated)} can be run now and validated" in summary
    assert (
        f"{len(compile_only)} can only be lowered or built: "
        "no online runner has that device"
    ) in summary


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
    assert response.context["summary"].runnable == 0
    summary = summary_of(response)
    assert re.search(r"\d+ can be run now", summary) is None
    queued = Sweep.objects.get().total
    assert f"{queued} already have a job queued or running" in summary
    assert "Run missing" not in response.content.decode()
    assert {g.queued for g in response.context["gaps"]} == {True}


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


def test_the_gaps_api_answers_304_until_a_result_or_a_runner_changes_it(
    client, results, cpu_runner, toolchains, device_types
):
    first = client.get("/api/v1/gaps", {"backend": "c"})
    etag, body = first["ETag"], first.json()
    assert body["count"] and all(g["reasons"] == [g["kind"]] for g in body["gaps"])
    again = client.get("/api/v1/gaps", {"backend": "c"}, HTTP_IF_NONE_MATCH=etag)
    assert again.status_code == 304 and again.content == b""

    # A new result closes a gap: the next request sees it.
    top = body["gaps"][0]
    shape_id = int(re.search(r"/cells/(\d+)/", top["url"]).group(1))
    shape = Shape.objects.get(pk=shape_id)
    record(shape, device_types["c"], toolchains[1], Status.PASS)
    after = client.get("/api/v1/gaps", {"backend": "c"}, HTTP_IF_NONE_MATCH=etag)
    assert after.status_code == 200 and after.json()["count"] == body["count"] - 1

    # The runner going offline leaves every gap without a runner.
    cpu_runner.state = cpu_runner.State.OFFLINE
    cpu_runner.save(update_fields=["state"])
    offline = client.get("/api/v1/gaps", {"backend": "c"}).json()
    assert offline["runnable"] == 0
    assert all("no runner" in g["reasons"] for g in offline["gaps"])


def test_readers_share_one_kept_gap_list_and_the_run_form_stays_per_user(
    client, results, cpu_runner, viewer, sweeper, django_user_model
):
    from django.contrib.auth.models import Group

    client.force_login(viewer)
    first = client.get(reverse("gaps")).content.decode()
    assert 'id="run-missing"' not in first
    # Another reader gets the list the first one's view rendered...
    other = django_user_model.objects.create_user("other-viewer")
    other.groups.add(Group.objects.get(name="viewer"))
    client.force_login(other)
    listed = re.compile(r'<div id="gap-list".*?</table>', re.S)
    assert (
        listed.search(client.get(reverse("gaps")).content.decode())[0]
        == (listed.search(first)[0])
    )
    # ...while one who may run sweeps gets Run missing, with a CSRF token that
    # works for their own session: the form never comes from the kept list.
    client.force_login(sweeper)
    page = client.get(reverse("gaps")).content.decode()
    assert 'id="run-missing"' in page
    token = re.search(r'name="csrfmiddlewaretoken" value="(\w+)"', page)[1]
    client.handler.enforce_csrf_checks = True
    response = client.post(reverse("gaps-run"), {"csrfmiddlewaretoken": token})
    assert response.status_code in (200, 302)


def test_the_gaps_csv_file_name_keeps_only_safe_characters(client, results, toolchains):
    Toolchain.objects.filter(pk=toolchains[1].pk).update(name='tl"; evil=1\r\n/..')
    response = client.get(reverse("gaps-csv"))
    assert response.status_code == 200
    assert (
        response["Content-Disposition"] == 'attachment; filename="gaps-tl-evil-1.csv"'
    )


def test_the_neighbours_of_the_served_shapes_are_added_from_the_page_and_listed(
    client, results, cpu_runner, sweeper, outsider
):
    from matrix.models import AuditEvent

    client.force_login(outsider)
    assert client.post(reverse("gaps-neighbours")).status_code == 403
    assert not Shape.objects.filter(guards=True).exists()

    client.force_login(sweeper)
    page = client.get(reverse("gaps"), {"backend": "c"}).content.decode()
    assert 'id="neighbours-form"' in page
    before = client.get(reverse("gaps"), {"backend": "c"}).context["gap_count"]
    response = client.post(reverse("gaps-neighbours"), follow=True)
    added = Shape.objects.filter(guards=True).count()
    assert added > 0
    assert f"{added} neighbour shapes added around the" in response.content.decode()
    event = AuditEvent.objects.get(verb="shapes.neighbours")
    assert event.actor == sweeper and event.after["added"] == added
    # The gaps now list them, and Run missing plans them.
    after = client.get(reverse("gaps"), {"backend": "c"}).context
    assert after["gap_count"] > before
    client.post(reverse("gaps-run"), {"backend": "c"})
    planned = set(Sweep.objects.get().jobs.values_list("shape__guards", flat=True))
    assert planned == {True, False}
    # Twice adds nothing.
    again = client.post(reverse("gaps-neighbours"), follow=True)
    assert "is a shape already" in again.content.decode()
    assert Shape.objects.filter(guards=True).count() == added


def test_a_gap_failing_here_that_passes_on_a_proposed_toolchain_says_so(
    client, results, toolchains, device_types, sweeper
):
    from matrix.gate.services import proposal_open

    old, current = toolchains
    cpu = device_types["c"]
    shape = Shape.objects.filter(served=True).order_by("pk").first()
    record(shape, cpu, current, Status.COMPILE_ERROR)
    record(shape, cpu, old, Status.PASS)
    proposal = proposal_open(
        baseline=current, candidate=old, device_types=[cpu], by=sweeper
    )
    client.force_login(sweeper)
    body = client.get(reverse("gaps"), {"backend": "c"}).content.decode()
    assert (
        f'fixed on candidate tl-0.1.13 (<a href="/upgrades/{proposal.pk}/">upgrade '
        f"#{proposal.pk}</a>): a run here fails the same way"
    ) in body
