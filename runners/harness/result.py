"""The result object: status ladder, stages and the shape every result has.

Shared by the supervisor and the child so that both build the same keys::

    status          lowered < built < pass, or compile_error, mismatch,
                    runtime_error, timeout, unsupported, infra_error
    stage_reached   the last stage entered: lower, build, validate (None when
                    nothing ran, e.g. unsupported)
    metrics         rel_err (norm-relative), max_abs_err, mismatch_ratio;
                    None where not measured or not finite
    timings         compile_s (program + lower + build), run_s (the validate
                    stage), kernel_ms and reference_ms (medians), speedup
                    (reference / kernel), tflops, gbps, wall_s (this job's
                    share of the supervisor's clock, the child's start
                    included for the first job of a child), overhead_s
                    (wall_s - compile_s - run_s)
    error           None, or signature, message (sanitized, at most 8 KB),
                    pass_name
    fingerprint     hash (toolchain only) and components (device too)
    kernel_source   generated device code, at most 64 KB
    tolerance       rel_err, atol, rtol, max_mismatch_ratio, reason
    timing_samples  kernel_ms and reference_ms: up to 32 of the timed
                    calls' milliseconds each (timing.kept), for the gate's
                    speed statistics; None where nothing was timed
    sandbox         what confined the child ("full: ..."), or what it lacked
    operator, shape, dtype, target, stage, seed, source_sha256: the job

A submitted kernel's result also has ``timing_trust``: how far its timings
can be trusted (the kernel ran, and was timed, in a process of its own).
"""

from __future__ import annotations

import itertools
import math
import re

from runners.harness.timing import SAMPLES_KEPT

STAGES = ("lower", "build", "validate")

# Success ladder: lowered < built < pass. Only "pass" is validation.
SUCCESS_FOR_STAGE = {"lower": "lowered", "build": "built", "validate": "pass"}
FAILURES = (
    "compile_error",
    "mismatch",
    # right on some runs of an input set and wrong on others (a race)
    "unstable",
    "runtime_error",
    "timeout",
    "unsupported",
    "infra_error",
)
STATUSES = ("lowered", "built", "pass", *FAILURES)

KERNEL_SOURCE_CAP = 64 * 1024
MESSAGE_CAP = 8 * 1024

# A line that says what failed: a compiler's "error:" or "fatal", Python's
# "...Error: ...".
_DIAGNOSTIC = re.compile(r"error|fatal", re.IGNORECASE)

METRIC_KEYS = ("rel_err", "max_abs_err", "mismatch_ratio")
TIMING_KEYS = (
    "compile_s",
    "run_s",
    "kernel_ms",
    "reference_ms",
    "speedup",
    "tflops",
    "gbps",
    "wall_s",
    "overhead_s",
)


def timing_samples_valid(samples) -> bool:
    """``timing_samples`` as a result may carry it: kernel_ms and/or
    reference_ms, each 2 to SAMPLES_KEPT positive, finite milliseconds."""
    if not isinstance(samples, dict) or not set(samples) <= {
        "kernel_ms",
        "reference_ms",
    }:
        return False
    return all(
        isinstance(values, list)
        and 2 <= len(values) <= SAMPLES_KEPT
        and all(
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and math.isfinite(v)
            and v > 0
            for v in values
        )
        for values in samples.values()
    )


def new_result(job: dict) -> dict:
    """An empty result for ``job`` (a parsed job dict), with the job echoed."""
    return {
        "status": None,
        "stage_reached": None,
        "metrics": dict.fromkeys(METRIC_KEYS),
        "timings": dict.fromkeys(TIMING_KEYS),
        "error": None,
        "fingerprint": {"hash": None, "components": {}},
        "kernel_source": None,
        "tolerance": None,
        "sandbox": None,
        # The input distributions a validate job was checked on, in order.
        "distributions": None,
        "timing_samples": None,
        "operator": job["operator"],
        "shape": job["shape"],
        "dtype": job["dtype"],
        "target": job["target"],
        "stage": job["stage"],
        "seed": job["seed"],
        "source_sha256": job.get("source_sha256"),
    }


def set_error(
    result: dict, status: str, message: str, *, pass_name: str | None = None
) -> dict:
    """Mark ``result`` failed. The signature is filled in by the supervisor,
    after sanitizing, so it groups on the text a user will see."""
    assert status in FAILURES, status
    result["status"] = status
    result["error"] = {"signature": None, "message": message, "pass_name": pass_name}
    return result


def cap_text(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    kept = data[:limit].decode(errors="ignore")
    return f"{kept}\n/* truncated: {len(data)} bytes in all */"


def cap_message(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` bytes, keeping the lines that explain a
    failure: the first, those that name an error (in order), then as many of
    the last as fit. A device compiler's message starts with the generated
    source and ends with the compiler's own lines, so cutting its tail off
    would keep only source."""
    if len(text.encode()) <= limit:
        return text
    lines = [_cap_line(line, limit // 4) for line in text.split("\n")]
    diagnostics = [i for i, line in enumerate(lines) if _DIAGNOSTIC.search(line)]
    # A marker line stands for each run of cut lines: one may come before
    # the first line kept and each diagnostic, and one before the last lines
    # (or at the very end, when none of them fit).
    marker_bytes = len(_cut_marker(len(lines)).encode()) + 1
    wanted = [(i, marker_bytes) for i in [0, *diagnostics]]
    wanted += [(i, 0) for i in range(len(lines) - 1, 0, -1)]
    kept: set[int] = set()
    used = marker_bytes
    for i, marker in wanted:
        if i in kept:
            continue
        used += len(lines[i].encode()) + 1 + marker
        if used > limit:
            break
        kept.add(i)
    out = []
    for keep, run in itertools.groupby(range(len(lines)), key=kept.__contains__):
        indices = list(run)
        out += [lines[i] for i in indices] if keep else [_cut_marker(len(indices))]
    return "\n".join(out)


def _cap_line(line: str, limit: int) -> str:
    data = line.encode()
    if len(data) <= limit:
        return line
    marker = " [cut]"
    return data[: limit - len(marker)].decode(errors="ignore") + marker


def _cut_marker(lines: int) -> str:
    return f"[{lines} lines cut]"
