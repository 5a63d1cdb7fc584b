"""Starts the app the way `make run` does and stops it with Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests import forkserver

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_env(tmp_path) -> dict:
    """A fresh demo's environment: embedded services, seeded, on a free port."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "DATABASE_URL", "CELERY_"))
    }
    env.update(TILEMATRIX_VAR_DIR=str(tmp_path / "var"), PORT=str(free_port()))
    for args in (["migrate", "--noinput"], ["seed_demo"], ["ensure_admin"]):
        manage(env, *args)
    return env


def manage(env, *args) -> str:
    return forkserver.run(
        ["manage.py", *args], cwd=ROOT, env=env, check=True, timeout=300
    ).stdout


def registered_as(env) -> str | None:
    """The runner name this demo host holds, once it is registered."""
    config = Path(env["TILEMATRIX_VAR_DIR"]) / "runner" / "runner.json"
    try:
        return json.loads(config.read_text())["name"]
    except (OSError, ValueError, KeyError):
        return None


def serve_until_ctrl_c(env, runner="local-cpu") -> tuple[str, str]:
    """Start the app as `make run` does, read the matrix page once its local
    runner is registered as ``runner``, press Ctrl-C: (the page, what the
    app printed)."""
    port = int(env["PORT"])
    proc = subprocess.Popen(
        ["scripts/run-dev"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        body = ""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if registered_as(env) != runner:
                time.sleep(0.5)
                continue
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/", timeout=5
                ) as r:
                    assert r.status == 200
                    body = r.read().decode()
                    break
            except OSError:
                time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # nothing of the app is left listening
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    return body, proc.stdout.read().decode()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One seeded demo, served once: migrating and seeding cost more than
    serving, and the revocation test goes on from where the first serve
    left it."""
    env = demo_env(tmp_path_factory.mktemp("demo"))
    body, _ = serve_until_ctrl_c(env)
    return env, body


def test_make_run_serves_the_seeded_matrix_and_stops_cleanly_on_ctrl_c(demo):
    _, body = demo
    assert "gemm" in body and "rmsnorm" in body
    assert "H200" in body and "MI300X" in body


def test_make_run_comes_back_after_its_runner_was_revoked(demo):
    env, _ = demo
    manage(env, "runner", "revoke", "local-cpu")
    # A revoked runner keeps its name: the host comes back under the next one.
    body, _ = serve_until_ctrl_c(env, runner="local-cpu-2")
    assert "gemm" in body
    standing = manage(
        env,
        "shell",
        "-c",
        "from matrix.fleet.models import Runner\n"
        "for r in Runner.objects.order_by('name'): print(r.name, bool(r.revoked_at))",
    )
    assert "local-cpu True\nlocal-cpu-2 False\n" in standing
