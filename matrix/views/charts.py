"""A small server-side SVG chart: latency and error of one cell over time.

Drawn as two polylines on a shared time axis, each scaled to its own range,
so the page needs no chart library and renders the same without JavaScript.
"""

from __future__ import annotations

from dataclasses import dataclass

WIDTH, HEIGHT, PAD = 560, 160, 28


@dataclass
class Series:
    name: str
    css: str
    points: str
    low: float
    high: float
    unit: str
    label_y: int


@dataclass
class Chart:
    width: int
    height: int
    pad: int
    series: list[Series]
    start: object
    end: object
    count: int


def _scale(values, lo, hi, top, bottom):
    span = (hi - lo) or 1.0
    return [bottom - (v - lo) / span * (bottom - top) for v in values]


def history_chart(results) -> Chart | None:
    """``results`` oldest first; None when there is nothing to draw."""
    results = [r for r in results if r.kernel_ms is not None or r.rel_err is not None]
    if len(results) < 1:
        return None
    t0 = results[0].created_at.timestamp()
    t1 = results[-1].created_at.timestamp()
    span = (t1 - t0) or 1.0
    xs = {
        r.pk: PAD + (r.created_at.timestamp() - t0) / span * (WIDTH - 2 * PAD)
        for r in results
    }
    if len(results) == 1:
        xs = {results[0].pk: WIDTH / 2}
    series = []
    for name, attr, css, unit in (
        ("kernel latency", "kernel_ms", "latency", "ms"),
        ("relative error", "rel_err", "error", ""),
    ):
        points = [
            (xs[r.pk], getattr(r, attr))
            for r in results
            if getattr(r, attr) is not None
        ]
        if not points:
            continue
        values = [v for _, v in points]
        lo, hi = min(values), max(values)
        ys = _scale(values, lo, hi, PAD, HEIGHT - PAD)
        series.append(
            Series(
                name,
                css,
                " ".join(
                    f"{x:.1f},{y:.1f}" for (x, _), y in zip(points, ys, strict=True)
                ),
                lo,
                hi,
                unit,
                12 + 12 * len(series),
            )
        )
    return Chart(
        WIDTH,
        HEIGHT,
        PAD,
        series,
        results[0].created_at,
        results[-1].created_at,
        len(results),
    )
