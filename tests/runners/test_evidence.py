"""Evidence from the H200 lab (docs/evidence, real signed results) replayed
into a fresh server: through the normal ingest, once, and refused where it
was altered or does not fit."""

from __future__ import annotations

import copy
import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from matrix.fleet.evidence import evidence_import
from matrix.fleet.models import Runner
from matrix.models import Cell, JobState, Result, Shape, Sweep, ValidationJob

# The lab's newest served sweep on the current toolchain (the candidate of its
# upgrade A/B; the compile-only file beside it holds no validated cells).
EVIDENCE = sorted(
    (Path(__file__).resolve().parents[2] / "docs" / "evidence").glob(
        "*-h200-ab-tilelang-0.1.15.evidence.json"
    )
)[-1]


@pytest.fixture(scope="module")
def evidence() -> dict:
    return json.loads(EVIDENCE.read_text())


@pytest.fixture
def fresh(catalog, evidence):
    return copy.deepcopy(evidence)


def test_the_lab_sweep_lands_under_the_h200_with_every_served_cell(fresh):
    counts = evidence_import(fresh)
    assert counts == {"stored": 188, "duplicate": 0, "refused": []}
    lab = Runner.objects.get(name="h200-lab")
    assert lab.public_key == fresh["runner"]["public_key"]
    # An offline lab known by its evidence: no approval waits, no queue.
    assert lab.get_health_display() == "offline lab (evidence only)"
    assert lab.has_no_queue and not lab.is_pending
    assert {str(d) for d in lab.device_types.all()} >= {"NVIDIA H200 · sm_90a · cuda"}
    cells = Cell.objects.filter(device_type__model="H200")
    assert cells.count() == 188
    assert set(cells.values_list("status", flat=True)) == {"pass"}
    # The Mixtral and Qwen profiles came with the evidence; Llama was seeded.
    profiles = set(
        Shape.objects.filter(cells__in=cells).values_list("source_profile", flat=True)
    )
    assert profiles == {"llama-3-8b", "mixtral-8x7b", "qwen2.5-7b"}
    assert not ValidationJob.objects.filter(state=JobState.RUNNING).exists()
    # The ids were given: the next planned job draws a fresh one.
    assert ValidationJob.objects.order_by("-pk").first().pk == 188


def test_importing_again_changes_nothing(fresh):
    evidence_import(fresh)
    again = evidence_import(copy.deepcopy(fresh))
    assert again == {"stored": 0, "duplicate": 188, "refused": []}
    assert Result.objects.count() == 188


def test_a_result_altered_after_the_lab_signed_it_is_refused(fresh):
    fresh["results"][5]["payload"]["result"]["metrics"]["rel_err"] = 0.0
    counts = evidence_import(fresh)
    assert counts["stored"] == 187
    assert len(counts["refused"]) == 1 and counts["refused"][0].startswith("result 5:")
    job = fresh["results"][5]["payload"]["job"]
    assert not Result.objects.filter(job_id=job).exists()


def test_a_database_whose_job_ids_are_taken_is_refused_whole(fresh, cpu_runner):
    from matrix.fleet import services

    cells = services.cells_select(operator="softmax")
    sweep = services.sweep_plan(cells=cells[:1])
    # A CPU job that holds the id of one of the lab's (sequences run on
    # across tests on PostgreSQL, so the id is given, not drawn).
    job = sweep.jobs.get()
    job.pk = fresh["jobs"][7]["job"]
    job.save(force_insert=True)
    with pytest.raises(ValidationError, match="is another job here"):
        evidence_import(fresh)
    assert not Runner.objects.filter(name="h200-lab").exists()
    assert not Result.objects.exists()


def test_a_runner_of_that_name_with_another_key_is_not_the_lab(fresh):
    from datetime import timedelta

    from matrix.fleet import services

    services.runner_register(
        token=services.token_create(expires=timedelta(minutes=5)),
        name=fresh["runner"]["name"],
        public_key="ab" * 32,
        inventory=fresh["runner"]["inventory"],
    )
    with pytest.raises(ValidationError, match="another key"):
        evidence_import(fresh)
    assert not ValidationJob.objects.exists() and not Sweep.objects.exists()


def test_the_command_says_why_a_file_is_not_evidence(catalog, tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"results": []}))
    with pytest.raises(CommandError, match="not an evidence file"):
        call_command("evidence", "import", str(path))


def test_the_demo_opens_on_the_lab_toolchain_unless_one_is_current(fresh):
    from matrix.models import AuditEvent, Toolchain
    from matrix.services import toolchain_register

    evidence_import(fresh, current_if_none=True)
    lab = Toolchain.objects.get(is_current=True)
    assert lab.fingerprint == fresh["jobs"][0]["toolchain"]
    assert AuditEvent.objects.filter(verb="toolchain.current").count() == 1

    lab.is_current = False
    lab.save()
    other = toolchain_register(
        name="tilelang-prod", components={"tilelang": "0.1.15"}, current=True
    )
    evidence_import(copy.deepcopy(fresh), current_if_none=True)
    assert list(Toolchain.objects.filter(is_current=True)) == [other]


def job_set(index: int, **fields):
    def change(evidence: dict) -> None:
        evidence["jobs"][index].update(fields)

    return change


def listed_twice(evidence: dict) -> None:
    evidence["jobs"][150]["job"] = evidence["jobs"][3]["job"]


def measured_as_a_list(evidence: dict) -> None:
    evidence["measured"] = [1, 2]


def results_set(results: list):
    def change(evidence: dict) -> None:
        evidence["results"] = results

    return change


def result_of_an_unlisted_job(evidence: dict) -> None:
    evidence["jobs"] = evidence["jobs"][1:]


def result_signed_by_another(evidence: dict) -> None:
    evidence["results"][9]["signer"] = "someone-else"


def nothing_in_it(evidence: dict) -> None:
    evidence["jobs"], evidence["results"] = [], []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (job_set(150, operator=["gemm"]), "jobs[150]: unknown operator ['gemm']"),
        (job_set(150, job=2**70), "jobs[150]: job must be an id from 1 to"),
        (job_set(150, attempt="x"), "jobs[150]: attempt must be an integer"),
        (job_set(150, seed="abc"), "jobs[150]: seed must be an integer"),
        (job_set(150, stage="bogus"), "jobs[150]: stage must be one of lower"),
        (
            job_set(150, dims={"M": 10**30, "N": 4096}, operator="rmsnorm"),
            "jobs[150] (rmsnorm): M must be at most 2147483647",
        ),
        (job_set(150, weight=10**400), "jobs[150] (rmsnorm): weight must"),
        (job_set(150, profile="x" * 81), "jobs[150]: profile must be a name"),
        (job_set(150, revision=None), "jobs[150]: revision must be a sha256"),
        (listed_twice, "jobs[150]: job 4 is listed twice (also jobs[3])"),
        (measured_as_a_list, "measured must be an object"),
        (results_set([1, None]), "results[0]: an envelope must be a JSON object"),
        (results_set({"a": 1}), "needs a list of signed results"),
        (results_set([]), "the evidence holds no signed results"),
        (
            result_of_an_unlisted_job,
            "results[0] is the result of job 1, which the evidence does not list",
        ),
        (
            result_signed_by_another,
            "results[9] is signed by 'someone-else', not by the evidence's runner",
        ),
        (nothing_in_it, "the evidence lists no jobs: nothing to import"),
    ],
)
def test_a_malformed_file_is_refused_naming_the_job_and_nothing_is_written(
    fresh, change, message
):
    change(fresh)
    with pytest.raises(ValidationError) as refused:
        evidence_import(fresh)
    assert message in "; ".join(refused.value.messages)
    assert not Runner.objects.filter(name="h200-lab").exists()
    assert not ValidationJob.objects.exists() and not Sweep.objects.exists()


def test_the_command_refuses_a_malformed_job_in_one_line(fresh, tmp_path):
    fresh["jobs"][150]["operator"] = ["gemm"]
    path = tmp_path / "lab.evidence.json"
    path.write_text(json.dumps(fresh))
    with pytest.raises(CommandError, match=r"jobs\[150\]: unknown operator"):
        call_command("evidence", "import", str(path))


def test_the_command_refuses_results_that_are_not_envelopes_and_writes_nothing(
    fresh, tmp_path
):
    fresh["results"] = [1, None]
    path = tmp_path / "lab.evidence.json"
    path.write_text(json.dumps(fresh))
    with pytest.raises(CommandError, match=r"results\[0\]: an envelope must be"):
        call_command("evidence", "import", str(path))
    assert not Runner.objects.exists()
    # No job left running to hold its cell from the next sweep.
    assert not ValidationJob.objects.exists() and not Sweep.objects.exists()


def test_the_command_refuses_an_empty_evidence_file(fresh, tmp_path):
    path = tmp_path / "empty.evidence.json"
    path.write_text(json.dumps(fresh | {"jobs": [], "results": []}))
    with pytest.raises(CommandError, match="lists no jobs: nothing to import"):
        call_command("evidence", "import", str(path))
    assert not Runner.objects.exists()


def export(*args) -> str:
    out = StringIO()
    call_command("evidence", "export", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def imported(fresh, tmp_path):
    """The lab's evidence on this server, with its signed results as the
    lab brought them home, ready to be exported again."""
    evidence_import(copy.deepcopy(fresh))
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"results": fresh["results"]}))
    return Sweep.objects.get(), results


def test_an_exported_file_is_one_import_accepts(fresh, imported, tmp_path):
    sweep, results = imported
    out = tmp_path / "again.evidence.json"
    said = export(
        "--sweep", str(sweep.pk), "--results", str(results), "--out", str(out)
    )
    assert said.startswith("188 jobs, 188 results in ")
    exported = json.loads(out.read_text())
    assert exported["results"] == fresh["results"]
    # Its jobs and results are this server's already: counted, not refused.
    counts = evidence_import(exported)
    assert counts == {"stored": 0, "duplicate": 188, "refused": []}


def test_export_and_a_shape_saved_again_keep_the_declared_dim_order(
    fresh, imported, tmp_path
):
    """PostgreSQL's jsonb hands an object's keys back in its own order
    (shorter keys first): the shape's key, and the dims an export writes,
    follow the operator's declared order instead. Stored here as jsonb
    would, so SQLite shows it too."""
    sweep, results = imported
    gemm = Shape.objects.filter(operator__name="gemm", jobs__sweep=sweep).first()
    key = gemm.dims_key
    assert key.startswith("M=")
    # K, M, N: as jsonb keeps them (there, already so).
    Shape.objects.filter(pk=gemm.pk).update(dims=dict(sorted(gemm.dims.items())))
    out = tmp_path / "again.evidence.json"
    export("--sweep", str(sweep.pk), "--results", str(results), "--out", str(out))
    dims = [
        j["dims"]
        for j in json.loads(out.read_text())["jobs"]
        if j["operator"] == "gemm"
    ]
    assert {tuple(d) for d in dims} == {("M", "N", "K")}
    gemm = Shape.objects.get(pk=gemm.pk)
    gemm.weight += 1
    gemm.save()
    assert Shape.objects.get(pk=gemm.pk).dims_key == key


@pytest.mark.parametrize(
    ("results", "measured", "message"),
    [
        ({"results": {"a": 1}}, None, "needs a list of signed results"),
        ({"results": [1, None, "x", {}]}, None, r"results\[0\]: an envelope must"),
        ({"results": []}, None, "holds no signed results"),
        ([1, None, "x", {}], None, "is not a results bundle"),
        (None, [1, 2], "measured must be an object of figures, got \\[1, 2\\]"),
    ],
)
def test_export_refuses_inputs_import_would_refuse_and_writes_nothing(
    imported, tmp_path, results, measured, message
):
    sweep, results_path = imported
    if results is not None:
        results_path.write_text(json.dumps(results))
    args = ["--sweep", str(sweep.pk), "--results", str(results_path)]
    if measured is not None:
        (tmp_path / "measured.json").write_text(json.dumps(measured))
        args += ["--measured", str(tmp_path / "measured.json")]
    out = tmp_path / "lab.evidence.json"
    with pytest.raises(CommandError, match=message):
        export(*args, "--out", str(out))
    assert not out.exists()


@pytest.mark.parametrize("sweep", ["99999999999999999999999", "0", "-1"])
def test_export_refuses_a_sweep_id_out_of_range(catalog, tmp_path, sweep):
    out = tmp_path / "lab.evidence.json"
    with pytest.raises(CommandError, match="--sweep: takes an id, a whole number"):
        export("--sweep", sweep, "--results", "r.json", "--out", str(out))
    assert not out.exists()


@pytest.mark.parametrize("option", ["--results", "--measured", "--out"])
def test_export_refuses_an_empty_option(catalog, tmp_path, option):
    args = {"--sweep": "1", "--results": "r.json", "--out": str(tmp_path / "e.json")}
    with pytest.raises(CommandError, match=f"{option}: must not be empty"):
        export(*[part for k, v in (args | {option: ""}).items() for part in (k, v)])


def test_archived_evidence_a_year_old_is_imported_while_a_live_upload_expires(
    register, cpu_cells, client
):
    """Issue 19: with the 90-day limit of live uploads, a fresh `make run`
    would have opened without its evidence from three months on. Each result
    stays single-use (its job attempt, its nonce)."""
    from datetime import UTC, datetime, timedelta

    from matrix.fleet import services
    from matrix.fleet.evidence import evidence_export

    from .conftest import resigned

    lab = register(name="lab-a")
    sweep, _ = services.bundle_plan(runner_name="lab-a", cells=cpu_cells()[:3])
    year_ago = (datetime.now(UTC) - timedelta(days=365)).isoformat()
    results = [
        resigned(lab.result(job, "compile_error"), lab.key, issued_at=year_ago)
        for job in sweep.jobs.order_by("pk")
    ]
    live = client.post(
        "/api/v1/results",
        json.dumps({"results": results}),
        content_type="application/json",
    )
    assert live.status_code == 403
    assert live.json()["detail"].startswith("expired envelope: issued 315")
    data = evidence_export(sweeps=[sweep], results=results, measured={})

    counts = evidence_import(json.loads(json.dumps(data)))

    assert counts == {"stored": 3, "duplicate": 0, "refused": []}
    assert sweep.progress()["done"] == 3
    again = evidence_import(json.loads(json.dumps(data)))
    assert again == {"stored": 0, "duplicate": 3, "refused": []}
    replay = resigned(results[0], lab.key, nonce="0" * 32)
    (outcome,) = services.results_ingest(
        envelopes=[replay], max_age_s=services.ingest.ARCHIVED
    )
    assert outcome.status == "duplicate"  # the job attempt holds its result
