"""The report of a TileLang upgrade A/B on one GPU: two evidence files of the
same served cells, one per toolchain, and the repeat timings of both runs.

Per cell it compares the statuses and the kernel's median time, candidate
over baseline, against the noise band of the two runs' repeats: the same
robust spread the upgrade gate computes (1.4826 x the median absolute
deviation over the median, per side, added in quadrature). A ratio outside
1 +- band is faster or slower; inside it, the same. The PyTorch reference
ran in both toolchains' children too: its own ratio says how much the GPU
and host moved between the runs, whatever TileLang did.

    python bench/h200_ab_report.py BASELINE.evidence.json CANDIDATE.evidence.json \\
        REPEATS.json > docs/evidence/DATE-h200-ab-tilelang.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import Counter, defaultdict
from pathlib import Path

MAD_TO_SIGMA = 1.4826


def noise(samples: list[float]) -> float | None:
    samples = [s for s in samples if s]
    if len(samples) < 2:
        return None
    centre = statistics.median(samples)
    mad = statistics.median(abs(s - centre) for s in samples)
    return MAD_TO_SIGMA * mad / centre


def cells(evidence: dict, repeats: list[dict]) -> dict[tuple, dict]:
    jobs = {job["job"]: job for job in evidence["jobs"]}
    timed = {row["job"]: row for row in repeats}
    out = {}
    for envelope in evidence["results"]:
        payload = envelope["payload"]
        job = jobs[payload["job"]]
        key = (job["operator"], json.dumps(job["dims"]), job["dtype"])
        out[key] = {
            "job": job,
            "result": payload["result"],
            "kernel_ms": [t for t in timed[payload["job"]]["kernel_ms"] if t],
            "reference_ms": [t for t in timed[payload["job"]]["reference_ms"] if t],
        }
    return out


def short_call_spread(repeats: dict) -> str:
    """How far apart the cold and warm timings of calls under 50 µs lie,
    kernel and reference alike, over both toolchains."""
    gaps = sorted(
        abs(a - b) * 1e3
        for rows in repeats["runs"].values()
        for row in rows
        for key in ("kernel_ms", "reference_ms")
        for a, b in [row[key]]
        if a and b and min(a, b) < 0.05
    )
    if not gaps:
        return ""
    p95, p99 = (gaps[min(len(gaps) - 1, int(len(gaps) * q))] for q in (0.95, 0.99))
    return (
        f"The cold and warm timings of the {len(gaps)} calls under 50 µs differ "
        f"by {p95:.1f} µs at the 95th percentile, {p99:.1f} µs at the 99th and "
        f"{gaps[-1]:.1f} µs at most."
    )


def compare(base: dict, cand: dict) -> dict:
    row = {
        "base_status": base["result"]["status"],
        "cand_status": cand["result"]["status"],
    }
    if not base["kernel_ms"] or not cand["kernel_ms"]:
        row["verdict"] = "no timing"
        return row
    b, c = statistics.median(base["kernel_ms"]), statistics.median(cand["kernel_ms"])
    band = math.hypot(
        noise(base["kernel_ms"]) or 0.05, noise(cand["kernel_ms"]) or 0.05
    )
    ratio = c / b
    verdict = "faster" if ratio < 1 - band else "slower" if ratio > 1 + band else "same"
    ref_ratio = statistics.median(cand["reference_ms"]) / statistics.median(
        base["reference_ms"]
    )
    return row | {
        "base_ms": b,
        "cand_ms": c,
        "ratio": ratio,
        "band": band,
        "verdict": verdict,
        "ref_ratio": ref_ratio,
    }


def fmt_ms(samples: list[float]) -> str:
    return " / ".join(f"{s:.4g}" for s in samples) or "–"


def report(base_data: dict, cand_data: dict, repeats: dict, names: tuple) -> str:
    versions = [
        d["results"][0]["payload"]["result"]["fingerprint"]["components"]["tilelang"]
        for d in (base_data, cand_data)
    ]
    base = cells(base_data, repeats["runs"][versions[0]])
    cand = cells(cand_data, repeats["runs"][versions[1]])
    keys = sorted(set(base) & set(cand))
    rows = {k: compare(base[k], cand[k]) for k in keys}
    components = cand_data["results"][0]["payload"]["result"]["fingerprint"][
        "components"
    ]
    statuses = Counter((r["base_status"], r["cand_status"]) for r in rows.values())
    verdicts = Counter(r["verdict"] for r in rows.values())
    lines = [
        f"# TileLang {versions[0]} → {versions[1]} on the H200: the served cells, A/B",
        "",
        f"Baseline `{names[0]}` (TileLang {versions[0]}), candidate `{names[1]}` "
        f"(TileLang {versions[1]}): the same {len(keys)} served cells (Llama-3-8B, "
        "Mixtral-8x7B, Qwen2.5-7B; fp16 and bf16 at 1, 16, 512 and 4096 tokens), "
        "the same kernel revisions, validated and timed by one runner "
        f"(`{cand_data['runner']['name']}`) hosting both toolchains, each an "
        "interpreter of its own, through an offline bundle per toolchain "
        "(`runner execute-bundle`); GPU "
        f"{components.get('gpu_name')}, driver {components.get('driver')}, torch "
        f"{components.get('torch')} (CUDA {components.get('torch_cuda')}), nvcc "
        f"{components.get('nvcc')}. Both toolchains share every component but "
        "TileLang.",
        "",
        "Every bundle ran twice: cold (empty kernel cache; the signed results in "
        "the evidence files) and warm (cache filled; its timings are the repeat). "
        "Order: baseline cold, candidate cold, baseline warm, candidate warm. "
        "The noise band of a cell is the robust spread of each side's two "
        "timings (1.4826 × MAD / median, 5% for a side with one timing), the "
        "two sides added in quadrature, as the upgrade gate computes it; a "
        "ratio (candidate / baseline kernel time) outside 1 ± band is faster "
        "or slower. The PyTorch reference ran in both toolchains' children: "
        "its candidate/baseline ratio measures the drift of the GPU and host "
        "between runs.",
        "",
        "Timings are the harness's: a call under 1 ms as replays of a CUDA "
        "graph of many calls (as a serving engine replays its decode step), "
        "longer calls by CUDA events around each; both sides in the same "
        f"child. {short_call_spread(repeats)}",
        "",
        "## What changed",
        "",
        "| baseline → candidate | cells |",
        "|---|---|",
    ]
    for (b, c), n in sorted(statuses.items(), key=lambda x: -x[1]):
        lines.append(f"| {b} → {c} | {n} |")
    lines += ["", "| kernel time, candidate vs baseline | cells |", "|---|---|"]
    for verdict in ("faster", "same", "slower", "no timing"):
        if verdicts[verdict]:
            lines.append(f"| {verdict} | {verdicts[verdict]} |")
    errors = Counter(
        (base[k]["result"]["error"] or {}).get("message", "")[:160]
        for k in keys
        if rows[k]["base_status"] != "pass"
    )
    if errors:
        lines += ["", "Baseline failures:", ""]
        for message, n in errors.items():
            lines.append(f"- {n} cells: `{message}`")
    lines += [
        "",
        "## Per operator",
        "",
        "| operator | cells | faster | same | slower | ratio: min, median, max | "
        "median band | reference drift: median |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_op = defaultdict(list)
    for k, r in rows.items():
        by_op[k[0]].append(r)
    for op, rs in sorted(by_op.items()):
        timed = [r for r in rs if "ratio" in r]
        counts = Counter(r["verdict"] for r in rs)
        spread = (
            f"{min(r['ratio'] for r in timed):.3f}, "
            f"{statistics.median(r['ratio'] for r in timed):.3f}, "
            f"{max(r['ratio'] for r in timed):.3f}"
            if timed
            else "–"
        )
        band = f"{statistics.median(r['band'] for r in timed):.1%}" if timed else "–"
        drift = (
            f"{statistics.median(r['ref_ratio'] for r in timed):.3f}" if timed else "–"
        )
        lines.append(
            f"| {op} | {len(rs)} | {counts['faster']} | {counts['same']} | "
            f"{counts['slower']} | {spread} | {band} | {drift} |"
        )
    lines += [
        "",
        "## Cell by cell",
        "",
        f"Kernel milliseconds as cold / warm; ratio = {versions[1]} / {versions[0]} "
        "(below 1: the candidate is faster).",
        "",
        f"| operator | shape | dtype | {versions[0]} | {versions[1]} | "
        f"{versions[0]} ms | {versions[1]} ms | ratio | band | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k in keys:
        r = rows[k]
        dims = " ".join(f"{d}={v}" for d, v in json.loads(k[1]).items())
        ratio = f"{r['ratio']:.3f}" if "ratio" in r else "–"
        band = f"±{r['band']:.1%}" if "band" in r else "–"
        lines.append(
            f"| {k[0]} | {dims} | {k[2]} | {r['base_status']} | {r['cand_status']} | "
            f"{fmt_ms(base[k]['kernel_ms'])} | {fmt_ms(cand[k]['kernel_ms'])} | "
            f"{ratio} | {band} | {r['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline", type=Path)
    parser.add_argument("candidate", type=Path)
    parser.add_argument("repeats", type=Path)
    args = parser.parse_args()
    data = [json.loads(p.read_text()) for p in (args.baseline, args.candidate)]
    names = tuple(p.name.split(".evidence")[0] for p in (args.baseline, args.candidate))
    repeats = json.loads(args.repeats.read_text())
    print(report(*data, repeats, names), end="")


if __name__ == "__main__":
    main()
