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
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from matrix.models import Status
from matrix.queries import (
    EMPTY,
    STALE,
    STATE_LABELS,
    MatrixCell,
    ShapeRow,
    Tally,
    status_kind,
)
from matrix.serving import ratio_text, serve_speedup_floor, speed_class

# Bar segments are SVG geometry with a class that app.css colours (dark mode
# included): the Content-Security-Policy forbids inline style attributes.
# The bar's own background is the colour of cells never run, so that segment
# and segments rounded to nothing are left out: the collapsed page carries
# 250 of these bars, and they were most of its bytes.
BAR_KINDS = {"pass", "evidence", "fail", "unsupported"}


def summary_bar(t: Tally) -> str:
    rects, x = [], 0
    for kind, pct in t.bar:
        if pct and kind in BAR_KINDS:
            rects.append(f'<rect class="s-{kind}" x="{x}" width="{pct}" height="4"/>')
        x += pct
    return (
        '<svg class="bar" viewBox="0 0 100 4" preserveAspectRatio="none" '
        f'aria-hidden="true">{"".join(rects)}</svg>'
    )


def tally_title(t: Tally) -> str:
    """Every status a tally counts, in the ladder's order, and its stale
    cells: "16 unsup." as much as "3 pass". Numbers and the fixed labels
    only: nothing to escape."""
    parts = [
        f"{n} {STATE_LABELS.get(status, ('', status, status))[1]}"
        for status in TALLY_ORDER
        if (n := t.by_status.get(status))
    ]
    if t.stale:
        parts.append(f"{t.stale} stale")
    return ", ".join(parts) or "no cells"


# Statuses in the order a tooltip lists them: the ladder, then failures,
# then what is outside the kernel, then never run.
TALLY_ORDER = [
    Status.PASS,
    Status.BUILT,
    Status.LOWERED,
    Status.COMPILE_ERROR,
    Status.MISMATCH,
    Status.UNSTABLE,
    Status.RUNTIME_ERROR,
    Status.TIMEOUT,
    Status.INFRA_ERROR,
    Status.UNSUPPORTED,
    EMPTY,
    STALE,
]


def progress_text(t: Tally) -> str:
    """What a tally reached, as words that do not read as failure: "✓3/16"
    where cells pass, "16/16 lowered" where a compile-only column lowered
    them all, "16/16 unsup." where the kernel declares none of them."""
    if t.passing:
        return f"✓{t.passing}/{t.total}"
    if t.evidence:
        built = t.by_status.get(Status.BUILT, 0)
        word = "built" if built == t.evidence else "lowered"
        if built and built != t.evidence:
            word = "compiled"
        return f"{t.evidence}/{t.total} {word}"
    unsupported = t.by_status.get(Status.UNSUPPORTED, 0)
    if unsupported:
        return f"{unsupported}/{t.total} unsup."
    return f"0/{t.total}"


def summary_cells(tallies: list[Tally]) -> SafeString:
    parts = []
    for t in tallies:
        fails = f' <b class="fails">✗{t.failing}</b>' if t.failing else ""
        unsupported = t.by_status.get(Status.UNSUPPORTED, 0)
        if unsupported and (t.passing or t.evidence):
            fails += f' <span class="unsup-n">–{unsupported}</span>'
        stale = f' <span class="stale-n">↻{t.stale}</span>' if t.stale else ""
        parts.append(
            f'<td class="summary{" has-fail" if t.failing else ""}">'
            f'<span data-nav tabindex="-1" title="{tally_title(t)}">'
            f"{summary_bar(t)}"
            f"{progress_text(t)}{fails}{stale}</span></td>"
        )
    return mark_safe("".join(parts))


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


SPEED_MARKS = {"faster": "▲", "parity": "≈", "slower": "▼"}


def speed_text(value: float, floor: float) -> str:
    """A pass's speed-up as text with a mark that reads without colour:
    "▲1.04×" faster, "≈0.98×" within the noise band, "▼0.69×" slower
    (production keeps the reference there)."""
    return _speed_parts(ratio_text(value, floor), speed_class(value, floor))[0]


@functools.cache
def _speed_parts(ratio: str, kind: str) -> tuple[str, str, str]:
    """(the mark and ratio; the ratio and the verdict for the cell's title)
    for a ratio's text: an expanded operator has thousands of passing cells
    but few distinct ratios, each built once. Only characters that need no
    escaping."""
    mark = (
        f'<span class="sp sp-{kind}"><span aria-hidden="true">{SPEED_MARKS[kind]}'
        f"</span>{ratio}</span>"
    )
    verdict = "; production keeps the reference" if kind == "slower" else ""
    return mark, f" · {ratio} the reference&#x27;s speed", verdict


def shape_cells(
    shape_id: int, cells: list[MatrixCell], prefix: str, query: str
) -> SafeString:
    link = f"{prefix}{shape_id}/"
    query = escape(query)
    floor = serve_speedup_floor()
    parts = []
    for c in cells:
        head, title, tail = _cell_parts(c.status, c.stale, c.dimmed)
        speedup = c.speedup if c.status == Status.PASS else None
        if speedup:
            mark, said, verdict = _speed_parts(
                ratio_text(speedup, floor), speed_class(speedup, floor)
            )
            title = (
                f"{title}{said} ({c.kernel_ms:.3g} ms against "
                f"{c.reference_ms:.3g} ms){verdict}"
            )
            tail = tail.replace("</a>", f" {mark}</a>", 1)
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
            f'<td class="count" title="{tally_title(t)}">{progress_text(t)}</td>'
            for t in columns
        )
    )
