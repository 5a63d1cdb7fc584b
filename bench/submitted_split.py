"""Wall time of one submitted kernel through the harness: this tree's three
children (builder, executor, judge) against the harness of a baseline
revision (by default the one before the split, where one child compiled and
ran the kernel and a judge compared).

    python bench/submitted_split.py [--baseline REV] [--rounds 3] [--out PATH]

Each round runs, on the CPU (target c), a correct elementwise_add that
passes and one whose program() raises (a compile error: the builder fails,
the others are stopped), in this tree and in the baseline in turn,
alternating which goes first. The baseline's harness is taken from git
(``git archive``) and run in a process of its own. Prints the median of
each and writes JSON (default bench/out/submitted_split.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = "2b4d638"  # the harness before the three-child split
GOOD = (REPO / "tests" / "security" / "attacks" / "good_add.py").read_text()
FAILING = "def program(shape, dtype, target):\n    raise ValueError('no kernel')\n"

RUN = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from runners.harness.sandbox import run_job
job = json.loads(sys.argv[2])
started = time.perf_counter()
result = run_job(job, cache_dir="unused")
print(json.dumps({"wall_s": time.perf_counter() - started,
                  "status": result["status"]}))
"""


def job(source: str) -> dict:
    return {
        "operator": "elementwise_add",
        "shape": {"M": 64, "N": 96},
        "dtype": "float32",
        "target": {"kind": "c"},
        "seed": 5,
        "source": source,
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
    }


def run(tree: Path, source: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(tree), json.dumps(job(source))],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(f"a run in {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def baseline_tree(revision: str) -> Path:
    """The baseline's runners/ package in a directory the sandbox's uids
    may read."""
    tree = Path(tempfile.mkdtemp(prefix="tm-bench-baseline-"))
    tree.chmod(0o755)
    archive = subprocess.run(
        ["git", "archive", revision, "runners"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for root, dirs, files in os.walk(tree):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    return tree


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", default=DEFAULT_BASELINE)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "bench/out/submitted_split.json"))
    args = parser.parse_args()
    baseline = baseline_tree(args.baseline)
    trees = {"split": REPO, f"baseline {args.baseline}": baseline}
    samples: dict[tuple[str, str], list[dict]] = {}
    try:
        for round_ in range(args.rounds):
            order = list(trees.items())
            if round_ % 2:
                order.reverse()
            for kernel, source in (("passing", GOOD), ("compile error", FAILING)):
                for name, tree in order:
                    sample = run(tree, source)
                    samples.setdefault((name, kernel), []).append(sample)
                    print(
                        f"round {round_ + 1}: {name:<18} {kernel:<14} "
                        f"{sample['status']:<14} {sample['wall_s']:.1f} s",
                        flush=True,
                    )
    finally:
        shutil.rmtree(baseline)
    rows = []
    for (name, kernel), runs in samples.items():
        walls = [r["wall_s"] for r in runs]
        rows.append(
            {
                "harness": name,
                "kernel": kernel,
                "statuses": sorted({r["status"] for r in runs}),
                "median_wall_s": statistics.median(walls),
                "walls_s": walls,
            }
        )
    print()
    print(f"{'harness':<18} {'kernel':<14} {'status':<14} {'median wall':>12}")
    for row in rows:
        print(
            f"{row['harness']:<18} {row['kernel']:<14} {','.join(row['statuses']):<14} "
            f"{row['median_wall_s']:>10.1f} s"
        )
    median = {(r["harness"], r["kernel"]): r["median_wall_s"] for r in rows}
    added = {
        kernel: median["split", kernel] - median[f"baseline {args.baseline}", kernel]
        for kernel in ("passing", "compile error")
    }
    for kernel, seconds in added.items():
        print(f"added by the split, {kernel}: {seconds:+.1f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "baseline": args.baseline,
                "rounds": args.rounds,
                "cpus": os.cpu_count(),
                "load_average": os.getloadavg(),
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "rows": rows,
                "added_s": added,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
