"""/metrics: the figures are there, and they move when the system does."""

from __future__ import annotations

import copy
import uuid
from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from matrix.fleet import services
from matrix.models import DeviceType, JobState, Result, Toolchain, ValidationJob
from matrix.models.gate import ProposalState, UpgradeProposal
from matrix.observability import fleet
from matrix.observability.ingest import REASONS, refusal_reason
from matrix.observability.queues import broker_connection
from runners import signing

from ..runners.conftest import resigned
from ..runners.test_result_ingest import _claimed_jobs
from .conftest import TOKEN

pytestmark = pytest.mark.django_db

STORED = ("tilematrix_results_stored_total", ())
LAG_COUNT = ("tilematrix_ingest_lag_seconds_gcount", ())
LAG_SUM = ("tilematrix_ingest_lag_seconds_gsum", ())


def lag_bucket(le: str):
    return ("tilematrix_ingest_lag_seconds_bucket", (("le", le),))


def refused(reason: str):
    return ("tilematrix_results_refused_total", (("reason", reason),))


def signed_ago(monkeypatch, seconds: float) -> None:
    """The runner's clock signs its envelopes ``seconds`` ago."""
    then = timezone.now() - timedelta(seconds=seconds)
    monkeypatch.setattr(
        signing, "now_iso", lambda: then.isoformat(timespec="microseconds")
    )


def claimed_jobs(hand, cells, n: int) -> list[ValidationJob]:
    sweep = services.sweep_plan(cells=cells()[:n])
    jobs = list(sweep.jobs.order_by("pk"))
    for job in jobs:
        assert services.job_claim(
            job_id=job.pk, attempt=job.attempt, runner=hand.runner
        )
        job.refresh_from_db()
    return jobs


def test_metrics_need_the_bearer_token_when_one_is_set(client, settings):
    settings.TILEMATRIX_METRICS_TOKEN = TOKEN
    assert client.get("/metrics").status_code == 401
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope")
    assert wrong.status_code == 401 and wrong["WWW-Authenticate"].startswith("Bearer")
    right = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert right.status_code == 200
    assert right["Content-Type"].startswith("text/plain; version=0.0.4")
    openmetrics = client.get(
        "/metrics",
        HTTP_AUTHORIZATION=f"Bearer {TOKEN}",
        HTTP_ACCEPT="application/openmetrics-text; version=1.0.0",
    )
    assert openmetrics["Content-Type"].startswith("application/openmetrics-text")
    assert b"# TYPE tilematrix_ingest_lag_seconds gaugehistogram" in openmetrics.content
    posted = client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert posted.status_code == 405


def test_without_a_token_metrics_are_served_only_with_debug_on(client, settings):
    settings.TILEMATRIX_METRICS_TOKEN = ""
    settings.DEBUG = True
    assert client.get("/metrics").status_code == 200
    settings.DEBUG = False
    off = client.get("/metrics")
    assert off.status_code == 403 and b"TILEMATRIX_METRICS_TOKEN" in off.content


def test_prometheus_reaches_a_process_by_its_address_over_plain_http(client, settings):
    """Scraped by IP, with a Host no ALLOWED_HOSTS names, and no HTTPS
    redirect: as Prometheus reaches each gunicorn process."""
    settings.TILEMATRIX_METRICS_TOKEN = TOKEN
    settings.DEBUG = False
    settings.SECURE_SSL_REDIRECT = True
    settings.ALLOWED_HOSTS = ["tilematrix.example"]
    response = client.get(
        "/metrics", HTTP_HOST="10.0.0.7:8000", HTTP_AUTHORIZATION=f"Bearer {TOKEN}"
    )
    assert response.status_code == 200
    assert b"tilematrix_results_stored_total" in response.content


def test_every_figure_is_on_a_scrape(catalog, scrape):
    names = {name for name, _ in scrape()}
    assert {
        "tilematrix_results_stored_total",
        "tilematrix_results_refused_total",
        "tilematrix_ingest_lag_seconds_bucket",
        "tilematrix_ingest_lag_seconds_gcount",
        "tilematrix_ingest_lag_seconds_gsum",
        "tilematrix_jobs_in_flight",
        "tilematrix_runner_offline_after_seconds",
        "tilematrix_broker_up",
        "tilematrix_queue_messages",
        "tilematrix_scrape_part_ok",
    } <= names
    assert {
        reason
        for (name, labels) in scrape()
        if name.endswith("refused_total")
        for _, reason in labels
    } == set(REASONS)


def test_a_result_stored_through_ingest_moves_the_stored_count_and_the_lag(
    cpu_runner, running_job, scrape, monkeypatch
):
    before = scrape()
    signed_ago(monkeypatch, 40)
    (outcome,) = services.results_ingest(envelopes=[cpu_runner.result(running_job)])
    assert outcome.status == "stored"
    after = scrape()

    assert after[STORED] == outcome.result.pk > before[STORED]
    # Signed 40 s before it was stored: in the bucket up to 60 s, not 30 s.
    assert after[lag_bucket("30.0")] == before[lag_bucket("30.0")]
    assert after[lag_bucket("60.0")] == before[lag_bucket("60.0")] + 1
    assert after[LAG_COUNT] == before[LAG_COUNT] + 1
    assert 40 <= after[LAG_SUM] - before[LAG_SUM] < 60


def test_the_lag_leaves_out_results_stored_before_its_window(
    cpu_runner, running_job, scrape
):
    (outcome,) = services.results_ingest(envelopes=[cpu_runner.result(running_job)])
    assert scrape()[LAG_COUNT] == 1
    type(outcome.result.receipt).objects.update(
        received_at=timezone.now() - timedelta(hours=1)
    )
    assert scrape()[LAG_COUNT] == 0


def test_a_refused_result_moves_the_count_of_its_reason_alone(
    cpu_runner, running_job, scrape
):
    before = scrape()
    altered = copy.deepcopy(cpu_runner.result(running_job))
    altered["payload"]["result"]["status"] = "mismatch"
    (outcome,) = services.results_ingest(envelopes=[altered])
    assert outcome.status == "refused"
    after = scrape()
    assert after[refused("bad_signature")] == before[refused("bad_signature")] + 1
    assert all(
        after[refused(r)] == before[refused(r)] for r in REASONS if r != "bad_signature"
    )


def test_each_refusal_of_ingest_is_filed_under_its_own_reason(
    register, cpu_runner, running_job
):
    """Through the real ingest, so a refusal reworded there is noticed
    here rather than counted as "other"."""
    good = cpu_runner.result(running_job)
    altered = copy.deepcopy(good)
    altered["payload"]["result"]["status"] = "mismatch"
    # Refused for good, it ends its job's attempt: on a job of its own.
    _, (other_job,) = _claimed_jobs(cpu_runner, 1)
    envelopes = {
        "bad_signature": altered,
        "invalid_result": cpu_runner.result(other_job, status="great"),
        "not_assigned": register(name="cpu-2").result(running_job),
        "no_job": resigned(
            good, cpu_runner.key, payload={**good["payload"], "job": 10**9}
        ),
        "unknown_runner": resigned(good, cpu_runner.key, signer="ghost"),
    }
    outcomes = services.results_ingest(envelopes=list(envelopes.values()))
    services.results_ingest(envelopes=[good])
    envelopes["replay"] = resigned(
        cpu_runner.result(running_job, status="mismatch"),
        cpu_runner.key,
        nonce=good["nonce"],
    )
    outcomes += services.results_ingest(envelopes=[envelopes["replay"]])
    assert [o.status for o in outcomes] == ["refused"] * len(envelopes)
    filed = [refusal_reason(reason=o.reason, code=o.code) for o in outcomes]
    assert filed == list(envelopes)


def test_a_superseded_attempt_and_a_lost_job_are_filed_apart(cpu_runner, running_job):
    stale = cpu_runner.result(running_job)
    services.jobs_requeue(jobs=[running_job], reason="test")
    assert services.job_claim(
        job_id=running_job.pk, attempt=2, runner=cpu_runner.runner
    )
    (outcome,) = services.results_ingest(envelopes=[stale])
    assert refusal_reason(reason=outcome.reason, code=outcome.code) == (
        "attempt_superseded"
    )
    ValidationJob.objects.filter(pk=running_job.pk).update(state=JobState.LOST)
    (outcome,) = services.results_ingest(envelopes=[stale])
    assert refusal_reason(reason=outcome.reason, code=outcome.code) == "job_lost"


def test_an_older_heartbeat_moves_its_runners_age(cpu_runner, scrape):
    age = (
        "tilematrix_runner_heartbeat_age_seconds",
        (("health", "active"), ("runner", cpu_runner.name)),
    )
    assert scrape()[age] < 5
    type(cpu_runner.runner).objects.filter(pk=cpu_runner.runner.pk).update(
        last_heartbeat=timezone.now() - timedelta(seconds=300)
    )
    assert 300 <= scrape()[age] < 310
    assert scrape()[("tilematrix_runner_offline_after_seconds", ())] == 90


def test_planned_jobs_show_in_flight_on_their_queue_and_in_their_sweep(
    cpu_runner, cpu_cells, scrape
):
    sweep = services.sweep_plan(cells=cpu_cells()[:3])
    job = sweep.jobs.order_by("pk").first()
    sweep.jobs.update(created_at=timezone.now() - timedelta(seconds=120))
    planned = scrape()
    stage_state = (("stage", job.stage), ("state", "queued"))
    assert planned[("tilematrix_jobs_in_flight", stage_state)] == 3
    assert planned[("tilematrix_queue_jobs", (("queue", job.queue),))] == 3
    wait = ("tilematrix_queue_oldest_job_age_seconds", (("queue", job.queue),))
    assert 120 <= planned[wait] < 130
    progress = ("tilematrix_sweep_progress_ratio", (("sweep", str(sweep.pk)),))
    assert planned[progress] == 0

    assert services.job_claim(job_id=job.pk, attempt=1, runner=cpu_runner.runner)
    job.refresh_from_db()
    services.results_ingest(envelopes=[cpu_runner.result(job)])
    later = scrape()
    assert later[("tilematrix_jobs_in_flight", stage_state)] == 2
    assert later[progress] == pytest.approx(1 / 3)
    done = ("tilematrix_sweep_jobs", (("state", "done"), ("sweep", str(sweep.pk))))
    assert later[done] == 1


def test_a_manifest_approved_an_hour_ago_is_an_hour_old(catalog, owner, scrape):
    cpu = DeviceType.objects.get(backend="c")
    baseline, candidate = (
        Toolchain.objects.create(
            name=name, tilelang_version=name, fingerprint=uuid.uuid4().hex * 2
        )
        for name in ("0.1.13", "0.1.15")
    )
    proposal = UpgradeProposal.objects.create(
        baseline=baseline,
        candidate=candidate,
        proposer=owner,
        state=ProposalState.APPROVED,
        approved_at=timezone.now() - timedelta(hours=1),
    )
    proposal.device_types.add(cpu)
    age = scrape()[("tilematrix_manifest_age_seconds", (("device_type", str(cpu)),))]
    assert 3600 <= age < 3610


@pytest.fixture
def broker_dir(settings, tmp_path):
    """The embedded broker in a folder of this test's own (Redis, where the
    settings name it, as it is)."""
    if settings.CELERY_BROKER_URL.startswith("filesystem"):
        folder = tmp_path / "broker"
        folder.mkdir()
        settings.CELERY_BROKER_TRANSPORT_OPTIONS = {
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "control_folder": str(tmp_path / "control"),
        }


def test_queue_depth_is_what_the_broker_holds(broker_dir, register, scrape):
    hand = register(name=f"obs-{uuid.uuid4().hex[:8]}")
    depth = ("tilematrix_queue_messages", (("queue", hand.runner.queue),))
    assert scrape()[depth] == 0
    with broker_connection(2) as conn:
        waiting = conn.SimpleQueue(hand.runner.queue)
        try:
            waiting.put({"job": 1})
            assert scrape()[depth] == 1
            waiting.get(timeout=2).ack()
        finally:
            waiting.close()
    assert scrape()[depth] == 0
    assert scrape()[("tilematrix_broker_up", ())] == 1


def test_each_ingest_queue_has_its_depth(broker_dir, register, scrape, settings):
    settings.TILEMATRIX_INGEST_QUEUES = 2
    register(name=f"obs-{uuid.uuid4().hex[:8]}")
    with broker_connection(2) as conn:
        waiting = conn.SimpleQueue("ingest.1")
        try:
            waiting.put({"results": []})
            samples = scrape()
            assert samples[("tilematrix_queue_messages", (("queue", "ingest.1"),))] == 1
            assert samples[("tilematrix_queue_messages", (("queue", "ingest.0"),))] == 0
            waiting.get(timeout=2).ack()
        finally:
            waiting.close()


def test_a_dead_broker_leaves_depths_out_and_the_scrape_answers(
    cpu_runner, settings, scrape
):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    settings.CELERY_BROKER_TRANSPORT = None
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {}
    samples = scrape()
    assert samples[("tilematrix_broker_up", ())] == 0
    assert not any(name == "tilematrix_queue_messages" for name, _ in samples)
    assert STORED in samples


def test_a_part_that_fails_is_named_and_the_rest_answer(catalog, scrape, monkeypatch):
    def down(limit):
        raise OperationalError("connection refused")

    monkeypatch.setattr(fleet, "receipts_newest", down)
    samples = scrape()
    assert samples[("tilematrix_scrape_part_ok", (("part", "ingest_lag"),))] == 0
    assert samples[("tilematrix_scrape_part_ok", (("part", "results"),))] == 1
    assert LAG_COUNT not in samples and STORED in samples


def test_a_scrape_costs_the_same_queries_whatever_was_stored(
    cpu_runner, cpu_cells, scrape
):
    jobs = claimed_jobs(cpu_runner, cpu_cells, 4)
    with CaptureQueriesContext(connection) as before:
        scrape()
    services.results_ingest(envelopes=[cpu_runner.result(job) for job in jobs[:3]])
    assert Result.objects.count() == 3
    with CaptureQueriesContext(connection) as after:
        scrape()
    assert len(after) == len(before) <= 12
