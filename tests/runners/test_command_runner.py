from __future__ import annotations

import json
import stat
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from matrix.fleet import services
from matrix.fleet.models import RegistrationToken, Runner, token_digest
from matrix.models import Cell, JobState, Result, Status, Sweep, ValidationJob
from runners import client, host
from tests.runners.conftest import cpu_inventory


def run(*args) -> str:
    out = StringIO()
    call_command("runner", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_token_create_prints_the_token_alone_on_its_last_line(catalog):
    token = run("token", "create", "--expires", "30m").strip().splitlines()[-1]
    record = RegistrationToken.objects.get()
    assert record.digest == token_digest(token)
    lifetime = (record.expires_at - record.created_at).total_seconds()
    assert 1790 < lifetime <= 1800


def test_token_create_refuses_a_malformed_lifetime(catalog):
    with pytest.raises(CommandError, match="like 1h"):
        run("token", "create", "--expires", "soon")


@pytest.mark.parametrize("lifetime", ["0s", "31d", "99999999999d"])
def test_token_create_refuses_a_lifetime_out_of_range(catalog, lifetime):
    with pytest.raises(CommandError, match="more than 0s and at most 30d"):
        run("token", "create", "--expires", lifetime)
    assert not RegistrationToken.objects.exists()


@pytest.mark.parametrize("server", ["nonsense", "ftp://127.0.0.1/", "file:///etc"])
def test_register_refuses_a_server_that_is_not_an_http_url(catalog, tmp_path, server):
    with pytest.raises(CommandError, match="--server takes an http"):
        run(
            "register", "--server", server, "--token", "t", "--name", "x",
            "--key-dir", str(tmp_path / "host"), "--inventory", "unread.json",
        )  # fmt: skip
    assert not (tmp_path / "host").exists()


def test_upload_refuses_a_server_that_is_not_an_http_url(catalog, tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"results": [{}]}))
    with pytest.raises(CommandError, match="--server takes an http"):
        run("upload", str(results), "--server", "nonsense")


def test_a_refused_registration_leaves_no_key_behind(catalog, tmp_path, server_http):
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps(cpu_inventory()))
    with pytest.raises(CommandError, match="unknown registration token"):
        run(
            "register", "--server", "http://testserver", "--token", "0" * 64,
            "--name", "lab", "--key-dir", str(tmp_path / "host"),
            "--inventory", str(inventory),
        )  # fmt: skip
    assert not (tmp_path / "host").exists()


def test_register_refuses_a_key_directory_it_cannot_write(catalog, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(CommandError, match="not a directory this user can write"):
        run(
            "register", "--server", "http://127.0.0.1:9", "--token", "t",
            "--name", "x", "--key-dir", str(blocker / "host"),
            "--inventory", "unread.json",
        )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_register_over_http_then_a_reused_token_exits_with_the_reason(
    live_server, tmp_path
):
    from matrix.services import catalog_seed

    catalog_seed()
    token = run("token", "create").strip().splitlines()[-1]
    key_dir = tmp_path / "host"
    out = run(
        "register",
        "--server",
        live_server.url,
        "--token",
        token,
        "--name",
        "lab-cpu",
        "--key-dir",
        str(key_dir),
    )
    runner = Runner.objects.get()
    assert (
        f"registered runner lab-cpu (id {runner.pk}): x86-64 CPU; key fingerprint "
        f"{runner.key_fingerprint}\nrunner lab-cpu is waiting for approval"
    ) in out
    assert f"({live_server.url}/runners/)" in out
    assert stat.S_IMODE((key_dir / "runner.key").stat().st_mode) == 0o600
    config = json.loads((key_dir / "runner.json").read_text())
    assert config["queues"] == []
    assert run("queues", "--key-dir", str(key_dir)).strip() == ""
    run("approve", "lab-cpu")
    assert run("queues", "--key-dir", str(key_dir)).strip() == ",".join(runner.queues())
    with pytest.raises(
        CommandError, match=r"refused \(403\): registration token already used"
    ):
        run(
            "register",
            "--server",
            live_server.url,
            "--token",
            token,
            "--name",
            "lab-cpu-2",
            "--key-dir",
            str(tmp_path / "other"),
        )
    assert Runner.objects.count() == 1
    # Refused: no key that no server knows, no directory for it.
    assert not (tmp_path / "other").exists()


def test_register_against_an_unreachable_server_says_so(catalog, tmp_path, monkeypatch):
    from runners import host

    monkeypatch.setattr(
        host, "inventory_probe", lambda interpreters: {"devices": [], "toolchains": []}
    )
    with pytest.raises(CommandError, match="cannot reach"):
        run(
            "register",
            "--server",
            "http://127.0.0.1:9",
            "--token",
            "t",
            "--name",
            "x",
            "--key-dir",
            str(tmp_path),
        )


def test_queues_without_registration_explains_what_to_do(catalog, tmp_path):
    with pytest.raises(CommandError, match="register first"):
        run("queues", "--key-dir", str(tmp_path))


def test_queues_are_asked_of_the_server(host_dir, cpu_runner, server_http):
    out = run("queues", "--key-dir", str(host_dir.directory))
    assert out.strip() == ",".join(cpu_runner.runner.queues())
    assert [url for url, _ in server_http] == [
        "http://testserver/api/v1/runners/queues"
    ]


def test_queues_of_a_runner_the_server_forgot_says_register_again(
    host_dir, server_http
):
    Runner.objects.all().delete()
    with pytest.raises(CommandError, match="does not know runner 'cpu-1'"):
        run("queues", "--key-dir", str(host_dir.directory))


def test_queues_with_the_server_away_says_so(host_dir, monkeypatch):

    host_dir.server = "http://127.0.0.1:9"
    host_dir.save()
    with pytest.raises(CommandError, match="cannot reach http://127.0.0.1:9"):
        run("queues", "--key-dir", str(host_dir.directory))


def test_revoke_refuses_the_runner(cpu_runner):
    assert "revoked" in run("revoke", cpu_runner.name)
    assert Runner.objects.get().revoked_at is not None
    with pytest.raises(CommandError, match="no runner named 'ghost'"):
        run("revoke", "ghost")


def test_maintenance_on_and_off_gives_no_work_then_sends_queued_jobs_again(
    cpu_runner, cpu_cells
):
    from matrix.models import AuditEvent

    assert "in maintenance" in run("maintenance", cpu_runner.name, "on")
    runner = Runner.objects.get()
    assert runner.health == Runner.Health.MAINTENANCE
    job = services.sweep_plan(cells=cpu_cells()[:2]).jobs.first()
    assert not services.job_claim(
        job_id=job.pk, attempt=1, runner=runner, queues=runner.queues()
    )
    assert "2 queued jobs on its queues sent again" in run(
        "maintenance", cpu_runner.name, "off"
    )
    # Each switch is audited; the command line has no user: "system".
    assert list(
        AuditEvent.objects.filter(verb__in=["runner.maintenance", "runner.active"])
        .order_by("pk")
        .values_list("actor_label", "verb")
    ) == [("system", "runner.maintenance"), ("system", "runner.active")]


def test_maintenance_refuses_a_revoked_or_unknown_runner(cpu_runner):
    run("revoke", cpu_runner.name)
    with pytest.raises(CommandError, match="a revoked runner stays revoked"):
        run("maintenance", cpu_runner.name, "on")
    assert Runner.objects.get().health == Runner.Health.ACTIVE
    with pytest.raises(CommandError, match="no runner named 'ghost'"):
        run("maintenance", "ghost", "off")


def test_a_bundle_that_will_not_come_home_is_abandoned_and_its_cells_freed(
    cpu_runner, tmp_path
):
    first = tmp_path / "first.json"
    run("bundle", cpu_runner.name, "--out", str(first))
    second = tmp_path / "second.json"
    # Every cell is held by the first bundle: nothing is left to plan.
    assert "open job" in run("bundle", cpu_runner.name, "--out", str(second))
    assert not second.exists()
    sweep = json.loads(first.read_text())["sweep"]
    said = run("bundle-abandon", cpu_runner.name, "--sweep", str(sweep))
    total = Sweep.objects.get(pk=sweep).total
    assert said.startswith(f"{total} bundle jobs of runner {cpu_runner.name} (sweep")
    assert Sweep.objects.get(pk=sweep).progress()["finished"]
    assert set(
        Result.objects.filter(job__sweep=sweep).values_list("status", flat=True)
    ) == {Status.INFRA_ERROR}
    run("bundle", cpu_runner.name, "--out", str(second))
    assert len(json.loads(second.read_text())["jobs"]) > 0
    assert "no open bundle job" in run(
        "bundle-abandon", cpu_runner.name, "--sweep", str(sweep)
    )
    with pytest.raises(CommandError, match="no runner named 'ghost'"):
        run("bundle-abandon", "ghost")


@pytest.mark.django_db(transaction=True)
def test_an_offline_bundle_runs_without_a_broker_and_comes_home(
    live_server, host_dir, tmp_path, server_http, django_db_blocker
):
    jobs, results = tmp_path / "jobs.json", tmp_path / "results.json"
    run(
        "bundle",
        host_dir.name,
        "--out",
        str(jobs),
        "--device-type",
        "c",
        "--operator",
        "softmax",
    )
    planned = ValidationJob.objects.filter(queue=f"bundle.{host_dir.name}")
    messages = json.loads(jobs.read_text())["jobs"]
    assert planned.count() == sum(len(m["payload"]["jobs"]) for m in messages) > 0
    assert set(planned.values_list("state", flat=True)) == {JobState.RUNNING}
    assert (
        services.runner_reap()["requeued"] == 0
    )  # a lab without a network does not heartbeat

    with django_db_blocker.block():  # no database, and no server either
        out = run(
            "execute-bundle",
            str(jobs),
            "--out",
            str(results),
            "--key-dir",
            str(host_dir.directory),
        )
    assert not server_http
    assert "signed results" in out
    assert not Result.objects.exists()  # nothing reached the server yet

    reply = run(
        "upload",
        str(results),
        "--server",
        live_server.url,
        "--key-dir",
        str(host_dir.directory),
    )
    assert reply.startswith(f"{planned.count()} stored, 0 already stored, 0 refused")
    assert set(Cell.objects.values_list("status", flat=True)) == {Status.PASS}
    # Sent again (its reply was lost, say): already stored, not a failure.
    again = run("upload", str(results), "--server", live_server.url)
    assert again.startswith(f"0 stored, {planned.count()} already stored, 0 refused")


@pytest.mark.django_db(transaction=True)
def test_an_air_gapped_host_registers_from_its_probed_inventory(live_server, tmp_path):
    from matrix.services import catalog_seed

    catalog_seed()
    inventory = tmp_path / "inventory.json"
    assert "inventory of x86-64 CPU" in run("probe", "--out", str(inventory))
    probed = json.loads(inventory.read_text())
    # What a GPU host in a closed lab would have written.
    probed["devices"].insert(
        0,
        {
            "vendor": "NVIDIA",
            "model": "H200",
            "arch": "sm_90a",
            "backend": "cuda",
            "memory_gb": 140,
        },
    )
    inventory.write_text(json.dumps(probed))
    token = run("token", "create").strip().splitlines()[-1]
    run(
        "register", "--server", live_server.url, "--token", token, "--name",
        "closed-lab", "--key-dir", str(tmp_path / "host"),
        "--inventory", str(inventory),
    )  # fmt: skip
    runner = Runner.objects.get(name="closed-lab")
    assert {str(d) for d in runner.claimed_device_types()} == {
        "NVIDIA H200 · sm_90a · cuda",
        "x86-64 CPU · c",
    }
    run("approve", "closed-lab")
    assert {str(d) for d in runner.device_types.all()} == {
        "NVIDIA H200 · sm_90a · cuda",
        "x86-64 CPU · c",
    }
    hosted = runner.runnertoolchain_set.get()
    assert hosted.interpreter == probed["toolchains"][0]["interpreter"]


def test_register_with_an_unreadable_inventory_says_so(catalog, tmp_path):
    with pytest.raises(CommandError, match=r"cannot read .*missing\.json"):
        run(
            "register", "--server", "http://127.0.0.1:9", "--token", "t",
            "--name", "x", "--key-dir", str(tmp_path / "h"),
            "--inventory", str(tmp_path / "missing.json"),
        )  # fmt: skip


def test_a_gpu_host_without_a_database_driver_loads_the_runner_command(tmp_path):
    """A GPU runner host installs requirements-gpu.txt, which has no psycopg
    (it holds no database login): Django and every runner module must load
    there, or `runner probe` dies before probing anything."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    code = (
        "import sys, runpy; sys.modules['psycopg'] = None;"
        "sys.argv = ['manage.py', 'runner', '--help'];"
        "runpy.run_path('manage.py', run_name='__main__')"
    )
    env = {
        **{k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
        "TILEMATRIX_VAR_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "probe" in done.stdout


def bundle(name, out, *filters) -> str:
    return run("bundle", name, "--out", str(out), "--device-type", "c", *filters)


def test_a_bundle_to_a_missing_directory_plans_nothing(cpu_runner, tmp_path):
    with pytest.raises(CommandError, match="there is no directory /nonexistent"):
        bundle(cpu_runner.name, "/nonexistent/b.json")
    assert not ValidationJob.objects.exists() and not Sweep.objects.exists()
    # The cells are still free: a bundle to a good path plans them.
    assert "signed jobs for cpu-1" in bundle(cpu_runner.name, tmp_path / "b.json")
    assert ValidationJob.objects.exists()


def test_a_bundle_whose_write_fails_rolls_its_plan_back(
    cpu_runner, tmp_path, monkeypatch
):
    from runners import files as _files

    def disk_full(source, target):
        raise OSError(28, "No space left on device")

    (tmp_path / "lab").mkdir()
    out = tmp_path / "lab" / "b.json"
    monkeypatch.setattr(_files.os, "replace", disk_full)
    with pytest.raises(CommandError, match="cannot write .*No space left"):
        bundle(cpu_runner.name, out)
    assert not ValidationJob.objects.exists() and not Sweep.objects.exists()
    assert list(out.parent.iterdir()) == []  # no half-written file either
    monkeypatch.undo()
    bundle(cpu_runner.name, out)
    planned = ValidationJob.objects.filter(state=JobState.RUNNING)
    messages = json.loads(out.read_text())["jobs"]
    assert planned.count() == sum(len(m["payload"]["jobs"]) for m in messages) > 0


def test_a_bundle_with_an_unknown_filter_value_names_the_allowed_ones(cpu_runner):
    with pytest.raises(CommandError, match="--operator must be one of .*gemm"):
        run("bundle", cpu_runner.name, "--out", "b.json", "--operator", "nope")
    assert not Sweep.objects.exists()


def test_a_bundle_with_nothing_to_plan_writes_nothing(cpu_runner, tmp_path):
    bundle(cpu_runner.name, tmp_path / "first.json")
    out = bundle(cpu_runner.name, tmp_path / "second.json")
    assert out.startswith("nothing to plan for cpu-1: ")
    assert "open job" in out
    assert Sweep.objects.count() == 1
    assert not (tmp_path / "second.json").exists()


def test_execute_bundle_refuses_a_directory_out_before_running_a_job(
    host_dir, tmp_path, monkeypatch
):
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps({"jobs": []}))
    monkeypatch.setattr(host, "bundle_execute", pytest.fail)
    with pytest.raises(CommandError, match="is a directory; name a file"):
        run("execute-bundle", str(jobs), "--out", str(tmp_path))


def test_probe_refuses_an_out_it_cannot_write_before_probing(monkeypatch):
    monkeypatch.setattr(host, "inventory_probe", pytest.fail)
    with pytest.raises(CommandError, match="there is no directory /nonexistent"):
        run("probe", "--out", "/nonexistent/x.json")


def padded_results(hand, jobs, size: int) -> list[dict]:
    """A signed result per job, each about ``size`` bytes of JSON: a lab's
    results carry long sanitized error messages and timings."""
    return [hand.result(job, status="compile_error", notes="x" * size) for job in jobs]


def test_upload_sends_a_large_bundle_in_batches_under_the_body_limit(
    cpu_runner, cpu_cells, tmp_path, server_http
):
    from django.conf import settings

    services.bundle_plan(runner_name=cpu_runner.name, cells=cpu_cells())
    jobs = list(ValidationJob.objects.order_by("pk"))
    results = tmp_path / "results.json"
    # Together well over the server's limit, as ~500 ordinary results are.
    envelopes = padded_results(cpu_runner, jobs, 400_000)
    results.write_text(json.dumps({"results": envelopes}))
    assert results.stat().st_size > settings.DATA_UPLOAD_MAX_MEMORY_SIZE

    out = run("upload", str(results), "--server", "http://testserver")

    assert out.startswith(f"{len(jobs)} stored, 0 already stored, 0 refused")
    sizes = [len(json.dumps(body)) for _, body in server_http]
    assert len(sizes) > 1
    assert max(sizes) < settings.DATA_UPLOAD_MAX_MEMORY_SIZE / 2
    assert Result.objects.count() == len(jobs)


def test_upload_numbers_refusals_by_their_place_in_the_file(
    cpu_runner, cpu_cells, tmp_path, server_http
):
    services.bundle_plan(runner_name=cpu_runner.name, cells=cpu_cells())
    jobs = list(ValidationJob.objects.order_by("pk"))
    envelopes = padded_results(cpu_runner, jobs, 400_000)
    envelopes[-1]["payload"]["result"]["status"] = "pass"  # no longer as signed
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"results": envelopes}))
    err = StringIO()
    with pytest.raises(SystemExit):
        call_command(
            "runner", "upload", str(results), "--server", "http://testserver",
            stdout=StringIO(), stderr=err,
        )  # fmt: skip
    assert err.getvalue().startswith(f"  result {len(envelopes) - 1}: ")


def test_upload_says_which_batch_failed_and_what_went_before(tmp_path, monkeypatch):
    envelopes = [{"nonce": str(i), "padding": "x" * 400_000} for i in range(6)]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"results": envelopes}))
    answers = iter(
        [
            (200, {"stored": 2, "duplicate": 0, "refused": []}),
            (
                413,
                {"detail": "the body is 3.1 MB; the most this server takes is 2.5 MB"},
            ),
        ]
    )
    monkeypatch.setattr(client, "post_json", lambda url, body, timeout: next(answers))
    with pytest.raises(CommandError) as refused:
        run("upload", str(results), "--server", "http://tilematrix.example")
    assert str(refused.value) == (
        "batch 2 of 3 (results 2-3) refused (413): the body is 3.1 MB; the most "
        "this server takes is 2.5 MB; the batches before it: 2 stored, 0 already "
        "stored, 0 refused"
    )


def test_registering_again_after_revocation_says_what_to_change(
    catalog, tmp_path, server_http
):
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps(cpu_inventory()))
    key_dir = tmp_path / "host"

    def register(name):
        token = run("token", "create").strip().splitlines()[-1]
        return run(
            "register", "--server", "http://testserver", "--token", token,
            "--name", name, "--key-dir", str(key_dir), "--inventory", str(inventory),
        )  # fmt: skip

    register("lab-cpu")
    run("revoke", "lab-cpu")
    with pytest.raises(CommandError, match="revoked; register under another name"):
        register("lab-cpu")
    with pytest.raises(
        CommandError, match=f"{key_dir / 'runner.key'} holds that key: move it away"
    ):
        register("lab-cpu-2")
    (key_dir / "runner.key").rename(tmp_path / "revoked.key")
    assert "registered runner lab-cpu-2" in register("lab-cpu-2")


def test_a_bundle_with_a_device_type_that_is_no_id_plans_nothing(cpu_runner, tmp_path):
    out = tmp_path / "b.json"
    with pytest.raises(CommandError, match="--device-type takes an id"):
        run("bundle", cpu_runner.name, "--out", str(out), "--device-type", "²")
    assert not Sweep.objects.exists() and not out.exists()


@pytest.mark.parametrize("option", ["--operator", "--device-type", "--toolchain"])
def test_a_bundle_with_an_empty_filter_value_plans_nothing(
    cpu_runner, tmp_path, option
):
    out = tmp_path / "b.json"
    with pytest.raises(CommandError, match=f"{option}: must not be empty"):
        run("bundle", cpu_runner.name, "--out", str(out), option, "")
    assert not Sweep.objects.exists() and not out.exists()


@pytest.mark.parametrize("sweep", ["99999999999999999999999", "0", "²"])
def test_bundle_abandon_refuses_a_sweep_id_out_of_range(cpu_runner, sweep):
    with pytest.raises(CommandError, match="--sweep: takes an id, a whole number"):
        run("bundle-abandon", cpu_runner.name, "--sweep", sweep)


def test_bundle_abandon_says_there_is_no_such_sweep(cpu_runner):
    with pytest.raises(CommandError, match="^there is no sweep 4242$"):
        run("bundle-abandon", cpu_runner.name, "--sweep", "4242")


def test_bundle_abandon_refuses_a_sweep_that_is_not_that_runners_bundle(
    cpu_runner, cpu_cells
):
    planned = services.sweep_plan(cells=cpu_cells()[:2])
    with pytest.raises(CommandError, match="is not a bundle of runner cpu-1"):
        run("bundle-abandon", cpu_runner.name, "--sweep", str(planned.pk))
    # Its jobs are the broker's, left to run.
    assert set(planned.jobs.values_list("state", flat=True)) == {JobState.QUEUED}


def test_execute_bundle_refuses_a_bundle_with_no_jobs_and_writes_nothing(
    host_dir, tmp_path
):
    jobs, out = tmp_path / "jobs.json", tmp_path / "results.json"
    jobs.write_text(json.dumps({"jobs": []}))
    with pytest.raises(CommandError, match="holds no jobs: nothing to run"):
        run("execute-bundle", str(jobs), "--out", str(out))
    assert not out.exists()


def test_execute_bundle_with_every_message_skipped_keeps_the_earlier_results(
    host_dir, tmp_path
):
    jobs, out = tmp_path / "jobs.json", tmp_path / "results.json"
    jobs.write_text(json.dumps({"jobs": [{"payload": {}}, "not a message"]}))
    out.write_text('{"results": ["an earlier run, not uploaded yet"]}')
    with pytest.raises(CommandError, match="every one of the 2 messages .* skipped"):
        run("execute-bundle", str(jobs), "--out", str(out))
    assert json.loads(out.read_text()) == {
        "results": ["an earlier run, not uploaded yet"]
    }
