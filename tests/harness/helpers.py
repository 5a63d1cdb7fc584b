"""Job builders and constants shared by the harness tests."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUBMITTED = Path(__file__).parent / "submitted"
CACHE_ROOT = REPO / "var" / "harness-cache"
TOOLCHAIN_0113 = Path(
    os.environ.get("TM_TOOLCHAIN_0113", REPO / "var" / "toolchains" / "tilelang-0.1.13")
)

CANARY = "tm-canary-4b1d9e77c2"
DJANGO_CANARY = "canary-django-secret-90c2f1"
PLANTED = {
    "TM_CANARY_SECRET": CANARY,
    "DJANGO_SECRET_KEY": DJANGO_CANARY,
    "DATABASE_URL": "postgres://tm:canary-db-pw-77@db.internal/tm",
    "CELERY_BROKER_URL": "redis://:canary-broker-pw-31@broker.internal:6379/0",
}


def library_job(operator: str, shape: dict, **extra) -> dict:
    job = {"operator": operator, "shape": shape, "dtype": "float32"}
    return {**job, "target": {"kind": "c"}, "seed": 7, **extra}


def submitted_job(
    name: str, shape: dict | None = None, *, fill: dict | None = None, **extra
) -> dict:
    """A job for the kernel in submitted/NAME.py (elementwise_add, c target),
    with ``fill`` placeholders replaced and its hash computed."""
    source = (SUBMITTED / f"{name}.py").read_text()
    for placeholder, value in (fill or {}).items():
        source = source.replace(placeholder, value)
    job = library_job("elementwise_add", shape or {"M": 5, "N": 7}, **extra)
    job["source"] = source
    job["source_sha256"] = hashlib.sha256(source.encode()).hexdigest()
    return job


def run_cli(job: object, *args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "job.json"
    path.write_text(job if isinstance(job, str) else json.dumps(job))
    return subprocess.run(
        [sys.executable, "-m", "runners.harness", str(path), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def sleep_token() -> str:
    """A duration for ``sleep`` that no other process on the host has in its
    command line: a test fills it into a kernel, then looks for it."""
    return f"600.{secrets.randbelow(10**9):09d}"


def processes_with(token: str) -> list[int]:
    """Live processes (zombies are dead already) whose command line holds
    ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token in command and state != "Z":
            found.append(int(entry.name))
    return found
