"""Submitted kernels: compile and run in one child, judge in another.

``run_submitted`` runs in the untrusted child. It cannot import the operator
library (``block_reference_modules``), so the reference is out of its reach;
it compiles the submitted program, runs it on two input sets drawn from two
seeds (one chosen by the supervisor at random, so outputs cached or
precomputed for one input set fail the other) and writes the raw outputs to
files. Whatever it says about itself is a claim: its "pass" only means
"outputs written". ``judge`` runs in a second child that imports no submitted
code; it draws the same inputs from the same seeds, computes the reference and
compares. Only the judge's verdict can make a result pass.

The untrusted child's timings are advisory: code that runs in its process
can patch its clock.
"""

from __future__ import annotations

import errno
import importlib.abc
import os
import sys
import threading
import time
from pathlib import Path

from runners.harness import isolation, tensors
from runners.harness.result import SUCCESS_FOR_STAGE, new_result, set_error

BLOCKED_MODULES = ("runners.kernels",)
_RESOURCE_ERRNOS = {errno.EFBIG, errno.ENOSPC, errno.EAGAIN, errno.ENOMEM, errno.EDQUOT}


class _BlockReference(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == m or name.startswith(m + ".") for m in BLOCKED_MODULES):
            raise ImportError(f"{name} is not available to submitted kernels")
        return None


def block_reference_modules() -> None:
    sys.meta_path.insert(0, _BlockReference())


class _Integrity:
    """What the harness relies on in the child's process, captured before
    the submitted module is imported and compared after each step it runs."""

    def __init__(self):
        import tilelang

        kernel_module = sys.modules["tilelang.jit.kernel"]
        self.kernel_class = kernel_module.JITKernel
        self.items = {
            "tilelang.compile": (tilelang, "compile", tilelang.compile),
            "tilelang.lower": (tilelang, "lower", tilelang.lower),
            "JITKernel.__call__": (
                self.kernel_class,
                "__call__",
                self.kernel_class.__dict__["__call__"],
            ),
            "time.perf_counter": (time, "perf_counter", time.perf_counter),
            "sys.meta_path": (sys, "meta_path", list(sys.meta_path)),
        }
        self.threads = {t.ident for t in threading.enumerate()}

    def original(self, name: str):
        return self.items[name][2]

    def changed(self, *, outputs_written: bool = False) -> list[str]:
        found = []
        for name, (owner, attribute, original) in self.items.items():
            now = getattr(owner, attribute, None)
            if name == "sys.meta_path":
                same = list(now or []) == original
            elif name == "JITKernel.__call__":
                same = owner.__dict__.get(attribute) is original
            else:
                same = now is original
            if not same:
                found.append(name)
        if any(m in sys.modules for m in BLOCKED_MODULES):
            found.append("the operator library was loaded")
        if not outputs_written:
            return found
        # A thread or a process of its own could rewrite the outputs after
        # the harness wrote them.
        if any(t.ident not in self.threads for t in threading.enumerate()):
            found.append("a Python thread was started")
        if os.getuid() in isolation.UID_RANGE and isolation.processes_of(
            os.getuid()
        ) != [os.getpid()]:
            found.append("another process of the sandbox is still running")
        return found


def run_submitted(
    job: dict,
    *,
    fingerprint: dict,
    workdir: str,
    seeds: list[int],
    inputs: list[dict],
    outputs: list[dict],
    unsupported: str | None,
    on_stage,
) -> dict:
    from runners.harness.stages import CompileFailure, _synchronize, device_for
    from runners.harness.timing import time_cpu

    result = new_result(job)
    result["fingerprint"] = fingerprint
    if unsupported is not None:
        return set_error(result, "unsupported", unsupported)
    integrity = _Integrity()
    started = time.perf_counter()
    try:
        kernel, source = _compile_submitted(job, workdir, result, on_stage, integrity)
    except CompileFailure as failure:
        result["stage_reached"] = failure.stage
        result["timings"]["compile_s"] = time.perf_counter() - started
        exhausted = resource_exhaustion(failure)
        if exhausted:
            return set_error(result, "runtime_error", exhausted)
        status = "infra_error" if failure.missing_compiler else "compile_error"
        return set_error(result, status, str(failure), pass_name=failure.pass_name)
    result["timings"]["compile_s"] = time.perf_counter() - started
    result["kernel_source"] = source or ""
    tampered = integrity.changed()
    if (
        not tampered
        and kernel is not None
        and type(kernel) is not integrity.kernel_class
    ):
        tampered = ["the compiled kernel is not a TileLang JITKernel"]
    if tampered:
        return _tampering(result, tampered)
    if job["stage"] != "validate":
        result["status"] = SUCCESS_FOR_STAGE[job["stage"]]
        return result

    result["stage_reached"] = "validate"
    on_stage("validate")
    device = device_for(job["target"])
    if device is None:
        kind = job["target"]["kind"]
        return set_error(result, "infra_error", f"this runner has no {kind} device")
    out_dir = Path(workdir, "out")
    out_dir.mkdir(exist_ok=True)
    started = time.perf_counter()
    try:
        for input_set, seed in enumerate(seeds):
            args = tensors.seeded_inputs(inputs, seed, device)
            outs = tensors.poisoned_outputs(outputs, device)
            kernel(*args, *outs)
            _synchronize(device)
            for index, out in enumerate(outs):
                path = out_dir / tensors.output_name(input_set, index)
                path.write_bytes(tensors.to_bytes(out))
        if device == "cpu":
            result["timings"]["kernel_ms"] = time_cpu(
                lambda i: kernel(*args, *outs), repeats=job["repeats"] or 5
            )
    except Exception as exc:
        return set_error(result, "runtime_error", f"{type(exc).__name__}: {exc}")
    finally:
        result["timings"]["run_s"] = time.perf_counter() - started
    tampered = integrity.changed(outputs_written=True)
    if tampered:
        return _tampering(result, tampered)
    # "Outputs written": the judge, not this process, decides pass or mismatch.
    result["status"] = "pass"
    return result


def _compile_submitted(job: dict, workdir: str, result: dict, on_stage, integrity):
    """Return (kernel or None, device source) for the job's stage, as
    ``stages._compile`` does for library kernels, with the TileLang entry
    points captured before the submitted module could replace them."""
    from tilelang import tvm

    from runners.harness.stages import CompileFailure, _submitted_program, failing_pass

    target = job["target"]
    result["stage_reached"] = "lower"
    on_stage("lower")
    func = None
    try:
        func = _submitted_program(job, workdir)
        if job["stage"] == "lower" or (
            job["stage"] == "build" and target["kind"] != "c"
        ):
            if job["stage"] == "build":
                on_stage("build")
            tvm_target = tvm.target.Target(target)
            with tvm_target:
                artifact = integrity.original("tilelang.lower")(
                    func,
                    target=tvm_target,
                    enable_device_compile=job["stage"] == "build",
                )
            result["stage_reached"] = job["stage"]
            return None, artifact.kernel_source
        on_stage("build")
        kernel = integrity.original("tilelang.compile")(func, target=target)
    except Exception as exc:
        lowering = func is None or job["stage"] == "lower" or failing_pass(exc)
        raise CompileFailure("lower" if lowering else "build", exc) from exc
    result["stage_reached"] = "build"
    if type(kernel) is not integrity.kernel_class:
        raise TypeError("tilelang.compile returned something other than a JITKernel")
    return kernel, integrity.kernel_class.get_kernel_source(kernel)


def _tampering(result: dict, changed: list[str]) -> dict:
    return set_error(
        result,
        "runtime_error",
        "the submitted code changed the harness it runs in: " + ", ".join(changed),
    )


def resource_exhaustion(exc: BaseException) -> str | None:
    """A limit the sandbox sets (memory, file size, processes) hit while the
    submitted code ran: a runtime error of the kernel, not a compile error."""
    while exc is not None:
        if isinstance(exc, MemoryError):
            return "a sandbox limit was reached: out of memory (MemoryError)"
        if isinstance(exc, OSError) and exc.errno in _RESOURCE_ERRNOS:
            return f"a sandbox limit was reached: {os.strerror(exc.errno)}"
        if isinstance(exc, RuntimeError) and "DefaultCPUAllocator" in str(exc):
            return "a sandbox limit was reached: out of memory"
        exc = exc.__cause__ or exc.__context__
    return None


def judge(job: dict, *, seeds: list[int], outputs_dir: str, on_stage) -> dict:
    """The verdict on outputs an untrusted child wrote for ``seeds``."""
    import dataclasses

    import torch

    from runners import kernels
    from runners.harness import compare, timing

    result = new_result(job)
    operator = kernels.get(job["operator"])
    shape, dtype = job["shape"], job["dtype"]
    tolerance = operator.tolerances.get(dtype)
    if tolerance is None:
        return set_error(
            result, "infra_error", f"{job['operator']} has no tolerance for {dtype}"
        )
    result["tolerance"] = dataclasses.asdict(tolerance)
    result["stage_reached"] = "validate"
    on_stage("validate")
    out_specs = [tensors.spec_dict(s) for s in operator.outputs(shape, dtype)]
    wide = torch.float32 if job["target"]["kind"] == "c" else torch.float64
    worst = None
    for input_set, seed in enumerate(seeds):
        inputs = operator.make_inputs(shape, dtype, seed, "cpu")
        outs = []
        for index, spec in enumerate(out_specs):
            path = Path(outputs_dir, tensors.output_name(input_set, index))
            data = path.read_bytes() if path.is_file() else None
            outs.append(tensors.from_bytes(data, spec))
        references = list(operator.reference(*[x.to(wide) for x in inputs]))
        if not all(torch.isfinite(r).all() for r in references):
            return set_error(
                result, "infra_error", "the reference produced non-finite values"
            )
        verdict = compare.compare_outputs(
            [s["name"] for s in out_specs], outs, references, tolerance
        )
        metrics = verdict.metrics()
        if worst is None or _worse(metrics, worst):
            worst = metrics
        result["metrics"] = {k: _finite_or_none(v) for k, v in worst.items()}
        problem = verdict.verdict(tolerance)
        if problem:
            which = "first" if input_set == 0 else "second"
            return set_error(
                result, "mismatch", f"{problem} (on the {which} input set)"
            )
    result["timings"]["reference_ms"] = timing.time_cpu(
        lambda i: operator.reference(*inputs), repeats=job["repeats"] or 5
    )
    result["status"] = "pass"
    return result


def _worse(a: dict, b: dict) -> bool:
    return (a.get("rel_err") or 0.0) > (b.get("rel_err") or 0.0)


def _finite_or_none(value):
    import math

    return value if isinstance(value, (int, float)) and math.isfinite(value) else None
