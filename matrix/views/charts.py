"""Small server-side SVG charts: kernel time against the reference over time
and across shapes, and an error over time.

Drawn here as SVG markup, so the pages need no chart library, render the
same without JavaScript and keep to the Content-Security-Policy (classes and
geometry only, no style attributes: app.css colours them, dark mode
included). Every series has its own marker shape, so a chart reads without
colour, and every point is drawn: a history of one result shows that point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 560, 200
LEFT, RIGHT, TOP, BOTTOM = 58, 16, 14, 34


def number(value: float) -> str:
    return f"{value:.3g}"


def _log_range(values: list[float]) -> tuple[float, float]:
    lo, hi = math.log10(min(values)), math.log10(max(values))
    if hi - lo < 0.2:  # at least a factor of 1.6 on screen
        middle = (hi + lo) / 2
        lo, hi = middle - 0.1, middle + 0.1
    pad = (hi - lo) * 0.08
    return lo - pad, hi + pad


def _marker(shape: str, x: float, y: float, css: str, title: str, href="") -> str:
    if shape == "square":
        mark = (
            f'<rect class="{css}" x="{x - 3.5:.1f}" y="{y - 3.5:.1f}" '
            f'width="7" height="7"><title>{escape(title)}</title></rect>'
        )
    elif shape in ("triangle", "down"):
        tip, base = (-4.5, 3.5) if shape == "triangle" else (4.5, -3.5)
        points = (
            f"{x:.1f},{y + tip:.1f} {x - 4.5:.1f},{y + base:.1f} "
            f"{x + 4.5:.1f},{y + base:.1f}"
        )
        mark = f'<polygon class="{css}" points="{points}"><title>{escape(title)}</title></polygon>'
    else:
        mark = (
            f'<circle class="{css}" cx="{x:.1f}" cy="{y:.1f}" r="4">'
            f"<title>{escape(title)}</title></circle>"
        )
    if href:
        return f'<a href="{escape(href)}">{mark}</a>'
    return mark


def _frame(label: str, body: str, width=WIDTH, height=HEIGHT) -> SafeString:
    return mark_safe(
        f'<svg class="chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" aria-label="{escape(label)}">{body}</svg>'
    )


@dataclass
class TimeSeries:
    name: str
    css: str  # the class of its line and markers
    marker: str  # circle, square or triangle
    points: list[tuple[datetime, float]]


def time_chart(label: str, unit: str, series: list[TimeSeries]) -> SafeString | None:
    """Series over time on one shared axis (log when the values span more
    than a factor of ten); None when no series has a point."""
    series = [s for s in series if s.points]
    if not series:
        return None
    times = [t.timestamp() for s in series for t, _ in s.points]
    values = [v for s in series for _, v in s.points if v > 0]
    if not values:
        return None
    t0, t1 = min(times), max(times)
    log = max(values) / min(values) > 10
    if log:
        lo, hi = _log_range(values)
    else:
        lo, hi = min(values), max(values)
        pad = (hi - lo) * 0.1 or abs(hi) * 0.1 or 1.0
        lo, hi = max(lo - pad, 0.0), hi + pad
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM

    def x_of(t: datetime) -> float:
        if t1 == t0:
            return LEFT + plot_w / 2
        return LEFT + (t.timestamp() - t0) / (t1 - t0) * plot_w

    def y_of(v: float) -> float:
        v = math.log10(max(v, 1e-12)) if log else v
        return TOP + (hi - v) / ((hi - lo) or 1.0) * plot_h

    parts = [_axes(plot_w, plot_h)]
    for value, text in _ticks(lo, hi, log, unit):
        y = y_of(value)
        parts.append(
            f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">{text}</text>'
        )
    start = datetime.fromtimestamp(t0, UTC)
    end = datetime.fromtimestamp(t1, UTC)
    parts.append(
        f'<text class="tick" x="{LEFT}" y="{HEIGHT - 8}">{start:%Y-%m-%d %H:%M}</text>'
    )
    if t1 != t0:
        parts.append(
            f'<text class="tick" x="{LEFT + plot_w}" y="{HEIGHT - 8}" '
            f'text-anchor="end">{end:%Y-%m-%d %H:%M}</text>'
        )
    for s in series:
        points = sorted(s.points)
        coords = [(x_of(t), y_of(v)) for t, v in points if v > 0]
        if len(coords) > 1:
            line = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
            parts.append(f'<polyline class="{s.css}" points="{line}"/>')
        for (t, v), (x, y) in zip([p for p in points if p[1] > 0], coords, strict=True):
            title = (
                f"{s.name}: {number(v)} {unit}, {t.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
            )
            parts.append(_marker(s.marker, x, y, f"{s.css} mark", title))
    return _frame(label, "".join(parts))


def _axes(plot_w: float, plot_h: float) -> str:
    return (
        f'<line class="axis" x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" '
        f'y2="{TOP + plot_h}"/><line class="axis" x1="{LEFT}" y1="{TOP}" '
        f'x2="{LEFT}" y2="{TOP + plot_h}"/>'
    )


def log_ticks(lo: float, hi: float) -> list[float]:
    """Round values (1, 2, 5 times a power of ten) between 10**lo and
    10**hi, as log10: every decade where they would crowd, at least two."""
    ticks = [
        math.log10(m * 10.0**d)
        for d in range(math.floor(lo), math.ceil(hi) + 1)
        for m in (1, 2, 5)
        if lo <= math.log10(m * 10.0**d) <= hi
    ]
    if len(ticks) > 6:
        ticks = [t for t in ticks if abs(t - round(t)) < 1e-9] or ticks[::3]
    return ticks if len(ticks) >= 2 else [lo, hi]


def _ticks(lo: float, hi: float, log: bool, unit: str) -> list[tuple[float, str]]:
    """Labelled values on the y axis."""
    if log:
        return [(t, f"{number(10.0**t)} {unit}") for t in log_ticks(lo, hi)]
    step = (hi - lo) / 4
    return [(lo + i * step, f"{number(lo + i * step)} {unit}") for i in range(5)]


@dataclass
class ScatterPoint:
    reference_ms: float
    kernel_ms: float
    title: str
    href: str
    slower: bool
    highlight: bool = False


def speed_scatter(label: str, points: list[ScatterPoint], floor: float):
    """Kernel time (y) against the reference's (x) across shapes, both on
    log axes, with the parity line (equal times) and the floor's line
    (kernel time = reference time / floor): a point below the parity line
    is faster than the reference, one above the floor's line too slow to
    serve. Slower points are downward triangles (▼, as in the matrix), the
    others circles; the point of
    the page's own cell is drawn larger. None without a point."""
    points = [p for p in points if p.kernel_ms > 0 and p.reference_ms > 0]
    if not points:
        return None
    values = [p.kernel_ms for p in points] + [p.reference_ms for p in points]
    lo, hi = _log_range(values)
    size = 360
    plot = size - TOP - BOTTOM
    width = plot + LEFT + RIGHT

    def at(v: float, vertical: bool) -> float:
        fraction = (math.log10(v) - lo) / (hi - lo)
        return TOP + (1 - fraction) * plot if vertical else LEFT + fraction * plot

    parts = [_axes(plot, plot)]
    for tick in log_ticks(lo, hi):
        v = 10.0**tick
        x, y = at(v, False), at(v, True)
        parts.append(
            f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot}" y2="{y:.1f}"/>'
            f'<line class="grid" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + plot}"/>'
            f'<text class="tick" x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">{number(v)}</text>'
            f'<text class="tick" x="{x:.1f}" y="{TOP + plot + 12}" text-anchor="middle">{number(v)}</text>'
        )
    a, b = 10.0**lo, 10.0**hi
    parts.append(
        f'<line class="parity" x1="{at(a, False):.1f}" y1="{at(a, True):.1f}" '
        f'x2="{at(b, False):.1f}" y2="{at(b, True):.1f}"><title>equal times</title></line>'
    )
    # kernel = reference / floor, clipped to the plot.
    x_end = b * floor
    parts.append(
        f'<line class="floor" x1="{at(a, False):.1f}" y1="{at(a / floor, True):.1f}" '
        f'x2="{at(x_end, False):.1f}" y2="{at(b, True):.1f}">'
        f"<title>{floor:.2f}× of the reference: slower than this falls back</title></line>"
    )
    parts.append(
        f'<text class="tick" x="{LEFT + plot / 2:.1f}" y="{size - 4}" '
        f'text-anchor="middle">reference time (ms)</text>'
        f'<text class="tick" x="12" y="{TOP + plot / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 12 {TOP + plot / 2:.1f})">kernel time (ms)</text>'
    )
    for p in sorted(points, key=lambda p: p.highlight):
        css = "slower" if p.slower else "faster"
        if p.highlight:
            css += " this"
        parts.append(
            _marker(
                "down" if p.slower else "circle",
                at(p.reference_ms, False),
                at(p.kernel_ms, True),
                f"point {css}",
                p.title,
                p.href,
            )
        )
    return _frame(label, "".join(parts), width=width, height=size)
