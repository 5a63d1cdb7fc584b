"""Harness overhead per trusted cell, beyond compiling and running, and how
compilation spreads over cores with run_batch's worker pool.

    python bench/harness_overhead.py [--cells 24] [--workers 1,2] [--out PATH]

Three measurements on CPU (target c) cells of the operator library:
- warm: one batch on a warm kernel cache; overhead = (wall - compile - run)
  per cell, the child's start (imports) included. Target: <= 0.3 s.
- cold: the same cells on an empty cache per worker count, so compilation is
  real; the wall time per worker count shows whether it spreads over cores.
- single: a few cells with one child each (run_job), the price of not
  batching.
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


def measure(jobs: list[dict], *, cache_dir: str, workers: int) -> dict:
    started = time.perf_counter()
    results = run_batch(jobs, cache_dir=cache_dir, workers=workers)
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
        # Work done in parallel overlaps, so per-cell overhead is measured on
        # the summed child-side time, not the wall clock.
        "overhead_per_cell_s": (
            sum(r["timings"]["wall_s"] for r in results) - compile_s - run_s
        )
        / len(jobs),
        "statuses": sorted({r["status"] for r in results}),
        "errors": sorted({r["error"]["message"][:500] for r in results if r["error"]}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=24)
    parser.add_argument("--workers", default="1,2", help="comma-separated pool sizes")
    parser.add_argument("--single", type=int, default=3, help="cells run one per child")
    parser.add_argument(
        "--out", default=str(REPO / "bench" / "out" / "harness_overhead.json")
    )
    args = parser.parse_args()
    jobs = cells(args.cells)
    pools = [int(w) for w in args.workers.split(",")]

    report = {"cpu_count": os.cpu_count(), "target_overhead_s": TARGET_OVERHEAD_S}
    with tempfile.TemporaryDirectory(prefix="tm-bench-") as scratch:
        report["cold"] = [
            measure(jobs, cache_dir=os.path.join(scratch, f"cold-{w}"), workers=w)
            for w in pools
        ]
        warm_cache = os.path.join(scratch, f"cold-{pools[0]}")
        report["warm"] = measure(jobs, cache_dir=warm_cache, workers=1)
        singles = []
        for job in jobs[: args.single]:
            started = time.perf_counter()
            result = run_job(job, cache_dir=warm_cache)
            timings = result["timings"]
            singles.append(
                {
                    "wall_s": time.perf_counter() - started,
                    "overhead_s": timings["overhead_s"],
                    "status": result["status"],
                }
            )
        report["single"] = singles

    base = report["cold"][0]["wall_s"]
    for row in report["cold"]:
        row["speedup_vs_first"] = base / row["wall_s"]
    warm = report["warm"]
    report["meets_target"] = warm["overhead_per_cell_s"] <= TARGET_OVERHEAD_S

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")

    print(
        f"{'run':<14}{'workers':>8}{'cells':>7}{'pass':>6}{'wall s':>9}"
        f"{'compile s':>11}{'run s':>8}{'overhead/cell s':>17}"
    )
    for name, row in [("cold cache", r) for r in report["cold"]] + [
        ("warm cache", warm)
    ]:
        print(
            f"{name:<14}{row['workers']:>8}{row['cells']:>7}{row['passed']:>6}"
            f"{row['wall_s']:>9.2f}{row['compile_s']:>11.2f}{row['run_s']:>8.2f}"
            f"{row['overhead_per_cell_s']:>17.3f}"
        )
    for single in report["single"]:
        print(
            f"{'one child':<14}{1:>8}{1:>7}{single['status'] == 'pass':>6d}"
            f"{single['wall_s']:>9.2f}{'':>11}{'':>8}{single['overhead_s']:>17.3f}"
        )
    verdict = "meets" if report["meets_target"] else "misses"
    print(
        f"warm overhead per trusted cell {warm['overhead_per_cell_s']:.3f} s "
        f"{verdict} the {TARGET_OVERHEAD_S} s target; cold compile with "
        f"{pools[-1]} workers ran {report['cold'][-1]['speedup_vs_first']:.2f}x "
        f"as fast as {pools[0]} ({os.cpu_count()} cores)"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
