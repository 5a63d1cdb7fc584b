"""Is a kernel slower or faster on one cell, and how sure is that?

Each timed result keeps up to 32 samples of its calls (runners/harness/
timing.py). Two results are compared on those samples as LLVM's LNT and
most A/B benches do: a rank test, so one stalled call on a shared host
moves nothing, and a minimum effect, so a difference too small to matter
is never a verdict however sure it is.

- The ratio is the Hodges-Lehmann estimate of candidate / baseline: the
  median of the ratios of every candidate sample to every baseline sample.
- Its 95% interval is the distribution-free one that goes with the
  Mann-Whitney test (the order statistics of those ratios).
- "How sure" is one minus the test's two-sided p-value.
- A change counts when the interval excludes no change *and* the estimate
  is at least MIN_EFFECT away from 1.
- Or, in a proposal's diff, when the cells whose generated code the release
  changed on that device type moved together by at least MIN_EFFECT (the
  median of their ratios, with the sign test's interval) and the cell's own
  interval excludes no change in that direction (``with_group``).

Samples from one child know nothing of the next child's clocks, placement
or neighbours, so the minimum effect is what separates two runs of the same
code on the same device: measured on the H100's served sweep, run twice on
one toolchain (docs/evidence/2026-12-06-h100-speed-samples.json).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

# Below this change the verdict is "same" whatever the test says.
MIN_EFFECT = 0.01
Z_95 = 1.959964
# Fewer samples on a side than this and the rank test has no 95% interval.
MIN_SAMPLES = 4

SLOWER, FASTER, SAME, SAME_CODE = "slower", "faster", "same", "same code"


@dataclass(frozen=True)
class SpeedChange:
    ratio: float
    low: float
    high: float
    # 1 - p of the rank test; None where a side had too few samples.
    confidence: float | None
    verdict: str

    @property
    def band(self) -> float:
        """The interval's wider half, as a fraction of the ratio."""
        return max(self.high - self.ratio, self.ratio - self.low)


def compare(
    baseline: list[float], candidate: list[float], *, min_effect: float = MIN_EFFECT
) -> SpeedChange | None:
    """Candidate against baseline on their samples (milliseconds); None
    unless each side has MIN_SAMPLES positive samples."""
    base = np.log([s for s in baseline if s and s > 0])
    cand = np.log([s for s in candidate if s and s > 0])
    n, m = len(base), len(cand)
    if n < MIN_SAMPLES or m < MIN_SAMPLES:
        return None
    diffs = np.sort(np.subtract.outer(cand, base).ravel())
    pairs = n * m
    spread = math.sqrt(n * m * (n + m + 1) / 12)
    # The interval's order statistic; at least 0 (tiny samples: the range).
    k = max(0, math.floor(pairs / 2 - Z_95 * spread))
    low, high = diffs[k], diffs[pairs - 1 - k]
    estimate = float(np.median(diffs))
    wins = np.count_nonzero(diffs > 0) + 0.5 * np.count_nonzero(diffs == 0)
    p_value = math.erfc(abs(wins - pairs / 2) / spread / math.sqrt(2))
    ratio = math.exp(estimate)
    significant = low > 0 or high < 0
    if significant and ratio >= 1 + min_effect:
        verdict = SLOWER
    elif significant and ratio <= 1 / (1 + min_effect):
        verdict = FASTER
    else:
        verdict = SAME
    return SpeedChange(
        ratio=ratio,
        low=math.exp(low),
        high=math.exp(high),
        confidence=1 - p_value,
        verdict=verdict,
    )


# Fewer cells than this and the sign test has no 95% interval.
MIN_GROUP = 6


@dataclass(frozen=True)
class GroupShift:
    """How a release moved a group of cells: the median of their ratios,
    with the sign test's distribution-free 95% interval."""

    ratio: float
    low: float
    high: float
    cells: int
    verdict: str


def group_shift(
    changes: list[SpeedChange], *, min_effect: float = MIN_EFFECT
) -> GroupShift | None:
    """The shift of the cells whose generated code a release changed, each
    cell one vote: a cell whose run drifted by 10% counts no more than one
    that moved by 1%. None for fewer than MIN_GROUP cells."""
    logs = sorted(math.log(c.ratio) for c in changes)
    n = len(logs)
    if n < MIN_GROUP:
        return None
    # The widest order statistics whose interval still covers 95%.
    k = 0
    while _binomial_tail(k + 2, n) <= 0.025:
        k += 1
    low, high = logs[k], logs[n - 1 - k]
    estimate = float(np.median(logs))
    if low > 0 and estimate >= math.log1p(min_effect):
        verdict = SLOWER
    elif high < 0 and estimate <= -math.log1p(min_effect):
        verdict = FASTER
    else:
        verdict = SAME
    return GroupShift(
        ratio=math.exp(estimate),
        low=math.exp(low),
        high=math.exp(high),
        cells=n,
        verdict=verdict,
    )


def _binomial_tail(k: int, n: int) -> float:
    """P(X < k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k)) / 2**n


def with_group(change: SpeedChange, group: GroupShift | None) -> SpeedChange:
    """A cell's verdict with its group's evidence. Between two runs a cell
    drifts by more than its own samples show, which is why one cell needs
    MIN_EFFECT to be called; where the cells whose code changed moved
    together by at least that much, the change is the release's, and a cell
    that is itself surely moved the same way is called with them, however
    small its own estimate. A cell whose interval holds no change stays
    "same": the group never overrules a cell's own samples."""
    if group is None or change.verdict != SAME or group.verdict == SAME:
        return change
    surely_slower, surely_faster = change.low > 1, change.high < 1
    if (group.verdict == SLOWER and surely_slower) or (
        group.verdict == FASTER and surely_faster
    ):
        return replace(change, verdict=group.verdict)
    return change
