"""What ``runners.serve.Router`` costs the host where it serves nothing.

On this CPU (torch on one thread, float32, target c), the tiny decoders of
``bench/serve_model.py --smoke``, eager, a decode step at batch 1 and a
prefill: each step unrouted ("plain") and under

- ``null mode``: a ``TorchFunctionMode`` that only passes each call on, the
  floor of any router that sees the model's calls;
- ``router, other cells``: a router whose manifest approves TileLang for
  cells of some other model only: it is on the mode stack, and every call
  of this model falls back;
- ``router, idle``: a router given this model's captured cells
  (``cells=``), none of which the manifest approves: it stays off the stack.

Then each call kind alone (a view, ``.shape``, an add, a linear, an RMSNorm,
a softmax) the same ways. Rounds alternate the variants, in reverse order
every other round; the medians and plain over each are printed and
written as JSON. No kernel is compiled: nothing here is served.

    python bench/serve_overhead.py [--rounds 15] [--reps 200] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from serve_model import SMOKE, build, capture_cells, make_step  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

from runners.dispatch import FORMAT, TILELANG, library_revisions  # noqa: E402
from runners.serve import ROUTED_OPERATORS, Router, host_device  # noqa: E402

FINGERPRINT = "bench-serve-overhead"


class NullMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def manifest_of(cells, device_type: str) -> dict:
    revisions = library_revisions(*ROUTED_OPERATORS)
    return {
        "format": FORMAT,
        "toolchain": {"name": "bench", "fingerprint": FINGERPRINT},
        "entries": [
            {
                "operator": op,
                "dtype": dtype,
                "device_type": device_type,
                "shape_rule": {"dims": dims},
                "choice": TILELANG,
                "reason": "bench: another model's cell",
                "kernel_sha256": revisions[op],
            }
            for op, dims, dtype in cells
        ],
    }


def router(manifest, device_type, target, cells=None) -> Router:
    return Router.from_manifest(
        manifest,
        target=target,
        device_type=device_type,
        toolchain_fingerprint=FINGERPRINT,
        cells=cells,
    )


def timed_in_turn(
    calls: dict, rounds: int, reps: int, enter_each: bool
) -> dict[str, float]:
    """Median microseconds per call of each ``name: (mode, fn)``, in turn;
    the mode entered around each call (a model's step, as serving enters
    it) or around the ``reps`` calls of a sample (one call kind alone)."""
    samples = {name: [] for name in calls}
    names = list(calls)

    def sample(mode, fn) -> float:
        began = time.perf_counter()
        if mode is None:
            for _ in range(reps):
                fn()
        elif enter_each:
            for _ in range(reps):
                with mode:
                    fn()
        else:
            with mode:
                for _ in range(reps):
                    fn()
        return (time.perf_counter() - began) * 1e6 / reps

    for name in names:
        sample(*calls[name])
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            samples[name].append(sample(*calls[name]))
    return {name: statistics.median(s) for name, s in samples.items()}


def report(label: str, medians: dict[str, float]) -> dict:
    plain = medians["plain"]
    row = {
        name: {"us": us, "plain_over": plain / us if us else None}
        for name, us in medians.items()
    }
    shown = "  ".join(
        f"{name} {v['us']:8.2f} us ({v['plain_over']:.2f}x)" for name, v in row.items()
    )
    print(f"{label:<28} {shown}", flush=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--out")
    ns = parser.parse_args(argv)
    torch.set_num_threads(1)
    target, device_type = host_device("c")
    dtype = torch.float32
    models = {name: replace(c, layers=ns.layers) for name, c in sorted(SMOKE.items())}
    built, steps, cells = {}, {}, {}
    for name, c in models.items():
        built[name] = build(c, 64, "cpu", dtype)
        steps[name] = [
            make_step(c, "decode", 1, 1, 16, 64, "cpu", dtype),
            make_step(c, "prefill", 1, 16, 0, 64, "cpu", dtype),
        ]
        cells[name] = [
            cell for s in steps[name] for cell in capture_cells(built[name], s)
        ]
    document = {
        "bench": "serve_overhead",
        "argv": sys.argv[1:],
        "device": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rounds": ns.rounds,
        "reps": ns.reps,
        "steps": [],
        "calls": [],
    }
    names = list(models)
    with torch.inference_mode():
        for i, name in enumerate(names):
            other = names[(i + 1) % len(names)]
            others = manifest_of(cells[other], device_type)
            modes = {
                "plain": None,
                "null mode": NullMode(),
                "router, other cells": router(others, device_type, target),
                "router, idle": router(others, device_type, target, cells=cells[name]),
            }
            assert modes["router, idle"].idle and not modes["router, other cells"].idle
            model = built[name]
            for step in steps[name]:
                calls = {
                    mode_name: (
                        mode,
                        lambda m=model, s=step: m(s.ids, s.caches, s.start),
                    )
                    for mode_name, mode in modes.items()
                }
                medians = timed_in_turn(
                    calls, ns.rounds, max(1, ns.reps // 10), enter_each=True
                )
                label = f"{models[name].name} {step.label()}"
                document["steps"].append(
                    {"model": models[name].name, "step": step.label()}
                    | report(label, medians)
                )
        x, y = torch.randn(8, 64), torch.randn(8, 64)
        w, nw = torch.nn.Parameter(torch.randn(64, 64)), torch.ones(64)
        single = {
            "x.view": lambda: x.view(4, 128),
            "x.shape": lambda: x.shape,
            "x + y": lambda: x + y,
            "F.linear": lambda: F.linear(x, w),
            "F.rms_norm": lambda: F.rms_norm(x, (64,), nw, 1e-6),
            "torch.softmax": lambda: torch.softmax(x, -1),
        }
        for label, fn in single.items():
            calls = {mode_name: (mode, fn) for mode_name, mode in modes.items()}
            medians = timed_in_turn(calls, ns.rounds, ns.reps, enter_each=False)
            document["calls"].append({"call": label} | report(label, medians))
    if ns.out:
        Path(ns.out).write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
