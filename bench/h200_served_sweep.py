"""The served sweep on a GPU runner host, cold kernel cache then warm.

Runs ``manage.py runner execute-bundle`` on each bundle of server-signed
jobs (one per toolchain for an upgrade A/B) twice: first with an empty
kernel cache, every bundle in turn, then again with the caches filled. The
runner's harness children compile across the host's cores and take the GPU
in turn to validate and time. A bundle of compile-only jobs (``--once``)
runs once, after the others. Prints a table, writes JSON beside the signed
results:

    python bench/h200_served_sweep.py --key-dir var/h200-runner --out "$OUT" \\
        --jobs var/h200-runner/jobs-0.1.13.json var/h200-runner/jobs-0.1.15.json \\
        --once var/h200-runner/jobs-lower.json

The signed results of each bundle's cold run (``STEM-results.json``) are
what comes home and is uploaded with ``manage.py runner upload``;
``STEM-results-warm.json`` repeats every timing, which gives the noise band
of a comparison between two bundles' results; ``repeats.json`` pairs them
per job (``bench/h200_ab_report.py`` reads it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def execute(jobs: Path, key_dir: Path, out: Path) -> float:
    """Run the bundle; its per-job lines go to a log beside the results, so a
    run cut short still shows how far it got."""
    started = time.perf_counter()
    with out.with_suffix(".log").open("w") as log:
        proc = subprocess.run(
            [
                sys.executable,
                "manage.py",
                "runner",
                "execute-bundle",
                str(jobs),
                "--key-dir",
                str(key_dir),
                "--out",
                str(out),
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode != 0:
        print(out.with_suffix(".log").read_text()[-3000:])
    return time.perf_counter() - started


def summarize(results_file: Path, wall_s: float, workers: int) -> dict:
    """Status counts and the wall time split. Children compile side by side
    and take the GPU in turn, so the GPU's share is the sum of the jobs' run
    times, compilation's is their compile time over the children, and the
    rest (child start-up, waits, the last straggler) is overhead."""
    results = [
        r["payload"]["result"] for r in json.loads(results_file.read_text())["results"]
    ]
    total = defaultdict(float)
    for r in results:
        for key in ("compile_s", "run_s"):
            total[key] += (r.get("timings") or {}).get(key) or 0.0
    compile_share = total["compile_s"] / workers
    return {
        "cells": len(results),
        "workers": workers,
        "wall_s": round(wall_s, 1),
        "status": dict(Counter(r["status"] for r in results)),
        "compile_s_total": round(total["compile_s"], 1),
        "compile_s": round(compile_share, 1),
        "gpu_run_s": round(total["run_s"], 1),
        "overhead_s": round(max(0.0, wall_s - compile_share - total["run_s"]), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=Path, nargs="+", required=True)
    parser.add_argument("--once", type=Path, nargs="*", default=[])
    parser.add_argument("--key-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.key_dir / "kernel-cache", ignore_errors=True)

    workers = compile_workers()
    report: dict[str, dict] = {}
    runs = [(jobs, "cold") for jobs in args.jobs + args.once]
    runs += [(jobs, "warm") for jobs in args.jobs]
    for jobs, run in runs:
        suffix = "" if run == "cold" else "-warm"
        results = args.out / f"{jobs.stem}-results{suffix}.json"
        wall = execute(jobs, args.key_dir, results)
        report.setdefault(jobs.stem, {})[run] = summarize(results, wall, workers)
        # Rewritten after every run, so a call cut short keeps what ran.
        (args.out / "h200_sweep.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "repeats.json").write_text(
        json.dumps(repeats(args.out, args.jobs), indent=1) + "\n"
    )
    print(
        f"{'bundle':<16}{'run':<6}{'cells':>7}{'wall s':>9}{'compile s':>11}"
        f"{'gpu s':>8}{'overhead s':>12}  status"
    )
    for stem, by_run in report.items():
        for name, row in by_run.items():
            print(
                f"{stem:<16}{name:<6}{row['cells']:>7}{row['wall_s']:>9}"
                f"{row['compile_s']:>11}{row['gpu_run_s']:>8}{row['overhead_s']:>12}"
                f"  {row['status']}"
            )


def signed_results(path: Path) -> dict[int, dict]:
    return {
        r["payload"]["job"]: r["payload"]["result"]
        for r in json.loads(path.read_text())["results"]
    }


def repeats(out: Path, bundles: list[Path]) -> dict:
    """Each job's cold and warm statuses and timings, as [cold, warm], per
    TileLang release: what ``bench/h200_ab_report.py`` reads as REPEATS.json
    for the noise band of each cell."""
    runs = {}
    for jobs in bundles:
        cold = signed_results(out / f"{jobs.stem}-results.json")
        warm = signed_results(out / f"{jobs.stem}-results-warm.json")
        some = next(iter(cold.values()), {})
        version = some.get("fingerprint", {}).get("components", {}).get("tilelang")
        runs[version or jobs.stem] = [
            {
                "job": job,
                "status": [cold[job]["status"], warm.get(job, {}).get("status")],
                **{
                    key: [
                        (cold[job].get("timings") or {}).get(key),
                        (warm.get(job, {}).get("timings") or {}).get(key),
                    ]
                    for key in ("kernel_ms", "reference_ms")
                },
            }
            for job in sorted(cold)
        ]
    return {
        "about": "Each job of the served sweep timed twice: the cold run (the "
        "signed results to upload) and the warm run, as [cold, warm].",
        "runs": runs,
    }


def compile_workers() -> int:
    sys.path.insert(0, str(ROOT))
    from runners.harness.sandbox import compile_workers as workers

    return workers()


if __name__ == "__main__":
    main()
