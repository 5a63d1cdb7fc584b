"""The A/B diff of two toolchains' matrices on some device types.

Pure reads: one query for the cells of both toolchains, one for the repeat
timings. The digest covers what a reviewer judges (statuses, and the
performance verdict in 5% steps), not raw milliseconds, so a rerun that
lands on the same picture does not void the approvals given on it.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from matrix.models import Cell, Result, Shape, Status

# Relative noise assumed for a side that has a single timing: a lone median
# says nothing about its own spread.
DEFAULT_NOISE_BAND = 0.05
# How many recent results of one cell count as its repeat timings.
REPEAT_WINDOW = 5
PERF_STEP = 0.05
MAD_TO_SIGMA = 1.4826


class Change:
    GREEN_TO_RED = "green_to_red"
    RED_TO_GREEN = "red_to_green"
    NEW = "new"
    MISSING = "missing"
    STILL_GREEN = "still_green"
    STILL_RED = "still_red"

    LABELS = {
        GREEN_TO_RED: "green → red",
        RED_TO_GREEN: "red → green",
        NEW: "new",
        MISSING: "missing",
        STILL_GREEN: "still green",
        STILL_RED: "still red",
    }
    ORDER = [GREEN_TO_RED, MISSING, RED_TO_GREEN, NEW, STILL_RED, STILL_GREEN]


@dataclass
class CellDiff:
    shape_id: int
    device_type_id: int
    operator: str
    dtype: str
    dims: dict
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

    @property
    def label(self) -> str:
        return f"{self.operator}[{self.dims_key}] {self.dtype} on {self.device_type}"

    @property
    def change_label(self) -> str:
        return Change.LABELS[self.change]

    @property
    def perf_step(self) -> int | None:
        """The slowdown (positive) or speed-up (negative) in 5% steps once
        outside the noise band; 0 inside it; None without two timings."""
        if self.ratio is None:
            return None
        if abs(self.ratio - 1) <= self.band:
            return 0
        return int(
            math.copysign(math.ceil(abs(self.ratio - 1) / PERF_STEP), self.ratio - 1)
        )

    def slower_than(self, budget: float) -> bool:
        """Slower than the budget allows even at the favourable edge of the
        noise band."""
        return self.ratio is not None and self.ratio - self.band > 1 + budget


@dataclass
class Diff:
    rows: list[CellDiff]
    digest: str

    @property
    def summary(self) -> dict:
        counts = {change: 0 for change in Change.ORDER}
        for row in self.rows:
            counts[row.change] += 1
        counts["cells"] = len(self.rows)
        counts["served"] = sum(row.served for row in self.rows)
        counts["slower"] = sum(
            bool(row.perf_step and row.perf_step > 0) for row in self.rows
        )
        counts["faster"] = sum(
            bool(row.perf_step and row.perf_step < 0) for row in self.rows
        )
        return counts

    def by(self, attribute: str) -> dict[str, list[CellDiff]]:
        groups: dict[str, list[CellDiff]] = defaultdict(list)
        for row in self.rows:
            groups[getattr(row, attribute)].append(row)
        return dict(sorted(groups.items()))

    def grouped(self, attribute: str) -> list[dict]:
        """Per group: its rows and its counts by change, for the diff page."""
        groups = []
        for key, rows in self.by(attribute).items():
            counts = {change: 0 for change in Change.ORDER}
            for row in rows:
                counts[row.change] += 1
            counts["slower"] = sum(bool(r.perf_step and r.perf_step > 0) for r in rows)
            groups.append({"key": key, "rows": rows, "counts": counts})
        return groups


def noise(samples: list[float]) -> float | None:
    """The relative spread of repeat timings, as a robust standard deviation
    (1.4826 x the median absolute deviation, over the median): one stalled
    run on a shared host must not widen the band into meaninglessness.
    None for fewer than two samples."""
    samples = [s for s in samples if s]
    if len(samples) < 2:
        return None
    centre = statistics.median(samples)
    mad = statistics.median(abs(s - centre) for s in samples)
    return MAD_TO_SIGMA * mad / centre


def timing_samples(result: Result, history: list[float]) -> list[float]:
    """Repeat timings of one cell: those the harness stored with the result,
    else the kernel medians of the cell's recent results."""
    stored = result.details.get("kernel_ms_samples") if result.details else None
    if isinstance(stored, list) and len(stored) >= 2:
        return [float(s) for s in stored]
    return history


def perf(baseline: list[float], candidate: list[float]) -> tuple[float, float] | None:
    """The candidate / baseline ratio of medians and its noise band."""
    if not baseline or not candidate:
        return None
    base_ms, cand_ms = statistics.median(baseline), statistics.median(candidate)
    if base_ms <= 0:
        return None
    base_noise = noise(baseline)
    cand_noise = noise(candidate)
    base_noise = DEFAULT_NOISE_BAND if base_noise is None else base_noise
    cand_noise = DEFAULT_NOISE_BAND if cand_noise is None else cand_noise
    return cand_ms / base_ms, math.hypot(base_noise, cand_noise)


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


def matrix_diff(*, baseline, candidate, device_types) -> Diff:
    """Every served shape on every device type, plus any unserved shape that
    has a result on either toolchain there."""
    device_types = list(device_types)
    dt_ids = [dt.pk for dt in device_types]
    cells = (
        Cell.objects.filter(
            device_type_id__in=dt_ids, toolchain__in=[baseline, candidate]
        )
        .select_related("result", "revision")
        .order_by()
    )
    by_key: dict[tuple[int, int, int], Cell] = {
        (c.shape_id, c.device_type_id, c.toolchain_id): c for c in cells
    }
    history = _timing_history(cells)
    shape_ids = {key[0] for key in by_key}
    shapes = (
        Shape.objects.filter(served=True) | Shape.objects.filter(pk__in=shape_ids)
    ).select_related("operator")
    rows = []
    for shape in shapes.order_by("operator__name", "dtype", "dims_key"):
        for dt in device_types:
            base = by_key.get((shape.pk, dt.pk, baseline.pk))
            cand = by_key.get((shape.pk, dt.pk, candidate.pk))
            if not shape.served and base is None and cand is None:
                continue
            row = CellDiff(
                shape_id=shape.pk,
                device_type_id=dt.pk,
                operator=shape.operator.name,
                dtype=shape.dtype,
                dims=shape.dims,
                dims_key=shape.dims_key,
                served=shape.served,
                weight=shape.weight,
                backend=dt.backend,
                device_type=str(dt),
                baseline_status=base.status if base else None,
                candidate_status=cand.status if cand else None,
                candidate_result_id=cand.result_id if cand else None,
                candidate_revision_sha256=cand.revision.source_sha256 if cand else "",
                candidate_error=cand.result.error_message[:300] if cand else "",
                change=classify(base and base.status, cand and cand.status),
            )
            if row.change == Change.STILL_GREEN:
                row.baseline_ms, row.candidate_ms = base.kernel_ms, cand.kernel_ms
                measured = perf(
                    timing_samples(base.result, history[base.pk]),
                    timing_samples(cand.result, history[cand.pk]),
                )
                if measured:
                    row.ratio, row.band = measured
            rows.append(row)
    return Diff(rows=rows, digest=digest_of(baseline, candidate, device_types, rows))


def _timing_history(cells) -> dict[int, list[float]]:
    """Per cell, the kernel medians of its latest passing results on the
    cell's current revision, newest first."""
    cells = [c for c in cells if c.status == Status.PASS]
    history: dict[int, list[float]] = defaultdict(list)
    if not cells:
        return history
    wanted = {
        (c.shape_id, c.device_type_id, c.toolchain_id, c.revision_id): c for c in cells
    }
    results = (
        Result.objects.filter(
            shape_id__in={c.shape_id for c in cells},
            device_type_id__in={c.device_type_id for c in cells},
            toolchain_id__in={c.toolchain_id for c in cells},
            status=Status.PASS,
            kernel_ms__isnull=False,
        )
        .order_by("-created_at", "-id")
        .values_list(
            "shape_id", "device_type_id", "toolchain_id", "revision_id", "kernel_ms"
        )
    )
    for *key, kernel_ms in results:
        cell = wanted.get(tuple(key))
        if cell is not None and len(history[cell.pk]) < REPEAT_WINDOW:
            history[cell.pk].append(kernel_ms)
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
