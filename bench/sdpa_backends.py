"""The attention baseline taken apart: at the shapes attention's speed target
is judged on, PyTorch's default ``scaled_dot_product_attention`` against each
backend it can be forced onto, and the library's kernel, all timed the way
``bench/gpu_validate.py`` times them (CUDA events, inputs rotated past L2).
Then the SM clock and board power (sampled by nvidia-smi) while the default
path and the library's kernel each run back to back at the largest shape:
a GPU held at its power cap runs at whatever clock the work lets it.
Prints a table; writes JSON to ``--out``.

    python bench/sdpa_backends.py [--out PATH]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_validate import (  # noqa: E402
    TARGET,
    environment,
    gpu_bench_parser,
    poisoned,
    rotated,
    time_gpu,
    torch_baseline,
)
from kernel_tune import ATTENTION  # noqa: E402

from runners.kernels import OPERATORS  # noqa: E402

BACKENDS = ("default", "CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")
SAMPLE_S = 3.0


def sdpa(op: str, backend: str):
    """``gpu_validate``'s PyTorch baseline for ``op``, forced onto ``backend``
    unless that is ``default``."""
    baseline = torch_baseline(op)
    if backend == "default":
        return baseline
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def call(*inputs):
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return baseline(*inputs)

    return call


def cells() -> list[dict]:
    return [
        {"op": op, "shape": shape, "dtype": dtype}
        for op in ("attention", "attention_causal")
        for shape in ATTENTION
        for dtype in ("float16", "bfloat16")
    ]


def compile_kernels(rows: list[dict], workers: int) -> None:
    import tilelang

    def work(row):
        program = OPERATORS[row["op"]].program(row["shape"], row["dtype"], TARGET)
        row["kernel"] = tilelang.compile(program, target=TARGET)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(work, rows))


def measure(row: dict) -> None:
    op = OPERATORS[row["op"]]
    shape, dtype = row["shape"], row["dtype"]
    inputs = op.make_inputs(shape, dtype, seed=0, device="cuda")
    input_sets = rotated(op, shape, dtype, inputs)
    outputs = poisoned(op, shape, dtype)
    kernel = row["kernel"]
    row["ms"] = {"library": time_gpu(lambda *x: kernel(*x, *outputs), input_sets)}
    for backend in BACKENDS:
        try:
            row["ms"][backend] = time_gpu(sdpa(row["op"], backend), input_sets)
        except RuntimeError as exc:  # a backend that refuses the shape or dtype
            row["ms"][backend] = None
            row.setdefault("refused", {})[backend] = str(exc).splitlines()[0][:200]


def clocks_while(fn) -> dict:
    """Median SM clock (MHz) and board power (W) while ``fn`` runs back to back."""
    import torch

    sampler = subprocess.Popen(
        [
            "nvidia-smi",
            "--query-gpu=clocks.sm,power.draw",
            "--format=csv,noheader,nounits",
            "-lms",
            "100",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    started = time.perf_counter()
    while time.perf_counter() - started < SAMPLE_S:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    sampler.terminate()
    samples = [line.split(",") for line in sampler.communicate()[0].splitlines()]
    steady = samples[len(samples) // 3 :]  # past the ramp-up
    return {
        "sm_mhz": statistics.median(float(s[0]) for s in steady),
        "power_w": statistics.median(float(s[1]) for s in steady),
        "samples": len(steady),
    }


def main(argv: list[str] | None = None) -> int:
    args = gpu_bench_parser(__doc__, "sdpa_backends.json").parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    rows = cells()
    compile_kernels(rows, args.workers)
    print(
        f"{'op':<17} {'shape':<30} {'dtype':<9} "
        + " ".join(f"{n[:9]:>9}" for n in ("library", *BACKENDS))
        + "   (ms)"
    )
    for row in rows:
        measure(row)
        shape = ",".join(f"{k}={v}" for k, v in row["shape"].items())
        times = " ".join(
            f"{row['ms'][n]:9.4f}" if row["ms"][n] is not None else f"{'refused':>9}"
            for n in ("library", *BACKENDS)
        )
        print(f"{row['op']:<17} {shape:<30} {row['dtype']:<9} {times}", flush=True)
    # The largest non-causal shape, fp16: the default path, then the library.
    largest = next(
        r
        for r in rows
        if r["op"] == "attention" and r["shape"]["B"] == 4 and r["dtype"] == "float16"
    )
    op, shape, dtype = OPERATORS["attention"], largest["shape"], largest["dtype"]
    inputs = op.make_inputs(shape, dtype, seed=0, device="cuda")
    outputs = poisoned(op, shape, dtype)
    baseline, kernel = sdpa("attention", "default"), largest["kernel"]
    power = {
        "shape": shape,
        "dtype": dtype,
        "default": clocks_while(lambda: baseline(*inputs)),
        "library": clocks_while(lambda: kernel(*inputs, *outputs)),
    }
    for name in ("default", "library"):
        p = power[name]
        print(
            f"B=4 fp16 attention, {name:<8}: SM {p['sm_mhz']:.0f} MHz, {p['power_w']:.0f} W ({p['samples']} samples)"
        )
    for row in rows:
        row.pop("kernel")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"environment": environment(), "cells": rows, "power": power}, indent=1
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
