"""The report beside a ``bench/sustained_speed.py`` JSON: every cell's ratio
against its goal with its rounds, the kernel the library chose for it, the
milliseconds per call, SM clock and power of both sides, and a count per
operator and row count.

    python bench/sustained_report.py docs/evidence/2026-12-02-h200-sustained-speed-decode.json \\
        > docs/evidence/2026-12-02-h200-sustained-speed-decode.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runners.kernels.gemm import tile_config  # noqa: E402
from runners.kernels.row_sum import split_ranks  # noqa: E402


def kernel_of(cell: dict, target: dict) -> str:
    if cell["op"] == "gemm":
        config = tile_config(cell["shape"], target, cell["dtype"])
        ranks = config.get("ranks", 1)
        return config["variant"] + (f", {ranks} ranks" if ranks > 1 else "")
    if cell["op"] == "row_sum":
        ranks = split_ranks(cell["shape"], target)
        return f"row split, {ranks} ranks" if ranks > 1 else "block per rows"
    return "–"


def ms(cell: dict, impl: str) -> float | None:
    runs = [r["ms"] for r in cell.get("runs", []) if r["impl"] == impl]
    return statistics.median(runs) if runs else None


def report(data: dict, name: str) -> str:
    env = data["environment"]
    target = env["target"]
    cells = data["cells"]
    graphs = any("graph_calls" in c for c in cells)
    runs = [r for c in cells for r in c.get("runs", [])]
    peak = max((r["power_w"] or 0) for r in runs)
    clocks = [r["sm_mhz"] for r in runs if r["sm_mhz"]]
    reasons = {reason for r in runs for reason in r["reasons"]}
    lines = [
        f"# Speed at the power cap on the H200: {name}",
        "",
        f"{env['gpu']}, TileLang {env['tilelang']}, torch {env['torch']}, target "
        f"`{target}`. Each cell ran the TileLang kernel and the PyTorch path back "
        f"to back for {data['seconds']} s at a time, {data['rounds']} rounds in "
        "alternating order; the ratio is PyTorch's time over TileLang's (above 1: "
        "TileLang is faster), the median round's; nvidia-smi sampled SM clock "
        "and power every 50 ms."
        + (
            " Both sides ran as CUDA-graph replays (each replay many calls over "
            "inputs rotated past L2), as a serving engine runs its decode step: a "
            "call of a few microseconds timed from the host would measure its "
            "launch."
            if graphs
            else ""
        ),
        "",
        f"Highest median power of a run: {peak:.0f} W; SM clock "
        f"{min(clocks):.0f}-{max(clocks):.0f} MHz; clock-event reasons seen: "
        + (", ".join(f"`{r}`" for r in sorted(reasons)) or "none")
        + " (0x0 is none, 0x4 the software power cap).",
        "",
        "## Met, per operator and rows",
        "",
        "| operator | rows (M) | cells | met | ratio: min, median, max |",
        "|---|---|---|---|---|",
    ]
    groups = defaultdict(list)
    for c in cells:
        groups[c["op"], c["shape"]["M"]].append(c)
    for (op, m), group in sorted(groups.items()):
        ratios = [c.get("ratio", 0) for c in group]
        lines.append(
            f"| {op} | {m} | {len(group)} | {sum(c['met'] for c in group)} | "
            f"{min(ratios):.3f}, {statistics.median(ratios):.3f}, {max(ratios):.3f} |"
        )
    met = sum(c["met"] for c in cells)
    lines += [
        "",
        f"{met} of {len(cells)} cells met their goal.",
        "",
        "## Every cell",
        "",
        "| operator | shape | dtype | kernel | goal | ratio | met | rounds | "
        "TileLang ms | PyTorch ms | SM MHz / W, TileLang | SM MHz / W, PyTorch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        shape = " ".join(f"{k}={v}" for k, v in c["shape"].items())
        rounds = " / ".join(f"{r:.3f}" for r in c.get("round_ratios", []))
        tl, ref = ms(c, "tl"), ms(c, "torch")
        lines.append(
            f"| {c['op']} | {shape} | {c['dtype']} | {kernel_of(c, target)} | "
            f"{c['goal']:.2f} | {c.get('ratio', 0):.3f} | "
            f"{'yes' if c['met'] else 'no'} | {rounds} | "
            f"{tl * 1e3 if tl else 0:.1f} µs | {ref * 1e3 if ref else 0:.1f} µs | "
            f"{c.get('tl_mhz', 0):.0f} / {c.get('tl_w', 0):.0f} | "
            f"{c.get('torch_mhz', 0):.0f} / {c.get('torch_w', 0):.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    args = parser.parse_args()
    data = json.loads(args.results.read_text())
    print(report(data, args.results.name.removesuffix(".json")), end="")


if __name__ == "__main__":
    main()
