"""Table cells of the matrix, rendered in Python.

A matrix row holds up to 50 cells and an expanded operator up to 2,000 rows;
through the template engine each cell costs a dozen variable lookups and
number localizations, which made an expanded operator take seconds. Built
here from integers and fixed labels (nothing user-supplied reaches these
strings unescaped), a row is one template variable.
"""

from __future__ import annotations

from django.urls import reverse
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from matrix.queries import MatrixCell, Tally

# Bar segments are SVG geometry with presentation attributes: the
# Content-Security-Policy forbids inline style attributes.
BAR_FILL = {
    "pass": "#1a7f37",
    "evidence": "#9a6700",
    "fail": "#cf222e",
    "unsupported": "#6e7781",
    "empty": "#afb8c1",
}


def summary_bar(t: Tally) -> str:
    rects, x = [], 0
    for kind, pct in t.bar:
        rects.append(
            f'<rect x="{x}" width="{pct}" height="4" fill="{BAR_FILL[kind]}"></rect>'
        )
        x += pct
    return (
        '<svg class="bar" viewBox="0 0 100 4" preserveAspectRatio="none" '
        f'aria-hidden="true">{"".join(rects)}</svg>'
    )


def summary_cells(tallies: list[Tally]) -> SafeString:
    parts = []
    for t in tallies:
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
            f"✓{t.passing}/{t.total}{fails}{stale}</span></td>"
        )
    return mark_safe("".join(parts))


def cell_link_prefix() -> str:
    """'/cells/' however the URLconf mounts the cell page."""
    return reverse("cell", args=[1, 1])[: -len("1/1/")]


def shape_cells(
    shape_id: int, cells: list[MatrixCell], prefix: str, query: str
) -> SafeString:
    query = escape(query)
    parts = []
    for c in cells:
        icon, short, long = c.label
        classes = f"c k-{c.kind}"
        title = long
        stale = ""
        if c.stale:
            classes += " stale"
            title += " (stale)"
            stale = ' <span class="stale-mark">↻<span class="sr">stale</span></span>'
        if c.dimmed:
            classes += " dim"
        if c.speedup:
            title += f" · {c.speedup:.2f}× vs reference"
        parts.append(
            f'<td class="{classes}"><a data-nav tabindex="-1" '
            f'href="{prefix}{shape_id}/{c.device_type_id}/?{query}" title="{title}">'
            f'<span aria-hidden="true">{icon}</span> {short}{stale}</a></td>'
        )
    return mark_safe("".join(parts))
