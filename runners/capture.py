"""Record the operator calls a PyTorch module makes, as TileMatrix shapes.

``python -m runners.capture MODULE:FACTORY --tokens 1,512 --out trace.json``
imports ``FACTORY`` from ``MODULE``, calls it with no arguments to build the
module, runs one forward per token count under ``torch.no_grad()`` and writes
the calls it saw, counted per forward, for ``manage.py import_shapes --trace``.
The module runs in its own dtype (an fp16 model built with ``.half()``
records float16 shapes); ``--dtype`` casts it first, and the trace says so
(``"cast": true``).

The recorder is a ``TorchDispatchMode``: it sees the aten ops that really run,
after ``linear`` and ``matmul`` have decomposed. What it recognises:

=================================  ===========================================
aten op                            TileMatrix operator
=================================  ===========================================
mm, addmm, _addmm_activation       gemm M,N,K of A[M,K] @ B[K,N]; a linear layer
                                   arrives as mm/addmm on the weight's transpose,
                                   so N = out_features, K = in_features, and
                                   aten has already folded leading batch dims
                                   into M. The bias or activation epilogue is
                                   not part of the shape.
bmm, baddbmm                       gemm M,N,K counted once per batch entry; when
                                   B is one matrix broadcast over the batch
                                   (stride 0) the batch folds into M instead.
_scaled_dot_product_*_attention    attention or attention_causal (is_causal)
(flash, flash_for_cpu, efficient,  B,H,HKV,S,D from q [B,H,S,D] and
cudnn, overrideable, math_for_mps) k [B,HKV,S,D], so grouped-query heads stay
                                   as the kernel receives them.
_softmax, _safe_softmax            softmax M,N over the last dim.
_fused_rms_norm                    rmsnorm M,N (backends with a fused kernel).
pow(x, 2) -> mean(-1, keepdim) ->  rmsnorm M,N: the decomposition ``rms_norm``
add eps -> rsqrt -> mul(x, .)      takes on CPU and the hand-written form of
                                   Llama-style models. When x is an fp16/bf16
                                   tensor upcast to float32 first, the dtype
                                   recorded is the one before the upcast.
add(a, b), add_(a, b)              elementwise_add M,N for two floating tensors
                                   of one shape and dtype (residual adds).
=================================  ===========================================

M is always the element count over N, N the last dim. An attention whose
backend has no fused kernel decomposes into bmm/softmax; a
``TorchFunctionMode`` marks each ``F.scaled_dot_product_attention`` call so
that decomposition is recorded as the one attention it is, not as its parts.
Calls of these families that fit no operator (a mask tensor, query and key of
different lengths, softmax over an inner dim, integer gemm) are listed under
``unmapped`` with the reason, never dropped silently. Everything else (views,
casts, embeddings, activations, products) is not an operator of the matrix.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import weakref
from collections import Counter

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

aten = torch.ops.aten

GEMMS = {
    aten.mm.default: ("self", "mat2"),
    aten.addmm.default: ("mat1", "mat2"),
    aten._addmm_activation.default: ("mat1", "mat2"),
}
BATCHED_GEMMS = {
    aten.bmm.default: ("self", "mat2"),
    aten.baddbmm.default: ("batch1", "batch2"),
}
ATTENTIONS = {
    getattr(aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable",
        "_scaled_dot_product_attention_math_for_mps",
    )
}
SOFTMAXES = {aten._softmax.default, aten._safe_softmax.default}
ADDS = {aten.add.Tensor, aten.add_.Tensor}
EPS_ADDS = {aten.add.Tensor, aten.add_.Tensor, aten.add.Scalar, aten.add_.Scalar}
LOW_PRECISION = {torch.float16, torch.bfloat16}
DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}


class CaptureError(Exception):
    """A bad command line or factory: reported in one line, exit status 2."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def bind(func, args, kwargs) -> dict:
    """An op's arguments by schema name, defaults filled in."""
    schema = func._schema.arguments
    bound = {a.name: a.default_value for a in schema if a.has_default_value()}
    bound.update(zip((a.name for a in schema), args, strict=False))
    bound.update(kwargs)
    return bound


def rows_by_last_dim(x: torch.Tensor) -> dict[str, int]:
    n = x.shape[-1]
    return {"M": x.numel() // n, "N": n}


def is_last_dim(dim, ndim: int) -> bool:
    return dim % max(ndim, 1) == max(ndim, 1) - 1


class _AttentionScope(TorchFunctionMode):
    """Brackets each F.scaled_dot_product_attention call for the recorder."""

    def __init__(self, recorder: CallRecorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        self.recorder.in_attention, self.recorder.fused_attention_seen = True, False
        try:
            out = func(*args, **kwargs)
        finally:
            self.recorder.in_attention = False
        if not self.recorder.fused_attention_seen:
            bound = bind(aten.scaled_dot_product_attention.default, args, kwargs)
            self.recorder.attention("scaled_dot_product_attention (math)", bound)
        return out


class CallRecorder(TorchDispatchMode):
    """``with CallRecorder() as rec: model(x)``; then ``rec.calls`` counts
    (operator, dims items, dtype) and ``rec.unmapped`` (aten op, reason)."""

    def __init__(self):
        super().__init__()
        self.calls: Counter[tuple[str, tuple[tuple[str, int], ...], str]] = Counter()
        self.unmapped: Counter[tuple[str, str]] = Counter()
        self.in_attention = False
        self.fused_attention_seen = False
        # Tensors on the way through an rms_norm decomposition -> (stage, x).
        self._rms = WeakIdKeyDictionary()
        # float32 copies of fp16/bf16 tensors -> the dtype they came from.
        self._upcast = WeakIdKeyDictionary()

    def __enter__(self):
        self._scope = _AttentionScope(self)
        self._scope.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._scope.__exit__(*exc)

    def record(self, operator: str, dims: dict, dtype: torch.dtype, count: int = 1):
        self.calls[(operator, tuple(dims.items()), dtype_name(dtype))] += count

    def skip(self, op: str, reason: str) -> None:
        self.unmapped[(op, reason)] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.in_attention:
            # Inside F.scaled_dot_product_attention only the fused kernel
            # counts; anything else is its decomposition or GQA expansion.
            if func in ATTENTIONS:
                self.fused_attention_seen = True
                self.attention(func.name(), bind(func, args, kwargs))
            return out
        if func in GEMMS or func in BATCHED_GEMMS:
            self.gemm(func, bind(func, args, kwargs))
        elif func in ATTENTIONS:
            self.attention(func.name(), bind(func, args, kwargs))
        elif func in SOFTMAXES:
            x, dim = args[0], args[1]
            if is_last_dim(dim, x.dim()):
                self.record("softmax", rows_by_last_dim(x), x.dtype)
            else:
                self.skip(func.name(), "softmax over a dim other than the last")
        elif func is aten._fused_rms_norm.default:
            x, normalized = args[0], list(args[1])
            n = math.prod(normalized)
            self.record("rmsnorm", {"M": x.numel() // n, "N": n}, x.dtype)
        else:
            if func in ADDS:
                self.elementwise_add(bind(func, args, kwargs))
            self.follow_rms_decomposition(func, args, out)
        return out

    def gemm(self, func, bound: dict) -> None:
        names = GEMMS.get(func) or BATCHED_GEMMS[func]
        a, b = bound[names[0]], bound[names[1]]
        if not a.is_floating_point():
            self.skip(func.name(), f"{dtype_name(a.dtype)} gemm")
            return
        if func in GEMMS:
            (m, k), n = a.shape, b.shape[1]
            self.record("gemm", {"M": m, "N": n, "K": k}, a.dtype)
            return
        batch, m, k = a.shape
        n = b.shape[2]
        if batch > 1 and b.stride(0) == 0:
            self.record("gemm", {"M": batch * m, "N": n, "K": k}, a.dtype)
        else:
            self.record("gemm", {"M": m, "N": n, "K": k}, a.dtype, count=batch)

    def attention(self, op: str, bound: dict) -> None:
        q, k, v = bound["query"], bound["key"], bound["value"]
        if bound.get("attn_mask") is not None or bound.get("attn_bias") is not None:
            self.skip(op, "attention with a mask tensor")
            return
        if q.dim() != 4:
            self.skip(op, "attention on tensors that are not [B, H, S, D]")
            return
        b, h, s, d = q.shape
        hkv, s_kv = k.shape[1], k.shape[2]
        if s_kv != s:
            self.skip(op, "query and key lengths differ (decode against a cache)")
            return
        if v.shape[-1] != d:
            self.skip(op, "value head dim differs from the query's")
            return
        name = "attention_causal" if bound["is_causal"] else "attention"
        self.record(name, {"B": b, "H": h, "HKV": hkv, "S": s, "D": d}, q.dtype)

    def elementwise_add(self, bound: dict) -> None:
        a, b = bound["self"], bound["other"]
        if (
            isinstance(b, torch.Tensor)
            and a.dim() > 0
            and a.shape == b.shape
            and a.dtype == b.dtype
            and a.is_floating_point()
            and bound["alpha"] == 1
        ):
            self.record("elementwise_add", rows_by_last_dim(a), a.dtype)

    def follow_rms_decomposition(self, func, args, out) -> None:
        """Advance x through pow(x, 2) -> mean(-1, keepdim) -> + eps -> rsqrt
        and record rmsnorm at mul(x, rsqrt(...))."""
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor):
            return
        if func is aten._to_copy.default and x.dtype in LOW_PRECISION:
            if out.dtype == torch.float32:
                self._upcast[out] = x.dtype
        elif func is aten.pow.Tensor_Scalar and args[1] == 2 and x.dim() > 0:
            self._rms[out] = ("pow", weakref.ref(x))
        elif func is aten.mean.dim and self._stage(x) == "pow":
            dims, keepdim = list(args[1] or []), len(args) > 2 and args[2]
            if keepdim and len(dims) == 1 and is_last_dim(dims[0], x.dim()):
                self._rms[out] = ("mean", self._rms[x][1])
        elif func in EPS_ADDS and self._stage(x) == "mean":
            if isinstance(args[1], int | float):
                self._rms[out] = ("eps", self._rms[x][1])
        elif func is aten.rsqrt.default and self._stage(x) == "eps":
            self._rms[out] = ("rsqrt", self._rms[x][1])
        elif func is aten.mul.Tensor:
            for scale, other in ((args[0], args[1]), (args[1], args[0])):
                if self._stage(scale) == "rsqrt" and self._rms[scale][1]() is other:
                    dtype = self._upcast.get(other, other.dtype)
                    self.record("rmsnorm", rows_by_last_dim(other), dtype)
                    return

    def _stage(self, t) -> str | None:
        entry = self._rms.get(t) if isinstance(t, torch.Tensor) else None
        return entry[0] if entry else None


def example_input(module: torch.nn.Module, tokens: int, dtype, hidden: int | None):
    """Input ids [1, tokens] for a module with an embedding, else hidden
    states [1, tokens, hidden], on the device of the module's parameters."""
    device = next(module.parameters(), torch.empty(0)).device
    embedding = next(
        (m for m in module.modules() if isinstance(m, torch.nn.Embedding)), None
    )
    if embedding is not None:
        return torch.randint(embedding.num_embeddings, (1, tokens), device=device)
    if hidden is None:
        raise CaptureError(
            "the module has no nn.Embedding to feed input ids to; "
            "pass --hidden N to feed hidden states [1, tokens, N]"
        )
    return torch.randn(1, tokens, hidden, dtype=dtype, device=device)


def module_dtype(module: torch.nn.Module) -> torch.dtype:
    """The floating dtype a module computes in: its floating parameters' (or
    buffers'), float32 for a module that has none."""
    tensors = [*module.parameters(), *module.buffers()]
    floating = [t.dtype for t in tensors if t.is_floating_point()]
    return floating[0] if floating else torch.float32


def module_dtypes(module: torch.nn.Module) -> str:
    """The floating dtypes of a module's parameters and buffers, as a trace
    names them: one name, or several joined by "+" (a mixed module)."""
    tensors = [*module.parameters(), *module.buffers()]
    names = sorted({dtype_name(t.dtype) for t in tensors if t.is_floating_point()})
    return "+".join(names) or dtype_name(torch.float32)


def trace_module(
    module: torch.nn.Module,
    *,
    tokens: list[int],
    model: str,
    dtype: torch.dtype | None = None,
    hidden: int | None = None,
) -> dict:
    """Run one forward per token count and return the trace document. The
    module runs in its own dtype, or is cast to ``dtype`` in place when one
    is given; it is put in eval mode."""
    if dtype is not None:
        module = module.to(dtype)
    module = module.eval()
    ran_in = module_dtype(module)
    torch.manual_seed(0)
    calls, unmapped = [], []
    for t in tokens:
        x = example_input(module, t, ran_in, hidden)
        with torch.no_grad(), CallRecorder() as recorder:
            module(x)
        for (operator, dims, dt), count in sorted(recorder.calls.items()):
            calls.append(
                {
                    "operator": operator,
                    "dims": dict(dims),
                    "dtype": dt,
                    "count": count,
                    "tokens": t,
                }
            )
        for (op, reason), count in sorted(recorder.unmapped.items()):
            unmapped.append({"op": op, "reason": reason, "count": count, "tokens": t})
    return {
        "model": model,
        "tokens": list(tokens),
        "dtype": module_dtypes(module),
        # Whether --dtype cast the module, or it ran as its factory built it.
        "cast": dtype is not None,
        "torch": torch.__version__,
        "calls": calls,
        "unmapped": unmapped,
    }


def load_factory(spec: str):
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr or ":" in attr:
        raise CaptureError(f"{spec!r} is not MODULE:FACTORY")
    try:
        source = importlib.import_module(module_name)
    except ImportError as exc:
        raise CaptureError(f"cannot import {module_name!r}: {exc}") from None
    factory = getattr(source, attr, None)
    if not callable(factory):
        raise CaptureError(f"{module_name!r} has no callable {attr!r}")
    return factory


def token_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of distinct positive integers"
        )
    return counts


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = _OneLineParser(
        prog="python -m runners.capture",
        description="Record the operator calls of a PyTorch module as a trace.",
    )
    parser.add_argument("factory", metavar="MODULE:FACTORY")
    parser.add_argument("--tokens", type=token_counts, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        help="cast the module to this dtype first (default: run it as built)",
    )
    parser.add_argument(
        "--hidden", type=int, help="hidden size, for modules without an embedding"
    )
    ns = parser.parse_args(argv)
    try:
        module = load_factory(ns.factory)()
        if not isinstance(module, torch.nn.Module):
            raise CaptureError(
                f"{ns.factory} returned {type(module).__name__}, not a torch.nn.Module"
            )
        trace = trace_module(
            module,
            tokens=ns.tokens,
            model=ns.factory,
            dtype=DTYPES[ns.dtype] if ns.dtype else None,
            hidden=ns.hidden,
        )
    except CaptureError as exc:
        parser.error(str(exc))
    with open(ns.out, "w") as f:
        json.dump(trace, f, indent=1)
        f.write("\n")
    total = sum(c["count"] for c in trace["calls"])
    how = "cast to" if trace["cast"] else "in the module's own"
    print(
        f"{ns.out}: {len(trace['calls'])} shapes, {total} calls at tokens "
        f"{','.join(map(str, ns.tokens))} ({how} {trace['dtype']}), "
        f"{len(trace['unmapped'])} unmapped"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
