from __future__ import annotations

import json
import stat
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from matrix.models import Cell, JobState, Result, Status, ValidationJob
from runners import services
from runners.models import RegistrationToken, Runner, token_digest


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
    assert f"registered runner lab-cpu (id {runner.pk})" in out
    assert stat.S_IMODE((key_dir / "runner.key").stat().st_mode) == 0o600
    config = json.loads((key_dir / "runner.json").read_text())
    assert config["queues"] == runner.queues()
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
    with pytest.raises(CommandError, match=r"refused \(409\): replayed envelope"):
        run("upload", str(results), "--server", live_server.url)


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
    assert {str(d) for d in runner.device_types.all()} == {
        "NVIDIA H200 · sm_90a · cuda",
        "x86-64 CPU · c",
    }
    hosted = runner.runnertoolchain_set.get()
    assert hosted.interpreter == probed["toolchains"][0]["interpreter"]


def test_register_with_an_unreadable_inventory_says_so(catalog, tmp_path):
    with pytest.raises(CommandError, match="cannot read the inventory"):
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
