"""Lower, build and validate one job. Runs inside the sandboxed child only.

Every outcome of the kernel becomes a status in the result; only a bug in the
harness itself escapes as an exception (the child reports it as infra_error).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from runners.harness import compare, distributions, tensors, timing
from runners.harness.result import (
    KERNEL_SOURCE_CAP,
    SUCCESS_FOR_STAGE,
    cap_text,
    new_result,
    set_error,
)

DEFAULT_REPEATS = {"cpu": 5, "gpu": 100}
# Set by the supervisor for library children that share a device: a file
# they lock, so kernels compile side by side, check their outputs on the
# device together, and are timed on it alone.
DEVICE_LOCK_ENV = "TILEMATRIX_DEVICE_LOCK"
_PASS_CALL = re.compile(r"\b(?:tilelang|tl|tir|tirx)\.transform\.(\w+)\s*\(")
_COMPILERS = {"nvcc", "hipcc", "gcc", "g++", "cc", "c++", "clang", "clang++"}


class CompileFailure(Exception):
    """Lowering or building failed; carries the stage and the TileLang pass."""

    def __init__(self, stage: str, exc: BaseException):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.stage = stage
        self.pass_name = failing_pass(exc)
        self.missing_compiler = _missing_compiler(exc)


def run_stages(
    job: dict,
    *,
    fingerprint: dict,
    workdir: str,
    on_stage: Callable[[str], None] = lambda stage: None,
) -> dict:
    from runners import kernels
    from runners.kernels.base import Unsupported

    result = new_result(job)
    result["fingerprint"] = fingerprint
    operator = kernels.get(job["operator"])
    shape, dtype, target = job["shape"], job["dtype"], job["target"]
    tolerance = operator.tolerances.get(dtype)
    if tolerance is not None:
        result["tolerance"] = dataclasses.asdict(tolerance)
    try:
        operator.check(shape, dtype, target)
    except Unsupported as exc:
        return set_error(result, "unsupported", str(exc))

    started = time.perf_counter()
    try:
        kernel, source = compile_program(
            job,
            lambda: operator.program(shape, dtype, target),
            result,
            on_stage,
            declines=Unsupported,
        )
    except Unsupported as exc:
        # A builder may refuse a cell that check() let through.
        return set_error(result, "unsupported", str(exc))
    except CompileFailure as failure:
        result["stage_reached"] = failure.stage
        result["timings"]["compile_s"] = time.perf_counter() - started
        status = "infra_error" if failure.missing_compiler else "compile_error"
        return set_error(result, status, str(failure), pass_name=failure.pass_name)
    result["timings"]["compile_s"] = time.perf_counter() - started
    result["kernel_source"] = cap_text(source or "", KERNEL_SOURCE_CAP)
    if job["stage"] != "validate":
        result["status"] = SUCCESS_FOR_STAGE[job["stage"]]
        return result

    result["stage_reached"] = "validate"
    on_stage("validate")
    if tolerance is None:
        return set_error(
            result, "infra_error", f"{job['operator']} has no tolerance for {dtype}"
        )
    started, waits = time.perf_counter(), []
    try:
        return _validate(job, operator, kernel, tolerance, result, waits)
    finally:
        # The stage's own time: what it waited for the device is not its.
        result["timings"]["run_s"] = time.perf_counter() - started - sum(waits)


def compile_program(job: dict, make_program, result: dict, on_stage, *, declines=()):
    """Return (kernel or None, device source) for the job's stage, lowering
    and building the PrimFunc that ``make_program()`` returns (a library
    operator's, or a submitted one loaded from its TVM JSON). ``declines``
    (a library builder's Unsupported) passes through untouched."""
    import tilelang
    from tilelang import tvm

    target = job["target"]
    result["stage_reached"] = "lower"
    on_stage("lower")
    func = None
    try:
        func = make_program()
        if job["stage"] == "lower" or (
            job["stage"] == "build" and target["kind"] != "c"
        ):
            if job["stage"] == "build":
                on_stage("build")
            tvm_target = tvm.target.Target(target)
            with tvm_target:
                artifact = tilelang.lower(
                    func,
                    target=tvm_target,
                    enable_device_compile=job["stage"] == "build",
                )
            result["stage_reached"] = job["stage"]
            return None, artifact.kernel_source
        on_stage("build")
        kernel = tilelang.compile(func, target=target)
        _make_host_library(kernel)
    except declines:
        raise
    except Exception as exc:
        # No program yet, or a named pass raised: lowering failed. Otherwise
        # the device compiler (or loading its output) did.
        lowering = func is None or job["stage"] == "lower" or failing_pass(exc)
        raise CompileFailure("lower" if lowering else "build", exc) from exc
    result["stage_reached"] = "build"
    _stamp_used(kernel)
    return kernel, kernel.get_kernel_source()


def _make_host_library(kernel) -> None:
    """Build a freshly compiled kernel's host library now. TileLang links it
    (a C compiler run, 0.2 s a kernel on the H100's host) at the kernel's
    first call, which is inside the device turn, where every other child
    waits on it. A kernel loaded from the cache holds a loaded library
    instead (a Module, not an Executable): nothing to do."""
    from tilelang import tvm

    executable_type = getattr(tvm.runtime, "Executable", None)
    make = getattr(getattr(kernel, "adapter", None), "get_exportable_executable", None)
    if executable_type is None or make is None:
        return  # an older TileLang, or a backend that links in the build
    executable = make()
    if isinstance(executable, executable_type):
        executable.jit()  # what the first call would do; it keeps the result


def _stamp_used(kernel) -> None:
    """Mark the kernel's cache entry as used now: the runner evicts the
    least recently used entries (runners.kernel_cache), and loading one
    from the cache changes no time the filesystem keeps (relatime)."""
    path = getattr(kernel, "_tilelang_cache_path", None)
    if path:
        try:
            os.utime(path)
        except OSError:
            pass  # gone meanwhile, or a throwaway cache: nothing to keep


def _validate(
    job: dict, operator, kernel, tolerance, result: dict, waits: list | None = None
) -> dict:
    """Run the kernel on each input distribution its operator declares,
    several times each, and compare with the reference (beside other
    children that check theirs); time it on the uniform draw (alone on the
    device). ``waits`` gets the seconds spent waiting for each turn."""
    shape, dtype, target = job["shape"], job["dtype"], job["target"]
    device = device_for(target)
    if device is None:
        return set_error(
            result, "infra_error", f"this runner has no {target['kind']} device"
        )
    out_specs = [tensors.spec_dict(s) for s in operator.outputs(shape, dtype)]
    in_specs = [tensors.spec_dict(s) for s in operator.inputs(shape, dtype)]
    result["distributions"] = []
    waits = [] if waits is None else waits
    beside_others = _fits_beside_others(in_specs + out_specs, device)
    with device_turn(device, shared=beside_others) as waited:
        waits.append(waited)
        checked = _check(job, operator, kernel, tolerance, result, out_specs, device)
    if isinstance(checked, dict):
        return checked
    with device_turn(device) as waited:
        waits.append(waited)
        timings = _time_both(job, operator, kernel, *checked, device, result)
    result["timings"].update(timings)
    result["status"] = "pass"
    return result


# Children that may check on one device at once: a runner host's compile
# workers (runners.harness.sandbox.compile_workers, 16 at most).
CHECKS_AT_ONCE = 16


def _fits_beside_others(specs: list[dict], device: str) -> bool:
    """Whether a cell's check may share the device: on CUDA, where what it
    holds (its tensors, their float64 copies, the reference's outputs and
    a second run's outputs) is at most 1/CHECKS_AT_ONCE of the device's
    memory, so that as many checks at once still fit. A vocabulary GEMM's
    weight (1 GB in float16, 4 GB in float64) is checked alone."""
    if device != "cuda":
        return False
    import torch

    held = sum(
        tensors.byte_size(spec) * (2 + 8 // tensors.ELEMENT_BYTES[spec["dtype"]])
        for spec in specs
    )
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return held * CHECKS_AT_ONCE <= total


def _check(job, operator, kernel, tolerance, result, out_specs, device):
    """The failed result, or the (inputs, outputs) of the uniform draw to
    time on, once every input set passed every run."""
    shape, dtype = job["shape"], job["dtype"]
    timed = None
    widened: dict[int, object] = {}
    for distribution, inputs in distributions.input_sets(
        operator, shape, dtype, job["seed"], device
    ):
        references = _references(operator, inputs, device, result, widened)
        if isinstance(references, dict):
            return references
        problems, first = [], None
        for _ in range(compare.VALIDATION_RUNS):
            outputs = tensors.poisoned_outputs(out_specs, device)
            try:
                kernel(*inputs, *outputs)
                synchronize(device)
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                return set_error(result, "runtime_error", message)
            if first is not None and compare.same_outputs(outputs, first):
                problems.append(problems[0])  # the first run's verdict, again
                continue
            first = first if first is not None else outputs
            problems.append(_compare(out_specs, outputs, references, tolerance, result))
        failed = compare.repeated_verdict(problems)
        if failed:
            status, message = failed
            if distribution != tensors.UNIFORM:
                message += f" (on {distribution.label} inputs)"
            return set_error(result, status, message)
        result["distributions"].append(distribution.label)
        timed = timed or (inputs, outputs)
    return timed


def _references(operator, inputs, device: str, result: dict, widened: dict):
    """The reference's outputs on ``inputs``, or the failed result.
    ``widened`` keeps the wide copies of the inputs after the first, which
    every input set shares (a GEMM's weight, 4 GB in float64): made once."""
    import torch

    # float64 where the device has it cheaply; the CPU reference stays float32.
    wide = torch.float32 if device == "cpu" else torch.float64
    for index, x in enumerate(inputs[1:], 1):
        if widened.get(index, (None,))[0] is not x:
            widened[index] = (x, x.to(wide))
    try:
        references = list(
            operator.reference(
                *[x.to(wide) for x in inputs[:1]],
                *[widened[i][1] for i in range(1, len(inputs))],
            )
        )
    except Exception as exc:
        return set_error(
            result, "infra_error", f"reference failed: {type(exc).__name__}: {exc}"
        )
    problem = compare.reference_problem(inputs, references)
    if problem:
        return set_error(result, "infra_error", problem)
    return references


def _compare(out_specs, outputs, references, tolerance, result) -> str | None:
    """Why ``outputs`` fail against ``references``, or None; the worst
    metrics so far are kept in ``result``."""
    names = [s["name"] for s in out_specs]
    verdict = compare.compare_outputs(names, outputs, references, tolerance)
    metrics = {k: finite_or_none(v) for k, v in verdict.metrics().items()}
    problem = verdict.verdict(tolerance)
    worst = result["metrics"].get("rel_err") or 0.0
    if problem or (metrics["rel_err"] or 0.0) >= worst:
        result["metrics"] = metrics
    return problem


def _time_both(job, operator, kernel, inputs, outputs, device, result) -> dict:
    shape, dtype = job["shape"], job["dtype"]
    kernel_samples = time_kernel(
        kernel, inputs, outputs, device, repeats=job["repeats"]
    )
    reference_samples = time_kernel(
        operator.reference, inputs, [], device, repeats=job["repeats"]
    )
    result["timing_samples"] = {
        "kernel_ms": timing.kept(kernel_samples),
        "reference_ms": timing.kept(reference_samples),
    }
    kernel_ms = timing.median(kernel_samples)
    reference_ms = timing.median(reference_samples)
    timings = {
        "kernel_ms": kernel_ms,
        "reference_ms": reference_ms,
        "speedup": reference_ms / kernel_ms if kernel_ms > 0 else None,
    }
    timings.update(
        timing.throughput(
            flops=operator.flops(shape),
            bytes_moved=operator.bytes_moved(shape, dtype),
            kernel_ms=kernel_ms,
        )
    )
    return timings


def time_kernel(
    kernel,
    inputs,
    outputs,
    device: str,
    *,
    repeats: int | None,
    poison_outputs: bool = False,
) -> list[float]:
    """Milliseconds of timed calls of ``kernel(*inputs, *outputs)``: wall clock on a
    CPU; CUDA events on a GPU (graph replays for short calls), each call on
    the next of several copies of the inputs (together larger than L2).
    ``poison_outputs``: on a CPU every call writes into fresh NaN, outside
    the time taken (on a GPU the TIR check's ban on reading outputs is what
    keeps a timed call from skipping work its output already holds)."""
    if device == "cpu":

        def poison() -> None:
            for out in outputs:
                out.fill_(float("nan"))

        return timing.time_cpu(
            lambda i: kernel(*inputs, *outputs),
            repeats=repeats or DEFAULT_REPEATS["cpu"],
            prepare=poison if poison_outputs else None,
        )
    input_bytes = sum(x.numel() * x.element_size() for x in inputs)
    sets = [inputs] + [
        [x.clone() for x in inputs]
        for _ in range(timing.rotation_sets(input_bytes) - 1)
    ]
    return timing.time_gpu(
        lambda *xs: kernel(*xs, *outputs),
        sets,
        repeats=repeats or DEFAULT_REPEATS["gpu"],
    )


def device_for(target: dict) -> str | None:
    """The torch device a target's kernels run on, if this process has it."""
    import torch

    kind = target["kind"]
    if kind == "c":
        return "cpu"
    if kind in ("cuda", "hip") and torch.cuda.is_available():
        is_hip = getattr(torch.version, "hip", None) is not None
        return "cuda" if is_hip == (kind == "hip") else None
    if kind == "metal" and torch.backends.mps.is_available():
        return "mps"
    return None


@contextmanager
def device_turn(device: str | None, *, shared: bool = False):
    """Hold the device (see DEVICE_LOCK_ENV): alone, to time a kernel, or
    ``shared`` with other children that check outputs, which no timing can
    see, since a turn alone waits until every shared turn ended. Yields the
    seconds waited. Gives back the memory this child cached at the end.

    A child waiting for a turn alone holds a second lock, the turnstile,
    that every new shared turn passes through: a steady stream of checks
    cannot keep the timing waiting for ever."""
    path = os.environ.get(DEVICE_LOCK_ENV)
    if not path or device in (None, "cpu"):
        yield 0.0
        return
    import fcntl

    import torch

    if device == "cuda":
        # The context and cuBLAS handle take about a second to make and run
        # nothing on the device: made before the turn, while another child
        # times, instead of on the one device everyone queues for.
        torch.cuda.init()
        torch.cuda.current_blas_handle()
    asked = time.perf_counter()
    with open(path, "a") as lock, open(path + ".turnstile", "a") as turnstile:
        fcntl.flock(turnstile, fcntl.LOCK_EX)  # behind a child waiting to time
        if shared:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_SH)
        else:
            fcntl.flock(lock, fcntl.LOCK_EX)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield time.perf_counter() - asked
        finally:
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def failing_pass(exc: BaseException) -> str | None:
    """The TileLang/TVM pass that raised, read from the Python frame that ran
    it (``tilelang.transform.LayoutInference()(mod)``)."""
    found = None
    while exc is not None:
        for frame in traceback.extract_tb(exc.__traceback__):
            match = _PASS_CALL.search(frame.line or "")
            if match:
                found = match.group(1)
        exc = exc.__cause__ or exc.__context__
    return found


def _missing_compiler(exc: BaseException) -> bool:
    while exc is not None:
        if (
            isinstance(exc, FileNotFoundError)
            and Path(str(exc.filename)).name in _COMPILERS
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
