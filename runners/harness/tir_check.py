"""What a submitted PrimFunc may contain: TIR's own operators, and nothing
that reaches past the kernel's tensors.

The executor runs this on the PrimFunc it loaded from the builder's JSON,
before anything is lowered or built: the builder ran submitted Python, so
what it wrote is as hostile as the source. A kernel's native code must be
what TIR's operators compile to, so these are refused, each named with the
TVMScript line it stands on:

- extern and packed calls (``T.call_extern``, ``T.call_packed``, LLVM
  intrinsics): through them a "kernel" called the executor's own Python
  (``PyRun_SimpleString``), patched its clock, or asked ``getuid()`` to
  tell the sandbox from production;
- inline assembly and source injection (``ptx_*``, ``T.import_source``);
- pointers: ``address_of`` or ``access_ptr`` of anything, and buffers over
  memory that is neither a parameter nor the kernel's own allocation;
- reads of an output: outputs start poisoned and the timed calls reuse
  them, so a kernel that reads its output can compute only while it still
  holds the poison and skip the work once it is right.

Every other call must be one of ``ALLOWED_OPS``: the operations the operator
library's own kernels use (their extern helpers and injected CUDA aside,
which are reviewed code), and TIR's pure math.
"""

from __future__ import annotations

from dataclasses import dataclass

# TIR's pure arithmetic and control intrinsics.
TIR_MATH = frozenset(
    f"tirx.{name}"
    for name in (
        "exp exp2 exp10 expm1 log log2 log10 log1p sqrt rsqrt tanh sigmoid "
        "sin cos tan sinh cosh asin acos atan atan2 erf fabs floor ceil round "
        "nearbyint trunc pow fmod hypot copysign isnan isinf isfinite "
        "if_then_else likely bitwise_and bitwise_or bitwise_xor bitwise_not "
        "shift_left shift_right popcount clz reinterpret tvm_tuple "
        "tvm_storage_sync"
    ).split()
)
# TileLang's tile operators and the thread-level intrinsics its library uses.
TILELANG_OPS = frozenset(
    f"tl.{name}"
    for name in (
        "region infinity launch_thread_idx any_sync all_sync shfl_xor_sync "
        "shfl_down_sync shfl_up_sync shfl_sync sync_threads wait_wgmma "
        "tileop.copy tileop.fill tileop.gemm tileop.wgmma_gemm tileop.reduce "
        "tileop.cumsum tileop.atomic_add tileop.atomicadd tileop.parallel"
    ).split()
)
ALLOWED_OPS = TIR_MATH | TILELANG_OPS

# Why the usual suspects are refused; any other op outside the allow-list
# gets the generic reason.
OP_REASONS = {
    "tirx.call_extern": "an extern call runs native code outside the kernel",
    "tirx.call_pure_extern": "an extern call runs native code outside the kernel",
    "tirx.call_llvm_intrin": "an LLVM intrinsic call reaches past TIR",
    "tirx.call_llvm_pure_intrin": "an LLVM intrinsic call reaches past TIR",
    "tirx.tvm_call_packed": "a packed call runs functions of the host process",
    "tirx.tvm_call_cpacked": "a packed call runs functions of the host process",
    "tirx.tvm_call_packed_lowered": "a packed call runs functions of the host",
    "tirx.tvm_call_cpacked_lowered": "a packed call runs functions of the host",
    "tirx.tvm_call_trace_packed": "a packed call runs functions of the host",
    "tirx.address_of": "a pointer reaches memory beyond the kernel's tensors",
    "tirx.tvm_access_ptr": "a pointer reaches memory beyond the kernel's tensors",
    "tl.access_ptr": "a pointer reaches memory beyond the kernel's tensors",
}
GENERIC_OP_REASON = "not among the TIR operations a submitted kernel may use"
ASSEMBLY_REASON = "inline assembly is native code outside TIR's operators"
# Block and loop annotations that carry source code into the build.
INJECTING_ANNOTATIONS = ("pragma_import_c", "pragma_import_llvm")
# What a PrimFunc's own attributes may say: its name. The rest (a target, a
# calling convention, linkage) is the compiler's to set, not the kernel's.
FUNCTION_ATTRIBUTES = frozenset({"global_symbol"})
FUNCTION_ATTRIBUTE_REASON = "a function attribute other than its name is the compiler's"
# tl.region's access mask: 1 read, 2 write, 3 read and write.
REGION_WRITE = 2


@dataclass(frozen=True)
class TirRefusal:
    line: int
    construct: str
    reason: str

    def __str__(self) -> str:
        return f"line {self.line} of the TIR: {self.construct}: {self.reason}"


def tir_check(func, *, outputs: int) -> list[TirRefusal]:
    """Every rule the PrimFunc breaks; empty when it passes. Its last
    ``outputs`` parameters are the outputs the harness allocates."""
    from tilelang import tvm

    tir = getattr(tvm, "tirx", None) or tvm.tir
    params = [func.buffer_map[p] for p in func.params if p in func.buffer_map]
    output_data = (
        {b.data for b in params[len(params) - outputs :]} if outputs else set()
    )
    own = {b.data for b in params}
    found: list[tuple[str, str]] = []
    # BufferLoads that only name where a tile operator writes.
    written_only: set = set()

    def collect_own(node) -> None:
        if isinstance(node, tir.SBlock):
            own.update(b.data for b in node.alloc_buffers)
            for view in node.match_buffers:
                if view.source.buffer.data in own:
                    own.add(view.buffer.data)
                if view.source.buffer.data in output_data:
                    output_data.add(view.buffer.data)
        elif isinstance(node, tir.AllocBuffer):
            own.add(node.buffer.data)

    def visit(node) -> None:
        if isinstance(node, tir.Call):
            _call(node, found, written_only)
        elif isinstance(node, tir.BufferLoad | tir.BufferStore):
            buffer = node.buffer
            if buffer.data not in own:
                found.append(
                    (
                        f"buffer {buffer.name}",
                        "it is over memory that is neither a parameter nor the "
                        "kernel's own allocation",
                    )
                )
            elif (
                isinstance(node, tir.BufferLoad)
                and buffer.data in output_data
                and not any(node.same_as(w) for w in written_only)
            ):
                found.append(
                    (
                        str(node),
                        f"{buffer.name} is an output: outputs are written, never read",
                    )
                )
        elif isinstance(node, tir.SBlock | tir.For):
            for key in node.annotations.keys():
                if str(key) in INJECTING_ANNOTATIONS:
                    found.append((str(key), "it injects source code into the build"))
        elif isinstance(node, tir.AttrStmt) and str(node.attr_key) in (
            INJECTING_ANNOTATIONS
        ):
            found.append((str(node.attr_key), "it injects source code into the build"))

    # Pre-order: an allocation or a view is known before what it encloses.
    tir.stmt_functor.pre_order_visit(func.body, lambda n: collect_own(n) or True)
    # Calls come before their arguments in pre-order, so a region's written
    # BufferLoad is known before it is visited.
    tir.stmt_functor.pre_order_visit(func.body, lambda n: visit(n) or True)
    for key in func.attrs.keys() if func.attrs else ():
        if str(key) in INJECTING_ANNOTATIONS:
            found.append((str(key), "it injects source code into the build"))
        elif str(key) not in FUNCTION_ATTRIBUTES:
            found.append((str(key), FUNCTION_ATTRIBUTE_REASON))
    return _with_lines(func, found)


def _call(node, found: list, written_only: set) -> None:
    name = getattr(node.op, "name", None)
    if name is None:
        found.append((str(node.op), "a call to a function, not a TIR operation"))
        return
    if name == "tl.region":
        mask = getattr(node.args[1], "value", None)
        if mask == REGION_WRITE:
            written_only.add(node.args[0])
        return
    if name in ALLOWED_OPS:
        return
    if "ptx" in name or "asm" in name:
        reason = ASSEMBLY_REASON
    else:
        reason = OP_REASONS.get(name, GENERIC_OP_REASON)
    shown = name.split(".", 1)[1]
    if name in ("tirx.call_extern", "tirx.call_pure_extern") and node.args:
        symbol = getattr(node.args[0], "value", "?")
        shown = f"{shown} {symbol!r}"
    found.append((f"T.{shown}", reason))


def _with_lines(func, found: list[tuple[str, str]]) -> list[TirRefusal]:
    """Each construct with the first line of the PrimFunc's TVMScript that
    shows it (TIR loaded from JSON keeps no source spans)."""
    lines = func.script().splitlines()
    refusals, seen = [], set()
    for construct, reason in found:
        if (construct, reason) in seen:
            continue
        seen.add((construct, reason))
        line = _line_of(lines, construct)
        refusals.append(TirRefusal(line, construct, reason))
    return sorted(refusals, key=lambda r: (r.line, r.construct))


def _line_of(lines: list[str], construct: str) -> int:
    if construct.startswith("T."):
        # TVMScript prints tvm_call_packed as T.call_packed(...).
        name = construct.split(" ")[0]
        needles = [f"{name}(", name.replace("T.tvm_", "T.") + "("]
    else:
        needles = [construct.removeprefix("buffer ")]
    for needle in needles:
        for number, text in enumerate(lines, 1):
            if needle in text:
                return number
    return 0
