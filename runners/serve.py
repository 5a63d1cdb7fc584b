"""Serve a PyTorch module's operator calls through the approved manifest.

A ``Router`` is a ``TorchFunctionMode``. While it is active, each call of
``F.linear`` (``nn.Linear``), ``F.rms_norm`` (``nn.RMSNorm``), softmax
(``torch.softmax``, ``F.softmax``, ``Tensor.softmax``),
``F.scaled_dot_product_attention`` and the add of two floating tensors of one
shape and dtype (a residual ``x + y``) becomes the (operator, dims, dtype)
cell that ``runners.capture`` records for it and the manifest keys.
``runners.dispatch.Dispatcher`` decides the cell: TileLang runs only where the
manifest approved that exact cell for this device type, toolchain and kernel
revision, the call is the computation the kernel does (layout, bias, eps,
mask), and the kernel compiled. Every other call runs the very function the
model called, and why is logged once per (operator, dtype, dims, reason) on
``tilematrix.serve``: shapes, never values.

    target, device_type = host_device("cuda")
    router = Router.from_manifest("manifest.json", target=target,
                                  device_type=device_type)
    with torch.inference_mode():
        router.prepare(model, ids)    # compiles each approved cell it meets
        with router:
            out = model(ids)          # eagerly, or inside torch.cuda.graph(...)
    print(router.report.table())

Kernels compile once per cell and stay in the router. Nothing compiles
under CUDA-graph capture: a cell first met there runs the reference inside
that graph, so run each shape once (``prepare``, or the warm-up every
capture needs) before capturing.

gemm: the library kernel multiplies A[M, K] by B[K, N] stored row-major;
``F.linear`` computes x @ W.T with W[N, K] row-major, so W.T is B with the
wrong strides. Copying it per call would move the weight twice, and keeping
a transposed copy beside it would double the weights' memory; instead the
first TileLang call of an ``nn.Parameter`` weight re-lays it in place (same
values and shape, column-major storage), after which W.T is B as it is.
PyTorch's own linear reads either layout, so the calls that stay on the
reference still work on it (their speed is the bench's to measure).

Not routed, by design: a linear with a bias (the kernel has no epilogue);
RMSNorm with an eps other than the kernel's 1e-6, without a weight, or
written by hand as ``w * x * rsqrt(mean(x^2) + eps)`` (call ``nn.RMSNorm`` or
``F.rms_norm``); attention with a mask, dropout, another scale, or queries
and keys of different lengths (decode against a KV cache); memory-bound
calls on non-contiguous tensors (a copy would cost more than the kernel
saves); in-place adds; tensor subclasses; any call autograd records (the
kernels have no backward: serve under ``torch.no_grad`` or
``torch.inference_mode``).
"""

from __future__ import annotations

import logging
import math
import platform
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from runners import kernels
from runners.capture import dtype_name
from runners.dispatch import (
    REFERENCE,
    TILELANG,
    Dispatcher,
    device_type_label,
    host_toolchain_fingerprint,
    library_revisions,
)
from runners.harness.compare import compare_one
from runners.harness.sanitize import sanitize
from runners.kernels.base import MalformedShape, Unsupported
from runners.kernels.rmsnorm import EPS as RMSNORM_EPS
from runners.kernels.toolchain import compile_kernel

logger = logging.getLogger("tilematrix.serve")

ROUTED_OPERATORS = (
    "gemm",
    "rmsnorm",
    "softmax",
    "attention",
    "attention_causal",
    "elementwise_add",
)
# The dims of each operator's cells, in the order its handler keys a call.
DIMS = {
    "gemm": ("M", "N", "K"),
    "rmsnorm": ("M", "N"),
    "softmax": ("M", "N"),
    "attention": ("B", "H", "HKV", "S", "D"),
    "attention_causal": ("B", "H", "HKV", "S", "D"),
    "elementwise_add": ("M", "N"),
}
# The torch device a target's kernels take their tensors on.
TORCH_DEVICE = {"c": "cpu", "cuda": "cuda", "hip": "cuda", "metal": "mps"}
PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})
CAPTURE_REASON = (
    "first met during CUDA-graph capture, where nothing compiles: "
    "run this shape once before capturing"
)


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def short_name(dtype: torch.dtype) -> str:
    """``runners.capture.dtype_name``, kept: every routed call asks."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype_name(dtype)
    return name


def host_device(kind: str = "cuda", index: int = 0) -> tuple[dict, str]:
    """(TileLang target, device type name) of this host's device of a backend
    kind ("cuda" or "c"), named as a runner's inventory names it."""
    if kind == "c":
        machine = platform.machine().lower()
        vendor = "x86-64" if machine in {"x86_64", "amd64"} else machine or "cpu"
        return {"kind": "c"}, device_type_label(vendor=vendor, model="CPU", backend="c")
    if kind != "cuda":
        raise ValueError(f"no host device naming for backend {kind!r}")
    major, minor = torch.cuda.get_device_capability(index)
    arch = f"sm_{major}{minor}"
    # Hopper kernels use sm_90a's arch-specific features (runners.host).
    arch = "sm_90a" if arch == "sm_90" else arch
    model = torch.cuda.get_device_name(index).removeprefix("NVIDIA ").strip()
    label = device_type_label(vendor="NVIDIA", model=model, arch=arch, backend="cuda")
    return {"kind": "cuda", "arch": arch}, label


@dataclass(slots=True)
class Tally:
    calls: int = 0
    seconds: float = 0.0


@dataclass(slots=True)
class Fallback:
    """One (operator, dtype, dims, reason) the reference ran for: its count,
    and the tally of its operator's reference path, held so that a call of
    a cell already met counts itself with no key to build."""

    key: tuple
    tally: Tally
    calls: int = 0


@dataclass
class Report:
    """What the router did, by operator and path (TILELANG or REFERENCE):
    calls it saw (a CUDA graph's calls once, at capture, never its replays)
    and, while the router is ``timed``, their time; each fallback's reason;
    each kernel compiled, with its seconds."""

    # Counters stay in place when cleared (the router holds them): the
    # ``tallies`` and ``fallbacks`` read show those that counted something.
    _tallies: dict[tuple[str, str], Tally] = field(default_factory=dict)
    # (operator, dtype, dims, reason) -> its counter
    _fallbacks: dict[tuple[str, str, tuple, str], Fallback] = field(
        default_factory=dict
    )
    compiled: dict[tuple[str, str, tuple], float] = field(default_factory=dict)
    relaid_weights: int = 0
    # While the router is ``checked``: each TileLang cell's worst relative
    # error against the model's own call, and the verdict of any out of
    # its tolerance.
    checked: dict[tuple[str, str, tuple], float] = field(default_factory=dict)
    mismatches: dict[tuple[str, str, tuple], str] = field(default_factory=dict)
    _events: list = field(default_factory=list, repr=False)

    @property
    def tallies(self) -> dict[tuple[str, str], Tally]:
        return {key: t for key, t in self._tallies.items() if t.calls}

    @property
    def fallbacks(self) -> dict[tuple[str, str, tuple, str], int]:
        return {key: f.calls for key, f in self._fallbacks.items() if f.calls}

    def tally(self, operator: str, path: str) -> Tally:
        key = (operator, path)
        found = self._tallies.get(key)
        if found is None:
            found = self._tallies[key] = Tally()
        return found

    def fallback(self, key: tuple[str, str, tuple, str]) -> Fallback:
        found = self._fallbacks.get(key)
        if found is None:
            found = self._fallbacks[key] = Fallback(key, self.tally(key[0], REFERENCE))
        return found

    def settle(self) -> None:
        """Add up the CUDA events of timed calls (waits for the device)."""
        if self._events:
            torch.cuda.synchronize()
            for tally, start, end in self._events:
                tally.seconds += start.elapsed_time(end) / 1e3
            self._events.clear()

    def clear_counts(self) -> None:
        """Forget calls and times (the kernels compiled stay listed)."""
        self.settle()
        for tally in self._tallies.values():
            tally.calls, tally.seconds = 0, 0.0
        for fallback in self._fallbacks.values():
            fallback.calls = 0

    def calls(self, path: str | None = None, operator: str | None = None) -> int:
        return sum(
            t.calls
            for (op, p), t in self._tallies.items()
            if (path is None or p == path) and (operator is None or op == operator)
        )

    def seconds(self, path: str | None = None) -> float:
        self.settle()
        return sum(
            t.seconds
            for (_, p), t in self._tallies.items()
            if path is None or p == path
        )

    def tilelang_share(self) -> dict[str, float]:
        """Shares of the routed calls, and of their time, that TileLang ran."""
        calls, seconds = self.calls(), self.seconds()
        return {
            "calls": self.calls(TILELANG) / calls if calls else 0.0,
            "time": self.seconds(TILELANG) / seconds if seconds else 0.0,
        }

    def as_dict(self) -> dict:
        self.settle()
        return {
            "by_operator": [
                {"operator": op, "path": path, "calls": t.calls, "seconds": t.seconds}
                for (op, path), t in sorted(self.tallies.items())
            ],
            "share": self.tilelang_share(),
            "fallbacks": [
                {
                    "operator": op,
                    "dtype": dt,
                    "dims": dict(dims),
                    "reason": reason,
                    "calls": calls,
                }
                for (op, dt, dims, reason), calls in sorted(self.fallbacks.items())
            ],
            "compiled": [
                {"operator": op, "dtype": dt, "dims": dict(dims), "seconds": s}
                for (op, dt, dims), s in sorted(self.compiled.items())
            ],
            "relaid_weights": self.relaid_weights,
            "checked": [
                {
                    "operator": op,
                    "dtype": dt,
                    "dims": dict(dims),
                    "rel_err": err,
                    "mismatch": self.mismatches.get((op, dt, dims)),
                }
                for (op, dt, dims), err in sorted(self.checked.items())
            ],
        }

    def table(self) -> str:
        self.settle()
        lines = [f"{'operator':<18} {'path':<10} {'calls':>7} {'ms':>10}"]
        for (op, path), t in sorted(self.tallies.items()):
            lines.append(f"{op:<18} {path:<10} {t.calls:>7} {t.seconds * 1e3:>10.3f}")
        for (op, dt, dims, reason), calls in sorted(self.fallbacks.items()):
            lines.append(f"reference x{calls}: {op} {dt} {dict(dims)}: {reason}")
        return "\n".join(lines)


@dataclass(slots=True)
class Cells:
    """One operator's cells, keyed as its handler keys a call: (torch dtype,
    then the dims in ``DIMS`` order), a tuple of the call's ints."""

    # Approved as TileLang here, and neither declined nor failed to compile.
    served: set = field(default_factory=set)
    kernels: dict = field(default_factory=dict)
    # Cells the reference runs whatever the call's details: the manifest's
    # reason, or the kernel's refusal to compile.
    fallbacks: dict = field(default_factory=dict)


class Router(TorchFunctionMode):
    """Routes a module's operator calls to TileLang or the reference, as the
    manifest read by ``dispatcher`` decides, for kernels built for
    ``target`` (an explicit TileLang target dict).

    ``cells`` (``(operator, dims, dtype)``, a capture trace's calls)
    restricts serving to those cells. A router that serves no cell at all
    (another toolchain's manifest, a device type it never validated, or a
    model none of whose cells it approves) stays off the mode stack: the
    model runs as if it were not there, and nothing is counted."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        target: dict,
        timed: bool = False,
        checked: bool = False,
        cells: Iterable[tuple[str, dict, str]] | None = None,
    ):
        super().__init__()
        if target.get("kind") not in TORCH_DEVICE:
            raise ValueError(f"no serving for target {target!r}")
        self.dispatcher = dispatcher
        self.target = dict(target)
        self.device = TORCH_DEVICE[target["kind"]]
        self._on_device = f"is_{self.device}"  # a bool property: no device object
        # Per-call timing: CUDA events on the GPU (settled when read), the
        # wall clock on the CPU. Off, a call costs only its count.
        self.timed = timed
        # Each TileLang call also runs the reference and is compared with it
        # (the report's ``checked`` and ``mismatches``): for tests and
        # benches, never for serving.
        self.checked = checked
        self.report = Report()
        self._cells = {op: Cells() for op in ROUTED_OPERATORS}
        self._only = None if cells is None else {_cell_of(*c) for c in cells}
        # A device type's name ends in its backend: cells validated on one
        # backend never run a kernel built for another.
        backend = dispatcher.device_type.rsplit(" · ", 1)[-1]
        self._elsewhere = backend in TORCH_DEVICE and backend != target["kind"]
        approved = [] if self._elsewhere else dispatcher.tilelang_cells()
        for operator, dims, dtype in approved:
            cell = _cell_of(operator, dims, dtype)
            if cell is not None and (self._only is None or cell in self._only):
                self._cells[operator].served.add(cell[1])
        self._idle_logged = False
        self._pushed = False
        self._depth = 0
        self._handlers = {
            F.linear: self._linear,
            F.rms_norm: self._rms_norm,
            torch.softmax: self._torch_softmax,
            torch.Tensor.softmax: self._torch_softmax,
            F.softmax: self._functional_softmax,
            F.scaled_dot_product_attention: self._attention,
            torch.add: self._add,
            torch.Tensor.add: self._add,
        }

    @classmethod
    def from_manifest(
        cls,
        manifest: dict | str | Path,
        *,
        target: dict,
        device_type: str | None = None,
        toolchain_fingerprint: str | None = None,
        kernel_revisions: Mapping[str, str] | None = None,
        timed: bool = False,
        checked: bool = False,
        cells: Iterable[tuple[str, dict, str]] | None = None,
    ) -> Router:
        """A router for this host: its device type (``host_device``), its
        toolchain fingerprint and its copy of the library's kernel
        revisions, unless given."""
        if device_type is None:
            device_type = host_device(target["kind"])[1]
        if kernel_revisions is None:
            kernel_revisions = library_revisions(*ROUTED_OPERATORS)
        kwargs = dict(
            device_type=device_type,
            toolchain_fingerprint=toolchain_fingerprint or host_toolchain_fingerprint(),
            kernel_revisions=kernel_revisions,
        )
        if isinstance(manifest, dict):
            dispatcher = Dispatcher(manifest, **kwargs)
        else:
            dispatcher = Dispatcher.from_file(manifest, **kwargs)
        return cls(dispatcher, target=target, timed=timed, checked=checked, cells=cells)

    @property
    def idle(self) -> bool:
        """True when no call could be served: the router stays off the stack."""
        return not any(c.served for c in self._cells.values())

    def idle_reason(self) -> str | None:
        """Why this router serves nothing (None while it serves a cell)."""
        if not self.idle:
            return None
        d = self.dispatcher
        if self._elsewhere:
            return (
                f"{d.device_type} was validated on another backend than this "
                f"router's target, {self.target['kind']}"
            )
        # The dispatcher's reason for a cell it has no entry for names the
        # toolchain or device type when either is what refuses everything.
        why = d.decide("gemm", {"M": 0, "N": 0, "K": 0}, "float32").reason
        if "has no approved entry" not in why:
            return why
        if self._only is not None and d.tilelang_cells():
            return (
                f"the manifest approves none of the {len(self._only)} cells "
                f"given for {d.device_type}"
            )
        # TileLang entries the dispatcher turns down here (another kernel
        # revision): the first one's reason.
        for operator, dims, dtype in d.entries_choosing_tilelang():
            return d.decide(operator, dims, dtype).reason
        return f"the manifest approves no TileLang cell for {d.device_type}"

    # Ahead of time ----------------------------------------------------------

    def prepare(self, fn: Callable, *args, **kwargs):
        """Call ``fn(*args, **kwargs)`` (a module, a decode step) once under
        the router, so that every approved cell it meets is compiled and
        every weight it serves by TileLang is laid out; then clear the
        counts, so the report counts serving only. Returns fn's output."""
        with self:
            out = fn(*args, **kwargs)
        self.report.clear_counts()
        return out

    def compile(self, cells: Iterable[tuple[str, dict, str]], workers: int = 1) -> int:
        """Compile the approved ones of ``(operator, dims, dtype)`` cells (a
        capture trace's calls, say), ``workers`` at a time; returns how many
        kernels are ready. Weights are still laid out at their first call."""
        keys = {
            (op, dtype, tuple(sorted(dims.items()))): dims for op, dims, dtype in cells
        }
        with ThreadPoolExecutor(max_workers=workers) as pool:
            kernels = list(
                pool.map(lambda key: self._kernel(key[0], keys[key], key[1]), keys)
            )
        return sum(k is not None for k in kernels)

    # The mode ----------------------------------------------------------------

    def __enter__(self):
        # Re-entered (``prepare`` inside ``with router``), it stays one mode
        # on the stack: twice, each call would be routed through it twice.
        self._depth += 1
        if self._depth == 1:
            self._pushed = not self.idle
            if self._pushed:
                super().__enter__()
            elif not self._idle_logged:
                self._idle_logged = True
                logger.info("serving nothing by TileLang: %s", self.idle_reason())
        return self

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0 and self._pushed:
            self._pushed = False
            return super().__exit__(*exc)
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # Every torch call of the model comes here, a tensor's .shape
        # included: the ones no kernel serves leave at once.
        handler = self._handlers.get(func)
        if handler is None:
            return func(*args, **kwargs) if kwargs else func(*args)
        # Tensor subclasses (fake, distributed, quantized) are not what the
        # kernels take: they pass through.
        if not PLAIN_TENSORS.issuperset(types):
            return func(*args, **kwargs) if kwargs else func(*args)
        return handler(func, *args, **(kwargs or {}))

    # The handlers: each keys its call as a cell from its shapes; a cell the
    # manifest does not serve here was decided when first met, and counts
    # itself and runs the model's own call with nothing more to work out.

    def _linear(self, func, input, weight, bias=None):
        K, N = input.shape[-1], weight.shape[0]
        cell = (input.dtype, input.numel() // (K or 1), N, K)
        cells = self._cells["gemm"]
        if cell not in cells.served:
            return self._fall_back("gemm", cell, func, input, weight, bias)

        def reference():
            return func(input, weight, bias)

        refusal = self._refusal(input, weight)
        if refusal is None and bias is not None:
            refusal = "linear with a bias: the gemm kernel has no bias epilogue"
        elif refusal is None and weight.dtype != input.dtype:
            refusal = "weight and input of different dtypes"
        kernel, reason = self._choose("gemm", cell, refusal)
        if kernel is not None:
            reason = self._lay_out(weight)
        if reason is not None:
            return self._reference("gemm", cell, reason, reference)

        def run():
            out = input.new_empty(*input.shape[:-1], N)
            kernel(input.reshape(-1, K).contiguous(), weight.t(), out.view(-1, N))
            return out

        return self._tilelang("gemm", cell, run, reference)

    def _rms_norm(self, func, input, normalized_shape, weight=None, eps=None):
        N = input.shape[-1] if input.dim() else 1
        cell = (input.dtype, input.numel() // (N or 1), N)
        cells = self._cells["rmsnorm"]
        if cell not in cells.served:
            return self._fall_back(
                "rmsnorm", cell, func, input, normalized_shape, weight, eps
            )

        def reference():
            return func(input, normalized_shape, weight, eps)

        refusal = self._refusal(input, weight) or self._contiguity(input)
        if refusal is None:
            if isinstance(normalized_shape, int):
                normalized_shape = (normalized_shape,)
            if tuple(normalized_shape) != (N,):
                refusal = "normalizes over more than the last dim"
            elif weight is None or weight.dtype != input.dtype:
                refusal = (
                    "no weight of the input's dtype (the kernel multiplies by one)"
                )
            elif eps != RMSNORM_EPS:
                refusal = f"eps {eps} where the kernel's is {RMSNORM_EPS}"
        kernel, reason = self._choose("rmsnorm", cell, refusal)
        if reason is not None:
            return self._reference("rmsnorm", cell, reason, reference)

        def run():
            out = torch.empty_like(input)
            kernel(input.view(-1, N), weight.contiguous(), out.view(-1, N))
            return out

        return self._tilelang("rmsnorm", cell, run, reference)

    def _torch_softmax(self, func, input, dim, dtype=None):
        N = input.shape[-1] if input.dim() else 1
        cell = (input.dtype, input.numel() // (N or 1), N)
        if cell not in self._cells["softmax"].served:
            if dtype is None:
                return self._fall_back("softmax", cell, func, input, dim)
            return self._fall_back("softmax", cell, func, input, dim, dtype=dtype)
        return self._softmax(
            cell, input, dim, dtype, lambda: func(input, dim, dtype=dtype)
        )

    def _functional_softmax(self, func, input, dim=None, _stacklevel=3, dtype=None):
        N = input.shape[-1] if input.dim() else 1
        cell = (input.dtype, input.numel() // (N or 1), N)
        if cell not in self._cells["softmax"].served:
            return self._fall_back("softmax", cell, func, input, dim, dtype=dtype)
        return self._softmax(
            cell, input, dim, dtype, lambda: func(input, dim, dtype=dtype)
        )

    def _softmax(self, cell, input, dim, dtype, reference):
        N = cell[2]
        refusal = self._refusal(input) or self._contiguity(input)
        if refusal is None:
            last = input.dim() - 1
            if not isinstance(dim, int) or last < 0 or dim % input.dim() != last:
                refusal = "softmax over a dim other than the last"
            elif dtype is not None and dtype != input.dtype:
                refusal = f"softmax into {dtype_name(dtype)}"
        kernel, reason = self._choose("softmax", cell, refusal)
        if reason is not None:
            return self._reference("softmax", cell, reason, reference)

        def run():
            out = torch.empty_like(input)
            kernel(input.view(-1, N), out.view(-1, N))
            return out

        return self._tilelang("softmax", cell, run, reference)

    def _attention(
        self,
        func,
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        enable_gqa=False,
    ):
        def reference():
            return func(
                query,
                key,
                value,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )

        operator = "attention_causal" if is_causal else "attention"
        if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
            return self._reference(
                operator,
                (query.dtype, *query.shape),
                "attention on tensors that are not [B, H, S, D]",
                reference,
                dims={"shape": tuple(query.shape)},
            )
        B, H, S, D = query.shape
        cell = (query.dtype, B, H, key.shape[1], S, D)
        if cell not in self._cells[operator].served:
            return self._fall_back(
                operator,
                cell,
                func,
                query,
                key,
                value,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )
        refusal = self._refusal(query, key, value)
        if refusal is None:
            if attn_mask is not None or dropout_p:
                refusal = "attention with a mask or dropout"
            elif key.shape[2] != S:
                refusal = (
                    f"query length {S} and key length {key.shape[2]} differ "
                    "(decode against a cache)"
                )
            elif key.shape != value.shape or key.shape[0] != B or key.shape[3] != D:
                refusal = "key and value are not [B, HKV, S, D] of the query's B and D"
            elif H != cell[3] and not enable_gqa:
                refusal = "grouped heads without enable_gqa"
            elif scale is not None and not math.isclose(scale, D**-0.5, rel_tol=1e-7):
                refusal = f"scale {scale} where the kernel's is 1/sqrt({D})"
        kernel, reason = self._choose(operator, cell, refusal)
        if reason is not None:
            return self._reference(operator, cell, reason, reference)

        def run():
            # Attention is O(S^2 D) against the O(S D) of these copies, and
            # heads split out of a fused projection are never contiguous.
            out = query.new_empty(B, H, S, D)
            kernel(query.contiguous(), key.contiguous(), value.contiguous(), out)
            return out

        return self._tilelang(operator, cell, run, reference)

    def _add(self, func, input, other, *, alpha=1, out=None):
        # Only what runners.capture records as elementwise_add is an
        # operator call; broadcasts, scalars and integers pass through.
        if not (
            out is None
            and alpha == 1
            and isinstance(other, torch.Tensor)
            and isinstance(input, torch.Tensor)
            and input.shape == other.shape
            and input.dtype == other.dtype
            and input.dim() > 0
            and input.is_floating_point()
        ):
            if out is not None:
                return func(input, other, alpha=alpha, out=out)
            return func(input, other, alpha=alpha) if alpha != 1 else func(input, other)
        N = input.shape[-1]
        cell = (input.dtype, input.numel() // (N or 1), N)
        if cell not in self._cells["elementwise_add"].served:
            return self._fall_back("elementwise_add", cell, func, input, other)

        def reference():
            return func(input, other)

        refusal = self._refusal(input, other) or self._contiguity(input, other)
        kernel, reason = self._choose("elementwise_add", cell, refusal)
        if reason is not None:
            return self._reference("elementwise_add", cell, reason, reference)

        def run():
            result = torch.empty_like(input)
            kernel(input.view(-1, N), other.view(-1, N), result.view(-1, N))
            return result

        return self._tilelang("elementwise_add", cell, run, reference)

    # Deciding ------------------------------------------------------------------

    def _refusal(self, *tensors) -> str | None:
        """Why no kernel can take these tensors, whatever the manifest says."""
        for t in tensors:
            if t is None:
                continue
            if not getattr(t, self._on_device):
                return f"a tensor on {t.device.type}, not {self.device}"
            if t.requires_grad and torch.is_grad_enabled():
                return "autograd is recording: the kernels have no backward"
        return None

    @staticmethod
    def _contiguity(*tensors) -> str | None:
        if all(t.is_contiguous() for t in tensors):
            return None
        return "non-contiguous operands: copying them would cost more than the kernel"

    def _choose(
        self, operator: str, cell: tuple, refusal: str | None
    ) -> tuple[Callable | None, str | None]:
        """For a served cell: (the compiled kernel, None), or (None, why the
        reference runs this call)."""
        if refusal is not None:
            return None, refusal
        kernel = self._cells[operator].kernels.get(cell)
        if kernel is not None:
            return kernel, None
        if self._capturing():
            return None, CAPTURE_REASON
        kernel = self._kernel(operator, _dims_of(operator, cell), short_name(cell[0]))
        if kernel is None:
            # Declined or failed: the cell's fallback now says why.
            return None, self._cells[operator].fallbacks[cell].key[3]
        return kernel, None

    def _kernel(self, operator: str, dims: dict, dtype: str) -> Callable | None:
        """The cell's compiled kernel, compiled now if the manifest approves
        it; None otherwise, and the cell then always takes the reference,
        the reason kept."""
        cell = _cell_of(operator, dims, dtype)
        cells = self._cells[operator]
        if cell is not None and cell[1] in cells.kernels:
            return cells.kernels[cell[1]]
        decision = self.dispatcher.decide(operator, dims, dtype)
        kernel, reason = None, decision.reason or "approved as reference"
        if self._only is not None and cell not in self._only:
            reason = "not among the cells this router was given"
        elif decision.uses_tilelang:
            library = kernels.get(operator)
            started = time.perf_counter()
            try:
                shape = library.validate_shape(dims)
                kernel = compile_kernel(
                    library.program(shape, dtype, self.target), self.target
                )
            except (MalformedShape, Unsupported) as exc:
                reason = f"the kernel declines it on {self.target['kind']}: {exc}"
            except Exception as exc:
                # A toolchain that validated this cell elsewhere failed here:
                # serve the reference rather than fail the request.
                reason = "compile failed: " + sanitize(
                    f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                )
                logger.warning("%s %s dims=%s: %s", operator, dtype, dims, reason)
            else:
                key = (operator, dtype, tuple(sorted(dims.items())))
                self.report.compiled[key] = time.perf_counter() - started
        if cell is None:  # a dtype torch does not name, or other dims
            return kernel
        if kernel is None:
            cells.served.discard(cell[1])
            cells.fallbacks[cell[1]] = self.report.fallback(
                (operator, dtype, tuple(dims.items()), reason)
            )
        else:
            cells.kernels[cell[1]] = kernel
        return kernel

    def _capturing(self) -> bool:
        return self.device == "cuda" and torch.cuda.is_current_stream_capturing()

    def _lay_out(self, weight: torch.Tensor) -> str | None:
        """None once ``weight.t()`` is B as the gemm kernel takes it (a
        parameter is re-laid in place the first time); else why not."""
        if weight.t().is_contiguous():
            return None
        if not isinstance(weight, torch.nn.Parameter):
            return "a weight that is not a parameter, stored [N, K] row-major"
        if self._capturing():
            return CAPTURE_REASON
        # Outside inference mode: an inference tensor in a parameter would
        # refuse any later use that autograd records.
        with torch.inference_mode(False), torch.no_grad():
            weight.data = weight.data.t().contiguous().t()
        self.report.relaid_weights += 1
        return None

    # Running -------------------------------------------------------------------

    def _fall_back(self, operator: str, cell: tuple, func, *args, **kwargs):
        """The model's own call of a cell the manifest does not serve here."""
        fallback = self._cells[operator].fallbacks.get(cell)
        if fallback is None:
            return self._reference(operator, cell, None, lambda: func(*args, **kwargs))
        fallback.calls += 1
        tally = fallback.tally
        tally.calls += 1
        if not self.timed:
            return func(*args, **kwargs)
        return self._timed(tally, lambda: func(*args, **kwargs))

    def _reference(
        self, operator: str, cell: tuple, reason: str | None, call, dims=None
    ):
        """The model's own call, counted under its reason; ``reason`` None
        is the manifest's, and then every later call of the cell takes
        ``_fall_back``'s shortcut."""
        dims = dims or _dims_of(operator, cell)
        dtype = short_name(cell[0])
        manifests = reason is None
        if manifests:
            reason = self.dispatcher.decide(operator, dims, dtype).reason
            if self._only is not None and _cell_of(operator, dims, dtype) not in (
                self._only
            ):
                reason = "not among the cells this router was given"
        key = (operator, dtype, tuple(dims.items()), reason)
        fallback = self.report._fallbacks.get(key)
        if fallback is None:
            fallback = self.report.fallback(key)
            logger.info(
                "reference for %s %s dims=%s on %s: %s",
                operator,
                dtype,
                dims,
                self.dispatcher.device_type,
                reason,
            )
        if manifests:
            self._cells[operator].fallbacks[cell] = fallback
        fallback.calls += 1
        fallback.tally.calls += 1
        return self._timed(fallback.tally, call) if self.timed else call()

    def _tilelang(self, operator: str, cell: tuple, run, reference):
        tally = self.report.tally(operator, TILELANG)
        tally.calls += 1
        out = self._timed(tally, run) if self.timed else run()
        if self.checked and not self._capturing():
            self._check(operator, cell, out, reference())
        return out

    def _check(self, operator: str, cell: tuple, out, expected) -> None:
        """Hold a TileLang output to its cell's tolerance against what the
        model's own call returns on the same inputs."""
        dtype = short_name(cell[0])
        tolerance = kernels.get(operator).tolerances[dtype]
        comparison = compare_one(operator, out, expected, tolerance)
        dims = _dims_of(operator, cell)
        key = (operator, dtype, tuple(sorted(dims.items())))
        worst = self.report.checked.get(key, 0.0)
        self.report.checked[key] = max(worst, comparison.rel_err)
        verdict = comparison.verdict(tolerance)
        if verdict is not None:
            self.report.mismatches.setdefault(key, verdict)
            logger.error("%s %s dims=%s: %s", operator, dtype, dims, verdict)

    def _timed(self, tally: Tally, call):
        if self.device != "cuda":
            started = time.perf_counter()
            out = call()
            tally.seconds += time.perf_counter() - started
            return out
        if self._capturing():
            return call()
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        out = call()
        end.record()
        self.report._events.append((tally, start, end))
        return out


def _dims_of(operator: str, cell: tuple) -> dict:
    """A handler's cell (torch dtype, *dims) as the manifest's dims."""
    return dict(zip(DIMS[operator], cell[1:], strict=True))


def _cell_of(operator: str, dims: dict, dtype: str) -> tuple[str, tuple] | None:
    """A manifest's (operator, dims, dtype) as (operator, the handler's
    cell), or None where no handler could key a call so."""
    order = DIMS.get(operator)
    torch_dtype = getattr(torch, dtype, None)
    if (
        order is None
        or set(dims) != set(order)
        or not isinstance(torch_dtype, torch.dtype)
    ):
        return None
    return operator, (torch_dtype, *(int(dims[d]) for d in order))
