"""The verdict: within the bounds passes; NaN, unwritten, infinite or all-zero
outputs never pass, however loose the bounds."""

from __future__ import annotations

from math import inf, nan

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runners.harness.compare import _figures, _figures_finite, compare_outputs
from runners.kernels.base import Tolerance

LOOSE = Tolerance(rel_err=1e9, atol=1e9, rtol=1e9, max_mismatch_ratio=1.0, reason="")
TIGHT = Tolerance(rel_err=1e-5, atol=1e-5, rtol=1e-4, max_mismatch_ratio=0.0, reason="")
REF = torch.linspace(-2, 3, 12, dtype=torch.float32).reshape(3, 4)


def verdict(out, tolerance=LOOSE, ref=REF):
    return compare_outputs(["C"], [out], [ref], tolerance).verdict(tolerance)


def test_a_close_output_passes_with_its_metrics():
    comparison = compare_outputs(["C"], [REF + 1e-7], [REF], TIGHT)
    assert comparison.verdict(TIGHT) is None
    assert 0 < comparison.rel_err < 1e-6
    assert comparison.mismatch_ratio == 0.0


def test_an_unwritten_output_never_passes():
    assert "never written" in verdict(torch.full_like(REF, float("nan")))


@pytest.mark.parametrize(
    "bad, why", [(float("nan"), "NaN"), (float("inf"), "infinite")]
)
def test_one_bad_element_never_passes(bad, why):
    out = REF.clone()
    out[1, 2] = bad
    assert why in verdict(out)


def test_an_all_zero_output_fails_unless_the_reference_is_zero():
    assert "all zeros" in verdict(torch.zeros_like(REF))
    zero = torch.zeros_like(REF)
    assert verdict(zero, TIGHT, ref=zero) is None


def test_bounds_decide_the_rest():
    out = REF.clone()
    out[0, 0] += 1.0
    assert "relative error" in verdict(out, TIGHT)
    assert verdict(out) is None


FP16 = Tolerance(rel_err=1e-3, atol=1e-3, rtol=2e-3, max_mismatch_ratio=1e-4, reason="")


def test_the_output_dtype_rounding_floor_widens_the_bound_and_no_further():
    # Probabilities of a 128k-wide softmax sit in fp16's subnormal range, where
    # even the correctly rounded reference is ~1e-3 off in norm.
    ref = torch.softmax(torch.rand(1, 128256, dtype=torch.float64) * 8 - 4, dim=-1)
    best = ref.to(torch.float16)
    comparison = compare_outputs(["Y"], [best], [ref], FP16)
    assert comparison.rounding_floor > FP16.rel_err / 2
    assert comparison.verdict(FP16) is None
    worse = (ref * 1.01).to(torch.float16)
    assert "relative error" in compare_outputs(["Y"], [worse], [ref], FP16).verdict(
        FP16
    )


def test_infinities_where_the_reference_has_them_pass_and_nowhere_else():
    ref = REF.clone()
    ref[0, 0], ref[2, 3] = float("inf"), float("-inf")
    assert verdict(ref.clone(), TIGHT, ref) is None
    clamped = ref.clamp(-3e38, 3e38)
    assert "not the reference's infinity at 2 of 2 places" in verdict(
        clamped, LOOSE, ref
    )
    flipped = ref.clone()
    flipped[0, 0] = float("-inf")
    assert "not the reference's infinity at 1 of 2 places" in verdict(
        flipped, LOOSE, ref
    )
    extra = ref.clone()
    extra[1, 1] = float("inf")
    assert "infinite" in verdict(extra, LOOSE, ref)


def test_nan_where_the_reference_has_it_passes_and_nowhere_else():
    ref = REF.clone()
    ref[1] = float("nan")  # a row whose input held a NaN
    assert verdict(ref.clone(), TIGHT, ref) is None
    dropped = ref.nan_to_num(0.0)
    assert "not NaN at 4 of 4 places where the reference is" in verdict(
        dropped, LOOSE, ref
    )
    extra = ref.clone()
    extra[0, 0] = float("nan")
    assert "has 1 of 12 elements NaN" in verdict(extra, LOOSE, ref)
    assert "never written" in verdict(torch.full_like(REF, float("nan")), LOOSE, ref)


def test_a_reference_that_overflowed_or_made_nan_cannot_judge():
    from runners.harness.compare import reference_problem

    finite = [REF]
    assert reference_problem(finite, [REF * 2]) is None
    assert "NaN" in reference_problem(finite, [REF / 0 * 0])
    overflowed = REF.clone()
    overflowed[0, 0] = float("inf")
    assert "from finite inputs" in reference_problem(finite, [overflowed])
    assert reference_problem([overflowed], [overflowed]) is None
    with_nan = REF.clone()
    with_nan[0, 0] = float("nan")
    assert reference_problem([with_nan], [with_nan]) is None


def test_a_verdict_does_not_change_with_the_units():
    """An element that cancels to near zero is off by atol at unit scale;
    the same outputs scaled by 2**100 (exactly) are judged the same."""
    ref = torch.tensor([[1.0, -1.0, 2e-6], [0.5, 1.5, -2.0]], dtype=torch.float64)
    out = ref.clone()
    out[0, 2] = 0.0  # off by 2e-6, within TIGHT's atol of 1e-5
    assert verdict(out, TIGHT, ref) is None
    scaled = 2.0**100
    assert verdict(out * scaled, TIGHT, ref * scaled) is None
    worse = ref.clone()
    worse[0, 2] = 2.7e-5  # off by 2.5e-5: past atol, the norm still close
    assert "mismatch" in verdict(worse * scaled, TIGHT, ref * scaled)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(
        st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=24
    ),
    noise=st.floats(0, 1e-1),
    broken=st.lists(
        st.tuples(st.integers(0, 23), st.sampled_from([nan, inf, -inf, 0.0, 7.0]))
    ),
    out_dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
    wide=st.sampled_from([torch.float32, torch.float64]),
)
def test_the_finite_reference_shortcut_reads_every_figure_as_the_general_compare(
    values, noise, broken, out_dtype, wide
):
    # Every served cell's reference is finite, so compare_one takes the
    # shortcut; its figures must be the general compare's, bit for bit,
    # whatever the kernel wrote (NaN, infinities, zeros, noise).
    ref = torch.tensor(values, dtype=wide)
    out = (ref * (1 + noise)).to(out_dtype).to(wide)
    for index, value in broken:
        out[index % len(values)] = value
    shortcut = _figures_finite(out, ref, out_dtype, TIGHT)
    general = _figures(out, ref, out_dtype, TIGHT)
    assert [repr(x) for x in shortcut] == [repr(x) for x in general]
