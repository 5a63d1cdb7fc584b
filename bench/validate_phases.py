"""Where a library cell's validation spends its time on a GPU: the served
cells' validate stage run in this process (no sandbox, no runner), warm
kernel cache, each phase timed with the device synchronised around it.

    python bench/validate_phases.py --device-type H100 [--every 2] [--out DIR]
        [--again] [--profile]

The runner takes the device in turn for the whole validate stage (one
child at a time), so the sum of these run times is what bounds a warm
sweep's wall time. Cells are the demo's served shapes (a scratch
deployment plans them); ``--every N`` keeps every Nth. Kernels are compiled
first across the host's cores into a shared TileLang cache (not timed).
Phases: ``draw`` (hashing and shaping the inputs), ``reference`` (the
float64 reference and its checks), ``compare`` (each run's outputs against
it), ``time`` (the timed calls of kernel and reference); ``other`` is the
rest of ``run_s``: the kernel's validation runs and their poisoned outputs.
Prints a table per operator and writes JSON (validate_phases.json).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PHASES = ("draw", "reference", "compare", "time")


def served_cells(device_type: str) -> list[dict]:
    """The demo's served cells as harness jobs for ``device_type``'s target."""
    from bench._scratch import scratch_setup

    scratch_setup()
    from django.core.management import call_command

    from bench.online_sweep import PROFILES
    from matrix.models import DeviceType, Shape

    for profile in PROFILES:  # the online sweep's served cells
        call_command(
            "import_shapes", "--profile", profile, stdout=open(os.devnull, "w")
        )

    named = DeviceType.objects.named(device_type).first()
    if named is None:
        raise SystemExit(
            f"no device type {device_type!r} in the scratch deployment: use one "
            f"of {sorted(str(t) for t in DeviceType.objects.all())} with the "
            "same target (the H200's is the H100's: cuda sm_90a)"
        )
    target = named.target
    return [
        {
            "operator": shape.operator.name,
            "shape": shape.dims,
            "dtype": shape.dtype,
            "target": target,
            "stage": "validate",
            "seed": 1000 + number,
        }
        for number, shape in enumerate(
            Shape.objects.served().select_related("operator").order_by("pk")
        )
    ]


def _compile(job: dict) -> str:
    """Build one cell's kernel into the shared cache (a pool worker)."""
    from runners.harness.job import parse_job
    from runners.harness.stages import run_stages

    with tempfile.TemporaryDirectory() as workdir:
        built = run_stages(
            parse_job({**job, "stage": "build"}), fingerprint={}, workdir=workdir
        )
    return built["status"]


class Phases:
    """Seconds per phase of the cell being run, the device synchronised
    around each, by wrapping what runners.harness.stages calls."""

    def __init__(self):
        import torch

        from runners.harness import stages

        self.sync = torch.cuda.synchronize if torch.cuda.is_available() else _nothing
        self.spent: dict[str, float] = defaultdict(float)
        for name in ("_references", "_compare", "time_kernel"):
            phase = {"_references": "reference", "_compare": "compare"}.get(
                name, "time"
            )
            setattr(stages, name, self.timed(getattr(stages, name), phase))
        drawn = stages.distributions
        if hasattr(drawn, "input_sets"):  # hashed once, then shaped
            drawn.input_sets = self.timed_generator(drawn.input_sets)
        else:  # each distribution drawn whole
            drawn.draw = self.timed(drawn.draw, "draw")

    def timed(self, fn, phase: str):
        def wrapper(*args, **kwargs):
            self.sync()
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                self.spent[phase] += time.perf_counter() - started

        return wrapper

    def timed_generator(self, fn):
        def wrapper(*args, **kwargs):
            items = fn(*args, **kwargs)
            while True:
                self.sync()
                started = time.perf_counter()
                try:
                    item = next(items)
                except StopIteration:
                    return
                finally:
                    self.sync()
                    self.spent["draw"] += time.perf_counter() - started
                yield item

        return wrapper

    def take(self) -> dict[str, float]:
        spent, self.spent = dict(self.spent), defaultdict(float)
        return spent


def measure(jobs: list[dict]) -> list[dict]:
    from runners.harness.job import parse_job
    from runners.harness.stages import run_stages

    phases = Phases()
    rows = []
    for job in jobs:
        with tempfile.TemporaryDirectory() as workdir:
            result = run_stages(parse_job(job), fingerprint={}, workdir=workdir)
        spent = phases.take()
        run_s = result["timings"].get("run_s") or 0.0
        rows.append(
            {
                "operator": job["operator"],
                "shape": job["shape"],
                "dtype": job["dtype"],
                "status": result["status"],
                "run_s": run_s,
                **{p: spent.get(p, 0.0) for p in PHASES},
                "other": run_s - sum(spent.values()),
            }
        )
    return rows


def summary(rows: list[dict]) -> list[tuple]:
    by_operator: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_operator[row["operator"]].append(row)
    table = []
    for name, group in sorted(by_operator.items()) + [("all", rows)]:
        sums = {k: sum(r[k] for r in group) for k in ("run_s", *PHASES, "other")}
        table.append(
            (name, len(group), *(f"{sums[k]:.2f}" for k in sums)),
        )
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device-type", default="H100")
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--cells", type=Path, help="jobs JSON instead of planning")
    parser.add_argument("--save-cells", type=Path)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out")
    parser.add_argument("--label", default="head")
    parser.add_argument(
        "--again",
        action="store_true",
        help="time every cell a second time, its kernel already loaded in "
        "this process (what a cell's first call costs is the difference)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the timed pass: print the top functions, save the stats",
    )
    args = parser.parse_args()
    os.environ.setdefault(
        "TILELANG_CACHE_DIR", str(Path(tempfile.gettempdir(), "tm-phases-cache"))
    )
    if args.cells:
        jobs = json.loads(args.cells.read_text())
    else:
        jobs = served_cells(args.device_type)[:: args.every]
    if args.save_cells:
        args.save_cells.write_text(json.dumps(jobs))
    started = time.perf_counter()
    with ProcessPoolExecutor(
        max_workers=min(16, os.cpu_count() or 1),
        mp_context=multiprocessing.get_context("spawn"),
    ) as pool:
        built = list(pool.map(_compile, jobs))
    print(
        f"built {len(jobs)} cells in {time.perf_counter() - started:.0f} s: "
        f"{dict((s, built.count(s)) for s in set(built))}",
        flush=True,
    )
    measure(jobs[:3])  # the first calls' libraries and contexts, not timed
    args.out.mkdir(parents=True, exist_ok=True)
    if args.profile:
        rows = _profiled(measure, jobs, args.out / f"validate_phases-{args.label}.prof")
    else:
        rows = measure(jobs)
    again = measure(jobs) if args.again else None
    from bench._scratch import table

    headers = ("operator", "cells", "run_s", *PHASES, "other")
    print(table(summary(rows), headers))
    if again:
        print("again, every kernel loaded in this process:")
        print(table(summary(again), headers))
    path = args.out / f"validate_phases-{args.label}.json"
    path.write_text(
        json.dumps(
            {
                "bench": "validate_phases",
                "label": args.label,
                "device": _device_name(),
                "cells": len(rows),
                "rows": rows,
                "by_operator": [
                    dict(zip(headers, r, strict=True)) for r in summary(rows)
                ],
                **(
                    {
                        "again_rows": again,
                        "again_by_operator": [
                            dict(zip(headers, r, strict=True)) for r in summary(again)
                        ],
                    }
                    if again
                    else {}
                ),
            },
            indent=1,
        )
    )
    print(f"wrote {path}")
    return 0


def _profiled(fn, jobs: list[dict], path: Path):
    """``fn(jobs)`` under cProfile: the functions that took most of their own
    time printed, the stats saved to ``path`` (read with pstats)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    rows = profiler.runcall(fn, jobs)
    profiler.dump_stats(path)
    stats = pstats.Stats(profiler, stream=sys.stdout).strip_dirs()
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)
    return rows


def _nothing() -> None:
    pass


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    raise SystemExit(main())
