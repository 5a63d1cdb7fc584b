"""The gate's speed verdict on recorded samples: how often a planted 3%
slowdown is caught, and how often re-runs of one toolchain are flagged.

    .venv/bin/python bench/speed_statistics.py [--trials 200] [--seed 20261206]

Re-run pairs: the cold and warm runs of the 188 served cells of one
toolchain on an H100, as recorded in docs/evidence (each pass keeps its
timing samples and the SHA-256 of its generated code). The first file
(three runs) is the one the procedure was designed on; the other two are
held out. Each pair is judged through the proposal diff's own code
(``matrix.gate.diff.measure`` and ``group_verdicts``):

- false flags: the full procedure on the pair as recorded (the generated
  code is the same, so "same code"); then, code-blind, as if a release had
  changed every cell's code and nothing else: the rank test alone, and with
  the group of the 188 cells, and with groups of 20 random cells;
- catch: in each trial 20 random cells of a pair get a new release whose
  code differs and whose calls take 3% longer; the cell counts as caught
  when called slower. Per cell alone (the rank test and its minimum
  effect), and with the 20 cells' group evidence.

The catch rate's interval is Wilson's over the trials' cells, and, as the
trials redraw the same cells, also over the distinct (pair, cell) draws
with every cell planted once (the whole 188 as the group). Prints a table
and writes var/bench/speed_statistics.json. Goals (issue 37): catch >= 95%,
re-runs flag <= 1% of cells.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from itertools import combinations
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EVIDENCE = REPO / "docs" / "evidence"
SOURCES = (
    ("designed on", "2026-12-06-h100-speed-samples.json"),
    ("held out", "2026-12-06-h100-online-sweep-eta.json"),
    ("held out", "2026-12-06-h100-online-sweep-eta-2.json"),
)
PLANTED = 1.03
GROUP = 20
Z_95 = 1.959964


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200, help="per run pair")
    parser.add_argument("--seed", type=int, default=20261206)
    parser.add_argument(
        "--out", default=str(REPO / "var" / "bench" / "speed_statistics.json")
    )
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "matrix.settings")
    import django

    django.setup()

    rng = random.Random(args.seed)
    report = {
        "about": "bench/speed_statistics.py: a planted 3% slowdown in 20 cells "
        "and re-runs of one toolchain, judged by the proposal diff's speed "
        "verdict on the recorded H100 timing samples.",
        "trials_per_pair": args.trials,
        "seed": args.seed,
        "sources": [],
    }
    for role, name in SOURCES:
        runs = recorded(EVIDENCE / name)
        pairs = [(a, b) for a, b in combinations(range(len(runs)), 2)]
        report["sources"].append(
            {"file": name, "role": role, "pairs": len(pairs)}
            | judge(runs, pairs, rng, args.trials)
        )
    total = {
        key: sum(s[key] for s in report["sources"])
        for key in report["sources"][0]
        if key.endswith(("_flagged", "_judged", "_caught", "_planted", "_moved"))
    }
    report["all"] = total | rates(total)
    print(table(report))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


def recorded(path: Path) -> list[dict]:
    """Per run, cell -> its timed pass; only cells every run passed."""
    runs = [{t["cell"]: t for t in run["timed"]} for run in load(path)["runs"]]
    common = set.intersection(*(set(run) for run in runs))
    return [{cell: run[cell] for cell in sorted(common)} for run in runs]


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def side(timed: dict, *, slower: float = 1.0, code: str | None = None) -> dict:
    return {
        "pk": 0,
        "kernel_ms": timed["kernel_ms"] * slower,
        "kernel_ms_samples": [s * slower for s in timed["kernel_ms_samples"]],
        "source_id": code or timed["kernel_source_sha256"],
    }


def verdicts(pairs: list[tuple[dict, dict]], *, group: bool) -> list[str]:
    """Each cell's speed verdict as the proposal diff gives it, with or
    without the evidence of the other cells whose code changed."""
    from matrix.gate.diff import group_verdicts, measure

    measured, rows = [], []
    for base, cand in pairs:
        cell = row()
        change = measure(cell, base, cand, history=None)
        if change is not None:
            measured.append((cell, change))
        rows.append(cell)
    if group:
        group_verdicts(measured)
    return [cell.speed_verdict for cell in rows]


def row():
    """A diff row of a cell green on both sides."""
    from matrix.gate.diff import CellDiff
    from matrix.models.gate import Change

    return CellDiff(
            shape_id=0, device_type_id=0, operator="", dtype="", dims_key="",
            served=True, weight=1.0, backend="cuda", device_type="H100",
            baseline_status="pass", candidate_status="pass",
            candidate_result_id=None, candidate_revision_sha256="",
            candidate_error="", change=Change.STILL_GREEN,
    )  # fmt: skip


def moved(pairs: list[tuple[dict, dict]]) -> bool:
    """Whether the group of these cells is called slower or faster."""
    from matrix.gate.diff import measure
    from matrix.gate.significance import SAME, group_shift

    changes = [measure(row(), base, cand, history=None) for base, cand in pairs]
    group = group_shift([c for c in changes if c is not None])
    return group is not None and group.verdict != SAME


def judge(runs: list[dict], pairs, rng: random.Random, trials: int) -> dict:
    from matrix.gate.significance import SAME, SAME_CODE, SLOWER

    counts = dict.fromkeys(
        (
            "full_flagged", "full_judged", "blind_flagged", "blind_judged",
            "blind_group_flagged", "blind_group20_flagged", "blind_alone20_flagged",
            "blind_group20_judged", "blind_groups_moved", "planted_groups_moved",
            "alone_caught", "group_caught", "trial_planted",
            "every_cell_caught", "every_cell_planted",
        ),
        0,
    )  # fmt: skip
    for a, b in pairs:
        cells = list(runs[a])
        as_recorded = [(side(runs[a][c]), side(runs[b][c])) for c in cells]
        blind = [(side(runs[a][c]), side(runs[b][c], code="new")) for c in cells]
        counts["full_judged"] += len(cells)
        counts["full_flagged"] += sum(
            v != SAME_CODE for v in verdicts(as_recorded, group=True)
        )
        counts["blind_judged"] += len(cells)
        counts["blind_flagged"] += sum(v != SAME for v in verdicts(blind, group=False))
        counts["blind_group_flagged"] += sum(
            v != SAME for v in verdicts(blind, group=True)
        )
        planted = [
            (side(runs[a][c]), side(runs[b][c], slower=PLANTED, code="new"))
            for c in cells
        ]
        counts["every_cell_planted"] += len(cells)
        counts["every_cell_caught"] += sum(
            v == SLOWER for v in verdicts(planted, group=True)
        )
        for _ in range(trials):
            chosen = rng.sample(range(len(cells)), GROUP)
            counts["blind_group20_judged"] += GROUP
            draw = [blind[i] for i in chosen]
            counts["blind_groups_moved"] += moved(draw)
            counts["blind_group20_flagged"] += sum(
                v != SAME for v in verdicts(draw, group=True)
            )
            counts["blind_alone20_flagged"] += sum(
                v != SAME for v in verdicts(draw, group=False)
            )
            draw = [planted[i] for i in chosen]
            counts["planted_groups_moved"] += moved(draw)
            counts["trial_planted"] += GROUP
            counts["alone_caught"] += sum(
                v == SLOWER for v in verdicts(draw, group=False)
            )
            counts["group_caught"] += sum(
                v == SLOWER for v in verdicts(draw, group=True)
            )
    return counts | rates(counts)


def rates(c: dict) -> dict:
    return {
        "full_false_flags": c["full_flagged"] / c["full_judged"],
        "blind_alone_false_flags": c["blind_flagged"] / c["blind_judged"],
        "blind_group_false_flags": c["blind_group_flagged"] / c["blind_judged"],
        "blind_group20_false_flags": c["blind_group20_flagged"]
        / c["blind_group20_judged"],
        "blind_alone20_false_flags": c["blind_alone20_flagged"]
        / c["blind_group20_judged"],
        "blind_groups_moved_rate": c["blind_groups_moved"]
        / (c["trial_planted"] / GROUP),
        "planted_groups_moved_rate": c["planted_groups_moved"]
        / (c["trial_planted"] / GROUP),
        "catch_alone": wilson(c["alone_caught"], c["trial_planted"]),
        "catch_group": wilson(c["group_caught"], c["trial_planted"]),
        "catch_group_every_cell": wilson(
            c["every_cell_caught"], c["every_cell_planted"]
        ),
    }


def wilson(k: int, n: int) -> dict:
    """The rate and its 95% Wilson score interval."""
    p = k / n
    centre = (p + Z_95**2 / (2 * n)) / (1 + Z_95**2 / n)
    half = Z_95 * math.sqrt(p * (1 - p) / n + Z_95**2 / (4 * n * n)) / (1 + Z_95**2 / n)
    return {"rate": p, "low": centre - half, "high": centre + half, "of": n}


def table(report: dict) -> str:
    def pct(x: float) -> str:
        return f"{100 * x:5.1f}%"

    def ci(w: dict) -> str:
        return f"{pct(w['rate'])} [{pct(w['low'])}, {pct(w['high'])}] of {w['of']}"

    lines = [
        f"{'source':44} {'re-runs flagged':>16} {'code-blind: alone':>18} "
        f"{'+188 group':>10} {'20: alone/group':>16} {'groups moved':>13}"
        "   catch alone / with group / every cell once",
    ]
    for s in [*report["sources"], {"file": "all", "role": "", **report["all"]}]:
        lines.append(
            f"{(s['role'] + ' ' + s['file']).strip():44} "
            f"{pct(s['full_false_flags']):>16} {pct(s['blind_alone_false_flags']):>18} "
            f"{pct(s['blind_group_false_flags']):>10} "
            f"{pct(s['blind_alone20_false_flags'])}/{pct(s['blind_group20_false_flags'])}"
            f"  {pct(s['blind_groups_moved_rate'])}/{pct(s['planted_groups_moved_rate'])}   "
            f"{ci(s['catch_alone'])} / {ci(s['catch_group'])} / "
            f"{ci(s['catch_group_every_cell'])}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
