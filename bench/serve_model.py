"""A whole model served through the manifest, against the same model unpatched.

Two Llama-style decoders with random weights: ``llama-3-8b`` (the real widths,
fused q/k/v and gate/up projections as the built-in profile names them,
RMSNorm eps 1e-5, ``--layers`` of its 32 layers) and ``tinyllama-1.1b``
(widths no built-in profile names; its cells are listed as
``runners.capture`` records them). For each: a decode step against a KV
cache of ``--context`` tokens at each of ``--batches`` (CUDA-graph replays on
the GPU) and a prefill of ``--prefill`` tokens (eager). Each step is run:

- checked: every TileLang call also runs the model's own call and is held to
  its cell's tolerance (``runners.serve``'s checked mode), and the step's
  output is compared with the unpatched model's. A call beyond its cell's
  tolerance, or an output further from the unpatched one than
  ``E2E_FACTOR`` times the loosest tolerance of the cells served, or not
  finite, is a wrong output: the bench exits 1.
- timed: the router's report of one eager step (calls and CUDA-event time
  per operator and path: the shares TileLang served), then the patched and
  unpatched steps in alternating rounds (the speed: unpatched over patched
  step time, goal >= 1.00x).

Each model's router serves only the cells its capture recorded
(``Router(cells=...)``): a model none of whose cells the manifest approves
runs with no router on the mode stack, and the output says why.

``--manifest`` takes a manifest the server exported (``manage.py
export_manifest`` or ``GET /api/v1/manifest``; ``scripts/demo-manifest``
writes the demo's, and docs/evidence holds the H200's). Its cells serve only
on the toolchain it validated: ``--assume-toolchain`` takes the manifest's
fingerprint as this host's (a GPU host whose driver or torch differ from the
lab's), and the JSON says so. Without ``--manifest`` the bench writes its
own: every cell the first model calls approved as TileLang for this host, no
evidence behind it. That only exercises the routing and shows what serving
every cell would cost; the output says so. ``--smoke`` runs tiny widths on
this CPU (target c), float32; a manifest of cuda cells serves nothing there.

    python bench/serve_model.py --manifest FILE --device cuda [--out PATH]
    python bench/serve_model.py --smoke [--manifest FILE] [--out PATH]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from runners import kernels  # noqa: E402
from runners.capture import CallRecorder  # noqa: E402
from runners.dispatch import (  # noqa: E402
    FORMAT,
    TILELANG,
    host_toolchain_fingerprint,
    library_revisions,
)
from runners.serve import ROUTED_OPERATORS, Router, host_device  # noqa: E402

# The step's output may drift from the unpatched one by more than one call's
# tolerance (each layer's rounding differs and feeds the next), but not by
# this many times the loosest: past it a call computed something else.
E2E_FACTOR = 4.0
SPEED_GOAL = 1.0
# The dispatcher names each shape in its reason; the summary counts reasons.
DISPATCH_SHAPE = re.compile(r"^\w+ \w+ shape \{[^}]*\} ")


@dataclass(frozen=True)
class Config:
    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layers: int
    eps: float = 1e-5
    rope_theta: float = 500000.0


MODELS = {
    "llama-3-8b": Config("llama-3-8b", 4096, 14336, 32, 8, 128, 128256, 32),
    # TinyLlama-1.1B's widths: named by no built-in profile.
    "tinyllama-1.1b": Config(
        "tinyllama-1.1b", 2048, 5632, 32, 4, 64, 32000, 22, rope_theta=10000.0
    ),
}
# Tiny widths for --smoke; the first takes the c kernels' rmsnorm eps.
SMOKE = {
    "llama-3-8b": Config("llama-3-8b-tiny", 64, 128, 4, 2, 16, 96, 2, eps=1e-6),
    "tinyllama-1.1b": Config("tinyllama-1.1b-tiny", 48, 112, 4, 1, 12, 80, 2),
}


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.attn_norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.qkv = nn.Linear(c.hidden, (c.heads + 2 * c.kv_heads) * c.head_dim, False)
        self.o = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)
        self.mlp_norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.gate_up = nn.Linear(c.hidden, 2 * c.intermediate, bias=False)
        self.down = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x, cos, sin, cache, start: int):
        c, (b, t, _) = self.c, x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(
            [c.heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim],
            dim=-1,
        )
        q, k, v = (y.view(b, t, -1, c.head_dim).transpose(1, 2) for y in (q, k, v))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k_cache, v_cache = cache
        k_cache[:, :, start : start + t] = k
        v_cache[:, :, start : start + t] = v
        if t > 1:  # prefill from the start: causal over its own keys
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            a = F.scaled_dot_product_attention(
                q,
                k_cache[:, :, : start + 1],
                v_cache[:, :, : start + 1],
                enable_gqa=True,
            )
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Decoder(nn.Module):
    """Returns the next token's probabilities at the last position."""

    def __init__(self, c: Config, max_len: int):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        inv = c.rope_theta ** -(torch.arange(0, c.head_dim, 2) / c.head_dim)
        angles = torch.outer(torch.arange(max_len), inv).repeat(1, 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids, caches, start: int):
        x = self.embed(ids)
        t = ids.shape[1]
        cos = self.cos[start : start + t].to(x.dtype)
        sin = self.sin[start : start + t].to(x.dtype)
        for block, cache in zip(self.blocks, caches, strict=True):
            x = block(x, cos, sin, cache, start)
        return torch.softmax(self.lm_head(self.norm(x[:, -1:])), dim=-1)


def build(c: Config, max_len: int, device: str, dtype) -> Decoder:
    torch.manual_seed(0)
    with torch.device(device):
        model = Decoder(c, max_len)
    for name, p in model.named_parameters():
        with torch.no_grad():
            if "norm" in name:
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0.0, 0.02)
    return model.to(dtype).eval()


def new_caches(c: Config, batch: int, max_len: int, device, dtype, seed: int):
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (batch, c.kv_heads, max_len, c.head_dim)
    return [
        tuple(
            torch.randn(shape, generator=g, device=device, dtype=dtype)
            for _ in range(2)
        )
        for _ in range(c.layers)
    ]


def clone_caches(caches):
    return [tuple(t.clone() for t in pair) for pair in caches]


# Steps -------------------------------------------------------------------


@dataclass
class Step:
    """One step (decode at a batch, or prefill) of one model, patched and
    unpatched, with their own copies of the inputs and KV cache."""

    kind: str  # "decode" or "prefill"
    batch: int
    tokens: int
    start: int
    ids: torch.Tensor
    caches: list
    base_caches: list

    def label(self) -> str:
        if self.kind == "decode":
            return f"decode b{self.batch}"
        return f"prefill {self.tokens}"


def make_step(c, kind, batch, tokens, start, max_len, device, dtype) -> Step:
    g = torch.Generator(device=device).manual_seed(batch * 1000 + tokens)
    ids = torch.randint(c.vocab, (batch, tokens), generator=g, device=device)
    caches = new_caches(c, batch, max_len, device, dtype, seed=batch)
    return Step(kind, batch, tokens, start, ids, caches, clone_caches(caches))


def capture_cells(model, step: Step) -> list[tuple[str, dict, str]]:
    """The step's cells as ``runners.capture`` records them: under no_grad,
    as its CLI runs a module (in inference mode PyTorch hands the recorder
    linear and softmax whole, and it records neither)."""
    with torch.no_grad(), CallRecorder() as recorder:
        model(step.ids, clone_caches(step.base_caches), step.start)
    return [(op, dict(dims), dtype) for (op, dims, dtype) in recorder.calls]


class Runner:
    """Calls of one step: eager, or (on the GPU) a CUDA graph of it."""

    def __init__(self, model, step: Step, caches, router=None, graph=False):
        self.model, self.step, self.caches, self.router = model, step, caches, router
        self.out = None
        self.graph = None
        if graph:
            self._capture()

    def forward(self):
        return self.model(self.step.ids, self.caches, self.step.start)

    def eager(self):
        with torch.inference_mode():
            if self.router is None:
                return self.forward()
            with self.router:
                return self.forward()

    def _capture(self):
        # Warm up on a side stream (cuBLAS workspaces, the router's kernels
        # and weight layouts), then capture: nothing compiles in the graph.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.eager()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.eager()

    def __call__(self):
        if self.graph is None:
            self.out = self.eager()
        else:
            self.graph.replay()
        return self.out


def time_in_turn(runners, rounds: int, reps: int, cuda: bool) -> list[list[float]]:
    """Milliseconds per call of each runner: ``reps`` calls a sample, the
    runners in turn, in reverse order every other round."""
    samples: list[list[float]] = [[] for _ in runners]
    for run in runners:  # untimed: caches, clocks and allocators warm
        run()
    for r in range(rounds):
        order = list(enumerate(runners))
        for i, run in order if r % 2 == 0 else reversed(order):
            if cuda:
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                for _ in range(reps):
                    run()
                end.record()
                end.synchronize()
                samples[i].append(start.elapsed_time(end) / reps)
            else:
                began = time.perf_counter()
                for _ in range(reps):
                    run()
                samples[i].append((time.perf_counter() - began) * 1e3 / reps)
    return samples


def output_difference(out, expected) -> dict:
    out, expected = out.double(), expected.double()
    finite = bool(torch.isfinite(out).all())
    diff = (out - expected).abs()
    rel = (diff.norm() / expected.norm()).item() if finite else math.inf
    return {"finite": finite, "rel_err": rel, "max_abs_err": diff.max().item()}


def e2e_bound(dtype: str) -> float:
    return E2E_FACTOR * max(
        kernels.get(op).tolerances[dtype].rel_err for op in ROUTED_OPERATORS
    )


# One model ---------------------------------------------------------------


def run_model(c: Config, ns, router_for, device, dtype) -> dict:
    cuda = device == "cuda"
    dtype_name = str(dtype).removeprefix("torch.")
    max_len = max(ns.context + 1, ns.prefill)
    model = build(c, max_len, device, dtype)
    # Its own copy: the router re-lays the served weights of ``model``.
    baseline = copy.deepcopy(model)
    steps = [
        make_step(c, "decode", b, 1, ns.context, max_len, device, dtype)
        for b in ns.batches
    ]
    steps.append(make_step(c, "prefill", 1, ns.prefill, 0, max_len, device, dtype))
    cells = {s.label(): capture_cells(baseline, s) for s in steps}
    router = router_for(c, cells)
    unique = {}
    for op, dims, dt in (cell for cs in cells.values() for cell in cs):
        unique.setdefault((op, dt, tuple(sorted(dims.items()))), (op, dims, dt))
    started = time.perf_counter()
    ready = router.compile(unique.values(), workers=ns.compile_workers)
    compile_s = time.perf_counter() - started
    result = {
        "model": asdict(c),
        "cells": len(unique),
        "approved_here": ready,
        "compile_s": compile_s,
        "serving_nothing": router.idle_reason(),
        "steps": [],
    }
    if router.idle:
        print(f"{c.name}: no router on the stack: {router.idle_reason()}", flush=True)
    bound = e2e_bound(dtype_name)
    for step in steps:
        graph = cuda and step.kind == "decode"
        row = {"step": step.label(), "graph": graph, "bound": bound}
        # One eager step checked (each TileLang call against the model's own
        # call), then one timed: the report's shares.
        patched = Runner(model, step, step.caches, router)
        router.checked = True
        with torch.inference_mode():
            router.prepare(patched.forward)
        checked = router.report.as_dict()["checked"]
        router.report.checked.clear()
        router.report.mismatches.clear()
        router.checked, router.timed = False, True
        patched.eager()
        report = router.report.as_dict()
        router.timed = False
        patched = Runner(model, step, step.caches, router, graph=graph)
        unpatched = Runner(baseline, step, step.base_caches, graph=graph)
        out, expected = patched(), unpatched()
        if cuda:
            torch.cuda.synchronize()
        row["output"] = output_difference(out, expected)
        reps = ns.reps if step.kind == "decode" else max(1, ns.reps // 4)
        times = time_in_turn([unpatched, patched], ns.rounds, reps, cuda)
        row["unpatched_ms"] = statistics.median(times[0])
        row["patched_ms"] = statistics.median(times[1])
        row["speed"] = row["unpatched_ms"] / row["patched_ms"]
        row["share"] = report["share"]
        row["report"] = report
        row["checked"] = checked
        row["wrong"] = [
            f"{m['operator']} {m['dtype']} {m['dims']}: {m['mismatch']}"
            for m in checked
            if m["mismatch"]
        ]
        if not row["output"]["finite"] or row["output"]["rel_err"] > bound:
            row["wrong"].append(
                f"output {row['output']['rel_err']:.3g} from the unpatched model's, "
                f"above {bound:.3g}"
            )
        result["steps"].append(row)
        print(table_row(c.name, row), flush=True)
    del model, baseline
    return result


# The manifest ------------------------------------------------------------


def synthetic_manifest(cells, device_type: str, fingerprint: str) -> dict:
    revisions = library_revisions(*ROUTED_OPERATORS)
    entries = {}
    for op, dims, dtype in cells:
        key = (op, dtype, tuple(sorted(dims.items())))
        entries[key] = {
            "operator": op,
            "dtype": dtype,
            "device_type": device_type,
            "shape_rule": {"dims": dims},
            "choice": TILELANG,
            "reason": "synthetic: approved by bench/serve_model.py, no evidence",
            "kernel_sha256": revisions[op],
        }
    return {
        "format": FORMAT,
        "toolchain": {"name": "synthetic (this host)", "fingerprint": fingerprint},
        "entries": list(entries.values()),
    }


def tilelang_version() -> str:
    from importlib import metadata

    return metadata.version("tilelang")


def only_device_type(manifest: dict) -> str | None:
    names = {e["device_type"] for e in manifest.get("entries", [])}
    return names.pop() if len(names) == 1 else None


# Output ------------------------------------------------------------------

HEADER = (
    f"{'model':<20} {'step':<12} {'unpatched ms':>12} {'patched ms':>10} "
    f"{'speed':>6} {'TL calls':>8} {'TL time':>8} {'out rel err':>11}  verdict"
)


def table_row(model: str, row: dict) -> str:
    verdict = (
        "WRONG" if row["wrong"] else ("ok" if row["speed"] >= SPEED_GOAL else "slower")
    )
    return (
        f"{model:<20} {row['step']:<12} {row['unpatched_ms']:>12.3f} "
        f"{row['patched_ms']:>10.3f} {row['speed']:>5.2f}x "
        f"{row['share']['calls']:>8.0%} {row['share']['time']:>8.0%} "
        f"{row['output']['rel_err']:>11.2e}  {verdict}"
    )


# The GPU run's defaults, and --smoke's (tiny, on this CPU's 2 cores).
DEFAULTS = dict(batches="1,4,16", context=512, prefill=512, rounds=10, reps=20)
SMOKE_DEFAULTS = dict(batches="1,4", context=16, prefill=16, rounds=5, reps=10)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", help="tilematrix-manifest/1 file")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--device-type", help="as the manifest names this host's")
    parser.add_argument(
        "--assume-toolchain",
        action="store_true",
        help="serve as the manifest's toolchain, whatever this host's fingerprint",
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batches", help=f"default {DEFAULTS['batches']}")
    for name in ("context", "prefill", "rounds", "reps"):
        parser.add_argument(f"--{name}", type=int, help=f"default {DEFAULTS[name]}")
    parser.add_argument("--compile-workers", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="tiny widths, CPU")
    parser.add_argument("--out")
    ns = parser.parse_args(argv)
    if ns.smoke:
        ns.device = "cpu"
    for name, value in (SMOKE_DEFAULTS if ns.smoke else DEFAULTS).items():
        if getattr(ns, name) is None:
            setattr(ns, name, value)
    ns.batches = [int(b) for b in ns.batches.split(",")]
    ns.models = ns.models.split(",")
    return ns


def main(argv=None) -> int:
    ns = parse_args(argv)
    cuda = ns.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("no CUDA device: use --smoke on the CPU", file=sys.stderr)
        return 2
    if not cuda:
        # The c kernels run on one thread; so does the reference (as the
        # harness times it): on a shared host its idle threads took longer
        # to wake than a tiny step takes.
        torch.set_num_threads(1)
    target, host_type = host_device("cuda" if cuda else "c")
    dtype = torch.bfloat16 if cuda else torch.float32
    fingerprint = host_toolchain_fingerprint()
    manifest = json.loads(Path(ns.manifest).read_text()) if ns.manifest else None
    served_as = fingerprint
    if manifest is not None and ns.assume_toolchain:
        served_as = manifest["toolchain"]["fingerprint"]
        print(
            f"--assume-toolchain: serving as {manifest['toolchain'].get('name')} "
            f"{served_as[:12]}, this host being {fingerprint[:12]}",
            flush=True,
        )
    device_type = ns.device_type or (manifest and only_device_type(manifest))
    device_type = device_type or host_type
    if manifest is None:
        print(
            "no --manifest: every cell of the first model approved as TileLang "
            "(synthetic, no evidence; exercises the routing only)",
            flush=True,
        )

    def router_for(c: Config, cells: dict) -> Router:
        nonlocal manifest
        if manifest is None:
            everything = [cell for cs in cells.values() for cell in cs]
            manifest = synthetic_manifest(everything, device_type, served_as)
        return Router.from_manifest(
            manifest,
            target=target,
            device_type=device_type,
            toolchain_fingerprint=served_as,
            cells=[cell for cs in cells.values() for cell in cs],
        )

    print(f"{device_type}, target {target}, toolchain {fingerprint[:12]}")
    print(HEADER, flush=True)
    results = []
    for name in ns.models:
        c = (SMOKE if ns.smoke else MODELS)[name]
        c = replace(c, layers=min(c.layers, ns.layers))
        results.append(run_model(c, ns, router_for, ns.device, dtype))
        if cuda:
            torch.cuda.empty_cache()
    wrong = [
        f"{r['model']['name']} {s['step']}: {w}"
        for r in results
        for s in r["steps"]
        for w in s["wrong"]
    ]
    for r in results:
        reasons = {}
        for s in r["steps"]:
            for f in s["report"]["fallbacks"]:
                why = f"{f['operator']}: {DISPATCH_SHAPE.sub('', f['reason'])}"
                reasons[why] = reasons.get(why, 0) + f["calls"]
        print(
            f"\n{r['model']['name']}: {r['cells']} cells captured, "
            f"{r['approved_here']} served by TileLang here, "
            f"compiled in {r['compile_s']:.1f} s; reference calls by reason:"
        )
        for reason, calls in sorted(reasons.items(), key=lambda kv: -kv[1]):
            print(f"  {calls:>5}  {reason}")
    for line in wrong:
        print(f"WRONG: {line}")
    document = {
        "bench": "serve_model",
        "argv": sys.argv[1:],
        "device": torch.cuda.get_device_name() if cuda else platform.processor(),
        "device_type": device_type,
        "target": target,
        "torch": torch.__version__,
        "tilelang": tilelang_version(),
        "toolchain_fingerprint": fingerprint,
        "manifest": ns.manifest or "synthetic: every cell of the first model",
        "manifest_toolchain": manifest["toolchain"],
        "toolchain_assumed": served_as != fingerprint,
        "e2e_factor": E2E_FACTOR,
        "models": results,
        "wrong": wrong,
    }
    if ns.out:
        Path(ns.out).write_text(json.dumps(document, indent=1) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
