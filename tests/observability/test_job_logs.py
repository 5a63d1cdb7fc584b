"""One job id follows a job through the logs: planned (the server), run
(the runner agent), stored (the control worker's ingest), each line with
``job_id`` as a field of its own in JSON logs, and the sweep and runner
where the line's side knows them."""

from __future__ import annotations

from matrix.fleet import services
from runners import host
from tests.observability.test_json_logs import json_lines  # noqa: F401 (a fixture)
from tests.runners.conftest import host_dir, host_dir_of  # noqa: F401 (fixtures)


def test_a_jobs_id_finds_its_planning_its_run_and_its_storage(
    host_dir,  # noqa: F811
    cpu_cells,
    server_http,
    monkeypatch,
    json_lines,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    with django_capture_on_commit_callbacks(execute=True):
        sweep = services.sweep_plan(cells=cpu_cells()[:1])
    job = sweep.jobs.select_related(
        "revision__operator", "shape", "device_type", "toolchain"
    ).get()
    sent = []
    monkeypatch.setattr(host, "results_send", sent.extend)
    host.jobs_execute(
        envelope=services.jobs_envelope([job]), config=host_dir, timeout_s=60
    )
    (outcome,) = services.results_ingest(envelopes=sent)
    assert outcome.status == "stored"

    lines = {line["logger"]: line for line in json_lines() if "job_id" in line}
    planned = lines["matrix.fleet.services.planning"]
    ran = lines["runners.host"]
    stored = lines["matrix.fleet.services.ingest"]
    assert planned["job_id"] == ran["job_id"] == stored["job_id"] == job.pk
    assert planned["sweep_id"] == stored["sweep_id"] == sweep.pk
    assert ran["runner"] == stored["runner"] == host_dir.name
    assert stored["result_id"] == outcome.result.pk
