"""Measure tile configurations of the library's GPU kernels on one CUDA GPU.

For each operator, at the large shapes the speed targets are judged on (and
the decode shapes where gemm lags), every listed configuration is compiled
(in parallel), checked against the float64 reference (a wrong schedule must
not win on speed), and timed the same way as ``bench/gpu_validate.py``
against the PyTorch path production would take instead. The fastest passing
configuration per cell is what ``tile_config`` in the operator module should
pick. Prints one table per cell; writes JSON to ``--out``.

    python bench/kernel_tune.py [--ops gemm,attention] [--out PATH]
    python bench/kernel_tune.py --decode [--out PATH]
    python bench/kernel_tune.py --decode-wide [--refine] [--shapes 4x4096x4096,...]

``--decode`` measures the decode variants instead: gemm at 1, 4 and 16 rows
against every weight the profiles multiply, row sums over few long rows,
and checks the float32 kernels at a few shapes; its calls are timed as
CUDA-graph replays (``gpu_validate.time_graphs_in_turn``), since a kernel
of a few microseconds timed call by call measures mostly its launch.
``--decode-wide`` tries a wider grid of both decode variants' knobs at the
bfloat16 decode gemm shapes alone (``--shapes`` picks and orders them;
``--refine`` takes a narrower grid around round 2's winners), compiling and
measuring a few cells at a time so that a run cut short keeps what it
measured.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_validate import (  # noqa: E402
    LONG_ROWS,
    TARGET,
    compare,
    copy_bandwidth_gbs,
    decode_shapes,
    environment,
    gpu_bench_parser,
    poisoned,
    rates,
    rotated,
    time_graphs_in_turn,
    time_in_turn,
    torch_baseline,
)

from runners.kernels import OPERATORS  # noqa: E402
from runners.kernels.cluster import CLUSTER_MAX, ranks_for  # noqa: E402
from runners.kernels.gemm import DECODE_M, H200_SMS, VEC  # noqa: E402

BIG_GEMM = [
    {"M": 4096, "N": 4096, "K": 4096},
    {"M": 8192, "N": 8192, "K": 8192},
    {"M": 4096, "N": 128256, "K": 4096},  # a 128k-vocabulary LM head
]
# Served Llama-3-8B projections that take the 128x128 and decode tiles.
SERVED_GEMM = [
    {"M": 512, "N": 4096, "K": 14336},
    {"M": 512, "N": 6144, "K": 4096},
    {"M": 16, "N": 28672, "K": 4096},
]
ATTENTION = [dict(B=b, H=32, HKV=8, S=4096, D=128) for b in (1, 4)]
VOCAB_ROWS = {"M": 4096, "N": 128256}

# Each list starts with {} (the operator's own choice); round 1 of
# docs/evidence/2026-11-30-h200-kernel-tune-*.json tried block shapes,
# pipeline depths and the epilogue for gemm, and the tile knobs of the
# memory-bound operators at 65536 x 4096, where all of them ran at 96-107% of
# the copy bandwidth with their own choice.
# Round 15 (alternating rounds) found 256 x 128 tiles and 128 x 128 tiles
# with four stages slower at 4096^3 and 8192^3, and the panels within the noise.
# Round 16 (five rounds) chose four stages over three (the epilogue's tile
# shares the B stages' shared memory, so they fit); a panel of 8 read the same
# as 16 within the noise, and 32-wide K steps in six stages were slower.
# Round 18 (five rounds) tried persistent kernels, one block per SM walking
# the tiles, for gemm (3 stages with the shared-memory epilogue, or 4 without
# it) and non-causal attention: gemm 4-12% slower, attention at half speed.
GEMM_BIG_CONFIGS = [
    {},
    {"stages": 3},
    {"panel": 8},
]
GEMM_SERVED_CONFIGS = [
    {},
    {"store_via_shared": True},
    {"store_via_shared": True, "panel": 16},
]
# Rounds 7-10 chose the bare exp2, masking after the score gemm, the stale
# running max and the shared-memory epilogue for attention, and per-thread
# partials for the vocabulary softmax; round 11 (issuing only the gemm each
# end of the KV loop needs) and round 13 (the two consumer warpgroups taking
# turns at the tensor cores, retried on the current kernel) did not win. The
# knobs those rounds turned are gone with the variants that lost. Round 14
# chose the queries in registers for non-causal attention; idle gemms
# reading zero-filled tiles from past the keys' ends (TMA reads nothing
# there) won nothing beyond the noise and are gone.
# Round 16: a third KV stage, or 64-key blocks in three stages, did not win.
ATTENTION_CONFIGS = [
    {},
    {"q_regs": False},
    {"stages": 3},
]
# Rounds 11-12 chose clusters of 8 blocks for vocabulary rows on Hopper.
VOCAB_CONFIGS = [
    {},
    {"cluster": 0},
    {"threads": 128},
]


def plan(ops: list[str]) -> list[dict]:
    """One entry per (operator, shape, dtype): the configurations to try."""
    cells = []

    def add(op, shapes, dtypes, configs):
        if ops and op not in ops:
            return
        for shape in shapes:
            for dtype in dtypes:
                cells.append(
                    {"op": op, "shape": shape, "dtype": dtype, "configs": configs}
                )

    add("gemm", BIG_GEMM, ("float16", "bfloat16"), GEMM_BIG_CONFIGS)
    add("gemm", SERVED_GEMM, ("bfloat16",), GEMM_SERVED_CONFIGS)
    for op in ("attention", "attention_causal"):
        add(op, ATTENTION, ("float16", "bfloat16"), ATTENTION_CONFIGS)
    add("softmax", [VOCAB_ROWS], ("float16", "bfloat16", "float32"), VOCAB_CONFIGS)
    return cells


# Decode round 1: the tile kernel production ran before (a 64 x 128 tile per
# block), the CUDA-core gemv and the tensor-core split-K kernel with the
# cluster ranks tile_config chooses and with twice as many, and the gemv
# without a cluster.
TILE_DECODE = {
    "variant": "tile",
    "block_m": 64,
    "block_n": 128,
    "block_k": 128,
    "stages": 3,
    "threads": 128,
    "panel": 10,
    "store_via_shared": False,
}
LONG_ROWS_CONFIGS = [
    {},
    {"ranks": 1},
    {"ranks": 16},
    {"threads": 1024, "tile": 16384},
]
FLOAT32_CHECKS = [
    ("gemm", {"M": 77, "N": 1003, "K": 1001}),
    ("gemm", {"M": 4096, "N": 4096, "K": 4096}),
    ("gemm", {"M": 1, "N": 4096, "K": 4096}),
    ("attention", dict(B=1, H=32, HKV=8, S=512, D=128)),
    ("attention", dict(B=2, H=4, HKV=2, S=77, D=64)),
    ("attention_causal", dict(B=1, H=32, HKV=8, S=512, D=128)),
    ("attention_causal", dict(B=2, H=4, HKV=2, S=77, D=64)),
]


def decode_configs(shape: dict) -> list[dict]:
    """The library's choice, the tile kernel, and each decode variant at its
    own cluster ranks, twice as many, and (gemv) none."""
    from runners.kernels.gemm import decode_config, tile_config

    chosen = tile_config(shape, TARGET, "bfloat16")
    configs = [{}, TILE_DECODE]
    for variant in ("gemv", "splitk"):
        config = decode_config(shape, variant)
        configs.append(config)
        doubled = config | {"ranks": 2 * config["ranks"]}
        steps = -(-shape["K"] // config.get("block_k", config.get("unroll", 8)))
        if doubled["ranks"] <= 8 and steps % doubled["ranks"] == 0:
            configs.append(doubled)
        if variant == "gemv" and config["ranks"] > 1:
            configs.append(config | {"ranks": 1})
    return [c for i, c in enumerate(configs) if c != chosen or i == 0]


# Decode round 2 (--decode-wide): round 1 tried each variant at the library's
# knobs alone. Here the gemv (at most four rows: at sixteen it ran at a third
# of torch.matmul in round 1) at 2, 4 and 8 lanes and 128 to 512 threads, and
# the split-K tile at 32 to 128 columns and 64 to 256-deep K steps in 2 to 6
# stages (3 at 64 columns alone). Each takes the cluster ranks that give
# every SM two blocks (tile_config's rule); the split-K tile also the most
# ranks that still fit every block on the GPU at once, as its shared memory
# allows. Shapes past the shared memory are left out.
WIDE_GEMV = [(lanes, threads, 8) for lanes in (2, 4, 8) for threads in (128, 256, 512)]
WIDE_GEMV += [(4, 256, 4)]
WIDE_GEMV_LONG_N = [(8, 256, 8), (8, 512, 8), (4, 512, 8)]  # past 8192 columns
WIDE_SPLITK = [
    (block_n, block_k, stages)
    for block_n in (32, 64, 128)
    for block_k, stages in ((64, 6), (128, 2), (128, 4), (256, 2))
] + [(64, 128, 3)]
WIDE_SMEM = 227 * 1024  # shared memory a block may take on Hopper
# A router's 8 columns already run at 2-2.6x: a few configs only.
WIDE_FEW_N = [
    {"variant": "gemv", "lanes": 2, "threads": 256, "unroll": 8, "ranks": 8},
    {"variant": "gemv", "lanes": 2, "threads": 512, "unroll": 8, "ranks": 8},
    {"variant": "splitk", "block_n": 32, "block_k": 128, "stages": 4, "ranks": 8},
    {"variant": "splitk", "block_n": 32, "block_k": 64, "stages": 6, "ranks": 8},
]

# Round 3 (--refine), at the shapes round 2 left below or near 1.0x: its
# winners were split-K tiles of 128 columns at most one block per SM, and the
# 8-lane gemv at one row. Here those tiles at every cluster ranks up to two
# blocks per SM and in deeper pipelines, and the 8-lane gemv (one row alone)
# at each block size and unroll, with its two-blocks-per-SM ranks and none.
REFINE_GEMV = [(8, threads, unroll) for threads in (128, 256, 512) for unroll in (4, 8)]
REFINE_SPLITK = [
    (128, block_k, stages)
    for block_k, stages in ((64, 4), (64, 6), (128, 3), (128, 4), (256, 2), (256, 3))
] + [(64, 64, 6), (64, 128, 4)]


def decode_wide_configs(shape: dict, refine: bool = False) -> list[dict]:
    """The library's choice and the wide (or ``refine``) grid of both decode
    variants."""
    from runners.kernels.gemm import tile_config

    M, N, K = shape["M"], shape["N"], shape["K"]
    if N < 2 * VEC:
        return [{}] + WIDE_FEW_N
    configs = [{}]
    gemv = REFINE_GEMV if refine else WIDE_GEMV if N <= 8192 else WIDE_GEMV_LONG_N
    for lanes, threads, unroll in gemv if M <= (1 if refine else 4) else []:
        tiles = -(-N // (lanes * VEC))
        fill = ranks_for(tiles, 2 * H200_SMS, K // unroll, threads // lanes)
        for ranks in sorted({fill, 1} if refine else {fill}):
            configs.append(
                dict(
                    variant="gemv",
                    lanes=lanes,
                    threads=threads,
                    unroll=unroll,
                    ranks=ranks,
                )
            )
    for block_n, block_k, stages in REFINE_SPLITK if refine else WIDE_SPLITK:
        smem = stages * (DECODE_M + block_n) * block_k * 2 + DECODE_M * block_n * 4
        if smem > WIDE_SMEM:
            continue
        tiles, steps = -(-N // block_n), -(-K // block_k)
        slots = H200_SMS * (WIDE_SMEM // (smem + 1024))
        fill = ranks_for(tiles, 2 * H200_SMS, steps, stages)
        fit = max(
            (
                r
                for r in (1, 2, 4, CLUSTER_MAX)
                if steps % r == 0 and tiles * r <= slots
            ),
            default=1,
        )
        every = {
            r
            for r in (1, 2, 4, CLUSTER_MAX)
            if steps % r == 0 and (r == 1 or tiles * r <= 2 * H200_SMS)
        }
        for ranks in sorted(every if refine else {fill, fit}):
            configs.append(
                dict(
                    variant="splitk",
                    block_n=block_n,
                    block_k=block_k,
                    stages=stages,
                    ranks=ranks,
                )
            )
    chosen = tile_config(shape, TARGET, "bfloat16")
    return [
        c
        for i, c in enumerate(configs)
        if i == 0 or (c != chosen and c not in configs[:i])
    ]


def plan_decode_wide(
    shapes: list[dict] | None = None, refine: bool = False
) -> list[dict]:
    return [
        {
            "op": "gemm",
            "shape": shape,
            "dtype": "bfloat16",
            "configs": decode_wide_configs(shape, refine),
        }
        for shape in shapes or decode_shapes()
    ]


def plan_decode() -> list[dict]:
    cells = [
        {
            "op": "gemm",
            "shape": shape,
            "dtype": "bfloat16",
            "configs": decode_configs(shape),
        }
        for shape in decode_shapes()
    ]
    for shape in LONG_ROWS:
        for dtype in ("float32", "bfloat16"):
            cells.append(
                {
                    "op": "row_sum",
                    "shape": shape,
                    "dtype": dtype,
                    "configs": LONG_ROWS_CONFIGS,
                }
            )
    for op, shape in FLOAT32_CHECKS:
        cells.append({"op": op, "shape": shape, "dtype": "float32", "configs": [{}]})
    return cells


def compile_all(cells: list[dict], workers: int) -> None:
    import tilelang

    trials = [(cell, config) for cell in cells for config in cell["configs"]]
    for cell in cells:
        cell["trials"] = []

    def work(item):
        cell, config = item
        trial = {"config": config}
        t0 = time.perf_counter()
        try:
            build = OPERATORS[cell["op"]].builders["cuda"]
            # Builders take ``config`` only where they have knobs to turn.
            extra = {"config": config} if config else {}
            program = build(cell["shape"], cell["dtype"], TARGET, **extra)
            trial["kernel"] = tilelang.compile(program, target=TARGET)
        except Exception as exc:  # a config TileLang refuses is an answer too
            trial["error"] = f"{type(exc).__name__}: {exc}"[-1500:]
        trial["compile_s"] = round(time.perf_counter() - t0, 2)
        return cell, trial

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for cell, trial in pool.map(work, trials):
            cell["trials"].append(trial)


def measure(cell: dict, copy_gbs: float, rounds: int, graphs: bool = False) -> None:
    """Check each trial, then time the PyTorch path and every trial in turn,
    ``rounds`` times over; each keeps its median round. ``graphs`` times
    CUDA-graph replays (decode) instead of calls."""
    import torch

    op = OPERATORS[cell["op"]]
    shape, dtype = cell["shape"], cell["dtype"]
    inputs = op.make_inputs(shape, dtype, seed=0, device="cuda")
    refs = op.reference(*[x.double() for x in inputs])
    input_sets = rotated(op, shape, dtype, inputs)
    timed = [("torch", torch_baseline(cell["op"]), cell)]
    for trial in cell["trials"]:
        kernel = trial.pop("kernel", None)
        if kernel is None:
            continue
        outputs = poisoned(op, shape, dtype)
        try:
            kernel(*inputs, *outputs)
            torch.cuda.synchronize()
            checks = [
                compare(o, r, op.tolerances[dtype])
                for o, r in zip(outputs, refs, strict=True)
            ]
        except Exception:
            trial["error"] = traceback.format_exc()[-1500:]
            continue
        trial["pass"] = all(c["pass"] for c in checks)
        trial["rel_err"] = max(c["rel_err"] for c in checks)
        timed.append(("tl", lambda *x, k=kernel, o=outputs: k(*x, *o), trial))
    del refs
    fns = [fn for _, fn, _ in timed]
    if graphs:
        times, captured = time_graphs_in_turn(fns, input_sets, rounds)
        for (_, _, record), was in zip(timed, captured, strict=True):
            record["graph"] = was
    else:
        times = time_in_turn(fns, input_sets, rounds)
    for (key, _, record), samples in zip(timed, times, strict=True):
        record[f"{key}_rounds_ms"] = samples
        record[f"{key}_ms"] = statistics.median(samples)
    for _, _, trial in timed[1:]:
        trial["speedup"] = cell["torch_ms"] / trial["tl_ms"]
        trial["round_speedups"] = [
            t / k
            for t, k in zip(cell["torch_rounds_ms"], trial["tl_rounds_ms"], strict=True)
        ]
        trial.update(rates(op, shape, dtype, trial["tl_ms"], copy_gbs))
    del inputs, input_sets
    torch.cuda.empty_cache()


def print_cell(cell: dict) -> None:
    shape = ",".join(f"{k}={v}" for k, v in cell["shape"].items())
    print(f"\n{cell['op']} {shape} {cell['dtype']}  torch {cell['torch_ms']:.4f} ms")
    ranked = sorted(cell["trials"], key=lambda t: t.get("tl_ms", math.inf))
    for t in ranked:
        config = json.dumps(t["config"], separators=(",", ":"))
        if "tl_ms" not in t:
            print(f"  {config:<52} error: {t.get('error', '?').splitlines()[-1][:80]}")
            continue
        print(
            f"  {config:<52} {'pass' if t['pass'] else 'MISMATCH':<8} "
            f"{t['tl_ms']:.4f} ms  x{t['speedup']:.3f}  {t['tflops']:.0f} TFLOP/s  "
            f"{t['copy_fraction']:.0%} of copy  rounds "
            + "/".join(f"{r:.3f}" for r in t["round_speedups"])
        )


def main(argv: list[str] | None = None) -> int:
    parser = gpu_bench_parser(
        __doc__, "kernel_tune.json", rounds="PyTorch and every trial of a cell"
    )
    parser.add_argument("--decode", action="store_true", help="the decode variants")
    parser.add_argument(
        "--decode-wide",
        action="store_true",
        help="a wide grid of the decode variants' knobs, bfloat16 gemm alone",
    )
    parser.add_argument(
        "--shapes", default="", help="with --decode-wide: MxNxK,... in this order"
    )
    parser.add_argument(
        "--refine", action="store_true", help="with --decode-wide: round 3's grid"
    )
    args = parser.parse_args(argv)
    args.decode = args.decode or args.decode_wide

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    started = time.perf_counter()
    ops = [o for o in args.ops.split(",") if o]
    if args.decode_wide:
        shapes = [
            dict(zip("MNK", map(int, s.split("x")), strict=True))
            for s in args.shapes.split(",")
            if s
        ]
        cells = plan_decode_wide(shapes, args.refine)
    else:
        cells = plan_decode() if args.decode else plan(ops)
    if args.decode and ops:
        cells = [c for c in cells if c["op"] in ops]
    print(f"{sum(len(c['configs']) for c in cells)} kernels; compiling", flush=True)
    # The wide grid compiles a few cells at a time (the GPU idle meanwhile:
    # a CUDA graph captured while other threads load kernels could break).
    batch = 4 if args.decode_wide else len(cells)
    compile_all(cells[:batch], args.workers)
    print(f"compiled in {time.perf_counter() - started:.0f} s", flush=True)
    copy_gbs = copy_bandwidth_gbs()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for i, cell in enumerate(cells):
        if i and i % batch == 0:
            compile_all(cells[i : i + batch], args.workers)
            print(
                f"compiled to cell {i + batch} at {time.perf_counter() - started:.0f} s"
            )
        try:
            measure(cell, copy_gbs, args.rounds, graphs=args.decode)
        except Exception:
            cell["error"] = traceback.format_exc()[-1500:]
            print(cell["op"], cell["shape"], cell["error"], flush=True)
            continue
        print_cell(cell)
        report = {
            "environment": environment(),
            "copy_gbs": copy_gbs,
            "cells": [
                {k: v for k, v in c.items() if k != "configs"}
                | {
                    "trials": [
                        {k: v for k, v in t.items() if k != "kernel"}
                        for t in c.get("trials", [])
                    ]
                }
                for c in cells
            ],
        }
        # Whole or not at all: a run cut short leaves the last cell's report.
        partial = out.with_name(out.name + ".part")
        partial.write_text(json.dumps(report, indent=1, default=str))
        partial.replace(out)
    print(
        f"\ncopy {copy_gbs:.0f} GB/s; wrote {out}; {time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
