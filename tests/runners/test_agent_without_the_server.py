"""The runner agent as a lab host has it: a package that installs no
Django, and commands that register a host, run signed jobs and upload
their results with Django and the server's code out of reach (any import
of them fails), against a real server."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from matrix.fleet import services
from matrix.fleet.models import Runner
from matrix.management.commands._files import read_json
from matrix.models import Result, Status

ROOT = Path(__file__).resolve().parents[2]
SERVER_SIDE = ("django", "matrix", "ninja", "axes", "psycopg", "celery_batches")

# Loaded before the agent: every import of the server's side fails, as on
# a host that has none of it.
NO_SERVER = f"""
import importlib.abc, sys

class NoServer(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SERVER_SIDE!r}:
            raise ModuleNotFoundError(f"{{name}} is not on a runner host", name=name)
        return None

sys.meta_path.insert(0, NoServer())
"""


def agent(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "no_server.py").write_text(NO_SERVER)
    script = (
        "import no_server, runpy, sys\n"
        f"sys.argv = ['tilematrix-runner', *{list(args)!r}]\n"
        "runpy.run_module('runners', run_name='__main__')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={
            "PYTHONPATH": f"{tmp_path}:{ROOT}",
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_agent_package_installs_no_django(tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
        + ["--quiet", "--report", str(report), str(ROOT / "agent")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    names = {
        i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]
    }
    assert {"tilematrix-runner", "celery", "cryptography", "pynacl"} <= names
    assert not names & {"django", "django-ninja", "psycopg", "django-axes", "torch"}


@pytest.mark.django_db(transaction=True)
def test_a_host_registers_runs_a_bundle_and_uploads_with_no_server_code(
    live_server, tmp_path
):
    from matrix.services import catalog_seed

    catalog_seed()
    key_dir = tmp_path / "host"
    token = services.token_create(expires=timedelta(minutes=10))
    registered = agent(
        tmp_path, "register", "--server", live_server.url, "--token", token,
        "--name", "agent-only", "--key-dir", str(key_dir),
    )  # fmt: skip
    assert registered.returncode == 0, registered.stderr
    assert "registered runner agent-only" in registered.stdout
    services.runner_approve(name="agent-only")

    jobs = tmp_path / "jobs.json"
    from django.core.management import call_command

    call_command(
        "runner", "bundle", "agent-only", "--out", str(jobs), "--operator",
        "elementwise_add", "--device-type", "c",
    )  # fmt: skip
    planned = len(read_json(str(jobs))["jobs"])
    assert planned > 0

    results = tmp_path / "results.json"
    ran = agent(
        tmp_path, "execute-bundle", str(jobs), "--out", str(results),
        "--key-dir", str(key_dir),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    uploaded = agent(tmp_path, "upload", str(results), "--key-dir", str(key_dir))
    assert uploaded.returncode == 0, uploaded.stderr

    runner = Runner.objects.get(name="agent-only")
    stored = Result.objects.filter(job__runner=runner)
    assert stored.count() == len(read_json(str(results))["results"]) > 0
    # The c backend runs some of the operator's dtypes; the rest say so.
    statuses = list(stored.values_list("status", flat=True))
    assert Status.PASS in statuses
    assert set(statuses) <= {Status.PASS, Status.UNSUPPORTED}
    assert uploaded.stdout.startswith(f"{stored.count()} stored, 0 already stored")


def test_a_server_import_fails_where_the_agent_runs(tmp_path):
    # The guard itself: were it to let the server's code in, the test above
    # would prove nothing.
    (tmp_path / "no_server.py").write_text(NO_SERVER)
    done = subprocess.run(
        [sys.executable, "-c", "import no_server, django"],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert "django is not on a runner host" in done.stderr
