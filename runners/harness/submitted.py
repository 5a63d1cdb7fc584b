"""A submitted kernel in three processes, so that no submitted Python runs
where the kernel is timed or judged.

``build`` runs in the *builder*: it imports the submitted module, calls its
``program(shape, dtype, target)`` and writes the PrimFunc as TVM JSON, size
capped. Whatever else it says or does stays in that process: the supervisor
keeps only the file (or its failure).

``execute`` runs in the *executor*, which never imports submitted code: it
loads the JSON with TVM's structural loader, checks it is a PrimFunc taking
the operator's tensors, lowers and builds it for the job's stage, runs it on
the input files the judge wrote, writes the outputs and times the kernel.
The kernel's own native code runs there, so its timing is the kernel's to
skew; its outputs are only outputs.

``judge`` runs in the *judge*, which never imports submitted code nor runs
the kernel: it draws the two input sets (the second from a seed the
supervisor drew at random), writes them for the executor, computes the
reference, waits for the outputs and decides pass or mismatch.

The executor and the judge start beside the builder and wait (``wait_for_go``)
until what they need is there.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib.util
import os
import time
from pathlib import Path

from runners.harness import compare, distributions, tensors, timing
from runners.harness.result import (
    KERNEL_SOURCE_CAP,
    SUCCESS_FOR_STAGE,
    cap_text,
    new_result,
    set_error,
)
from runners.harness.stages import (
    CompileFailure,
    compile_program,
    device_for,
    failing_pass,
    finite_or_none,
    synchronize,
    time_kernel,
)
from runners.harness.tir_check import tir_check

PROGRAM_NAME = "program.json"
PROGRAM_CAP = 16 * 2**20
# A refusal names this many constructs at most: the message has a cap too.
MAX_REFUSALS_SHOWN = 5
# The builder's "done": its program is written. Never a result of its own.
PROGRAM_WRITTEN = "lowered"
_RESOURCE_ERRNOS = {errno.EFBIG, errno.ENOSPC, errno.EAGAIN, errno.ENOMEM, errno.EDQUOT}


class ProgramRefused(Exception):
    """The builder's JSON is not a PrimFunc taking the operator's tensors."""


def build(job: dict, *, fingerprint: dict, workdir: str, on_stage) -> dict:
    """Import the submitted source, call its program() and write the
    PrimFunc as TVM JSON to ``out/program.json``."""
    from tilelang import tvm

    result = new_result(job)
    result["fingerprint"] = fingerprint
    result["stage_reached"] = "lower"
    on_stage("lower")
    try:
        func = _submitted_program(job, workdir)
        if not isinstance(func, _prim_func_class()):
            raise TypeError(
                f"program() returned {type(func).__name__}, not a TileLang PrimFunc"
            )
        text = tvm.ir.save_json(func)
    except Exception as exc:
        exhausted = resource_exhaustion(exc)
        if exhausted:
            return set_error(result, "runtime_error", exhausted)
        return set_error(
            result,
            "compile_error",
            f"{type(exc).__name__}: {exc}",
            pass_name=failing_pass(exc),
        )
    if len(text) > PROGRAM_CAP:
        return set_error(
            result,
            "compile_error",
            f"the program is {len(text) / 2**20:.1f} MB of TVM JSON, "
            f"more than {PROGRAM_CAP // 2**20} MB",
        )
    out = Path(workdir, "out")
    out.mkdir(exist_ok=True)
    partial = out / (PROGRAM_NAME + ".partial")
    partial.write_text(text)
    partial.rename(out / PROGRAM_NAME)
    result["status"] = PROGRAM_WRITTEN
    return result


def _submitted_program(job: dict, workdir: str):
    """Import the submitted text as a module and call its ``program``. It lives
    in a real file because TileLang reads a kernel's source to parse it."""
    path = Path(workdir) / "submitted_kernel.py"
    path.write_text(job["source"])
    spec = importlib.util.spec_from_file_location("submitted_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "program", None)):
        raise TypeError("the submitted source defines no program(shape, dtype, target)")
    return module.program(job["shape"], job["dtype"], job["target"])


def _prim_func_class():
    from tilelang import tvm

    tir = getattr(tvm, "tirx", None) or tvm.tir
    return tir.PrimFunc


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


def load_program(path: str, in_specs: list[dict], out_specs: list[dict]):
    """The PrimFunc in the TVM JSON at ``path``, checked against the tensors
    the operator passes and against what a kernel may contain (tir_check)."""
    from tilelang import tvm

    try:
        with open(path, encoding="utf-8") as stream:
            text = stream.read(PROGRAM_CAP + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise ProgramRefused(f"the builder's program cannot be read: {exc}") from None
    if len(text) > PROGRAM_CAP:
        raise ProgramRefused("the builder's program is over the size cap")
    try:
        func = tvm.ir.load_json(text)
    except Exception as exc:
        raise ProgramRefused(
            f"the builder's program is not TVM JSON: {type(exc).__name__}"
        ) from None
    if not isinstance(func, _prim_func_class()):
        raise ProgramRefused(
            f"the builder's program is a {type(func).__name__}, not a PrimFunc"
        )
    _check_parameters(func, in_specs + out_specs)
    refusals = tir_check(func, outputs=len(out_specs))
    if refusals:
        raise ProgramRefused("; ".join(str(r) for r in refusals[:MAX_REFUSALS_SHOWN]))
    return func


def _check_parameters(func, specs: list[dict]) -> None:
    names = ", ".join(s["name"] for s in specs)
    if len(func.params) != len(specs):
        raise ProgramRefused(
            f"program() takes {len(func.params)} parameters; the operator passes "
            f"{len(specs)} tensors ({names})"
        )
    for param, spec in zip(func.params, specs, strict=True):
        buffer = func.buffer_map.get(param)
        if buffer is None:
            raise ProgramRefused(
                f"parameter {param.name} is not a tensor; the operator passes "
                f"{spec['name']} {spec['shape']} {spec['dtype']}"
            )
        dims = [getattr(d, "value", None) for d in buffer.shape]
        static = all(isinstance(d, int) for d in dims)
        if str(buffer.dtype) != spec["dtype"] or (static and dims != spec["shape"]):
            shown = dims if static else [str(d) for d in buffer.shape]
            raise ProgramRefused(
                f"parameter {buffer.name} is {shown} {buffer.dtype}; the operator "
                f"passes {spec['name']} as {spec['shape']} {spec['dtype']}"
            )


def execute(
    job: dict,
    *,
    fingerprint: dict,
    workdir: str,
    on_stage,
    wait_for_go,
    spec: dict,
) -> dict:
    """Compile the builder's program for the job's stage; for validate, run
    it on each input set the judge wrote and write the outputs, then time
    it. "pass" here only means "outputs written": the judge decides."""
    result = new_result(job)
    result["fingerprint"] = fingerprint
    if spec.get("unsupported"):
        return set_error(result, "unsupported", spec["unsupported"])
    if not wait_for_go():
        return set_error(result, "infra_error", "the supervisor stopped the job")
    in_specs, out_specs = spec["inputs"], spec["outputs"]
    started = time.perf_counter()
    try:
        kernel, source = compile_program(
            job,
            lambda: load_program(spec["program"], in_specs, out_specs),
            result,
            on_stage,
        )
    except CompileFailure as failure:
        result["stage_reached"] = failure.stage
        result["timings"]["compile_s"] = time.perf_counter() - started
        status = "infra_error" if failure.missing_compiler else "compile_error"
        return set_error(result, status, str(failure), pass_name=failure.pass_name)
    result["timings"]["compile_s"] = time.perf_counter() - started
    result["kernel_source"] = source or ""
    if job["stage"] != "validate":
        result["status"] = SUCCESS_FOR_STAGE[job["stage"]]
        return result

    result["stage_reached"] = "validate"
    # The source the cell page shows leaves this process before the kernel
    # first runs: the kernel's native code may write past its buffers, and
    # the supervisor keeps this copy, not the one in the result.
    on_stage("validate", kernel_source=cap_text(source or "", KERNEL_SOURCE_CAP))
    device = device_for(job["target"])
    if device is None:
        kind = job["target"]["kind"]
        return set_error(result, "infra_error", f"this runner has no {kind} device")
    out_dir = Path(workdir, "out")
    out_dir.mkdir(exist_ok=True)
    started = time.perf_counter()
    try:
        timed = None
        for input_set in range(spec["input_sets"]):
            args = []
            for index, tensor_spec in enumerate(in_specs):
                name = tensors.input_name(input_set, index)
                tensor = tensors.read_tensor(
                    Path(spec["inputs_dir"], name), tensor_spec, device
                )
                if tensor is None:
                    return set_error(result, "infra_error", f"input {name} is missing")
                args.append(tensor)
            for run in range(compare.VALIDATION_RUNS):
                outs = tensors.poisoned_outputs(out_specs, device)
                kernel(*args, *outs)
                synchronize(device)
                for index, out in enumerate(outs):
                    name = tensors.output_name(tensors.run_set(input_set, run), index)
                    tensors.write_tensor(out_dir / name, out)
            if timed is None:
                timed = (args, outs)
        args, outs = timed
        for out in outs:
            out.fill_(float("nan"))
        samples = time_kernel(
            kernel, args, outs, device, repeats=job["repeats"], poison_outputs=True
        )
        result["timings"]["kernel_ms"] = timing.median(samples)
        result["timing_samples"] = {"kernel_ms": timing.kept(samples)}
        synchronize(device)
        for index, out in enumerate(outs):
            tensors.write_tensor(
                out_dir / tensors.output_name(tensors.TIMED_SET, index), out
            )
    except Exception as exc:
        return set_error(result, "runtime_error", f"{type(exc).__name__}: {exc}")
    finally:
        result["timings"]["run_s"] = time.perf_counter() - started
    result["status"] = "pass"
    return result


def judge(
    job: dict,
    *,
    fingerprint: dict,
    workdir: str,
    on_stage,
    wait_for_go,
    spec: dict,
) -> dict:
    """Write the input sets ``spec["input_sets"]`` names, compute the
    reference, wait for the executor's outputs and compare."""
    import torch

    from runners import kernels

    result = new_result(job)
    result["fingerprint"] = fingerprint
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
    sets, labels = [], []
    for input_set, drawn in enumerate(spec["input_sets"]):
        distribution = tensors.Distribution(**drawn["distribution"])
        inputs = distributions.draw(
            operator, shape, dtype, drawn["seed"], "cpu", distribution
        )
        for index, tensor in enumerate(inputs):
            name = tensors.input_name(input_set, index)
            tensors.write_tensor(Path(spec["inputs_dir"], name), tensor)
        references = list(operator.reference(*[x.to(wide) for x in inputs]))
        problem = compare.reference_problem(inputs, references)
        if problem:
            return set_error(result, "infra_error", problem)
        sets.append((inputs, references))
        labels.append(_input_set_label(input_set, distribution))
    if not wait_for_go():
        return set_error(result, "infra_error", "the supervisor stopped the job")

    worst = None
    runs = [
        [tensors.run_set(input_set, run) for run in range(compare.VALIDATION_RUNS)]
        for input_set in range(len(sets))
    ]
    checked = [*zip(runs, sets, strict=True), ([tensors.TIMED_SET], sets[0])]
    labels.append("on the first input set, as the timed calls left it")
    for (names, (_, references)), label in zip(checked, labels, strict=True):
        problems, first = [], None
        for name in names:
            outs = []
            for index, out_spec in enumerate(out_specs):
                path = Path(spec["outputs_dir"], tensors.output_name(name, index))
                out = tensors.read_tensor(path, out_spec)
                if out is None:  # never written
                    out = tensors.poisoned_outputs([out_spec], "cpu")[0]
                outs.append(out)
            if first is not None and compare.same_outputs(outs, first):
                problems.append(problems[0])  # the first run's verdict, again
                continue
            first = first if first is not None else outs
            verdict = compare.compare_outputs(
                [s["name"] for s in out_specs], outs, references, tolerance
            )
            metrics = verdict.metrics()
            if worst is None or (metrics["rel_err"] or 0) > (worst["rel_err"] or 0):
                worst = metrics
            result["metrics"] = {k: finite_or_none(v) for k, v in worst.items()}
            problems.append(verdict.verdict(tolerance))
        failed = compare.repeated_verdict(problems)
        if failed:
            status, message = failed
            return set_error(result, status, f"{message} ({label})")
    samples = _time_reference(job, operator, sets[0][0])
    if samples:
        result["timings"]["reference_ms"] = timing.median(samples)
        result["timing_samples"] = {"reference_ms": timing.kept(samples)}
    result["distributions"] = [
        d.label for d in distributions.checked_on(job["operator"])
    ]
    result["status"] = "pass"
    return result


def _input_set_label(input_set: int, distribution) -> str:
    if input_set < 2:
        return f"on the {('first', 'second')[input_set]} input set"
    return f"on {distribution.label} inputs"


def _time_reference(job: dict, operator, inputs) -> list[float] | None:
    """The reference's timings on the kernel's device; None where this
    process has no such device (a CPU time is no measure of a GPU kernel)."""
    device = device_for(job["target"])
    if device is None:
        return None
    inputs = [x.to(device) for x in inputs]
    return time_kernel(operator.reference, inputs, [], device, repeats=job["repeats"])
