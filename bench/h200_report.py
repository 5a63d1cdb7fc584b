"""The report beside an evidence file of a served sweep: per operator the
status counts, worst error and TileLang against the PyTorch reference; per
served shape its latencies; and the sweep's wall time split.

    python bench/h200_report.py docs/evidence/2026-12-03-h200-ab-tilelang-0.1.15.evidence.json \\
        --sustained docs/evidence/2026-12-03-h200-sustained-speed-decode.json \\
        > docs/evidence/2026-12-03-h200-ab-tilelang-0.1.15.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path


def dims_text(dims: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in dims.items())


def ms(value) -> str:
    return "–" if value is None else f"{value:.4g}"


def cell_key(operator: str, dims: dict, dtype: str) -> tuple:
    return operator, json.dumps(dims, sort_keys=True), dtype


def sustained_speeds(data: dict) -> dict:
    """Cell -> speed at the power cap from a ``bench/sustained_speed.py``
    file: the median round's ratio, as ``manage.py evidence import-sustained``
    keeps it."""
    return {
        cell_key(c["op"], c["shape"], c["dtype"]): c["ratio"]
        for c in data["cells"]
        if c.get("status") == "pass" and c.get("ratio")
    }


def report(data: dict, name: str, sustained: dict | None = None) -> str:
    sustained = sustained or {}
    jobs = {job["job"]: job for job in data["jobs"]}
    rows = []
    for envelope in data["results"]:
        payload = envelope["payload"]
        rows.append((jobs[payload["job"]], payload["result"]))
    rows.sort(
        key=lambda row: (
            row[1]["target"]["kind"],
            row[0]["operator"],
            row[0]["profile"],
            row[0]["dtype"],
            list(row[0]["dims"].values()),
        )
    )
    components = rows[0][1]["fingerprint"]["components"]
    profiles = Counter(job["profile"] for job, _ in rows)
    lines = [
        f"# Served shapes on the H200 lab runner: {name}",
        "",
        f"Runner `{data['runner']['name']}` (offline bundle, `runner execute-bundle`), "
        f"{len(rows)} served cells: "
        + ", ".join(f"{n} of {p}" for p, n in sorted(profiles.items()))
        + "; float16 and bfloat16 at 1, 16, 512 and 4096 tokens.",
        "",
        "Toolchain: "
        + ", ".join(
            f"{k} {components.get(k)}"
            for k in ("tilelang", "torch", "torch_cuda", "nvcc", "driver", "python")
        )
        + f"; GPU {components.get('gpu_name')}.",
        "",
        "Every result is signed by the runner and was imported through the "
        "normal ingest (`manage.py evidence import` replays it into another "
        "server). Latencies are medians by CUDA events with inputs rotated "
        "past L2 (a call under 1 ms as replays of a CUDA graph of many calls, "
        "as a serving engine replays its decode step), TileLang's kernel "
        "against the operator's PyTorch reference in the "
        "same child; while one child timed, others compiled on the host's "
        "other cores.",
        "",
        "## Wall time",
        "",
        "| run | cells | wall s | compile s (sum / children) | GPU s | overhead s |",
        "|---|---|---|---|---|---|",
    ]
    for run, figures in data.get("measured", {}).items():
        compile_split = (
            f"{figures['compile_s_total']} / {figures['workers']} = "
            f"{figures['compile_s']}"
            if "compile_s_total" in figures
            else f"all of it, {figures.get('workers')} children"
        )
        lines.append(
            f"| {run} | {figures['cells']} | {figures['wall_s']} | {compile_split} | "
            f"{figures.get('gpu_run_s', '–')} | {figures.get('overhead_s', '–')} |"
        )
    lines += [
        "",
        "Children compile side by side and take the GPU in turn, so compilation "
        "and GPU time overlap: the overhead column is what the wall time holds "
        "beyond the two (child start-up, waits); 0 when they overlap fully.",
        "",
        "## Per operator",
        "",
        "| operator | cells | status | worst rel. error (cell) | "
        "TileLang / reference speed: min, median, max |",
        "|---|---|---|---|---|",
    ]
    by_operator = defaultdict(list)
    for job, result in rows:
        by_operator[job["operator"]].append((job, result))
    for operator, cells in by_operator.items():
        status = Counter(result["status"] for _, result in cells)
        worst_job, worst = max(
            cells, key=lambda c: (c[1]["metrics"] or {}).get("rel_err") or 0
        )
        worst_rel = (worst["metrics"] or {}).get("rel_err")
        worst_text = (
            "–"
            if worst_rel is None
            else f"{worst_rel:.2e} ({dims_text(worst_job['dims'])} {worst_job['dtype']})"
        )
        speedups = [
            r["timings"]["speedup"] for _, r in cells if r["timings"]["speedup"]
        ]
        spread = (
            f"{min(speedups):.2f}×, {statistics.median(speedups):.2f}×, "
            f"{max(speedups):.2f}×"
            if speedups
            else "–"
        )
        lines.append(
            f"| {operator} | {len(cells)} | "
            + ", ".join(f"{n} {s}" for s, n in status.items())
            + f" | {worst_text} | {spread} |"
        )
    lines += [
        "",
        "## Per served shape",
        "",
        "Speed is the reference's time over TileLang's: above 1 TileLang is "
        "faster. A cell that passed is correct with TileLang on that device "
        "with this toolchain; `served` is what an approved manifest chooses "
        "there at the default speed budget (0): TileLang where it passed and "
        "was measured at least as fast as the reference, here and, for the "
        "cells also run at the power cap (`bench/sustained_speed.py`, imported "
        "by `manage.py evidence import-sustained`), there too; the reference "
        "elsewhere. `lowered` is compile-only evidence, not validation. "
        f"{served_summary(rows, sustained)}",
        "",
        "| operator | shape | dtype | target | profile | weight | status | rel. error | "
        "TileLang ms | reference ms | speed | served |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for job, result in rows:
        timings, metrics = result["timings"], result["metrics"] or {}
        speed = timings.get("speedup")
        at_cap = sustained.get(cell_key(job["operator"], job["dims"], job["dtype"]))
        choice = served(result, at_cap)
        if choice == "reference" and at_cap is not None and speed and speed >= 1:
            choice += f" ({at_cap:.4f}× at the power cap)"
        lines.append(
            f"| {job['operator']} | {dims_text(job['dims'])} | {job['dtype']} | "
            f"{result['target']['kind']} | {job['profile']} | {job['weight']:g} | "
            f"{result['status']} | "
            f"{ms(metrics.get('rel_err'))} | {ms(timings.get('kernel_ms'))} | "
            f"{ms(timings.get('reference_ms'))} | "
            + (f"{speed:.2f}×" if speed else "–")
            + f" | {choice} |"
        )
    return "\n".join(lines) + "\n"


def served(result: dict, at_cap: float | None = None) -> str:
    """The manifest's choice at the default speed budget
    (``matrix.gate.manifest.manifest_choice`` on one timing a side, and the
    cell's speed at the power cap where it has one)."""
    speed = (result.get("timings") or {}).get("speedup")
    if result["status"] == "pass" and speed and speed >= 1:
        if at_cap is None or at_cap >= 1:
            return "TileLang"
    return "reference"


def served_summary(rows: list, sustained: dict) -> str:
    passed = [(job, r) for job, r in rows if r["status"] == "pass"]
    if not passed:
        return ""
    choices = [
        served(r, sustained.get(cell_key(job["operator"], job["dims"], job["dtype"])))
        for job, r in passed
    ]
    fast = choices.count("TileLang")
    by_cap = sum(
        choice == "reference" and (r["timings"].get("speedup") or 0) >= 1
        for choice, (_, r) in zip(choices, passed, strict=True)
    )
    text = (
        f"Of the {len(passed)} cells that passed, {fast} are served TileLang "
        f"and {len(passed) - fast} the reference, as slower than it"
    )
    if by_cap:
        text += f" ({by_cap} of them only at the power cap)"
    return text + "."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("evidence", type=Path)
    parser.add_argument(
        "--sustained",
        type=Path,
        help="a bench/sustained_speed.py file of the same toolchain and device",
    )
    args = parser.parse_args()
    data = json.loads(args.evidence.read_text())
    name = args.evidence.name.removesuffix(".evidence.json")
    sustained = None
    if args.sustained:
        sustained = sustained_speeds(json.loads(args.sustained.read_text()))
    print(report(data, name, sustained), end="")


if __name__ == "__main__":
    main()
