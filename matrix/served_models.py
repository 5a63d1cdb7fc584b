"""Coverage per served model: of the operator calls a model makes in a
forward step, weighted by how often it makes them, the share that would run
validated TileLang on a device type with a toolchain, the share that falls
back to the PyTorch reference, and the share not validated yet.

A model is the source of its calls: a built-in profile (``llama-3-8b``) or
a captured trace, as ``import_shapes`` recorded them in ``ServedCall``. Its
shares are over its calls per forward step, summed over the step sizes
(token counts) imported, and per step size too. Five queries, whatever the
number of models, shapes and device types.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from heapq import nsmallest

from matrix import queries, revisions
from matrix.models import FAILURES, Cell, DeviceType, ServedCall, Shape, Status
from matrix.serving import (
    OUTCOMES,
    TILELANG,
    Verdict,
    serve_speedup_floor,
    serving_verdict,
    speedup,
)


@dataclass
class Shares:
    """Calls per forward step by outcome."""

    calls: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(OUTCOMES, 0.0)
    )

    def add(self, outcome: str, n: float) -> None:
        self.calls[outcome] += n

    @property
    def total(self) -> float:
        return sum(self.calls.values())

    def percent(self, outcome: str) -> float:
        total = self.total
        return 100 * self.calls[outcome] / total if total else 0.0

    @property
    def percents(self) -> dict[str, float]:
        return {outcome: self.percent(outcome) for outcome in OUTCOMES}

    @property
    def bar(self) -> list[tuple[str, float]]:
        """(outcome, percent) for a stacked bar, in the outcomes' order."""
        return [(o, self.percent(o)) for o in OUTCOMES if self.calls[o]]


@dataclass
class Piece:
    """One cell of the model on a device type that does not serve TileLang,
    with the calls per forward step that fall back or wait on it."""

    shape: Shape
    calls: float
    status: str
    verdict: Verdict
    speedup: float | None
    device_type_id: int
    # The revision the cell's result ran (None: never run).
    revision_id: int | None
    # Where it fails here but its revision passes on another toolchain (same
    # device type): queries.PassesOn, set by ``mark_passing_elsewhere`` for
    # the pieces a reader is shown. A run here cannot close it unless the
    # revision that failed is not the current one; the upgrade can.
    passes_on: queries.PassesOn | None = None

    @property
    def rerun_helps(self) -> bool:
        """A fresh run could close it: never run, stale or failing, unless
        another toolchain passes the very revision a run here would try."""
        return self.verdict.rerun_helps and not (
            self.passes_on and not self.passes_on.stale
        )


@dataclass
class DeviceCoverage:
    device_type: DeviceType
    shares: Shares
    # (tokens, shares) per step size, smallest first; 0: not recorded.
    steps: list[tuple[int, Shares]]
    # The cells not serving TileLang, as (calls, shape id): their pieces are
    # made when asked for (``pieces``, ``top``). A summary of every model
    # counts them and lists none: making and sorting them all was a sixth
    # of an uncached Models read at 1M results.
    missing_cells: list[tuple[float, int]] = field(repr=False)
    make_pieces: Callable[[list[tuple[float, int]]], list[Piece]] = field(repr=False)

    @property
    def missing(self) -> int:
        return len(self.missing_cells)

    @cached_property
    def pieces(self) -> list[Piece]:
        """Every cell not serving TileLang, the most calls first."""
        return self.make_pieces(self.missing_cells)

    def top(self, n: int) -> list[Piece]:
        """The first ``n`` of ``pieces``, without making the others."""
        return self.make_pieces(self.missing_cells, n)

    @property
    def rerunnable(self) -> list[Piece]:
        """The pieces a fresh run could close: never run, stale, failing
        (but not where another toolchain already passes the current
        revision: the same one fails the same way again)."""
        return [p for p in self.pieces if p.rerun_helps]


@dataclass
class ModelCoverage:
    name: str
    shape_count: int
    calls: float
    tokens: list[int]
    devices: list[DeviceCoverage]


def _calls(filters: queries.MatrixFilters):
    calls = ServedCall.objects.all()
    if filters.model:
        calls = calls.filter(source=filters.model)
    shape_q = filters.shape_q("shape__")
    return calls.filter(shape_q) if shape_q else calls


# What the page, the API and the CSV read of a piece's shape.
PIECE_FIELDS = ("dims", "dims_key", "dtype", "weight", "operator__name")


def served_calls(filters: queries.MatrixFilters) -> tuple[list, dict]:
    """(source, shape id, tokens, calls) of the calls under the filters'
    model, operator, shape text and dtype, and their shapes (id -> Shape,
    its operator read with it): a shape once however many calls name it.
    Two queries."""
    rows = list(
        _calls(filters)
        .order_by("source", "tokens", "-calls", "shape_id")
        .values_list("source", "shape_id", "tokens", "calls")
    )
    # The fields a piece shows, no more: building the shapes and their
    # operators whole was half the Models read's Python at 100k results.
    shapes = (
        Shape.objects.select_related("operator")
        .only(*PIECE_FIELDS)
        .in_bulk({shape_id for _, shape_id, _, _ in rows})
    )
    return rows, shapes


def model_coverage(
    filters: queries.MatrixFilters,
    device_types: list[DeviceType] | None = None,
) -> list[ModelCoverage]:
    """Each model's coverage on each device type under the filters, on the
    filters' toolchain. Device types come from ``device_types`` when given
    (read from the database otherwise). Which pieces pass on another
    toolchain is left to ``mark_passing_elsewhere``, for the pieces shown:
    asked of every failing cell, it was a fifth of a Models read that shows
    none (at 1M results)."""
    floor = serve_speedup_floor()
    device_types = queries.device_type_list(filters, device_types)
    calls, shapes_by_id = served_calls(filters)
    found: dict[tuple[int, int], tuple] = {}
    if filters.toolchain is not None and calls and device_types:
        found = {
            (s, d): rest
            for s, d, *rest in Cell.objects.filter(
                shape_id__in=_calls(filters).values("shape_id"),
                toolchain=filters.toolchain,
                device_type_id__in=[d.id for d in device_types],
            ).values_list(
                "shape_id",
                "device_type_id",
                "status",
                "revision_id",
                "kernel_ms",
                "reference_ms",
            )
        }
    current = revisions.current_map() if found else {}
    backend = {d.id: d.backend for d in device_types}
    operator = {s.pk: s.operator_id for s in shapes_by_id.values()}

    by_model: dict[str, list[tuple]] = {}
    for source, *call in calls:
        by_model.setdefault(source, []).append(call)
    # Plain tuples in the loops below: they run models × device types ×
    # calls times, and model attribute lookups were most of a Models read.
    verdicts: dict[tuple[int, int], tuple] = {}
    models = []
    for name, model_calls in by_model.items():
        shapes = {s: shapes_by_id[s] for s, _, _ in model_calls}
        order = {
            pk: (shape.operator.name, shape.dims_key, shape.dtype)
            for pk, shape in shapes.items()
        }
        rows = [(s, operator[s], t, n) for s, t, n in model_calls]
        per_shape: dict[int, float] = {}
        for shape_id, _, _, n in rows:
            per_shape[shape_id] = per_shape.get(shape_id, 0.0) + n
        tokens = sorted({t for _, _, t, _ in rows})
        devices = []
        for dt in device_types:
            dt_id, backend = dt.id, dt.backend
            total = dict.fromkeys(OUTCOMES, 0.0)
            by_step = {t: dict.fromkeys(OUTCOMES, 0.0) for t in tokens}
            for shape_id, operator_id, tok, n in rows:
                key = (shape_id, dt_id)
                found_verdict = verdicts.get(key)
                if found_verdict is None:
                    found_verdict = verdicts[key] = _verdict(
                        found.get(key),
                        current.get((operator_id, backend)),
                        filters,
                        floor,
                    )
                outcome = found_verdict[1].outcome
                total[outcome] += n
                by_step[tok][outcome] += n
            missing = [
                (n, shape_id)
                for shape_id, n in per_shape.items()
                if verdicts[shape_id, dt_id][1].outcome != TILELANG
            ]
            steps = [(t, Shares(by_step[t])) for t in tokens]
            make = functools.partial(_pieces, dt_id, shapes, order, verdicts)
            devices.append(DeviceCoverage(dt, Shares(total), steps, missing, make))
        models.append(
            ModelCoverage(
                name,
                len(shapes),
                sum(per_shape.values()),
                tokens,
                devices,
            )
        )
    return models


def _pieces(
    dt_id: int,
    shapes: dict,
    order: dict,
    verdicts: dict,
    missing: list[tuple[float, int]],
    n: int | None = None,
) -> list[Piece]:
    """The pieces of ``missing`` cells on a device type, the most calls
    first (then by operator, dims and dtype); the first ``n`` only when
    given."""

    def place(cell):
        calls, shape_id = cell
        return -calls, order[shape_id]

    chosen = sorted(missing, key=place) if n is None else nsmallest(n, missing, place)
    pieces = []
    for calls, shape_id in chosen:
        status, verdict, value, revision_id = verdicts[shape_id, dt_id]
        pieces.append(
            Piece(shapes[shape_id], calls, status, verdict, value, dt_id, revision_id)
        )
    return pieces


def _verdict(hit, current: int | None, filters, floor: float):
    """(status, verdict, speedup, revision id) of a cell; ``current``: the id
    of the revision current on the cell's backend."""
    if hit is None:
        empty = serving_verdict(queries.EMPTY, False, None, floor)
        return queries.EMPTY, empty, None, None
    status, revision_id, kernel_ms, reference_ms = hit
    stale = filters.toolchain_stale or revision_id != current
    value = speedup(kernel_ms, reference_ms) if status == Status.PASS else None
    return status, serving_verdict(status, stale, value, floor), value, revision_id


def mark_passing_elsewhere(pieces: Iterable[Piece], toolchain) -> None:
    """Set ``passes_on`` of each failing piece of ``pieces`` whose revision
    passes on another toolchain, same shape and device type (see
    queries.passing_elsewhere). Two queries, none where nothing fails."""
    failing: dict[tuple[int, int], list[Piece]] = {}
    for piece in pieces:
        if piece.status in FAILURES:
            failing.setdefault((piece.shape.pk, piece.device_type_id), []).append(piece)
    found = queries.passing_elsewhere(
        set(failing),
        toolchain,
        {key: same[0].revision_id for key, same in failing.items()},
    )
    for key, passes_on in found.items():
        for piece in failing[key]:
            piece.passes_on = passes_on
