"""Escapes a submitted kernel attempts from inside the sandbox: each is
contained, and the supervisor keeps running the jobs after it.

Isolation (a uid of its own, an empty network namespace, a mount namespace
hiding unreadable homes) needs root; CI and the runner hosts run as root,
and so must these tests: a silent fallback would prove nothing."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from runners.harness import isolation
from runners.harness.sandbox import run_batch
from tests.security.helpers import CANARIES, ENV_CANARY, KEY_CANARY, attack_job

TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def escapes():
    assert isolation.can_isolate(), "run as root with util-linux unshare/setpriv"
    shared = Path(tempfile.mkdtemp(prefix="tm-escape-"))
    shared.chmod(0o1777)
    # The runner's key, as `manage.py runner register` leaves it: 0600.
    key_dir = Path(tempfile.mkdtemp(prefix="tm-runner-key-"))
    key_dir.chmod(0o755)
    key = key_dir / "runner.key"
    key.write_text(KEY_CANARY)
    key.chmod(0o600)
    jobs = {
        "read_key": attack_job("read_key", fill={"@KEY_PATH@": str(key)}),
        "network": attack_job("network"),
        "environment": attack_job("environment"),
        "fork_bomb": attack_job(
            "fork_bomb",
            fill={"@REPORT_PATH@": str(shared / "fork")},
            timeout_s=TIMEOUT_S,
        ),
        "allocate_8gb": attack_job("allocate_8gb"),
        "write_1gb": attack_job("write_1gb"),
        "output_flood": attack_job("output_flood", timeout_s=TIMEOUT_S),
        "stray_process": attack_job(
            "stray_process",
            fill={"@REPORT_PATH@": str(shared / "stray")},
            timeout_s=TIMEOUT_S,
        ),
        "after": attack_job("good_add"),
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TM_CANARY_SECRET", ENV_CANARY)
        patch.setenv("DJANGO_SECRET_KEY", ENV_CANARY)
        patch.setenv("DATABASE_URL", f"postgres://tm:{ENV_CANARY}@127.0.0.1/tm")
        patch.setenv("CELERY_BROKER_URL", f"redis://:{ENV_CANARY}@127.0.0.1:6379/0")
        outcome = run_batch(list(jobs.values()), cache_dir="unused", workers=2)
    yield {
        **dict(zip(jobs, outcome, strict=True)),
        "shared": shared,
        "supervisor_pid": os.getpid(),
    }
    shutil.rmtree(shared)
    shutil.rmtree(key_dir)


def _message(result: dict) -> str:
    return (result["error"] or {}).get("message") or ""


def test_the_child_cannot_read_the_runner_key(escapes):
    result = escapes["read_key"]
    assert result["status"] == "compile_error"
    assert "Permission denied" in _message(result)
    assert KEY_CANARY not in json.dumps(result)


def test_the_child_cannot_reach_the_database_or_the_broker(escapes):
    message = _message(escapes["network"])
    # 101: ENETUNREACH, the empty namespace's loopback is down.
    assert "5432: refused 101" in message
    assert "6379: refused 101" in message
    assert "connected" not in message


def test_the_child_sees_no_credentials(escapes):
    message = _message(escapes["environment"])
    assert "environment probe" in message
    for name in ("DJANGO_", "DATABASE_URL", "CELERY_BROKER_URL", "TM_CANARY"):
        assert name not in message
    for canary in CANARIES:
        assert canary not in json.dumps(escapes["environment"])


def test_a_fork_bomb_times_out_and_leaves_no_process(escapes):
    result = escapes["fork_bomb"]
    assert result["status"] in ("timeout", "runtime_error")
    uid = int((escapes["shared"] / "fork").read_text())
    assert uid in isolation.UID_RANGE
    assert isolation.processes_of(uid) == []


def test_an_8_gb_allocation_is_a_runtime_error(escapes):
    result = escapes["allocate_8gb"]
    assert result["status"] == "runtime_error"
    assert "out of memory" in _message(result)


def test_a_1_gb_file_is_a_runtime_error(escapes):
    result = escapes["write_1gb"]
    assert result["status"] == "runtime_error"
    assert "File too large" in _message(result)


def test_an_output_flood_times_out_with_capped_output(escapes):
    result = escapes["output_flood"]
    assert result["status"] == "timeout"
    assert len(json.dumps(result)) < 64 * 1024


def test_a_process_outside_the_process_group_is_killed(escapes):
    assert escapes["stray_process"]["status"] == "timeout"
    pid = int((escapes["shared"] / "stray").read_text())
    assert not Path(f"/proc/{pid}").exists() or _zombie(pid)


def test_the_supervisor_keeps_running_jobs_after_every_escape(escapes):
    assert escapes["after"]["status"] == "pass"
    assert escapes["supervisor_pid"] == os.getpid()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
