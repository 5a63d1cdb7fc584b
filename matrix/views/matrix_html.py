"""Table rows and cells of the matrix, rendered in Python.

A matrix row holds up to 50 cells and an expanded operator up to 2,000 rows;
through the template engine each cell costs a dozen variable lookups and
number localizations, which made an expanded operator take seconds and the
collapsed page tens of milliseconds. Built here from integers and fixed
labels, with every catalogue string (device names, shape keys) escaped, the
column headers are one template variable and so is each block of rows.
"""

from __future__ import annotations

import functools

from django.template.defaultfilters import floatformat
from django.urls import reverse
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from matrix.queries import STATE_LABELS, MatrixCell, ShapeRow, Tally, status_kind

# Bar segments are SVG geometry with presentation attributes: the
# Content-Security-Policy forbids inline style attributes. The bar's own
# background (app.css) is the colour of cells never run, so that segment and
# segments rounded to nothing are left out: the collapsed page carries 250
# of these bars, and they were most of its bytes.
BAR_FILL = {
    "pass": "#1a7f37",
    "evidence": "#9a6700",
    "fail": "#cf222e",
    "unsupported": "#6e7781",
}


def summary_bar(t: Tally) -> str:
    rects, x = [], 0
    for kind, pct in t.bar:
        if pct and kind in BAR_FILL:
            rects.append(
                f'<rect x="{x}" width="{pct}" height="4" fill="{BAR_FILL[kind]}"/>'
            )
        x += pct
    return (
        '<svg class="bar" viewBox="0 0 100 4" preserveAspectRatio="none" '
        f'aria-hidden="true">{"".join(rects)}</svg>'
    )


def summary_cells(tallies: list[Tally]) -> SafeString:
    parts = []
    for t in tallies:
        # The pass glyph only where something passes: "✓0/16" read as a pass.
        passing = f"✓{t.passing}" if t.passing else "0"
        fails = f' <b class="fails">✗{t.failing}</b>' if t.failing else ""
        stale = f' <span class="stale-n">↻{t.stale}</span>' if t.stale else ""
        title = (
            f"{t.passing} pass, {t.evidence} lowered/built, {t.failing} failing, "
            f"{t.empty} not run, {t.stale} stale"
        )
        parts.append(
            f'<td class="summary{" has-fail" if t.failing else ""}">'
            f'<span data-nav tabindex="-1" title="{title}">'
            f"{summary_bar(t)}"
            f"{passing}/{t.total}{fails}{stale}</span></td>"
        )
    return mark_safe("".join(parts))


def cell_link_prefix() -> str:
    """'/cells/' however the URLconf mounts the cell page."""
    return reverse("cell", args=[1, 1])[: -len("1/1/")]


@functools.cache
def _cell_parts(status: str, stale: bool, dimmed: bool) -> tuple[str, str, str]:
    """The fixed text of a cell around its link and title: a handful of
    (status, stale, dimmed) combinations, each built once."""
    icon, short, long = STATE_LABELS.get(status, ("?", status, status))
    classes = f"c k-{status_kind(status)}"
    title = long
    mark = ""
    if stale:
        classes += " stale"
        title += " (stale)"
        mark = ' <span class="stale-mark">↻<span class="sr">stale</span></span>'
    if dimmed:
        classes += " dim"
    return (
        f'<td class="{escape(classes)}"><a data-nav tabindex="-1" href="',
        escape(title),
        f'"><span aria-hidden="true">{escape(icon)}</span> {escape(short)}{mark}'
        "</a></td>",
    )


def shape_cells(
    shape_id: int, cells: list[MatrixCell], prefix: str, query: str
) -> SafeString:
    link = f"{prefix}{shape_id}/"
    query = escape(query)
    parts = []
    for c in cells:
        head, title, tail = _cell_parts(c.status, c.stale, c.dimmed)
        speedup = c.speedup
        if speedup:
            title = f"{title} · {speedup:.2f}× vs reference"
        parts.append(f'{head}{link}{c.device_type_id}/?{query}" title="{title}{tail}')
    return mark_safe("".join(parts))


def shape_rows(rows: list[ShapeRow], prefix: str, query: str) -> SafeString:
    """The ``<tr>`` of each shape × dtype row of an expanded operator."""
    parts = []
    for r in rows:
        shape = r.shape
        served = ""
        if shape.served:
            weight = floatformat(shape.weight, "-2")
            served = f' <span class="served" title="served weight">w {weight}</span>'
        parts.append(
            '<tr class="shape-row"><th scope="row" class="shape">'
            f"{escape(shape.dims_key)} "
            f'<span class="dtype">{escape(shape.dtype)}</span>{served}</th>'
            f'<td class="count">{r.passing} / {r.total}</td>'
            f"{shape_cells(shape.id, r.cells, prefix, query)}</tr>\n"
        )
    return mark_safe("".join(parts))


def backend_headers(groups: list[tuple[str, int]]) -> SafeString:
    return mark_safe(
        "".join(
            f'<th scope="colgroup" colspan="{span}" class="backend">'
            f"{escape(label)}</th>"
            for label, span in groups
        )
    )


def device_headers(device_types) -> SafeString:
    parts = []
    for d in device_types:
        arch = f"<small>{escape(d.arch)}</small>" if d.arch else ""
        parts.append(
            f'<th scope="col" class="device"><span>{escape(d.vendor)} '
            f"{escape(d.model)}</span>{arch}</th>"
        )
    return mark_safe("".join(parts))


def column_counts(columns: list[Tally]) -> SafeString:
    return mark_safe(
        "".join(
            f'<td class="count" title="{t.failing} failing, {t.empty} not run, '
            f'{t.stale} stale">{t.passing} / {t.total}</td>'
            for t in columns
        )
    )
