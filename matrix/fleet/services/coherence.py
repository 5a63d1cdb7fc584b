"""What a signed result must make sense as before it is stored.

A signature proves which runner sent a result, not that the result is true:
a runner's key holder (or a harness it no longer controls) can sign any
JSON. So the server checks what it can know without running anything:

- the status is one the job's stage can end in (a ``build`` job never
  passes, a ``lower`` job never mismatches);
- every timing and metric is null or a finite, non-negative number below
  a ceiling (``Infinity``, ``-5``, ``1e308``);
- a pass carries the metrics a pass is judged on, and they are within the
  tolerance of the operator and dtype as *this server's* operator library
  has it (runners.kernels), not as the result claims; a timed pass has a
  kernel time above zero;
- a timed pass is no faster than its device's datasheet allows for the
  operator's bytes and flops (runners.kernels.peaks).

Each refusal names the field at fault, as ``result.timings.kernel_ms``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from django.core.exceptions import ValidationError

from matrix.fleet.services.envelopes import shown
from runners import kernels
from runners.harness.result import (
    FAILURES,
    STAGES,
    SUCCESS_FOR_STAGE,
    timing_samples_valid,
)
from runners.harness.timing import SAMPLES_KEPT
from runners.kernels import peaks

# The statuses a job of each stage can end in: its own rung of the ladder
# or a failure. Only a validate job compares outputs, so only it can
# mismatch, be unstable or pass.
REACHABLE = {
    stage: frozenset(
        {SUCCESS_FOR_STAGE[stage], *FAILURES}
        - (set() if stage == "validate" else {"mismatch", "unstable"})
    )
    for stage in STAGES
}

# A job is killed at its budget (TILEMATRIX_JOB_TIMEOUT_S, minutes) and its
# message at the hard time limit: a day is far above any budget a lab would
# set, and far below what only a forger sends (1e308 ms). Rates get a
# thousand times an H200's (989 dense fp16 TFLOP/s, 4.8 TB/s).
SECONDS_MAX = 86_400.0
TIMING_MAX = {
    "compile_s": SECONDS_MAX,
    "run_s": SECONDS_MAX,
    "wall_s": SECONDS_MAX,
    "overhead_s": SECONDS_MAX,
    "kernel_ms": SECONDS_MAX * 1000,
    "reference_ms": SECONDS_MAX * 1000,
    "tflops": 1_000_000.0,
    "gbps": 5_000_000.0,
    "speedup": 1_000_000.0,
}
UNITS = {"kernel_ms": " ms", "reference_ms": " ms"} | {
    k: " s" for k in ("compile_s", "run_s", "wall_s", "overhead_s")
}
# Errors have no ceiling but the float range (a wrong kernel can be wrong by
# any amount); shares and the rounding floor are fractions.
METRIC_MAX = {
    "rel_err": math.inf,
    "max_abs_err": math.inf,
    "mismatch_ratio": 1.0,
    "rounding_floor": 1.0,
}
# Samples are rounded to six digits, and a median of batch medians need not
# equal the median of every call.
SAMPLES_SLACK = 0.01
PASS_METRICS = ("rel_err", "max_abs_err", "mismatch_ratio")

# The harness passes a result whose rel_err is within the tolerance or
# within twice the rounding floor it measured (the error of rounding the
# exact reference to the output dtype: no kernel can beat it). The server
# cannot recompute the floor, so it takes the measured one only up to what
# rounding can cost: twice the unit roundoff of the dtype, and for float16
# four times more, for its subnormals below 6.1e-5 (a softmax over a
# 152k-token vocabulary measured 7.6e-4 on the H200). A result that names
# no floor (older harnesses) is given the cap.
ROUNDING_FLOOR_MAX = {"float16": 2**-9, "bfloat16": 2**-7, "float32": 2**-23}


def _numbers(raw: dict, part: str, ceilings: dict) -> dict:
    """The known numbers of ``raw[part]``, each null or finite, at least 0
    and at most its ceiling; anything else is refused naming it."""
    values = raw.get(part) or {}
    clean = {}
    for key, ceiling in ceilings.items():
        value = values.get(key)
        if value is None:
            clean[key] = None
            continue
        where = f"result.{part}.{key}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValidationError(
                f"{where} must be a number or null, got {shown(value)}"
            )
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number) or not 0 <= number <= ceiling:
            top = "" if math.isinf(ceiling) else f" and at most {ceiling:g}"
            unit = UNITS.get(key, "")
            raise ValidationError(
                f"{where} must be a finite number of at least 0{top}{unit}, "
                f"got {shown(value)}"
            )
        clean[key] = number
    return clean


def _physically_possible(
    operator: str, shape: dict, dtype: str, kernel_ms: float, device: tuple
) -> None:
    peak = peaks.device_peak(*device)
    try:
        library_operator = kernels.get(operator)
    except KeyError:
        return
    if peak is None:
        return
    why = peaks.implausible(
        operator=library_operator,
        shape=shape,
        dtype=dtype,
        kernel_ms=kernel_ms,
        peak=peak,
    )
    if why:
        raise ValidationError(f"result.timings.kernel_ms is implausible: {why}")


@functools.cache
def _tolerance_fields(tolerance) -> tuple:
    # dataclasses.asdict copies deeply: a tenth of a result's ingest.
    return tuple(dataclasses.asdict(tolerance).items())


def _as_dict(tolerance) -> dict:
    return dict(_tolerance_fields(tolerance))


def _server_tolerance(operator: str, dtype: str):
    try:
        return kernels.get(operator).tolerances.get(dtype)
    except KeyError:
        return None


def result_check(
    *,
    stage: str,
    operator: str,
    dtype: str,
    raw: dict,
    shape: dict | None = None,
    device: tuple[str, str] | None = None,
) -> dict | None:
    """Refuse (ValidationError naming the field) a result that its job's
    stage cannot produce, whose numbers make no sense, or whose kernel time
    is faster than its device (``(model, backend)``) can do the ``shape``;
    return this server's tolerance for the cell, as a dict, or None where it
    has none."""
    status = raw.get("status")
    if status not in REACHABLE[stage]:
        allowed = ", ".join(sorted(REACHABLE[stage]))
        raise ValidationError(
            f"result.status {status!r} cannot come from a {stage} job "
            f"(it ends {allowed})"
        )
    reached = raw.get("stage_reached")
    if reached and reached not in STAGES[: STAGES.index(stage) + 1]:
        raise ValidationError(
            f"result.stage_reached {shown(reached)} is beyond the job's stage {stage}"
        )
    timings = _numbers(raw, "timings", TIMING_MAX)
    metrics = _numbers(raw, "metrics", METRIC_MAX)
    tolerance = _server_tolerance(operator, dtype)
    if status != "pass":
        return _as_dict(tolerance) if tolerance else None
    for key in PASS_METRICS:
        if metrics[key] is None:
            raise ValidationError(
                f"result.metrics.{key} is missing: a pass is judged on "
                f"{', '.join(PASS_METRICS)}"
            )
    for key in ("kernel_ms", "reference_ms"):
        if timings[key] == 0:
            raise ValidationError(
                f"result.timings.{key} of a timed pass must be above 0"
            )
    if timings["kernel_ms"] and shape is not None and device is not None:
        _physically_possible(operator, shape, dtype, timings["kernel_ms"], device)
    if tolerance is None:
        raise ValidationError(
            f"result.status 'pass' cannot be checked: this server has no "
            f"tolerance for {operator} in {dtype}"
        )
    cap = ROUNDING_FLOOR_MAX.get(dtype, 0.0)
    floor = cap if metrics["rounding_floor"] is None else metrics["rounding_floor"]
    bound = max(tolerance.rel_err, 2 * min(floor, cap))
    if metrics["rel_err"] > bound:
        raise ValidationError(
            f"result.metrics.rel_err {metrics['rel_err']:.3g} is above the "
            f"tolerance of {operator} in {dtype} ({bound:.3g}): not a pass"
        )
    if metrics["mismatch_ratio"] > tolerance.max_mismatch_ratio:
        raise ValidationError(
            f"result.metrics.mismatch_ratio {metrics['mismatch_ratio']:.3g} is above "
            f"the tolerance of {operator} in {dtype} "
            f"({tolerance.max_mismatch_ratio:g}): not a pass"
        )
    return _as_dict(tolerance)


def samples_check(raw: dict) -> dict:
    """A pass's timing samples as details keep them (``kernel_ms_samples``,
    ``reference_ms_samples``), or nothing. Refused when malformed, or when
    the median a result states lies outside its own samples: the gate tests
    the samples, and a runner must not send one figure to be shown and
    others to be judged."""
    samples = raw.get("timing_samples")
    if raw.get("status") != "pass" or samples is None:
        return {}
    if not timing_samples_valid(samples):
        raise ValidationError(
            "result.timing_samples must hold kernel_ms and reference_ms lists "
            f"of 2 to {SAMPLES_KEPT} positive milliseconds, got {shown(samples)}"
        )
    kept = {}
    timings = raw.get("timings") or {}
    for key, values in samples.items():
        stated = timings.get(key)
        if stated is None:
            continue
        if (
            not min(values) * (1 - SAMPLES_SLACK)
            <= stated
            <= max(values) * (1 + SAMPLES_SLACK)
        ):
            raise ValidationError(
                f"result.timings.{key} {stated:.4g} ms lies outside its own "
                f"samples ({min(values):.4g}-{max(values):.4g} ms)"
            )
        kept[f"{key}_samples"] = [float(v) for v in values]
    return kept
