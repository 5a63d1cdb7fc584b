"""Escapes a submitted kernel attempts from inside the sandbox: each is
contained, and the supervisor keeps running the jobs after it.

The sandbox (bubblewrap namespaces and a uid of its own) needs root; CI and
the runner hosts run as root, and so must these tests: a silent fallback
would prove nothing. The probes run where submitted Python runs, the
builder; the executor and the judge start through the same sandbox."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from runners.harness import isolation
from runners.harness.children import REPO_ROOT
from runners.harness.sandbox import run_batch
from tests.harness.helpers import processes_with, sleep_token
from tests.security.helpers import CANARIES, ENV_CANARY, KEY_CANARY, attack_job

# What the attacks that never end get. A job's time starts once its child
# is up and each attack starts at import: the fork bomb reached its process
# limit (255 forks of a process holding torch) in 5 to 6 s on a loaded
# 2-core host, and the flood passes the output cap at once. Both keep a
# core busy until they are killed.
TIMEOUT_S = 10.0
POSTGRES_SOCKET = Path("/var/run/postgresql/.s.PGSQL.5432")
DB_CANARY = "tm-db-canary-0e4c9b2a"


@pytest.fixture(scope="module")
def escapes():
    assert isolation.confinement().level == isolation.FULL, (
        "run as root with bubblewrap installed"
    )
    token = secrets.token_hex(8)
    # The database of the embedded default, world-readable as the report
    # found it.
    db = Path(REPO_ROOT, "var", f"tm-canary-{token}.sqlite3")
    db.parent.mkdir(exist_ok=True)
    db.write_text(DB_CANARY)
    db.chmod(0o644)
    # The runner's key, as `manage.py runner register` leaves it: 0600.
    key_dir = Path(tempfile.mkdtemp(prefix="tm-runner-key-"))
    key = key_dir / "runner.key"
    key.write_text(KEY_CANARY)
    key.chmod(0o600)
    # A Unix socket any user of the host may connect to (Redis's, say), and
    # an abstract one, which no file permission guards.
    socket_dir = Path(tempfile.mkdtemp(prefix="tm-canary-socket-"))
    socket_dir.chmod(0o755)
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(socket_dir / "redis.sock"))
    (socket_dir / "redis.sock").chmod(0o777)
    listening.listen()
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0tm-canary-{token}")
    abstract.listen()
    sleepers = {name: sleep_token() for name in ("fork_bomb", "stray_process")}
    jobs = {
        "probe": attack_job(
            "probe_host",
            fill={
                "@DB_PATH@": str(db),
                "@KEY_PATH@": str(key),
                "@SOCKET_PATH@": str(socket_dir / "redis.sock"),
                "@ABSTRACT_NAME@": f"tm-canary-{token}",
                "@TOKEN@": f"tm-escape-{token}",
            },
        ),
        "fork_bomb": attack_job(
            "fork_bomb", fill={"@SLEEP@": sleepers["fork_bomb"]}, timeout_s=TIMEOUT_S
        ),
        "allocate_8gb": attack_job("allocate_8gb"),
        # A GPU job's builder, which maps no GPU, had no memory cap at all.
        "allocate_8gb_cuda": attack_job(
            "allocate_8gb", target={"kind": "cuda", "arch": "sm_90a"}, stage="lower"
        ),
        "write_1gb": attack_job("write_1gb"),
        "fill_home": attack_job("fill_home", timeout_s=60.0),
        "fill_tmp": attack_job("fill_tmp", fill={"@TOKEN@": f"tm-fill-{token}"}),
        "output_flood": attack_job("output_flood", timeout_s=TIMEOUT_S),
        "stray_process": attack_job(
            "stray_process",
            fill={"@SLEEP@": sleepers["stray_process"]},
            timeout_s=TIMEOUT_S,
        ),
        "after": attack_job("good_add"),
    }
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TM_CANARY_SECRET", ENV_CANARY)
            patch.setenv("DJANGO_SECRET_KEY", ENV_CANARY)
            patch.setenv("DATABASE_URL", f"postgres://tm:{ENV_CANARY}@127.0.0.1/tm")
            patch.setenv("CELERY_BROKER_URL", f"redis://:{ENV_CANARY}@127.0.0.1:6379/0")
            # Most of these wait out a timeout or a limit: side by side, the
            # batch takes its longest job, not the sum of pairs.
            outcome = run_batch(list(jobs.values()), cache_dir="unused", workers=5)
        yield {
            **dict(zip(jobs, outcome, strict=True)),
            "token": token,
            "sleepers": sleepers,
            "socket": str(socket_dir / "redis.sock"),
        }
    finally:
        listening.close()
        abstract.close()
        db.unlink()
        shutil.rmtree(key_dir)
        shutil.rmtree(socket_dir)
        for leftover in ("/tmp", "/dev/shm"):
            Path(leftover, f"tm-escape-{token}").unlink(missing_ok=True)


def _message(result: dict) -> str:
    return (result["error"] or {}).get("message") or ""


def _probe(result: dict) -> dict[str, str]:
    assert result["status"] == "compile_error", result
    report = _message(result).split("probe ", 1)[1].splitlines()[0]
    return dict(pair.split("=", 1) for pair in report.split("; "))


def test_the_database_file_and_the_runner_key_are_not_there(escapes):
    probe = _probe(escapes["probe"])
    # Not "permission denied": nothing of var/ or the key's directory exists
    # in the sandbox.
    assert probe["db"] == "FileNotFoundError(2)"
    assert probe["runner_key"] == "FileNotFoundError(2)"
    for canary in (DB_CANARY, KEY_CANARY):
        assert canary not in json.dumps(escapes["probe"])


def test_no_unix_socket_of_the_host_is_reachable(escapes):
    assert POSTGRES_SOCKET.is_socket(), "PostgreSQL must listen on its socket"
    for address in (escapes["socket"], f"\0tm-canary-{escapes['token']}"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(address)  # the canaries answer outside the sandbox
    probe = _probe(escapes["probe"])
    assert probe["postgres_socket"] == "FileNotFoundError(2)"
    assert probe["canary_socket"] == "FileNotFoundError(2)"
    # Abstract sockets belong to the network namespace: there is none.
    assert probe["canary_abstract"] == "ConnectionRefusedError(111)"


def test_the_database_and_the_broker_are_unreachable_over_tcp(escapes):
    probe = _probe(escapes["probe"])
    # The namespace's own loopback, where nothing listens.
    assert probe["tcp_postgres"] == "ConnectionRefusedError(111)"
    assert probe["tcp_redis"] == "ConnectionRefusedError(111)"


def test_writes_to_tmp_and_dev_shm_stay_in_the_sandbox(escapes):
    probe = _probe(escapes["probe"])
    assert probe["tmp_write"] == "ok" and probe["shm_write"] == "ok"
    token = escapes["token"]
    assert not Path("/tmp", f"tm-escape-{token}").exists()
    assert not Path("/dev/shm", f"tm-escape-{token}").exists()


def test_the_child_sees_only_its_own_processes_and_ipc(escapes):
    probe = _probe(escapes["probe"])
    # bwrap's init and the child itself, out of the host's many.
    assert probe["processes"].split(",")[0] == "1:bwrap"
    assert len(probe["processes"].split(",")) == 2
    assert probe["self"] == "2"
    assert len([p for p in os.listdir("/proc") if p.isdigit()]) > 2
    assert probe["sysv_shm"] == "0"
    assert probe["hostname"] == isolation.HOSTNAME


def test_the_child_sees_no_credentials(escapes):
    names = _probe(escapes["probe"])["environment"].split(",")
    assert "PATH" in names and "HOME" in names
    for name in names:
        assert not name.startswith(("DJANGO_", "DATABASE_", "CELERY_", "TM_CANARY"))
    for canary in CANARIES:
        assert canary not in json.dumps(escapes["probe"])


def test_a_fork_bomb_times_out_and_leaves_no_process(escapes):
    assert escapes["fork_bomb"]["status"] == "timeout"
    assert processes_with(escapes["sleepers"]["fork_bomb"]) == []


def test_an_8_gb_allocation_is_a_runtime_error(escapes):
    result = escapes["allocate_8gb"]
    assert result["status"] == "runtime_error"
    assert "out of memory" in _message(result)


def test_8_gb_in_a_gpu_jobs_builder_is_a_runtime_error_too(escapes):
    result = escapes["allocate_8gb_cuda"]
    assert result["status"] == "runtime_error"
    assert "out of memory" in _message(result)


def test_filling_home_with_files_under_the_size_limit_stops_at_its_quota(escapes):
    result = escapes["fill_home"]
    assert result["status"] == "runtime_error"
    message = _message(result)
    assert "a sandbox limit was reached: its HOME held" in message
    assert "more than 1024 MB" in message


def test_tmp_and_shm_are_small_and_the_sandbox_own(escapes):
    """Files under the per-file limit, outside HOME's quota, stop at the
    sandbox's own /dev/shm (64 MB) and /tmp, and none reaches the host."""
    result = escapes["fill_tmp"]
    assert result["status"] != "pass"
    message = _message(result)
    assert "/shm: No space left on device" in message  # paths read <path>
    assert "/tmp: No space left on device" in message
    for where in ("/tmp", "/dev/shm"):
        assert not list(Path(where).glob(f"tm-fill-{escapes['token']}-*"))


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
    assert processes_with(escapes["sleepers"]["stray_process"]) == []


def test_the_supervisor_keeps_running_jobs_after_every_escape(escapes):
    assert escapes["after"]["status"] == "pass"
