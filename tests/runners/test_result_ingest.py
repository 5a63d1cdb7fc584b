from __future__ import annotations

import copy
import hashlib
import threading
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from matrix.fleet import services
from matrix.fleet.models import Receipt
from matrix.fleet.services import ingest
from matrix.models import (
    Blob,
    Cell,
    DeviceType,
    JobState,
    Result,
    Shape,
    Status,
    Toolchain,
    ValidationJob,
)
from matrix.services import shape_import

from .conftest import RunnerHand, resigned


def test_a_result_is_stored_with_its_receipt_and_the_cell_points_at_it(
    cpu_runner, running_job
):
    envelope = cpu_runner.result(
        running_job, status="pass", timings={"kernel_ms": 0.2, "reference_ms": 0.4}
    )
    result, created = services.result_ingest(envelope=envelope)
    assert created
    assert result.status == Status.PASS and result.kernel_ms == 0.2
    assert result.receipt.signature == envelope["signature"]
    cell = Cell.objects.get()
    assert (cell.result, cell.status, cell.kernel_ms) == (result, Status.PASS, 0.2)
    running_job.refresh_from_db()
    assert running_job.state == JobState.DONE and running_job.finished_at


def test_a_second_copy_of_the_same_attempt_stores_nothing_new(cpu_runner, running_job):
    first, _ = services.result_ingest(
        envelope=cpu_runner.result(running_job, status="compile_error")
    )
    again, created = services.result_ingest(
        envelope=cpu_runner.result(running_job, status="pass")
    )
    assert not created and again.pk == first.pk
    assert Result.objects.count() == 1
    assert Cell.objects.get().status == Status.COMPILE_ERROR


def test_the_same_envelope_sent_again_is_already_stored(cpu_runner, running_job):
    """An upload retried after its reply was lost sends the very envelopes
    stored the first time: that is no failure."""
    envelope = cpu_runner.result(running_job)
    first, _ = services.result_ingest(envelope=envelope)
    again, created = services.result_ingest(envelope=envelope)
    assert not created and again.pk == first.pk
    assert Result.objects.count() == 1 and Receipt.objects.count() == 1


def test_another_envelope_with_a_spent_nonce_is_refused_as_a_replay(
    cpu_runner, running_job
):
    envelope = cpu_runner.result(running_job, status="compile_error")
    services.result_ingest(envelope=envelope)
    other = resigned(
        cpu_runner.result(running_job, status="pass"),
        cpu_runner.key,
        nonce=envelope["nonce"],
    )
    with pytest.raises(services.Conflict, match="replayed envelope"):
        services.result_ingest(envelope=other)
    assert Result.objects.get().status == Status.COMPILE_ERROR


def test_an_altered_result_is_refused(cpu_runner, running_job):
    envelope = cpu_runner.result(running_job, status="compile_error")
    altered = copy.deepcopy(envelope)
    altered["payload"]["result"]["status"] = "pass"
    with pytest.raises(PermissionDenied, match="bad signature"):
        services.result_ingest(envelope=altered)
    assert not Result.objects.exists()


def test_a_forged_result_is_refused(cpu_runner, running_job):
    cpu_runner.key = Ed25519PrivateKey.generate()
    with pytest.raises(PermissionDenied, match="bad signature"):
        services.result_ingest(envelope=cpu_runner.result(running_job))
    assert not Cell.objects.exists()


def test_a_revoked_runner_is_refused(cpu_runner, running_job):
    services.runner_revoke(name=cpu_runner.name)
    with pytest.raises(PermissionDenied, match="revoked"):
        services.result_ingest(envelope=cpu_runner.result(running_job))


def test_a_result_for_a_job_of_another_runner_is_refused(
    register, cpu_runner, running_job
):
    intruder = register(name="cpu-2")
    with pytest.raises(PermissionDenied, match="not assigned to runner 'cpu-2'"):
        services.result_ingest(envelope=intruder.result(running_job))
    assert not Result.objects.exists()


def test_a_result_for_a_superseded_attempt_is_refused(cpu_runner, running_job):
    stale = cpu_runner.result(running_job)
    services.jobs_requeue(jobs=[running_job], reason="test")
    running_job.refresh_from_db()
    assert services.job_claim(
        job_id=running_job.pk, attempt=2, runner=cpu_runner.runner
    )
    with pytest.raises(services.Conflict, match="no longer running"):
        services.result_ingest(envelope=stale)


def test_an_unknown_status_is_refused(cpu_runner, running_job):
    with pytest.raises(
        ValidationError, match="result.status must be a status of the ladder"
    ):
        services.result_ingest(envelope=cpu_runner.result(running_job, status="great"))


def test_the_harness_error_is_stored_with_its_signature(cpu_runner, running_job):
    error = {"signature": "c0ffee", "message": "LayoutInference failed for T.gemm"}
    result, _ = services.result_ingest(
        envelope=cpu_runner.result(running_job, status="compile_error", error=error)
    )
    assert (result.error_signature, result.error_message) == (
        "c0ffee",
        error["message"],
    )
    assert Cell.objects.get().error_signature == "c0ffee"


def test_an_infra_error_never_hides_an_answer_already_in_the_cell(
    cpu_runner, running_job, cpu_cells
):
    services.result_ingest(envelope=cpu_runner.result(running_job, status="pass"))
    job = services.sweep_plan(cells=cpu_cells()[:1]).jobs.get()
    services.job_claim(job_id=job.pk, attempt=1, runner=cpu_runner.runner)
    services.result_ingest(envelope=cpu_runner.result(job, status="infra_error"))
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert Cell.objects.get().status == Status.PASS


def test_a_batch_stores_the_good_results_and_names_each_refusal(
    cpu_runner, cpu_cells, register
):
    sweep = services.sweep_plan(cells=cpu_cells()[:4])
    jobs = list(sweep.jobs.order_by("pk"))
    for job in jobs:
        services.job_claim(job_id=job.pk, attempt=1, runner=cpu_runner.runner)
    intruder = register(name="cpu-2")
    outcomes = services.results_ingest(
        envelopes=[
            cpu_runner.result(jobs[0]),
            intruder.result(jobs[1]),
            "garbage",
            cpu_runner.result(jobs[3], status="mismatch"),
        ]
    )
    assert [o.status for o in outcomes] == ["stored", "refused", "refused", "stored"]
    assert outcomes[1].code == 403 and outcomes[2].code == 400
    assert Cell.objects.count() == 2
    assert sweep.progress()["done"] == 2


def _claimed_jobs(cpu_runner, count):
    """``count`` jobs on the CPU cells, claimed by the CPU runner."""
    shape_import(
        rows=[
            ("elementwise_add", {"M": m, "N": 8}, "float32", 0.0)
            for m in range(1, count + 1)
        ],
        source_profile="ingest-batch",
        served=False,
    )
    cpu = DeviceType.objects.get(backend="c")
    toolchain = Toolchain.objects.get(name="tilelang-0.1.15-cpu")
    shapes = Shape.objects.filter(source_profile="ingest-batch").order_by("pk")
    sweep = services.sweep_plan(cells=[(s, cpu, toolchain) for s in shapes])
    jobs = list(sweep.jobs.order_by("pk"))
    for job in jobs:
        assert services.job_claim(job_id=job.pk, attempt=1, runner=cpu_runner.runner)
    return sweep, jobs


def test_a_mixed_batch_stores_exactly_the_good_envelopes(cpu_runner, register):
    sweep, jobs = _claimed_jobs(cpu_runner, 8)
    earlier = cpu_runner.result(jobs[0], status="pass")
    services.result_ingest(envelope=earlier)
    intruder = register(name="cpu-2")
    altered = cpu_runner.result(jobs[3], status="compile_error")
    altered["payload"]["result"]["status"] = "pass"
    forger = RunnerHand(cpu_runner.runner, Ed25519PrivateKey.generate())
    twice = cpu_runner.result(jobs[1], status="mismatch")
    reused_nonce = resigned(
        cpu_runner.result(jobs[1], status="pass"), cpu_runner.key, nonce=twice["nonce"]
    )
    stale = cpu_runner.result(jobs[6])
    services.jobs_requeue(jobs=[jobs[6]], reason="test")
    assert services.job_claim(job_id=jobs[6].pk, attempt=2, runner=cpu_runner.runner)
    batch = [
        earlier,  # the same envelope stored before: already stored
        twice,  # good
        twice,  # the same envelope again in the batch: already stored
        reused_nonce,  # another envelope with the nonce just spent: replayed
        cpu_runner.result(jobs[1]),  # another copy of a stored attempt
        altered,
        forger.result(jobs[4]),
        intruder.result(jobs[5]),
        stale,  # its attempt was superseded
        cpu_runner.result(jobs[7], status="infra_error"),  # good
        cpu_runner.result(jobs[2], status="pass"),  # good
    ]
    outcomes = services.results_ingest(envelopes=batch)
    assert [(o.status, o.code) for o in outcomes] == [
        ("duplicate", 200),
        ("stored", 200),
        ("duplicate", 200),
        ("refused", 409),
        ("duplicate", 200),
        ("refused", 403),
        ("refused", 403),
        ("refused", 403),
        ("refused", 409),
        ("stored", 200),
        ("stored", 200),
    ]
    assert "replayed" in outcomes[3].reason
    assert "bad signature" in outcomes[5].reason
    assert "bad signature" in outcomes[6].reason
    assert "not assigned" in outcomes[7].reason
    assert "no longer running" in outcomes[8].reason
    assert outcomes[0].result.job_id == jobs[0].pk
    assert outcomes[2].result.pk == outcomes[4].result.pk == outcomes[1].result.pk
    stored = {(r.job_id, r.status) for r in Result.objects.all()}
    assert stored == {
        (jobs[0].pk, Status.PASS),
        (jobs[1].pk, Status.MISMATCH),
        (jobs[7].pk, Status.INFRA_ERROR),
        (jobs[2].pk, Status.PASS),
    }
    receipts = dict(Receipt.objects.values_list("result__job_id", "signature"))
    assert receipts[jobs[1].pk] == twice["signature"]
    assert receipts[jobs[2].pk] == batch[10]["signature"]
    states = dict(ValidationJob.objects.values_list("pk", "state"))
    assert [states[j.pk] for j in jobs] == [
        JobState.DONE,
        JobState.DONE,
        JobState.DONE,
        JobState.RUNNING,
        JobState.RUNNING,
        JobState.RUNNING,
        JobState.RUNNING,
        JobState.FAILED,
    ]
    cells = dict(Cell.objects.values_list("shape_id", "status"))
    assert cells == {
        jobs[0].shape_id: Status.PASS,
        jobs[1].shape_id: Status.MISMATCH,
        jobs[2].shape_id: Status.PASS,
        jobs[7].shape_id: Status.INFRA_ERROR,
    }
    progress = sweep.progress()
    assert (progress["done"], progress["failed"]) == (3, 1)


def test_a_large_batch_keeps_each_outcome_in_its_place(cpu_runner):
    _, jobs = _claimed_jobs(cpu_runner, ingest.VERIFY_PARALLEL_FROM * 2 + 3)
    forger = RunnerHand(cpu_runner.runner, Ed25519PrivateKey.generate())
    forged = {0, 5, 64, len(jobs) - 1}
    batch = [
        (forger if i in forged else cpu_runner).result(job, status="pass")
        for i, job in enumerate(jobs)
    ]
    outcomes = services.results_ingest(envelopes=batch)
    assert [o.status == "refused" for o in outcomes] == [
        i in forged for i in range(len(jobs))
    ]
    assert {o.result.job_id for o in outcomes if o.result} == {
        job.pk for i, job in enumerate(jobs) if i not in forged
    }
    assert Receipt.objects.count() == len(jobs) - len(forged)
    assert Cell.objects.filter(status=Status.PASS).count() == len(jobs) - len(forged)


def test_text_no_database_column_holds_costs_only_itself(cpu_runner):
    """A NUL character (PostgreSQL refuses it in text and JSON) in one
    runner's result is made storable; the rest of its batch is stored as it
    came."""
    sweep, jobs = _claimed_jobs(cpu_runner, 3)
    odd = cpu_runner.result(
        jobs[0],
        status="compile_error",
        error={"signature": "ab\x00cd", "message": "failed at \x00 byte"},
        kernel_source="int main() {\x00}",
        target={"kind": "c\x00"},
    )
    outcomes = services.results_ingest(
        envelopes=[odd, cpu_runner.result(jobs[1]), cpu_runner.result(jobs[2])]
    )
    assert [o.status for o in outcomes] == ["stored"] * 3
    stored = Result.objects.get(job=jobs[0])
    assert stored.error_message == "failed at \ufffd byte"
    assert stored.error_signature == "ab\ufffdcd"
    assert stored.kernel_source == "int main() {\ufffd}"
    assert stored.details["target"] == {"kind": "c\ufffd"}
    assert sweep.progress()["done"] == 3


def test_identical_texts_are_stored_once_across_results_and_batches(cpu_runner):
    _, jobs = _claimed_jobs(cpu_runner, 5)
    source, other = "void k(float* A) { /* generated */ }", "void k2() {}"
    failed = {"signature": "", "message": "error: tile shape does not divide M"}

    services.results_ingest(
        envelopes=[
            cpu_runner.result(jobs[0], kernel_source=source),
            cpu_runner.result(jobs[1], kernel_source=source),
            cpu_runner.result(jobs[2], "compile_error", error=failed),
        ]
    )
    services.results_ingest(
        envelopes=[
            cpu_runner.result(jobs[3], kernel_source=source),
            cpu_runner.result(
                jobs[4], "compile_error", error=failed, kernel_source=other
            ),
        ]
    )

    assert Blob.objects.count() == 3
    stored = [
        Result.objects.select_related("source", "error").get(job=job) for job in jobs
    ]
    assert [(r.kernel_source, r.error_message) for r in stored] == [
        (source, ""),
        (source, ""),
        ("", failed["message"]),
        (source, ""),
        (other, failed["message"]),
    ]
    assert len({stored[i].source_id for i in (0, 1, 3)}) == 1
    assert stored[2].error_id == stored[4].error_id
    # Named by the SHA-256 the gate compared before texts were shared.
    assert stored[0].source.sha256 == hashlib.sha256(source.encode()).hexdigest()
    assert "kernel_source" not in stored[0].details
    assert "kernel_source_sha256" not in stored[0].details


@pytest.mark.django_db(transaction=True)
def test_a_text_another_worker_is_storing_at_once_is_shared_not_refused(cpu_runner):
    """Two control workers meet the same new source: the second's insert
    waits for the first's transaction, then finds its row. PostgreSQL only:
    SQLite has one writer at a time."""
    if connection.vendor != "postgresql":
        pytest.skip("needs concurrent writers (PostgreSQL)")
    _, (job,) = _claimed_jobs(cpu_runner, 1)
    source = "void k_shared() {}"
    inserted = threading.Event()

    def other_worker_still_in_flight():
        with transaction.atomic():
            Blob.objects.resolve([Blob.of(source)])
            inserted.set()
            time.sleep(1.0)  # this ingest's insert of the text waits on it
        connection.close()

    other = threading.Thread(target=other_worker_still_in_flight)
    other.start()
    assert inserted.wait(10)
    try:
        (outcome,) = services.results_ingest(
            envelopes=[cpu_runner.result(job, kernel_source=source)]
        )
    finally:
        other.join()
    assert outcome.status == "stored", outcome.reason
    assert Blob.objects.get().text == source
    assert Result.objects.get().source_id == Blob.objects.get().pk


def test_a_batch_stores_its_texts_in_as_many_queries_whatever_its_size(cpu_runner):
    """No query a result: two new texts or twelve, the same statements."""
    # A ninth job stays running: a sweep's last result also tells its
    # subscribers it finished, which is statements of another kind.
    _, jobs = _claimed_jobs(cpu_runner, 9)
    failed = {"signature": "", "message": "error: {}"}

    def ingest_counting(batch) -> int:
        envelopes = [
            cpu_runner.result(
                job,
                "compile_error",
                error={**failed, "message": failed["message"].format(job.pk)},
                kernel_source=f"void k{job.pk}() {{}}",
            )
            for job in batch
        ]
        with CaptureQueriesContext(connection) as queries:
            outcomes = services.results_ingest(envelopes=envelopes)
        assert [o.status for o in outcomes] == ["stored"] * len(batch)
        return len(queries.captured_queries)

    # A first batch fills what ingest caches (the current revisions): the
    # batches compared are both warm.
    ingest_counting(jobs[:1])
    assert ingest_counting(jobs[1:3]) == ingest_counting(jobs[3:8])
    assert Blob.objects.count() == 16
