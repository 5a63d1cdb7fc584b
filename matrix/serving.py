"""What production would run for a cell: the TileLang kernel, or the PyTorch
reference, and why.

A cell serves TileLang only where its current result passes and its kernel
is fast enough against the reference measured on that same cell. Anything
else falls back to the reference (unsupported, failing, passing but slower)
or has not been validated yet (never run, stale, only lowered or built, or
an infrastructure error that is retried)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from matrix.models import EVIDENCE, Status
from matrix.queries import EMPTY

# Kernel time within the noise band of the reference's: a passing kernel at
# 0.96x is as good as the reference, one at 0.69x is not.
SPEEDUP_FLOOR = 0.95

TILELANG = "tilelang"
REFERENCE = "reference"
UNVALIDATED = "unvalidated"
OUTCOMES = (TILELANG, REFERENCE, UNVALIDATED)
OUTCOME_LABELS = {
    TILELANG: "TileLang",
    REFERENCE: "reference",
    UNVALIDATED: "not validated",
}


def serve_speedup_floor() -> float:
    """The lowest speed-up over the reference (reference time / kernel time)
    at which a passing cell is fast enough to serve with TileLang. The pages
    and the API read it here, and only here."""
    return SPEEDUP_FLOOR


def speedup(kernel_ms: float | None, reference_ms: float | None) -> float | None:
    if kernel_ms and reference_ms:
        return reference_ms / kernel_ms
    return None


def ratio_text(value: float, floor: float) -> str:
    """'1.04×'; more decimals where two would round across the floor
    (0.9499 reads '0.9499×', below 0.95, not '0.95×')."""
    for places in range(2, 7):
        text = f"{value:.{places}f}"
        if (float(text) < floor) == (value < floor):
            break
    return f"{text}×"


def speed_class(value: float | None, floor: float) -> str:
    """'faster', 'parity' or 'slower' against the reference; '' unmeasured.
    Parity is the band from the floor to its mirror above 1."""
    if value is None:
        return ""
    if value < floor:
        return "slower"
    if value > 1 / floor:
        return "faster"
    return "parity"


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: str
    reason: str
    # Would a fresh run (Run missing) change it?
    rerun_helps: bool


# Kept by its arguments: the Models read asks for every served shape on
# every device type (9,240 cells at 100k results), mostly the same few
# statuses, and building each verdict again was half its Python.
@functools.lru_cache(maxsize=8192)
def serving_verdict(
    status: str, stale: bool, speedup_value: float | None, floor: float
) -> Verdict:
    """What production runs for a cell in ``status`` (``EMPTY`` when never
    run) and why, in a few words. Frozen, so shared by every cell asking."""
    if status == EMPTY:
        return Verdict(UNVALIDATED, "never run", True)
    if stale:
        return Verdict(UNVALIDATED, f"stale {status}", True)
    if status in EVIDENCE:
        return Verdict(UNVALIDATED, f"{status} only, not run on the device", True)
    if status == Status.INFRA_ERROR:
        return Verdict(UNVALIDATED, "infrastructure error", True)
    if status == Status.PASS:
        if speedup_value is None:
            return Verdict(REFERENCE, "pass, speed not measured", True)
        if speedup_value < floor:
            ratio = ratio_text(speedup_value, floor)
            return Verdict(REFERENCE, f"pass, but {ratio} of the reference", False)
        return Verdict(
            TILELANG, f"pass, {ratio_text(speedup_value, floor)} the reference", False
        )
    if status == Status.UNSUPPORTED:
        return Verdict(REFERENCE, "unsupported by the kernel", False)
    return Verdict(REFERENCE, status.replace("_", " "), True)
