"""The demo's Run missing, as a newcomer meets it after `make run`: a fresh
var/ seeded by `make seed`, `scripts/run-dev` (web, control worker and the
local CPU runner, each a process of its own), then Run missing on the gaps
page of the toolchain the local runner hosts, for every served cell (the
view itself, posted as the admin). Every 2 s it reads the sweep's progress
as the sweep's page reads it; the first ETA of each basis is held against
when the sweep really finished. Prints a table and writes JSON:

    python bench/demo_run_missing.py --out OUT
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from online_sweep import first_etas, free_port

ROOT = Path(__file__).resolve().parent.parent
RUNNER = "local-cpu"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--timeout", type=float, default=900, help="the sweep, s")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    var = Path(tempfile.mkdtemp(prefix="tm-demo-run-missing-"))
    port = free_port()
    env = {
        **os.environ,
        "TILEMATRIX_VAR_DIR": str(var),
        "PORT": str(port),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DATABASE_URL", None)  # the demo's embedded database, as make run
    env.pop("CELERY_BROKER_URL", None)
    os.environ.update(env)
    subprocess.run(["make", "-s", "seed"], cwd=ROOT, env=env, check=True)
    log = (args.out / "run-dev.log").open("w")
    demo = subprocess.Popen(
        [str(ROOT / "scripts" / "run-dev")],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        report = _run_missing(demo, args.timeout)
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        try:
            demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
        shutil.rmtree(var, ignore_errors=True)
    report["host_cores"] = os.cpu_count()
    (args.out / "demo_run_missing.json").write_text(json.dumps(report, indent=2))
    _print(report)
    return 0 if report["finished"] and not report["failed"] else 1


def _run_missing(demo: subprocess.Popen, timeout: float) -> dict:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "matrix.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.contrib.messages.storage.fallback import FallbackStorage
    from django.contrib.sessions.backends.base import SessionBase
    from django.test import RequestFactory

    from matrix import gaps
    from matrix.fleet.models import Runner
    from matrix.models import Sweep
    from matrix.views.gaps import gaps_run

    deadline = time.monotonic() + 180
    while not Runner.objects.filter(name=RUNNER, state="online").exists():
        if demo.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the demo's runner never came online: see run-dev.log")
        time.sleep(1)
    toolchain = Runner.objects.get(name=RUNNER).toolchains.get()
    admin = get_user_model().objects.filter(is_superuser=True).first()
    request = RequestFactory().post(
        "/gaps/run", {"toolchain": toolchain.name, "served": "1"}
    )
    request.user, request.htmx = admin, False
    request.session = SessionBase()
    request._messages = FallbackStorage(request)
    started = time.monotonic()
    gaps_run(request)
    sweep = Sweep.objects.order_by("-pk").first()
    etas: dict[str, tuple[float, float]] = {}
    states: Counter = Counter()
    while True:
        if demo.poll() is not None:
            raise SystemExit("the demo stopped: see run-dev.log")
        gaps.cache.delete("gaps:job-durations")
        progress = sweep.progress(stage_seconds=gaps.job_durations().per_stage())
        at = time.monotonic() - started
        if progress["eta_s"] is not None and progress["eta_basis"] not in etas:
            etas[progress["eta_basis"]] = (at, progress["eta_s"])
        states[Runner.objects.get(name=RUNNER).state] += 1
        print(
            f"  {at:6.1f} s  {progress['done']} done, {progress['failed']} failed, "
            f"{progress['running']} running, {progress['queued']} queued, "
            f"ETA {progress['eta_s']} ({progress['eta_basis'] or '-'})",
            flush=True,
        )
        if progress["finished"] or at > timeout:
            break
        time.sleep(2)
    wall = time.monotonic() - started
    return {
        "bench": "demo_run_missing",
        "toolchain": toolchain.name,
        "sweep": sweep.pk,
        "jobs": progress["total"],
        "stages": dict(Counter(sweep.jobs.values_list("stage", flat=True))),
        "finished": progress["finished"],
        "done": progress["done"],
        "failed": progress["failed"],
        "wall_s": round(wall, 1),
        "first_etas": first_etas(etas, wall),
        "runner_state_samples": dict(states),
    }


def _print(report: dict) -> None:
    print(
        f"\n{report['jobs']} jobs {report['stages']}: {report['done']} done, "
        f"{report['failed']} failed in {report['wall_s']} s"
    )
    print(f"{'first ETA':<10} {'seen at s':>10} {'ETA s':>8} {'end ÷ outcome':>14}")
    for basis, eta in report["first_etas"].items():
        print(
            f"{basis:<10} {eta['seen_at_s']:>10} {eta['eta_s']:>8} "
            f"{eta['predicted_over_outcome']:>14}"
        )


if __name__ == "__main__":
    sys.exit(main())
