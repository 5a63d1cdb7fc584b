"""Compare kernel outputs with the reference: metrics and a verdict.

Pure functions over torch tensors. The outputs were poisoned with NaN before
the kernel ran, so a NaN left in an output is either unwritten memory or a NaN
the kernel produced: neither may pass.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Comparison:
    rel_err: float
    max_abs_err: float
    mismatch_ratio: float
    problem: str | None  # why it fails regardless of the bounds, or None
    # The error of the reference itself rounded to the output dtype: no kernel
    # writing that dtype can do better (e.g. fp16 subnormals in a softmax over
    # a 128k vocabulary), so the bound never drops below twice this floor.
    rounding_floor: float = 0.0

    def metrics(self) -> dict:
        return {
            "rel_err": self.rel_err,
            "max_abs_err": self.max_abs_err,
            "mismatch_ratio": self.mismatch_ratio,
            "rounding_floor": self.rounding_floor,
        }

    def verdict(self, tolerance) -> str | None:
        """None when within ``tolerance``, else the reason it is a mismatch."""
        if self.problem:
            return self.problem
        bound = max(tolerance.rel_err, 2 * self.rounding_floor)
        if self.rel_err > bound:
            return f"relative error {self.rel_err:.3g} above {bound:.3g}"
        if self.mismatch_ratio > tolerance.max_mismatch_ratio:
            return (
                f"{self.mismatch_ratio:.3g} of elements mismatch, "
                f"above {tolerance.max_mismatch_ratio:g}"
            )
        return None


def reference_problem(inputs, references) -> str | None:
    """Why the reference's outputs cannot judge a kernel, or None: a NaN
    that no input held, or an infinity that no input held (it overflowed).
    Infinite or NaN inputs (the ``infinities`` and ``nan`` distributions)
    may give infinite or NaN results: the reference defines them, and the
    kernel must match them."""
    import torch

    if any(torch.isnan(r).any() for r in references) and not any(
        torch.isnan(x).any() for x in inputs
    ):
        return "the reference produced NaN"
    if not all(torch.isfinite(r).all() for r in references) and all(
        torch.isfinite(x).all() for x in inputs
    ):
        return "the reference produced non-finite values from finite inputs"
    return None


def compare_one(name: str, out, ref, tolerance) -> Comparison:
    """Compare one output tensor with its reference (any float dtypes)."""
    import torch

    wide = ref.dtype if ref.dtype == torch.float64 else torch.float32
    out_dtype = out.dtype
    out = out.detach().to(device=ref.device, dtype=wide)
    ref = ref.detach().to(dtype=wide)
    if out.shape != ref.shape:
        return Comparison(
            float("inf"),
            float("inf"),
            1.0,
            f"{name} has shape {list(out.shape)}, the reference {list(ref.shape)}",
        )
    if not out.numel():
        return Comparison(0.0, 0.0, 0.0, None)
    total = out.numel()
    figures = (
        _figures_finite(out, ref, out_dtype, tolerance)
        if bool(torch.isfinite(ref).all())
        else _figures(out, ref, out_dtype, tolerance)
    )
    ref_norm, floor_norm, err_norm, diff_max, out_max = figures[:5]
    mismatch_count, accounted, nan_count, out_nan_count = map(int, figures[5:9])
    missed_count, missed_nan_count, inf_count, nan_ref_count = map(int, figures[9:])
    mismatch_ratio = mismatch_count / total
    floor = floor_norm / ref_norm if ref_norm > 0 and out_dtype != wide else 0.0
    if accounted == total:
        rel_err = err_norm / ref_norm if ref_norm > 0 else err_norm
        max_abs_err = diff_max
    else:
        rel_err = max_abs_err = float("inf")
    problem = None
    if out_nan_count == total:
        # The poison is NaN: a kernel that wrote NaN everywhere reads the same.
        problem = f"{name} is NaN everywhere (never written, or written as NaN)"
    elif nan_count:
        problem = f"{name} has {nan_count} of {total} elements NaN"
    elif missed_nan_count:
        problem = (
            f"{name} is not NaN at {missed_nan_count} of {nan_ref_count} places "
            "where the reference is (a NaN input was dropped)"
        )
    elif missed_count:
        problem = (
            f"{name} is not the reference's infinity at {missed_count} of "
            f"{inf_count} places"
        )
    elif accounted != total:
        problem = f"{name} has infinite values"
    elif ref_norm > 0 and not out_max > 0:
        problem = f"{name} is all zeros and the reference is not"
    return Comparison(rel_err, max_abs_err, mismatch_ratio, problem, floor)


def _figures(out, ref, out_dtype, tolerance) -> list[float]:
    """``compare_one``'s figures, in float64 (a count stays exact past
    2**24) and read with one wait for the device: the norms of the
    reference, its rounding and the error, the largest error and output,
    then the counts of mismatched, accounted-for, wrongly NaN and NaN
    outputs, of the reference's infinities and NaNs missed, and of them
    all."""
    import torch

    wide = ref.dtype
    # Where the reference is infinite (an add of an infinite input), the
    # kernel must give the same infinity, and where it is NaN (a NaN input)
    # NaN; elsewhere its error is measured. A NaN there may be the poison
    # left unwritten: it is the right answer either way.
    ref_inf = torch.isinf(ref)
    ref_nan = torch.isnan(ref)
    out_nan = torch.isnan(out)
    inf_right = ref_inf & (out == ref)
    nan_right = ref_nan & out_nan
    measured = ~ref_inf & ~ref_nan
    ref = torch.where(measured, ref, 0.0)
    finite = torch.isfinite(out)
    diff = torch.where(measured & finite, out - ref, 0.0).abs()
    ref_norm = torch.linalg.vector_norm(ref)
    ref_rms = ref_norm / measured.sum().clamp_min(1).to(wide).sqrt()
    bound = _bound(ref, ref_rms, tolerance)
    missed = ref_inf & ~inf_right
    missed_nan = ref_nan & ~nan_right
    mismatched = missed | missed_nan | (measured & ~finite) | (diff > bound)
    return _read(
        [
            ref_norm,
            _rounding_norm(ref, out_dtype),
            torch.linalg.vector_norm(diff),
            diff.max(),
            torch.where(measured, out, 0.0).abs().max(),
        ],
        [
            mismatched,
            finite | inf_right | nan_right,
            out_nan & ~ref_nan,
            out_nan,
            missed,
            missed_nan,
            ref_inf,
            ref_nan,
        ],
    )


def _figures_finite(out, ref, out_dtype, tolerance) -> list[float]:
    """``_figures`` where every reference element is finite, the usual
    case, in fewer passes over the tensors: with no infinity or NaN to
    match, every element is measured. A large softmax's output is 4 GB in
    float64, and each pass is a read and a write of it inside the device
    turn every other job waits for."""
    import torch

    nonfinite = ~torch.isfinite(out)
    out_nan = torch.isnan(out)
    diff = (out - ref).abs_().masked_fill_(nonfinite, 0.0)
    ref_norm = torch.linalg.vector_norm(ref)
    ref_rms = ref_norm / torch.tensor(float(out.numel()), dtype=ref.dtype).sqrt()
    mismatched = (diff > _bound(ref, ref_rms, tolerance)) | nonfinite
    low, high = torch.aminmax(out)
    nothing = torch.zeros((), dtype=torch.bool, device=out.device)
    return _read(
        [
            ref_norm,
            _rounding_norm(ref, out_dtype),
            torch.linalg.vector_norm(diff),
            diff.max(),
            torch.maximum(low.abs(), high.abs()),
        ],
        [mismatched, ~nonfinite, out_nan, out_nan, nothing, nothing, nothing, nothing],
    )


def _rounding_norm(ref, out_dtype):
    """The norm of what the (measured) reference loses rounded to the
    output's dtype."""
    import torch

    if out_dtype == ref.dtype:
        return torch.zeros((), dtype=ref.dtype, device=ref.device)
    return torch.linalg.vector_norm(ref.to(out_dtype).to(ref.dtype).sub_(ref))


def _bound(ref, ref_rms, tolerance):
    # atol is an error for outputs of about unit size; where the outputs are
    # larger (a matmul of inputs scaled toward the dtype's limit, a row of
    # outlier channels) it grows with their root mean square, so a verdict
    # does not change with the units: an element that cancels to near zero
    # is held to the same error relative to its row's terms.
    return ref.abs().mul_(tolerance.rtol).add_(tolerance.atol * ref_rms.clamp_min(1.0))


def _read(values: list, masks: list) -> list[float]:
    """The values, then the masks' counts, with one wait for the device."""
    import torch

    return torch.stack(
        [t.double() for t in values] + [t.sum().double() for t in masks]
    ).tolist()


def compare_outputs(names, outs, refs, tolerance) -> Comparison:
    """Compare every output; the worst metric of any output is reported."""
    if not len(names) == len(outs) == len(refs):
        return Comparison(
            float("inf"),
            float("inf"),
            1.0,
            f"the reference returned {len(refs)} outputs, the operator declares "
            f"{len(names)}",
        )
    parts = [
        compare_one(n, o, r, tolerance)
        for n, o, r in zip(names, outs, refs, strict=True)
    ]
    failing = [p for p in parts if p.verdict(tolerance)]
    return Comparison(
        rel_err=max(p.rel_err for p in parts),
        max_abs_err=max(p.max_abs_err for p in parts),
        mismatch_ratio=max(p.mismatch_ratio for p in parts),
        problem=next((p.problem for p in failing if p.problem), None),
        rounding_floor=max(p.rounding_floor for p in parts),
    )


# Every input set is run this many times, each into fresh poisoned outputs:
# a kernel with a race is right on some runs and wrong on others.
VALIDATION_RUNS = 3


def same_outputs(outs, earlier) -> bool:
    """Whether ``outs`` hold what ``earlier`` held, element for element (a
    NaN never counts as the same). A run that repeats an earlier run's
    outputs repeats its comparison, which is then not made again: compared
    in float64 over every element, three runs of each input distribution
    were 29% of the served cells' validation on the H100, 2.5 s of a large
    GEMM's 4.2 s."""
    import torch

    return len(outs) == len(earlier) and all(
        o.dtype == e.dtype and o.shape == e.shape and torch.equal(o, e)
        for o, e in zip(outs, earlier, strict=True)
    )


def repeated_verdict(problems: list[str | None]) -> tuple[str, str] | None:
    """The verdict of several runs on one input set, from each run's problem
    (None where it matched): None when every run matched, ``mismatch`` when
    every run failed, ``unstable`` with the failure rate and its 95% Wilson
    interval when some did."""
    failed = [p for p in problems if p]
    if not failed:
        return None
    if len(failed) == len(problems):
        return "mismatch", failed[0]
    low, high = wilson_interval(len(failed), len(problems))
    return (
        "unstable",
        f"{len(failed)} of {len(problems)} runs wrong, failure rate "
        f"{len(failed) / len(problems):.0%} (95% interval {low:.0%}-{high:.0%}): "
        f"{failed[0]}",
    )


def wilson_interval(failures: int, runs: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a failure rate seen as ``failures`` of
    ``runs``: honest at a handful of runs, where the normal one is not."""
    rate = failures / runs
    denominator = 1 + z * z / runs
    centre = (rate + z * z / (2 * runs)) / denominator
    half = z * ((rate * (1 - rate) / runs + z * z / (4 * runs * runs)) ** 0.5)
    half /= denominator
    return max(0.0, centre - half), min(1.0, centre + half)
