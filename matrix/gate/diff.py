"""The A/B diff of two toolchains' matrices on some device types.

Pure reads of the columns the diff needs: one query for the cells of both
toolchains (never a result's details or a revision's source, which made it
ten times slower on a large matrix), one for the shapes, one for the repeat
timings. The digest covers what a reviewer judges (statuses, kernel
revisions, and the performance verdict in 5% steps), not raw milliseconds,
so a rerun that lands on the same picture does not void the approvals given
on it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from dataclasses import dataclass, fields

from django.db.models import F, Q
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Substr

from matrix.gate import significance
from matrix.models import Cell, Result, Shape, Status
from matrix.models.gate import Change

# Relative noise assumed for a side that has a single timing: a lone median
# says nothing about its own spread.
DEFAULT_NOISE_BAND = 0.05
# A lone timing of a call of a few microseconds carries more than 5%: on the
# H200 the harness times such calls as CUDA-graph replays, and the cold and
# warm runs of one cell (docs/evidence/2026-12-03-h200-ab-repeats.json)
# differ by up to 3.4 µs for calls under 50 µs at the 99th percentile (1 µs
# at the 95th). Timed call by call, launch and all, they had differed by up
# to 13.6 µs (2026-12-02). A lone timing's band covers that spread.
LAUNCH_JITTER_MS = 0.0035
# How many recent results of one cell count as its repeat timings.
REPEAT_WINDOW = 5
PERF_STEP = 0.05
# A candidate 1,700x slower than its baseline is 33,980 steps: past a
# smallint, so the column is an integer and a step past it is clamped
# (the ratio itself is kept whole beside it).
PERF_STEP_MAX = 2**31 - 1
MAD_TO_SIGMA = 1.4826
ERROR_SHOWN = 300


# What a reviewer reads first: regressions, missing results and slowdowns,
# then improvements, then what did not change.
RANKS = {
    Change.GREEN_TO_RED: 0,
    Change.MISSING: 1,
    "slower": 2,
    Change.RED_TO_GREEN: 3,
    Change.NEW: 4,
    "faster": 5,
    Change.STILL_RED: 6,
    Change.STILL_GREEN: 7,
}


def serve_floor(speed_budget: float) -> float:
    """The lowest measured speed (reference time / kernel time) at which a
    passing candidate is served TileLang under ``speed_budget``: the one
    comparison the manifest, the rows and the page's stated rule share."""
    return 1 / (1 + speed_budget)


@dataclass
class CellDiff:
    shape_id: int
    device_type_id: int
    operator: str
    dtype: str
    dims_key: str
    served: bool
    weight: float
    backend: str
    device_type: str
    baseline_status: str | None
    candidate_status: str | None
    candidate_result_id: int | None
    candidate_revision_sha256: str
    candidate_error: str
    change: str
    baseline_ms: float | None = None
    candidate_ms: float | None = None
    ratio: float | None = None
    band: float | None = None
    # The candidate's own PyTorch reference on this cell, and its speed
    # against it (reference / TileLang time) with that comparison's band.
    reference_ms: float | None = None
    speed: float | None = None
    speed_band: float | None = None
    # The rank test's verdict on the timing samples (significance.SLOWER, FASTER,
    # SAME, SAME_CODE: the generated code is byte-identical), and how sure
    # it is; blank where a side had too few samples for the test.
    speed_verdict: str = ""
    confidence: float | None = None
    # Why the candidate's pass may not be served whatever its speed (a
    # submitted kernel judged without the full sandbox); blank when none.
    candidate_distrust: str = ""

    @property
    def label(self) -> str:
        return f"{self.operator}[{self.dims_key}] {self.dtype} on {self.device_type}"

    @property
    def change_label(self) -> str:
        return Change.LABELS[self.change]

    @property
    def perf_step(self) -> int | None:
        """The slowdown (positive) or speed-up (negative) in 5% steps once
        the rank test calls it one (else outside the noise band); 0 when it
        is not one; None without two timings."""
        if self.ratio is None:
            return None
        if self.speed_verdict in (significance.SAME, significance.SAME_CODE):
            return 0
        if not self.speed_verdict and abs(self.ratio - 1) <= self.band:
            return 0
        steps = min(math.ceil(abs(self.ratio - 1) / PERF_STEP), PERF_STEP_MAX)
        return int(math.copysign(steps, self.ratio - 1))

    @property
    def rank(self) -> int:
        """Changed rows first, and within a change served rows first."""
        kind = self.change
        if kind == Change.STILL_GREEN and self.perf_step:
            kind = "slower" if self.perf_step > 0 else "faster"
        return 2 * RANKS[kind] + (0 if self.served else 1)

    def slower_than(self, budget: float) -> bool:
        """Called slower, and slower than the budget allows even at the
        favourable edge of its interval (or noise band)."""
        return (
            (self.perf_step or 0) > 0
            and self.ratio is not None
            and self.ratio - self.band > 1 + budget
        )

    def slower_than_reference(self, budget: float) -> bool:
        """The candidate's kernel was measured taking longer than its PyTorch
        reference on this cell by more than ``budget``. The measured speed
        decides, not the favourable edge of its band: serving TileLang has
        to be earned, and where the two are within noise of each other the
        reference is the one production already trusts. (Judged at the
        band's edge, the H200's decode cells at 0.95-0.99x were served.)"""
        return self.speed is not None and self.speed < serve_floor(budget)

    def row_fields(self) -> dict:
        """The stored row's fields (``DiffRow``), but for its place."""
        values = {name: getattr(self, name) for name in FIELD_NAMES}
        values["device_type_label"] = values.pop("device_type")
        values["baseline_status"] = self.baseline_status or ""
        values["candidate_status"] = self.candidate_status or ""
        values["candidate_error"] = self.candidate_error[:ERROR_SHOWN]
        values["perf_step"] = self.perf_step
        values["rank"] = self.rank
        return values

    @classmethod
    def from_row(cls, row) -> CellDiff:
        """A stored row read back."""
        values = {}
        for name in FIELD_NAMES:
            source = "device_type_label" if name == "device_type" else name
            values[name] = getattr(row, source)
        values["baseline_status"] = row.baseline_status or None
        values["candidate_status"] = row.candidate_status or None
        return cls(**values)


FIELD_NAMES = tuple(f.name for f in fields(CellDiff))


def summary_of(rows) -> dict:
    """Counts by change, by operator and by backend: what the proposal page
    and the list show without reading the rows again."""

    def counts(group) -> dict:
        totals = {change: 0 for change in Change.ORDER}
        for row in group:
            totals[row.change] += 1
        totals["cells"] = len(group)
        totals["served"] = sum(row.served for row in group)
        totals["served_missing"] = sum(
            row.served and row.change == Change.MISSING for row in group
        )
        totals["slower"] = sum(bool(r.perf_step and r.perf_step > 0) for r in group)
        totals["faster"] = sum(bool(r.perf_step and r.perf_step < 0) for r in group)
        return totals

    rows = list(rows)
    summary = counts(rows)
    for attribute in ("operator", "backend"):
        groups: dict[str, list] = defaultdict(list)
        for row in rows:
            groups[getattr(row, attribute)].append(row)
        summary[f"by_{attribute}"] = {
            key: counts(group) for key, group in sorted(groups.items())
        }
    return summary


@dataclass
class Diff:
    rows: list[CellDiff]
    digest: str

    @property
    def summary(self) -> dict:
        return summary_of(self.rows)


def median(samples) -> float:
    """statistics.median, for the few samples a cell has, without its
    checks: a large diff takes hundreds of thousands."""
    ordered = sorted(samples)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def noise(samples: list[float]) -> float | None:
    """The relative spread of repeat timings, as a robust standard deviation
    (1.4826 x the median absolute deviation, over the median): one stalled
    run on a shared host must not widen the band into meaninglessness.
    None for fewer than two samples."""
    samples = [s for s in samples if s]
    if len(samples) < 2:
        return None
    centre = median(samples)
    mad = median([abs(s - centre) for s in samples])
    return MAD_TO_SIGMA * mad / centre


def distrust(cell: dict) -> str:
    """Why a pass may not be served whatever it measured: a submitted
    kernel's verdict counts only from the full sandbox, which kept its code
    from the judge and the clock (the harness refuses to run one in less;
    a result that says otherwise was not made by this harness)."""
    if cell["status"] != Status.PASS or cell["revision_origin"] == "library":
        return ""
    sandbox = cell["sandbox"] if isinstance(cell["sandbox"], str) else ""
    if sandbox.startswith("full"):
        return ""
    return (
        "a submitted kernel judged without the full sandbox "
        f"({sandbox[:80] or 'its result does not say'})"
    )


def measure(
    row: CellDiff, base: dict, cand: dict, history
) -> significance.SpeedChange | None:
    """The candidate's speed against the baseline on a cell green on both:
    no change where the generated code is byte-identical; else the rank test
    on both results' samples; else the ratio of medians and its noise band
    (results from before samples were kept). Returns the rank test where it
    decided the verdict, for the group of cells whose code changed."""
    row.baseline_ms, row.candidate_ms = base["kernel_ms"], cand["kernel_ms"]
    changed = significance.compare(
        base["kernel_ms_samples"] or [], cand["kernel_ms_samples"] or []
    )
    if changed is not None:
        row.ratio, row.band = changed.ratio, changed.band
        row.speed_verdict, row.confidence = changed.verdict, changed.confidence
    else:
        measured = perf(
            timing_samples(base["kernel_ms_samples"], history[base["pk"]][0]),
            timing_samples(cand["kernel_ms_samples"], history[cand["pk"]][0]),
        )
        if measured:
            row.ratio, row.band = measured
    # The same source id is the same SHA-256 of the generated code.
    code = base["source_id"]
    if code and code == cand["source_id"] and row.ratio is not None:
        # Any difference is the device's or the host's, not the release's.
        row.speed_verdict = significance.SAME_CODE
        return None
    # Only cells whose code is known to differ are the release's group.
    return changed if code and cand["source_id"] else None


def timing_samples(stored, history: list[float]) -> list[float]:
    """Repeat timings of one cell: those the harness stored with the result
    (``kernel_ms_samples``), else the kernel medians of the cell's recent
    results."""
    if isinstance(stored, list) and len(stored) >= 2:
        return [float(s) for s in stored]
    return history


def perf(baseline: list[float], candidate: list[float]) -> tuple[float, float] | None:
    """The candidate / baseline ratio of medians and its noise band."""
    if not baseline or not candidate:
        return None
    base_ms, cand_ms = median(baseline), median(candidate)
    if base_ms <= 0 or cand_ms <= 0:
        return None
    base_noise = noise(baseline)
    cand_noise = noise(candidate)
    base_noise = lone_band(base_ms) if base_noise is None else base_noise
    cand_noise = lone_band(cand_ms) if cand_noise is None else cand_noise
    return cand_ms / base_ms, math.hypot(base_noise, cand_noise)


def lone_band(ms: float) -> float:
    """The relative band of a side that has a single timing of ``ms``."""
    return max(DEFAULT_NOISE_BAND, LAUNCH_JITTER_MS / ms)


def classify(baseline: str | None, candidate: str | None) -> str:
    """A side whose result is ``infra_error`` has no evidence: the runner or
    the sandbox failed, the kernel did not, so it is neither red nor a
    regression. (Ingest lets infra_error fill only an empty cell, so it
    never hides an earlier answer.)"""
    if baseline == Status.INFRA_ERROR:
        baseline = None
    if candidate == Status.INFRA_ERROR:
        candidate = None
    if candidate is None:
        return Change.MISSING
    if baseline is None:
        return Change.NEW
    was_green, is_green = baseline == Status.PASS, candidate == Status.PASS
    if was_green and is_green:
        return Change.STILL_GREEN
    if was_green:
        return Change.GREEN_TO_RED
    if is_green:
        return Change.RED_TO_GREEN
    return Change.STILL_RED


CELL_COLUMNS = (
    "pk",
    "shape_id",
    "device_type_id",
    "toolchain_id",
    "revision_id",
    "result_id",
    "status",
    "kernel_ms",
    "reference_ms",
    "revision_sha256",
    "error",
    "revision_origin",
    "sandbox",
    "source_id",
    "kernel_ms_samples",
    "reference_ms_samples",
)


def _cells(baseline, candidate, dt_ids) -> list[dict]:
    """The cells of both toolchains on the device types, with only the
    columns the diff reads: the first 300 characters of a result's error,
    the id of its generated source (never the text) and the keys of its
    details that may hold repeat timings."""
    return list(
        Cell.objects.filter(
            device_type_id__in=dt_ids, toolchain__in=[baseline, candidate]
        )
        .annotate(
            revision_sha256=F("revision__source_sha256"),
            revision_origin=F("revision__origin"),
            sandbox=KeyTransform("sandbox", "result__details"),
            error=Substr("result__error__text", 1, ERROR_SHOWN),
            source_id=F("result__source_id"),
            **{key: KeyTransform(key, "result__details") for key in CELL_COLUMNS[-2:]},
        )
        .order_by()
        .values(*CELL_COLUMNS)
    )


def matrix_diff(*, baseline, candidate, device_types) -> Diff:
    """Every served shape on every device type, plus any unserved shape that
    has a result on either toolchain there."""
    device_types = list(device_types)
    dt_ids = [dt.pk for dt in device_types]
    cells = _cells(baseline, candidate, dt_ids)
    by_key = {(c["shape_id"], c["device_type_id"], c["toolchain_id"]): c for c in cells}
    history = _timing_history(cells)
    with_results = Cell.objects.filter(
        device_type_id__in=dt_ids, toolchain__in=[baseline, candidate]
    ).values("shape_id")
    shapes = (
        Shape.objects.filter(Q(served=True) | Q(pk__in=with_results))
        .order_by("operator__name", "dtype", "dims_key")
        .values_list(
            "pk", "operator__name", "dtype", "dims_key", "served", "weight", named=True
        )
    )
    rows = []
    # Per device type, the rank tests of the cells whose generated code
    # changed: the group the release moved (significance.group_shift).
    code_changed: dict[int, list[tuple[CellDiff, significance.SpeedChange]]] = (
        defaultdict(list)
    )
    for shape in shapes:
        for dt in device_types:
            base = by_key.get((shape.pk, dt.pk, baseline.pk))
            cand = by_key.get((shape.pk, dt.pk, candidate.pk))
            if not shape.served and base is None and cand is None:
                continue
            row = CellDiff(
                shape_id=shape.pk,
                device_type_id=dt.pk,
                operator=shape.operator__name,
                dtype=shape.dtype,
                dims_key=shape.dims_key,
                served=shape.served,
                weight=shape.weight,
                backend=dt.backend,
                device_type=str(dt),
                baseline_status=base["status"] if base else None,
                candidate_status=cand["status"] if cand else None,
                candidate_result_id=cand["result_id"] if cand else None,
                candidate_revision_sha256=cand["revision_sha256"] if cand else "",
                candidate_error=(cand["error"] or "") if cand else "",
                change=classify(base and base["status"], cand and cand["status"]),
                candidate_distrust=distrust(cand) if cand else "",
            )
            if row.change == Change.STILL_GREEN:
                changed = measure(row, base, cand, history)
                if changed is not None:
                    code_changed[dt.pk].append((row, changed))
            if cand and cand["status"] == Status.PASS:
                _speed_measure(row, cand, history[cand["pk"]])
            rows.append(row)
    for measured in code_changed.values():
        group_verdicts(measured)
    return Diff(rows=rows, digest=digest_of(baseline, candidate, device_types, rows))


def group_verdicts(measured: list[tuple[CellDiff, significance.SpeedChange]]) -> None:
    """Each cell's verdict with the evidence of the others whose code the
    release changed on the same device type (significance.with_group)."""
    group = significance.group_shift([change for _, change in measured])
    for row, change in measured:
        row.speed_verdict = significance.with_group(change, group).verdict


def _speed_measure(row: CellDiff, cand: dict, history: tuple[list, list]) -> None:
    """The candidate's speed against its PyTorch reference on the same cell,
    from the same results' timings: both are timed in the same child."""
    kernels, references = history
    row.candidate_ms = cand["kernel_ms"]
    row.reference_ms = cand["reference_ms"]
    # compare(a, b) and perf(a, b) are b / a: here reference / TileLang.
    changed = significance.compare(
        cand["kernel_ms_samples"] or [], cand["reference_ms_samples"] or []
    )
    if changed is not None:
        row.speed, row.speed_band = changed.ratio, changed.band
        return
    kernels = timing_samples(cand["kernel_ms_samples"], kernels)
    measured = perf(kernels, references)
    if measured:
        row.speed, row.speed_band = measured


def _timing_history(cells: list[dict]) -> dict[int, tuple[list, list]]:
    """Per cell, the kernel and reference medians of its latest passing
    results on the cell's current revision, newest first."""
    cells = [c for c in cells if c["status"] == Status.PASS]
    history: dict[int, tuple[list, list]] = defaultdict(lambda: ([], []))
    if not cells:
        return history
    wanted = {
        (c["shape_id"], c["device_type_id"], c["toolchain_id"], c["revision_id"]): c
        for c in cells
    }
    results = (
        Result.objects.filter(
            shape_id__in={c["shape_id"] for c in cells},
            device_type_id__in={c["device_type_id"] for c in cells},
            toolchain_id__in={c["toolchain_id"] for c in cells},
            status=Status.PASS,
            kernel_ms__isnull=False,
        )
        .order_by("-created_at", "-id")
        .values_list(
            "shape_id",
            "device_type_id",
            "toolchain_id",
            "revision_id",
            "kernel_ms",
            "reference_ms",
        )
    )
    for *key, kernel_ms, reference_ms in results:
        cell = wanted.get(tuple(key))
        if cell is None:
            continue
        kernels, references = history[cell["pk"]]
        if len(kernels) < REPEAT_WINDOW:
            kernels.append(kernel_ms)
            if reference_ms:
                references.append(reference_ms)
    return history


def digest_of(baseline, candidate, device_types, rows: list[CellDiff]) -> str:
    canonical = {
        "baseline": baseline.fingerprint,
        "candidate": candidate.fingerprint,
        "device_types": sorted(dt.pk for dt in device_types),
        "cells": sorted(
            json.dumps(
                [
                    r.shape_id,
                    r.device_type_id,
                    r.baseline_status,
                    r.candidate_status,
                    r.candidate_revision_sha256,
                    r.perf_step,
                ]
            )
            for r in rows
        ),
    }
    encoded = json.dumps(canonical, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(encoded.encode()).hexdigest()
