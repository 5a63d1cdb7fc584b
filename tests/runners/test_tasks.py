from __future__ import annotations

import copy
import logging
import queue
import time
from concurrent.futures import Future

import pytest
from celery.exceptions import Reject
from celery_batches import SimpleRequest
from django.db import OperationalError, connection, connections
from django.urls import reverse

from matrix.fleet import keys, services, tasks
from matrix.fleet.models import Runner
from matrix.models import Cell, JobState, Result, Status
from runners import jobs as job_task
from runners import signing

from .conftest import resigned

# What a worker's request carries beside its arguments.
REQUEST = {
    "id": "test",
    "name": "runners.ingest_result",
    "delivery_info": {},
    "hostname": "test",
    "ignore_result": True,
    "reply_to": None,
    "correlation_id": None,
    "request_dict": {},
}


def planned_job(cpu_cells):
    sweep = services.sweep_plan(cells=cpu_cells()[:1])
    job = sweep.jobs.select_related(
        "revision__operator", "shape", "device_type", "toolchain"
    ).get()
    return job, services.jobs_envelope([job])


def test_execute_job_runs_the_job_and_the_control_side_stores_its_result(
    host_dir, cpu_cells, eager_celery
):
    job, envelope = planned_job(cpu_cells)
    job_task.execute_job(envelope)
    job.refresh_from_db()
    assert job.state == JobState.DONE
    assert job.runner.name == host_dir.name
    result = Result.objects.get(job=job)
    assert result.status == Status.PASS
    assert Cell.objects.get().result == result


def test_execute_job_twice_runs_the_job_once(host_dir, cpu_cells, eager_celery, caplog):
    job, envelope = planned_job(cpu_cells)
    job_task.execute_job(envelope)
    with caplog.at_level(logging.INFO, logger="runners.jobs"):
        job_task.execute_job(envelope)
    assert Result.objects.filter(job=job).count() == 1
    assert "already taken" in caplog.text


def test_a_job_not_signed_by_the_server_is_dropped_with_a_log_line(
    host_dir, cpu_cells, eager_celery, caplog
):
    job, envelope = planned_job(cpu_cells)
    forged = copy.deepcopy(envelope)
    forged["payload"]["shape"] = {"M": 1, "N": 1}
    with caplog.at_level(logging.WARNING, logger="runners.jobs"):
        job_task.execute_job(forged)
        job_task.execute_job({"not": "an envelope"})
    assert caplog.text.count("dropped job message") == 2
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_a_job_whose_kernel_source_differs_here_ends_in_an_infra_error(
    host_dir, cpu_cells, eager_celery
):
    job, _ = planned_job(cpu_cells)
    job.revision.source_sha256 = "0" * 64
    envelope = services.jobs_envelope([job])
    job_task.execute_job(envelope)
    result = Result.objects.get(job=job)
    assert result.status == Status.INFRA_ERROR
    assert "kernel library differs" in result.error_message


def ingest(*messages) -> None:
    """The messages through the control worker's task, as one batch."""
    tasks.ingest_result.run(
        [SimpleRequest(args=[m], kwargs={}, **REQUEST) for m in messages]
    )


def test_ingest_result_logs_a_refusal_instead_of_failing(
    cpu_runner, running_job, caplog
):
    envelope = cpu_runner.result(running_job, status="compile_error")
    ingest(envelope)
    replay = resigned(
        cpu_runner.result(running_job, status="pass"),
        cpu_runner.key,
        nonce=envelope["nonce"],
    )
    with caplog.at_level(logging.WARNING, logger="matrix.fleet.tasks"):
        ingest(replay)
        ingest("garbage")
    assert "replayed envelope" in caplog.text
    assert "dropped result message" in caplog.text
    assert Result.objects.get().status == Status.COMPILE_ERROR


def test_ingest_result_delivered_twice_is_already_stored(
    cpu_runner, running_job, caplog
):
    envelope = cpu_runner.result(running_job, status="compile_error")
    ingest(envelope)
    with caplog.at_level(logging.INFO, logger="matrix.fleet.tasks"):
        ingest(envelope)
    assert "already stored" in caplog.text and "refused" not in caplog.text
    assert Result.objects.count() == 1


def test_messages_taken_together_store_each_result_and_drop_only_the_bad_one(
    cpu_runner, cpu_cells, caplog
):
    sweep = services.sweep_plan(cells=cpu_cells()[:3])
    jobs = list(sweep.jobs.order_by("pk"))
    for job in jobs:
        services.job_claim(job_id=job.pk, attempt=job.attempt, runner=cpu_runner.runner)
        job.refresh_from_db()
    first, second, third = (
        cpu_runner.result(job, status="compile_error") for job in jobs
    )
    with caplog.at_level(logging.WARNING, logger="matrix.fleet.tasks"):
        # Two messages of results, a message that is no list of envelopes,
        # and a copy of a result in the same batch.
        ingest([first, second], "garbage", third, [first])
    assert "dropped result message" in caplog.text
    assert set(Result.objects.values_list("job_id", flat=True)) == {j.pk for j in jobs}
    assert Result.objects.count() == 3


def test_a_batch_the_database_refuses_is_stored_message_by_message(
    cpu_runner, cpu_cells, monkeypatch, eager_celery, caplog
):
    """The database's refusal is simulated (no input this server lets
    through makes PostgreSQL refuse a batch): a batch that fails whole is
    tried one message at a time, and a message that still fails is sent
    again until it is stored."""
    from django.db import OperationalError

    sweep = services.sweep_plan(cells=cpu_cells()[:2])
    jobs = list(sweep.jobs.order_by("pk"))
    for job in jobs:
        services.job_claim(job_id=job.pk, attempt=job.attempt, runner=cpu_runner.runner)
        job.refresh_from_db()
    good, flaky = (cpu_runner.result(job, status="compile_error") for job in jobs)
    real = services.results_ingest
    failures = {"whole": 0, "flaky": 0}

    def refusing(*, envelopes, **options):
        if len(envelopes) > 1:
            failures["whole"] += 1
            raise OperationalError("simulated: could not serialize access")
        if envelopes[0]["nonce"] == flaky["nonce"] and failures["flaky"] < 2:
            failures["flaky"] += 1
            raise OperationalError("simulated: connection lost")
        return real(envelopes=envelopes, **options)

    monkeypatch.setattr(services, "results_ingest", refusing)
    with caplog.at_level(logging.WARNING, logger="matrix.fleet.tasks"):
        ingest(good, flaky)
    assert failures == {"whole": 1, "flaky": 2}
    assert "to be retried (retry 2)" in caplog.text
    assert set(Result.objects.values_list("job_id", flat=True)) == {j.pk for j in jobs}


def test_heartbeat_task_records_the_heartbeat_and_refuses_a_revoked_runner(
    register, caplog
):
    hand = register(online=False)
    tasks.heartbeat(hand.heartbeat())
    assert Runner.objects.get().state == Runner.State.ONLINE
    services.runner_revoke(name=hand.name)
    with caplog.at_level(logging.WARNING, logger="matrix.fleet.tasks"):
        tasks.heartbeat(hand.heartbeat())
    assert "is revoked" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_whose_connection_the_database_cuts_mid_task_is_recorded_at_once(
    register, caplog
):
    """A restart or failover that ends the control worker's connection while
    a task is inside its statements: the task runs again on a new
    connection, instead of failing (or waiting for a retry)."""
    if connection.vendor != "postgresql":
        pytest.skip("cutting a connection needs PostgreSQL (DATABASE_URL)")
    hand = register(online=False)
    connection.ensure_connection()
    victim = connection.connection.info.backend_pid
    cuts = []

    def cut_before_the_first_statement(execute, sql, params, many, context):
        if not cuts:
            cuts.append(sql)
            admin = connections.create_connection("default")
            with admin.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [victim])
            admin.close()
        return execute(sql, params, many, context)

    with (
        connection.execute_wrapper(cut_before_the_first_statement),
        caplog.at_level(logging.WARNING, logger="matrix.fleet.tasks"),
    ):
        tasks.heartbeat(hand.heartbeat())
    assert cuts, "the task made no statement to cut"
    assert Runner.objects.get().state == Runner.State.ONLINE
    assert "ended its connection mid-task; run again" in caplog.text
    assert connection.connection.info.backend_pid != victim


@pytest.mark.django_db(transaction=True)
def test_a_database_error_of_the_task_itself_is_not_run_again():
    """Only a cut connection makes a task run twice: an operational error of
    its own statements (a timeout, a missing table) is raised at once."""
    runs = []

    @tasks.again_if_the_connection_was_cut
    def broken():
        runs.append(1)
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SET statement_timeout = 1")
                cursor.execute("SELECT pg_sleep(1)")
            else:
                cursor.execute("SELECT * FROM no_such_table")

    try:
        with pytest.raises(OperationalError):
            broken()
    finally:
        connection.close()  # not the timeout for the tests after
    assert runs == [1]


def test_reap_task_requeues_the_jobs_of_a_silent_runner(cpu_runner, running_job):
    Runner.objects.update(last_heartbeat=None)
    tasks.reap()
    tasks.reap()
    running_job.refresh_from_db()
    assert (running_job.state, running_job.attempt) == (JobState.QUEUED, 2)


def test_signed_job_carries_what_the_harness_needs(cpu_runner, cpu_cells):
    job, envelope = planned_job(cpu_cells)
    payload = signing.envelope_verify(envelope, public_key=keys.server_public_key())
    (sent,) = payload["jobs"]
    assert sent["target"] == {"kind": "c"}
    assert sent["shape"] == job.shape.dims
    assert sent["toolchain"] == job.toolchain.fingerprint


def test_messages_carry_a_few_jobs_of_one_queue(cpu_runner, cpu_cells):
    sweep = services.sweep_plan(cells=cpu_cells())
    jobs = list(sweep.jobs.all())
    chunks = services.job_chunks(jobs + jobs[:3])
    assert [len(chunk) for _, chunk in chunks] == [5, 5, 3]
    assert {queue for queue, _ in chunks} == {jobs[0].queue}
    many = services.job_chunks(jobs * 100)
    assert len(many) == 40 and {len(c) for _, c in many} == {25}


def test_a_message_of_several_jobs_runs_them_all(host_dir, cpu_cells, eager_celery):
    sweep = services.sweep_plan(cells=cpu_cells())
    jobs = list(
        sweep.jobs.select_related(
            "revision__operator", "shape", "device_type", "toolchain"
        )
    )
    job_task.execute_job(services.jobs_envelope(jobs))
    assert sweep.progress()["done"] == len(jobs) == Result.objects.count()


def test_results_reach_the_server_job_by_job_while_the_message_runs(
    host_dir, cpu_cells, eager_celery, monkeypatch
):
    from runners import host

    # Each job takes longer than the time results wait to travel together.
    monkeypatch.setenv("TILEMATRIX_EDGE_HARNESS_DELAY_S", "1.2")
    sweep = services.sweep_plan(cells=cpu_cells()[:3])
    jobs = list(
        sweep.jobs.select_related(
            "revision__operator", "shape", "device_type", "toolchain"
        )
    )
    sent, done_after = [], []
    send = host.results_send

    def watched(envelopes):
        sent.append([e["payload"]["job"] for e in envelopes])
        send(envelopes)
        done_after.append(sweep.progress()["done"])

    monkeypatch.setattr(host, "results_send", watched)
    job_task.execute_job(services.jobs_envelope(jobs))
    assert sent == [[job.pk] for job in jobs]
    assert done_after == [1, 2, 3]
    assert Result.objects.count() == 3


def test_the_window_results_share_runs_from_the_first_ones_end_not_from_its_send(
    monkeypatch,
):
    from runners import host

    sent = []
    monkeypatch.setattr(host, "results_send", sent.append)
    ended = queue.SimpleQueue()
    now = time.monotonic()
    # All three wait at once, as after a slow send: "a"'s window closed
    # before "b" ended; "c" ended inside "b"'s.
    ended.put((now - 2.0, "a"))
    ended.put((now - 0.5, "b"))
    ended.put((now - 0.2, "c"))
    jobs_done = Future()
    jobs_done.set_result(None)
    host.results_stream(ended, jobs_done)
    assert sent == [["a"], ["b", "c"]]


def test_results_that_end_together_travel_in_one_message(
    host_dir, cpu_cells, eager_celery, monkeypatch
):
    from runners import host

    sweep = services.sweep_plan(cells=cpu_cells()[:5])
    jobs = list(
        sweep.jobs.select_related(
            "revision__operator", "shape", "device_type", "toolchain"
        )
    )
    sent = []
    send = host.results_send
    monkeypatch.setattr(host, "results_send", lambda e: sent.append(e) or send(e))
    job_task.execute_job(services.jobs_envelope(jobs))
    assert [len(envelopes) for envelopes in sent] == [5]
    assert sweep.progress()["done"] == 5


@pytest.fixture
def held_in_maintenance(host_dir, cpu_cells, eager_celery, client, admin_user):
    """A queued job whose message the runner's worker, left running in
    maintenance, gave back (no broker here takes it back: as good as lost);
    the admin is signed in."""
    job, envelope = planned_job(cpu_cells)
    runner = Runner.objects.get(name=host_dir.name)
    runner.set_health(Runner.Health.MAINTENANCE, by=admin_user)
    with pytest.raises(Reject):
        job_task.execute_job(envelope)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    client.force_login(admin_user)
    return job, runner


def test_ending_maintenance_runs_the_jobs_whose_messages_were_lost(
    held_in_maintenance, client, django_capture_on_commit_callbacks
):
    job, runner = held_in_maintenance
    with django_capture_on_commit_callbacks(execute=True):
        client.post(reverse("runner-health", args=[runner.pk]), {"health": "active"})
    job.refresh_from_db()
    assert job.state == JobState.DONE
    assert Result.objects.get(job=job).status == Status.PASS
