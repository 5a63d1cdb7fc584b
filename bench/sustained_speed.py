"""The speed targets at the power cap: every cell a speed target of
``bench/gpu_validate.py`` judges (gemm at M, N, K >= 4096 against
``torch.matmul``, attention at S >= 4096 against SDPA), with the kernel and
the PyTorch path each run back to back for ``--seconds`` at a time instead
of ``gpu_validate``'s quarter-second bursts.

An H200 under steady load sits at its 700 W cap, where the SM clock is what
the power allows, not the boost clock a short burst after the host's own
work may still see: a kernel that does less work per clock but spends less
energy per FLOP can lose a burst and win at the cap, or the other way
round. Each cell runs the two in turn, in alternating order, over
``--rounds``; ``nvidia-smi`` samples SM clock, power and the clock-event
reasons every 50 ms (the first fifth of each run, the ramp, left out); the
rate of each run comes from CUDA events around all its calls. Prints a
table; writes JSON to ``--out``.

``--decode`` runs the decode cells instead: gemm at 1, 4 and 16 rows
against every weight matrix of the built-in profiles and the 152k-vocabulary
head, against ``torch.matmul`` (goal 1.0x), and row sums over few long rows
against ``torch.sum`` (goal 0.9x). A call there lasts microseconds, less
than the host takes to launch it, so both sides run as CUDA-graph replays
(as a serving engine runs its decode step), each replay many calls over
the rotated inputs.

    python bench/sustained_speed.py [--decode] [--seconds 2] [--rounds 3] [--out PATH]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_validate import (  # noqa: E402
    DECODE_TARGET,
    LONG_ROWS,
    LONG_ROWS_TARGET,
    compare,
    compile_cells,
    decode_shapes,
    environment,
    gpu_bench_parser,
    graph_calls,
    graphed,
    make_cells,
    poisoned,
    rotated,
    target_of,
    torch_baseline,
)

from runners.kernels import OPERATORS  # noqa: E402
from runners.kernels.revision import library_source, revision_sha256  # noqa: E402

QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"
SAMPLE_MS = 50
BATCH_S = 0.1  # enqueued between host checks of the time


def sustained(
    fn, input_sets, seconds: float, call_s: float, calls_each: int = 1
) -> dict:
    """Calls of ``fn`` back to back for ``seconds`` while nvidia-smi samples
    the GPU: milliseconds per call from CUDA events around them all, and the
    median SM clock and power of the steady part. A call of ``fn`` that
    replays a graph makes ``calls_each`` calls."""
    import torch

    smi = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]
        + ["-lms", str(SAMPLE_MS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    batch = max(1, int(BATCH_S / call_s))
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    calls, began = 0, time.perf_counter()
    start.record()
    while time.perf_counter() - began < seconds:
        for _ in range(batch):
            fn(*input_sets[calls % len(input_sets)])
            calls += 1
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    smi.terminate()
    rows = []
    for line in smi.communicate()[0].splitlines():
        try:
            clock, power, reasons = (p.strip() for p in line.split(","))
            rows.append((float(clock), float(power), reasons))
        except ValueError:
            continue  # a line cut by the terminate, or a field the driver lacks
    steady = rows[len(rows) // 5 :]
    return {
        "ms": start.elapsed_time(end) / (calls * calls_each),
        "calls": calls * calls_each,
        "sm_mhz": statistics.median(r[0] for r in steady) if steady else None,
        "power_w": statistics.median(r[1] for r in steady) if steady else None,
        "reasons": dict(Counter(r[2] for r in steady)),
    }


def decode_cells() -> list[dict]:
    """The decode targets: gemm against torch.matmul, few long rows against
    torch.sum."""
    cells = [
        {"op": "gemm", "kind": "decode", "shape": shape, "dtype": dtype}
        for shape in decode_shapes()
        for dtype in ("float16", "bfloat16")
    ]
    cells += [
        {"op": "row_sum", "kind": "long_rows", "shape": shape, "dtype": dtype}
        for shape in LONG_ROWS
        for dtype in ("float32", "bfloat16")
    ]
    return cells


def decode_goal(cell: dict) -> float:
    return DECODE_TARGET if cell["op"] == "gemm" else LONG_ROWS_TARGET


def as_graphs(impls: dict, input_sets: list) -> tuple[dict, int]:
    """Each implementation as a replay of a CUDA graph of ``calls`` calls,
    where both can be captured; otherwise the calls themselves."""
    calls = graph_calls(impls["torch"], input_sets)
    graphs = {name: graphed(fn, input_sets, calls) for name, fn in impls.items()}
    if any(g is None for g in graphs.values()):
        return impls, 1
    return {name: (lambda *_, g=g: g.replay()) for name, g in graphs.items()}, calls


def run_cell(cell: dict, seconds: float, rounds: int, graphs: bool = False) -> None:
    import torch

    op = OPERATORS[cell["op"]]
    shape, dtype = cell["shape"], cell["dtype"]
    kernel = cell.pop("kernel")
    inputs = op.make_inputs(shape, dtype, seed=0, device="cuda")
    outputs = poisoned(op, shape, dtype)
    kernel(*inputs, *outputs)
    torch.cuda.synchronize()
    refs = op.reference(*[x.double() for x in inputs])
    checks = [
        compare(o, r, op.tolerances[dtype]) for o, r in zip(outputs, refs, strict=True)
    ]
    cell["status"] = "pass" if all(c["pass"] for c in checks) else "mismatch"
    del refs
    input_sets = rotated(op, shape, dtype, inputs)
    impls = {
        "tl": lambda *x, o=outputs: kernel(*x, *o),
        "torch": torch_baseline(cell["op"]),
    }
    calls_each = 1
    if graphs:
        impls, calls_each = as_graphs(impls, input_sets)
        cell["graph_calls"] = calls_each
    call_s = {}
    for name, fn in impls.items():  # warm, and how long one call takes
        fn(*inputs)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*inputs)
        torch.cuda.synchronize()
        call_s[name] = time.perf_counter() - t0
    cell["runs"] = []
    for n in range(rounds):
        for name in impls if n % 2 == 0 else reversed(list(impls)):
            run = sustained(impls[name], input_sets, seconds, call_s[name], calls_each)
            cell["runs"].append({"impl": name, "round": n} | run)
    by = {name: [r for r in cell["runs"] if r["impl"] == name] for name in impls}
    cell["round_ratios"] = [
        t["ms"] / k["ms"]
        for k, t in zip(
            sorted(by["tl"], key=lambda r: r["round"]),
            sorted(by["torch"], key=lambda r: r["round"]),
            strict=True,
        )
    ]
    cell["ratio"] = statistics.median(cell["round_ratios"])
    for name in impls:
        cell[f"{name}_mhz"] = statistics.median(r["sm_mhz"] or 0 for r in by[name])
        cell[f"{name}_w"] = statistics.median(r["power_w"] or 0 for r in by[name])
    del inputs, input_sets, outputs


def main(argv: list[str] | None = None) -> int:
    parser = gpu_bench_parser(__doc__, "sustained_speed.json")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--decode", action="store_true", help="the decode cells, as graph replays"
    )
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    started = time.perf_counter()
    ops = [o for o in args.ops.split(",") if o]
    if args.decode:
        cells = [c for c in decode_cells() if not ops or c["op"] in ops]
    else:
        cells = [
            c
            for c in make_cells(False, ops)
            if (target_of(c) or (None, ""))[1] == "speedup"
        ]
    # The served and default lists can name one shape twice: once is enough.
    unique = {(c["op"], json.dumps(c["shape"]), c["dtype"]): c for c in cells}
    cells = list(unique.values())
    print(f"{len(cells)} cells; compiling", flush=True)
    compile_cells(cells, args.workers)
    print(f"compiled in {time.perf_counter() - started:.0f} s", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"{'op':<17} {'shape':<30} {'dtype':<9} {'goal':>5} {'ratio':>6} met  "
        f"{'rounds':<20} {'tl MHz/W':>10} {'torch MHz/W':>11}"
    )
    revisions = {
        name: revision_sha256(library_source(name))
        for name in sorted({cell["op"] for cell in cells})
    }
    for cell in cells:
        if cell.get("status") == "built":
            run_cell(cell, args.seconds, args.rounds, graphs=args.decode)
        torch.cuda.empty_cache()
        cell["goal"] = decode_goal(cell) if args.decode else target_of(cell)[0]
        cell["met"] = cell.get("ratio", 0) >= cell["goal"]
        shape = ",".join(f"{k}={v}" for k, v in cell["shape"].items())
        print(
            f"{cell['op']:<17} {shape:<30} {cell['dtype']:<9} {cell['goal']:>5.2f} "
            f"{cell.get('ratio', 0):>6.3f} {'yes' if cell['met'] else 'NO ':<4}"
            + "/".join(f"{r:.3f}" for r in cell.get("round_ratios", []))
            + f"  {cell.get('tl_mhz', 0):.0f}/{cell.get('tl_w', 0):.0f}"
            + f"  {cell.get('torch_mhz', 0):.0f}/{cell.get('torch_w', 0):.0f}",
            flush=True,
        )
        report = {
            # The kernel revisions measured, which the server's import checks
            # against its current ones.
            "environment": {**environment(), "revisions": revisions},
            "seconds": args.seconds,
            "rounds": args.rounds,
            "total_s": time.perf_counter() - started,
            "cells": [{k: v for k, v in c.items() if k != "kernel"} for c in cells],
        }
        out.write_text(json.dumps(report, indent=1, default=str))
    met = sum(c["met"] for c in cells)
    print(f"\n{met} of {len(cells)} speed targets met at the power cap; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
