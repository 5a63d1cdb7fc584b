"""The served sweep through the online runner path, as a lab runs it: the web
server, the control worker and ``manage.py runner work`` started here, on an
empty embedded database, then ``manage.py sweep`` of the served cells on this
host's device type twice, from a cold kernel cache and then warm. Not the
offline bundle: jobs travel as broker messages, are claimed over HTTP, run in
the sandboxed harness and come back one result at a time through the control
worker. Prints a table and writes JSON:

    python bench/online_sweep.py --device-type H200 --out OUT     # the H200
    python bench/online_sweep.py --device-type c --out OUT        # this CPU

Every few seconds it notes the runner's state, as the Runners page would
show it, and whether any job was given another attempt (a runner taken for
silent while it works).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNNER = "online-bench"


# Served besides the demo's models: 188 cells in all.
PROFILES = ("mixtral-8x7b", "qwen2.5-7b")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Deployment:
    """Web, control worker and one runner worker, each a process of its own
    with its log under ``out``."""

    def __init__(self, out: Path, var: Path, concurrency: int):
        self.out, self.var, self.concurrency = out, var, concurrency
        self.port = free_port()
        self.server = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "TILEMATRIX_VAR_DIR": str(var),
            "PYTHONUNBUFFERED": "1",
            "DJANGO_DEBUG": "1",
        }
        self.processes: dict[str, subprocess.Popen] = {}

    def manage(self, *args: str, program=("manage.py",)) -> str:
        done = subprocess.run(
            [sys.executable, *program, *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"{' '.join((*program, *args))} failed:\n{done.stderr}")
        return done.stdout

    def start(self, name: str, *args: str, program=("manage.py",)) -> None:
        log = (self.out / f"{name}.log").open("w")
        self.processes[name] = subprocess.Popen(
            [sys.executable, *program, *args],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def alive(self) -> None:
        """Fail fast: a dead process must not eat the time limit."""
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                tail = (self.out / f"{name}.log").read_text()[-3000:]
                raise SystemExit(f"{name} died (status {proc.returncode}):\n{tail}")

    def up(self) -> None:
        self.manage("migrate", "--noinput")
        self.manage("seed_demo")
        for profile in PROFILES:
            self.manage("import_shapes", "--profile", profile)
        self.start("web", "runserver", f"127.0.0.1:{self.port}", "--noreload")
        self.start("control", "control", "work")
        wait(self.web_answers, 60, "the web server", self)
        token = self.manage("runner", "token", "create", "--expires", "10m")
        key_dir = self.var / "runner"
        # The host side through the runner agent (runners/cli.py), as a lab
        # host has it; the server side through manage.py.
        said = self.manage(
            "register",
            *("--server", self.server, "--token", token.strip().splitlines()[-1]),
            *("--name", RUNNER, "--key-dir", str(key_dir)),
            program=("-m", "runners"),
        )
        print(said.strip())
        print(self.manage("runner", "approve", RUNNER).strip())
        self.start(
            "runner",
            "work",
            *("--key-dir", str(key_dir), "--concurrency", str(self.concurrency)),
            program=("-m", "runners"),
        )

    def web_answers(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.server}/api/v1/openapi.json", timeout=2)
        except OSError:
            return False
        return True

    def down(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.processes.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def first_etas(etas: dict[str, tuple[float, float]], wall: float) -> dict:
    """Each basis's first ETA, (seen at s, ETA s), with when it put the end
    over when the end came."""
    return {
        basis: {
            "seen_at_s": round(at, 1),
            "eta_s": round(eta, 1),
            "predicted_over_outcome": round((at + eta) / wall, 2),
        }
        for basis, (at, eta) in etas.items()
    }


def wait(predicate, timeout: float, what: str, deployment: Deployment) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        deployment.alive()
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} not ready after {timeout:.0f} s")
        time.sleep(0.5)


def sweep(deployment: Deployment, device_type: str, timeout: float) -> dict:
    """Plan the served cells on the device type with the runner's toolchain
    and wait for the last result; what happened, timed from the plan."""
    from django.db.models import F

    from matrix import gaps
    from matrix.fleet.models import Runner
    from matrix.models import JobState, Result, Sweep

    runner = Runner.objects.get(name=RUNNER)
    toolchain = runner.toolchains.get()
    started = time.monotonic()
    said = deployment.manage(
        "sweep",
        "--served-only",
        *("--device-type", device_type, "--toolchain", toolchain.name),
        "--no-wait",
    )
    sweep = Sweep.objects.order_by("-pk").first()
    print(said.strip())
    states: Counter = Counter()
    first_result_s = None
    # The ETAs the sweep's page shows (its durations read as the page reads
    # them): the first of each basis, to hold against the outcome.
    etas: dict[str, tuple[float, float]] = {}
    while True:
        deployment.alive()
        gaps.cache.delete("gaps:job-durations")
        progress = sweep.progress(stage_seconds=gaps.job_durations().per_stage())
        if progress["eta_s"] is not None and progress["eta_basis"] not in etas:
            etas[progress["eta_basis"]] = (
                time.monotonic() - started,
                progress["eta_s"],
            )
        states[Runner.objects.get(pk=runner.pk).state] += 1
        if first_result_s is None and progress["done"] + progress["failed"]:
            first_result_s = time.monotonic() - started
        print(
            f"  {time.monotonic() - started:6.1f} s  {progress['done']} done, "
            f"{progress['failed']} failed, {progress['running']} running, "
            f"{progress['queued']} queued",
            flush=True,
        )
        finished = progress["finished"]
        if finished or time.monotonic() - started > timeout:
            # Past the limit the sweep is reported as it stands, unfinished.
            break
        time.sleep(2)
    wall = time.monotonic() - started
    jobs = sweep.jobs.all()
    results = Result.objects.filter(job__sweep=sweep)
    walls = [r.wall_s for r in results if r.wall_s]
    return {
        "sweep": sweep.pk,
        "finished": finished,
        "cells": jobs.count(),
        "done": progress["done"],
        "failed": progress["failed"],
        "wall_s": round(wall, 1),
        "first_result_s": round(first_result_s or wall, 1),
        # Each first ETA as (seen at s, ETA s, when it put the end ÷ the
        # end): "estimate" before any job finished, "pace" after.
        "first_etas": first_etas(etas, wall),
        "statuses": dict(Counter(results.values_list("status", flat=True))),
        "stages": dict(Counter(jobs.values_list("stage", flat=True))),
        "given_another_attempt": jobs.filter(attempt__gt=1).count(),
        "lost": jobs.filter(state=JobState.LOST).count(),
        "results_per_job": results.count() / max(1, jobs.count()),
        "job_wall_s_median": round(statistics.median(walls), 2) if walls else None,
        # Compiling (or loading from the kernel cache) runs side by side;
        # the rest of a job's wall is mostly its turn on the device.
        "job_compile_s_median": _median(results.values_list("compile_s", flat=True)),
        "job_wall_s_sum": round(sum(walls), 1),
        "runner_state_samples": dict(states),
        # What did not pass, and why: a distribution or a run it failed on
        # is named in the message.
        "not_passed": [
            {
                "operator": r.shape.operator.name,
                "dims": r.shape.dims,
                "dtype": r.shape.dtype,
                "status": r.status,
                "message": r.error_message[:300],
            }
            for r in results.exclude(status="pass").select_related(
                "shape__operator", "error"
            )
        ],
        # Every pass's timings and samples, and its generated code's hash:
        # the recorded samples the gate's speed statistics are tested on
        # (tests/gate/test_speed_statistics.py).
        "timed": [
            {
                "cell": f"{r.shape.operator.name}[{r.shape.dims_key}] {r.shape.dtype}",
                "kernel_ms": r.kernel_ms,
                "reference_ms": r.reference_ms,
                "kernel_ms_samples": r.details.get("kernel_ms_samples"),
                "reference_ms_samples": r.details.get("reference_ms_samples"),
                "kernel_source_sha256": r.source_sha256,
                # Where the job's time went: its compile (or cache load),
                # and the rest of its wall, mostly its turn on the device.
                "compile_s": r.compile_s,
                "wall_s": r.wall_s,
            }
            for r in results.filter(status="pass")
            .select_related("shape__operator")
            .annotate(source_sha256=F("source__sha256"))
        ],
    }


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device-type", default="H200", help="as `sweep` takes it")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="messages at once (default: what `runner work` picks on this host)",
    )
    parser.add_argument("--timeout", type=float, default=300, help="cold sweep, s")
    parser.add_argument("--warm-timeout", type=float, default=None, help="warm, s")
    parser.add_argument("--rounds", type=int, default=2, help="1: cold only")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    var = Path(tempfile.mkdtemp(prefix="tm-online-"))
    os.environ["TILEMATRIX_VAR_DIR"] = str(var)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "matrix.settings")
    sys.path.insert(0, str(ROOT))
    if args.concurrency is None:
        from runners.host import work_processes

        args.concurrency = work_processes()
    deployment = Deployment(args.out, var, args.concurrency)
    runs = []
    try:
        set_up = time.monotonic()
        deployment.up()
        import django

        django.setup()
        from matrix.fleet.models import Runner

        wait(
            lambda: Runner.objects.get(name=RUNNER).state != "offline",
            120,
            "the runner",
            deployment,
        )
        print(f"deployment up in {time.monotonic() - set_up:.0f} s", flush=True)
        for n in range(args.rounds):
            label = "cold" if n == 0 else "warm"
            print(f"{label} sweep:", flush=True)
            limit = args.timeout if n == 0 else (args.warm_timeout or args.timeout)
            runs.append({"run": label, **sweep(deployment, args.device_type, limit)})
            if not runs[-1]["finished"]:
                break
    finally:
        deployment.down()
        shutil.rmtree(var, ignore_errors=True)
    report = {
        "bench": "online_sweep",
        "device_type": args.device_type,
        "concurrency": args.concurrency,
        "compile_workers_per_process": os.environ.get("TILEMATRIX_COMPILE_WORKERS")
        or max(1, min(16, os.cpu_count() or 1) // args.concurrency),
        "host_cores": os.cpu_count(),
        "runs": runs,
    }
    (args.out / "online_sweep.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"\n{'run':6} {'cells':>6} {'done':>6} {'wall s':>8} {'1st s':>6} "
        f"{'retried':>8}  statuses"
    )
    for run in runs:
        print(
            f"{run['run']:6} {run['cells']:6d} {run['done']:6d} {run['wall_s']:8.1f} "
            f"{run['first_result_s']:6.1f} {run['given_another_attempt']:8d}  "
            f"{run['statuses']}" + ("" if run["finished"] else "  (unfinished)")
        )
    print(
        f"\n{'run':6} {'first ETA':>10} {'seen at s':>10} {'ETA s':>8} {'end ÷ outcome':>14}"
    )
    for run in runs:
        for basis, eta in run["first_etas"].items():
            print(
                f"{run['run']:6} {basis:>10} {eta['seen_at_s']:10.1f} "
                f"{eta['eta_s']:8.1f} {eta['predicted_over_outcome']:14.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
