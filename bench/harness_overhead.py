"""Harness overhead per trusted cell, beyond compiling and running, at the
sizes a job message really has, and how compilation spreads over cores
with run_batch's worker pool.

    python bench/harness_overhead.py [--sizes 5,25] [--workers 1,2] [--out PATH]

On CPU (target c) cells of the operator library:
- cold: 25 cells on an empty kernel cache per worker count, so compilation
  is real; the wall time per worker count shows whether it spreads over
  cores.
- message sizes: one batch of each size on the warm cache, as a runner's
  worker runs one message after another: the library child is kept warm
  between messages (runners/harness/warm.py), so only the worker's first
  message pays the child's start and TileLang import (shown on its own
  row). Overhead per cell = (wall - compile - run) / cells. Target:
  <= 0.3 s at every size.
- one child per cell (run_job), the price of not batching (not judged).
Prints a table and writes JSON (default bench/out/harness_overhead.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runners import kernels  # noqa: E402
from runners.harness import warm  # noqa: E402
from runners.harness.sandbox import run_batch, run_job  # noqa: E402

TARGET_OVERHEAD_S = 0.3
ROWS = (1, 7, 33, 64, 100, 129)
COLS = (1, 17, 96, 128, 250, 1000)


def cells(count: int) -> list[dict]:
    """``count`` distinct CPU cells, cycling through operators and shapes."""
    names = sorted(n for n, op in kernels.OPERATORS.items() if "c" in op.builders)
    two_d = [n for n in names if kernels.get(n).dims == ("M", "N")]
    shapes = itertools.product(ROWS, COLS)
    jobs = []
    for (m, n), name in zip(shapes, itertools.cycle(two_d)):
        if len(jobs) == count:
            break
        shape = {"M": m, "N": n}
        jobs.append(
            {
                "operator": name,
                "shape": shape,
                "dtype": "float32",
                "target": {"kind": "c"},
            }
        )
    return jobs


def measure(
    jobs: list[dict], *, cache_dir: str, workers: int, keep_warm: bool = False
) -> dict:
    started = time.perf_counter()
    results = run_batch(jobs, cache_dir=cache_dir, workers=workers, keep_warm=keep_warm)
    wall = time.perf_counter() - started
    compile_s = sum(r["timings"]["compile_s"] or 0.0 for r in results)
    run_s = sum(r["timings"]["run_s"] or 0.0 for r in results)
    return {
        "workers": workers,
        "cells": len(jobs),
        "passed": sum(r["status"] == "pass" for r in results),
        "wall_s": wall,
        "compile_s": compile_s,
        "run_s": run_s,
        # One child: everything the wall clock holds beyond compiling and
        # running is overhead (the child's start and imports included). With
        # several, their work overlaps on the wall clock: not measured.
        "overhead_per_cell_s": (
            (wall - compile_s - run_s) / len(jobs) if workers == 1 else None
        ),
        "statuses": sorted({r["status"] for r in results}),
        "errors": sorted({r["error"]["message"][:500] for r in results if r["error"]}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,5,25", help="job message sizes")
    parser.add_argument("--workers", default="1,2", help="comma-separated pool sizes")
    parser.add_argument("--single", type=int, default=3, help="cells run one per child")
    parser.add_argument(
        "--out", default=str(REPO / "bench" / "out" / "harness_overhead.json")
    )
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    pools = [int(w) for w in args.workers.split(",")]
    jobs = cells(max(sizes))

    report = {"cpu_count": os.cpu_count(), "target_overhead_s": TARGET_OVERHEAD_S}
    with tempfile.TemporaryDirectory(prefix="tm-bench-") as scratch:
        report["cold"] = [
            measure(jobs, cache_dir=os.path.join(scratch, f"cold-{w}"), workers=w)
            for w in pools
        ]
        warm_cache = os.path.join(scratch, f"cold-{pools[0]}")
        # A worker's first message starts the child; the next ones find it.
        report["first_message"] = measure(
            jobs[: sizes[0]], cache_dir=warm_cache, workers=1, keep_warm=True
        )
        report["sizes"] = [
            measure(jobs[:size], cache_dir=warm_cache, workers=1, keep_warm=True)
            for size in sizes
        ]
        warm.end_all()
        singles = []
        for job in jobs[: args.single]:
            started = time.perf_counter()
            result = run_job(job, cache_dir=warm_cache)
            timings = result["timings"]
            wall = time.perf_counter() - started
            singles.append(
                {
                    "wall_s": wall,
                    "overhead_s": wall
                    - (timings["compile_s"] or 0.0)
                    - (timings["run_s"] or 0.0),
                    "status": result["status"],
                }
            )
        report["single"] = singles

    base = report["cold"][0]["wall_s"]
    for row in report["cold"]:
        row["speedup_vs_first"] = base / row["wall_s"]
    worst = max(row["overhead_per_cell_s"] for row in report["sizes"])
    report["meets_target"] = worst <= TARGET_OVERHEAD_S

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")

    print(
        f"{'run':<16}{'workers':>8}{'cells':>7}{'pass':>6}{'wall s':>9}"
        f"{'compile s':>11}{'run s':>8}{'overhead/cell s':>17}"
    )
    rows = [("cold cache", r) for r in report["cold"]]
    rows.append(("first message", report["first_message"]))
    rows += [(f"message of {r['cells']}", r) for r in report["sizes"]]
    for name, row in rows:
        overhead = row["overhead_per_cell_s"]
        overhead = "-" if overhead is None else f"{overhead:.3f}"
        print(
            f"{name:<16}{row['workers']:>8}{row['cells']:>7}{row['passed']:>6}"
            f"{row['wall_s']:>9.2f}{row['compile_s']:>11.2f}{row['run_s']:>8.2f}"
            f"{overhead:>17}"
        )
    for single in report["single"]:
        print(
            f"{'one child':<16}{1:>8}{1:>7}{single['status'] == 'pass':>6d}"
            f"{single['wall_s']:>9.2f}{'':>11}{'':>8}{single['overhead_s']:>17.3f}"
        )
    verdict = "meets" if report["meets_target"] else "misses"
    print(
        f"worst overhead per cell of a message {worst:.3f} s {verdict} the "
        f"{TARGET_OVERHEAD_S} s target (a worker's first message: "
        f"{report['first_message']['overhead_per_cell_s']:.3f}); "
        f"cold compile with {pools[-1]} workers ran "
        f"{report['cold'][-1]['speedup_vs_first']:.2f}x as fast as {pools[0]} "
        f"({os.cpu_count()} cores)"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
