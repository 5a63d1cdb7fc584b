"""A signed result must still make sense: POST /api/v1/results refuses, with
the field named, every incoherent result a runner's key holder could sign
(issue 20: Infinity, -5, 1e308 and 0 ms passes, -100 s compiles, a pass
with rel_err 1e9, a pass for a build job), and stores the rest of the
batch."""

from __future__ import annotations

import hashlib
import json
import math

import pytest

from matrix.fleet import services
from matrix.models import (
    Cell,
    JobStage,
    KernelRevision,
    Operator,
    Result,
    Shape,
    Status,
    ValidationJob,
)
from runners import protocol
from runners.kernels import gemm, softmax

from .test_api import post
from .test_result_ingest import _claimed_jobs

PASSING = {"rel_err": 0.0, "max_abs_err": 0.0, "mismatch_ratio": 0.0}
TIMED = {"compile_s": 0.5, "kernel_ms": 0.2, "reference_ms": 0.4}


def _pass(**changes) -> dict:
    """A coherent pass of a validate job, with ``changes`` to its parts."""
    fields = {"metrics": dict(PASSING), "timings": dict(TIMED)}
    for part, values in changes.items():
        fields[part] = {**fields.get(part, {}), **values}
    return fields


INCOHERENT = [
    # (what the runner signs, the field the refusal names)
    pytest.param(
        "pass",
        _pass(timings={"kernel_ms": math.inf}),
        "result.timings.kernel_ms",
        id="kernel_ms-infinity",
    ),
    pytest.param(
        "pass",
        _pass(timings={"kernel_ms": -5}),
        "result.timings.kernel_ms",
        id="kernel_ms-negative",
    ),
    pytest.param(
        "pass",
        _pass(timings={"kernel_ms": 1e308}),
        "result.timings.kernel_ms",
        id="kernel_ms-1e308",
    ),
    pytest.param(
        "pass",
        _pass(timings={"kernel_ms": 0}),
        "result.timings.kernel_ms",
        id="kernel_ms-zero",
    ),
    pytest.param(
        "pass",
        _pass(timings={"compile_s": -100}),
        "result.timings.compile_s",
        id="compile_s-negative",
    ),
    pytest.param(
        "pass",
        _pass(metrics={"rel_err": 1e9, "mismatch_ratio": 1.0}),
        "result.metrics.rel_err",
        id="pass-with-rel_err-1e9",
    ),
    pytest.param(
        "pass",
        _pass(metrics={"mismatch_ratio": 0.5}),
        "result.metrics.mismatch_ratio",
        id="pass-with-half-mismatching",
    ),
    pytest.param(
        "pass",
        {"metrics": None, "timings": TIMED},
        "result.metrics.rel_err",
        id="pass-without-metrics",
    ),
    pytest.param(
        "mismatch",
        {"metrics": {"rel_err": math.nan}},
        "result.metrics.rel_err",
        id="metric-nan",
    ),
    pytest.param(
        "mismatch",
        {"metrics": {"mismatch_ratio": 1.5}},
        "result.metrics.mismatch_ratio",
        id="ratio-above-one",
    ),
    pytest.param(
        "runtime_error",
        {"timings": {"compile_s": "fast"}},
        "result.timings.compile_s",
        id="timing-not-a-number",
    ),
    pytest.param(
        ["pass"], _pass(), "result.status must be a status", id="status-a-list"
    ),
    pytest.param(
        "lowered",
        {},
        "result.status",
        id="lowered-from-a-validate-job",
    ),
    pytest.param(
        "pass",
        {**_pass(), "timing_samples": {"kernel_ms": [0.2, -1.0, 0.2]}},
        "result.timing_samples",
        id="sample-negative",
    ),
    pytest.param(
        "pass",
        {**_pass(), "timing_samples": {"kernel_ms": [0.2] * 500}},
        "result.timing_samples",
        id="samples-too-many",
    ),
    pytest.param(
        "pass",
        {**_pass(), "timing_samples": {"clock": [0.2, 0.2]}},
        "result.timing_samples",
        id="samples-of-an-unknown-clock",
    ),
    pytest.param(
        "pass",
        # Shown at 0.2 ms, judged on samples ten times slower.
        {**_pass(), "timing_samples": {"kernel_ms": [2.0, 2.1, 1.9, 2.0]}},
        "result.timings.kernel_ms 0.2 ms lies outside its own samples",
        id="median-outside-its-samples",
    ),
]


@pytest.mark.parametrize(("status", "fields", "field"), INCOHERENT)
def test_an_incoherent_result_is_refused_naming_the_field_and_the_batch_stored(
    client, cpu_runner, status, fields, field
):
    sweep, jobs = _claimed_jobs(cpu_runner, 2)
    bundle = {
        "results": [
            cpu_runner.result(jobs[0], status=status, **fields),
            cpu_runner.result(jobs[1], **_pass()),
        ]
    }

    response = post(client, "/results", bundle)

    assert response.status_code == 200
    reply = response.json()
    assert reply["stored"] == 1
    [refusal] = reply["refused"]
    assert refusal["index"] == 0 and refusal["reason"].startswith(field)
    assert Result.objects.get(job=jobs[1]).status == Status.PASS
    # Sent again it would be refused again: the attempt ends failed, with
    # the server's own infra_error result saying why.
    jobs[0].refresh_from_db()
    assert jobs[0].state == "failed"
    ended = Result.objects.get(job=jobs[0])
    assert ended.status == Status.INFRA_ERROR
    assert ended.error_message.endswith(refusal["reason"])


def test_a_result_refused_for_good_ends_its_job_frees_its_cell_and_leaves_the_outbox(
    cpu_runner,
):
    """Re-sent from the runner's outbox every heartbeat, it kept its job
    running forever, its cell unplannable and its sweep's ETA never met."""
    sweep, (job,) = _claimed_jobs(cpu_runner, 1)
    envelope = cpu_runner.result(job, **_pass(metrics={"rel_err": 0.5}))

    (refused,) = services.results_ingest(envelopes=[envelope])
    (again,) = services.results_ingest(envelopes=[envelope])

    assert refused.status == "refused" and refused.code == 400
    assert again.status == "duplicate"  # the outbox's copy changes nothing
    job.refresh_from_db()
    assert job.state == "failed"
    asked = protocol.request_envelope(
        kind="outbox",
        runner_name=cpu_runner.runner.name,
        key=cpu_runner.key,
        jobs=[{"job": job.pk, "attempt": job.attempt}],
    )
    assert services.outbox_pending(envelope=asked) == {"running": []}
    replanned = services.sweep_plan(
        cells=[(job.shape_id, job.device_type_id, job.toolchain_id)]
    )
    assert replanned.total == 1


def test_a_refused_result_signed_by_another_runner_leaves_the_job_running(
    cpu_runner, register
):
    """Only the job's own runner can end it: a key holder of another runner
    cannot fail someone else's job with an incoherent result."""
    sweep, (job,) = _claimed_jobs(cpu_runner, 1)
    other = register("cpu-other")
    forged = other.result(job, **_pass(metrics={"rel_err": 0.5}))

    (refused,) = services.results_ingest(envelopes=[forged])

    assert refused.status == "refused" and refused.code == 403
    job.refresh_from_db()
    assert job.state == "running"
    assert not Result.objects.filter(job=job).exists()


def _staged(cpu_runner, stage: str) -> ValidationJob:
    (_, (job,)) = _claimed_jobs(cpu_runner, 1)
    ValidationJob.objects.filter(pk=job.pk).update(stage=stage)
    job.refresh_from_db()
    return job


def test_a_pass_for_a_build_job_is_refused(client, cpu_runner):
    job = _staged(cpu_runner, JobStage.BUILD)

    response = post(
        client, "/results", {"results": [cpu_runner.result(job, "pass", **_pass())]}
    )

    assert response.status_code == 400
    assert response.json()["detail"] == (
        "result.status 'pass' cannot come from a build job (it ends built, "
        "compile_error, infra_error, runtime_error, timeout, unsupported)"
    )
    # Never a pass: the cell, empty before, shows the runner's trouble.
    assert list(Cell.objects.values_list("status", flat=True)) == [Status.INFRA_ERROR]


@pytest.mark.parametrize(
    ("stage", "status", "stored"),
    [
        (JobStage.LOWER, "lowered", True),
        (JobStage.LOWER, "unsupported", True),
        (JobStage.LOWER, "built", False),
        (JobStage.LOWER, "mismatch", False),
        (JobStage.BUILD, "built", True),
        (JobStage.BUILD, "timeout", True),
        (JobStage.BUILD, "mismatch", False),
        (JobStage.VALIDATE, "mismatch", True),
        (JobStage.VALIDATE, "built", False),
    ],
)
def test_a_status_is_stored_only_where_the_jobs_stage_can_reach_it(
    cpu_runner, stage, status, stored
):
    job = _staged(cpu_runner, stage)
    envelope = cpu_runner.result(job, status, stage_reached=stage)

    (outcome,) = services.results_ingest(envelopes=[envelope])

    assert (outcome.status == "stored") is stored, outcome.reason


def test_a_stage_beyond_the_jobs_own_is_refused(cpu_runner):
    job = _staged(cpu_runner, JobStage.LOWER)
    envelope = cpu_runner.result(job, "compile_error", stage_reached="validate")

    (outcome,) = services.results_ingest(envelopes=[envelope])

    assert outcome.status == "refused"
    assert outcome.reason == (
        'result.stage_reached "validate" is beyond the job\'s stage lower'
    )


def test_the_tolerance_is_the_servers_not_the_one_the_result_claims(cpu_runner):
    """A runner that claims a looser tolerance does not get a pass past the
    server's; what is stored beside the result is the server's tolerance."""
    sweep, jobs = _claimed_jobs(cpu_runner, 2)
    loose = {"rel_err": 1.0, "atol": 1, "rtol": 1, "max_mismatch_ratio": 1.0}
    forged = cpu_runner.result(
        jobs[0], **_pass(metrics={"rel_err": 0.5}), tolerance={**loose, "reason": "x"}
    )
    honest = cpu_runner.result(
        jobs[1], **_pass(metrics={"rel_err": 1e-6}), tolerance={**loose, "reason": "x"}
    )

    refused, stored = services.results_ingest(envelopes=[forged, honest])

    assert refused.status == "refused"
    assert refused.reason == (
        "result.metrics.rel_err 0.5 is above the tolerance of elementwise_add "
        "in float32 (1e-05): not a pass"
    )
    assert stored.status == "stored"
    tolerance = Result.objects.get(job=jobs[1]).details["tolerance"]
    assert tolerance["rel_err"] == 1e-5
    assert tolerance["reason"] != "x"


def _job_on(cpu_runner, operator: str, dims: dict, dtype: str) -> ValidationJob:
    """A claimed job, moved onto a cell of ``operator``."""
    job = _staged(cpu_runner, JobStage.VALIDATE)
    shape = Shape.objects.create(
        operator=Operator.objects.get(name=operator), dims=dims, dtype=dtype
    )
    revision = KernelRevision.objects.get(operator__name=operator, is_current=True)
    ValidationJob.objects.filter(pk=job.pk).update(shape=shape, revision=revision)
    job.refresh_from_db()
    return job


def test_a_pass_within_twice_the_rounding_floor_is_a_pass(cpu_runner):
    """The harness passes a float16 softmax over a large vocabulary whose
    error is its output dtype's rounding (subnormals); the H200 evidence
    has 0.0015 against a 0.001 tolerance, with no floor recorded."""
    job = _job_on(cpu_runner, "softmax", {"M": 1, "N": 151936}, "float16")
    assert softmax.OPERATOR.tolerances["float16"].rel_err == 1e-3

    within = cpu_runner.result(job, **_pass(metrics={"rel_err": 0.0015}))
    (outcome,) = services.results_ingest(envelopes=[within])

    assert outcome.status == "stored", outcome.reason


@pytest.mark.parametrize(
    ("floor", "rel_err", "stored"),
    [
        (6e-4, 1.1e-3, True),  # within twice the measured floor
        (6e-4, 1.3e-3, False),  # above it, and above the tolerance
        (1.0, 0.5, False),  # a floor no rounding can cost: capped
        (None, 0.5, False),  # no floor named: the cap
    ],
)
def test_a_claimed_rounding_floor_counts_up_to_what_rounding_can_cost(
    cpu_runner, floor, rel_err, stored
):
    job = _job_on(cpu_runner, "gemm", {"M": 64, "N": 64, "K": 64}, "float16")
    assert gemm.OPERATOR.tolerances["float16"].rel_err == 1e-3
    envelope = cpu_runner.result(
        job, **_pass(metrics={"rel_err": rel_err, "rounding_floor": floor})
    )

    (outcome,) = services.results_ingest(envelopes=[envelope])

    assert (outcome.status == "stored") is stored, outcome.reason
    if not stored:
        assert outcome.reason.startswith("result.metrics.rel_err")


def test_the_matrix_api_never_answered_infinity_for_a_refused_pass(client, cpu_runner):
    sweep, jobs = _claimed_jobs(cpu_runner, 1)
    post(
        client,
        "/results",
        {
            "results": [
                cpu_runner.result(jobs[0], **_pass(timings={"kernel_ms": math.inf}))
            ]
        },
    )

    text = client.get("/api/v1/matrix?backend=c").content.decode()

    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the API"))


def test_a_pass_faster_than_its_device_can_run_is_refused_naming_both_figures(
    cpu_runner,
):
    # A signed pass at 1e-9 ms was stored and served at 8.6e16x.
    job = _job_on(cpu_runner, "gemm", {"M": 512, "N": 512, "K": 512}, "float32")
    forged = cpu_runner.result(job, **_pass(timings={"kernel_ms": 1e-9}))
    twin = _job_on(cpu_runner, "gemm", {"M": 512, "N": 512, "K": 256}, "float32")
    honest = cpu_runner.result(twin, **_pass(timings={"kernel_ms": 0.5}))

    (refused,) = services.results_ingest(envelopes=[forged])
    (stored,) = services.results_ingest(envelopes=[honest])

    assert refused.status == "refused"
    assert refused.reason.startswith("result.timings.kernel_ms is implausible")
    assert "GB/s against a peak of 2000 GB/s" in refused.reason
    assert "TFLOP/s against 20" in refused.reason
    assert stored.status == "stored", stored.reason


def test_what_the_harness_learned_is_kept_and_the_cell_page_shows_it(
    client, cpu_runner, owner
):
    # Ingest dropped the distributions, the sandbox and the timing's trust.
    (_, (job,)) = _claimed_jobs(cpu_runner, 1)
    envelope = cpu_runner.result(
        job,
        **_pass(),
        distributions=["uniform", "zero rows", "outliers x1000", 7],
        sandbox="full: bwrap namespaces and a uid of its own",
        timing_trust="submitted: timed in a process that imported no submitted Python",
    )

    (outcome,) = services.results_ingest(envelopes=[envelope])

    details = outcome.result.details
    assert details["distributions"] == ["uniform", "zero rows", "outliers x1000"]
    assert details["sandbox"].startswith("full:")
    client.force_login(owner)
    page = client.get(f"/cells/{job.shape_id}/{job.device_type_id}/").content.decode()
    assert "uniform, zero rows, outliers x1000" in page
    assert "timed in a process that imported no submitted Python" in page


def test_a_pass_keeps_its_timing_samples_and_the_hash_of_its_code(cpu_runner):
    (_, (job,)) = _claimed_jobs(cpu_runner, 1)
    samples = {"kernel_ms": [0.19, 0.2, 0.21, 0.2], "reference_ms": [0.4, 0.41]}
    envelope = cpu_runner.result(
        job, **_pass(), timing_samples=samples, kernel_source="void k() {}"
    )

    (outcome,) = services.results_ingest(envelopes=[envelope])

    details = outcome.result.details
    assert details["kernel_ms_samples"] == samples["kernel_ms"]
    assert details["reference_ms_samples"] == samples["reference_ms"]
    stored = Result.objects.select_related("source").get(pk=outcome.result.pk)
    assert stored.source.sha256 == hashlib.sha256(b"void k() {}").hexdigest()
    assert stored.kernel_source == "void k() {}"


def test_an_unstable_validate_result_is_stored_and_shown_and_a_build_cannot_be(
    client, cpu_runner, owner
):
    _, (job, build) = _claimed_jobs(cpu_runner, 2)
    ValidationJob.objects.filter(pk=build.pk).update(stage=JobStage.BUILD)
    build.refresh_from_db()
    message = "1 of 3 runs wrong, failure rate 33% (95% interval 6%-79%): C has NaN"
    unstable = cpu_runner.result(
        job,
        "unstable",
        metrics={"rel_err": 0.5, "max_abs_err": 1.0, "mismatch_ratio": 0.5},
        error={"message": message, "signature": None, "pass_name": None},
    )
    claimed = cpu_runner.result(
        build,
        "unstable",
        error={"message": "x", "signature": None, "pass_name": None},
    )

    stored, refused = services.results_ingest(envelopes=[unstable, claimed])

    assert stored.status == "stored", stored.reason
    assert Cell.objects.get(result=stored.result).status == Status.UNSTABLE
    assert refused.status == "refused"
    assert "cannot come from a build job" in refused.reason
    client.force_login(owner)
    page = client.get(f"/cells/{job.shape_id}/{job.device_type_id}/").content.decode()
    assert "unstable" in page and "95% interval 6%-79%" in page


def test_the_cell_page_says_how_a_pass_compares_with_the_pass_before(
    client, cpu_runner, owner
):
    (_, (job,)) = _claimed_jobs(cpu_runner, 1)
    before = [0.200, 0.201, 0.199, 0.200, 0.202, 0.198]
    services.results_ingest(
        envelopes=[
            cpu_runner.result(
                job,
                **_pass(),
                timing_samples={"kernel_ms": before},
                kernel_source="void k() {}",
            )
        ]
    )
    again = services.sweep_plan(cells=[(job.shape, job.device_type, job.toolchain)])
    rerun = again.jobs.get()
    services.job_claim(job_id=rerun.pk, attempt=1, runner=cpu_runner.runner)
    rerun.refresh_from_db()
    slower = [s * 1.1 for s in before]
    (outcome,) = services.results_ingest(
        envelopes=[
            cpu_runner.result(
                rerun,
                **_pass(timings={"kernel_ms": 0.22}),
                timing_samples={"kernel_ms": slower},
                kernel_source="void k() {}",
            )
        ]
    )
    assert outcome.status == "stored", outcome.reason

    client.force_login(owner)
    page = client.get(f"/cells/{job.shape_id}/{job.device_type_id}/").content.decode()
    said = page.split("Since the pass before")[1].split("</dd>")[0]
    assert "1.10× the time of result" in said
    assert "<strong>slower</strong>, 99." in said
    assert "the same generated code" in said
