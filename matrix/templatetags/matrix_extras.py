"""Filters shared by the pages: a result's time as people read it, and a
toolchain named for what it is."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils import timezone
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import mark_safe

from matrix.links import cell_link_prefix

register = template.Library()


@register.simple_tag
def cell_url(shape_id: int, device_type_id: int) -> str:
    """The cell page's address, as ``{% url 'cell' ... %}`` gives it."""
    return f"{cell_link_prefix()}{shape_id}/{device_type_id}/"


@register.simple_tag
def error_cell_rows(cells, query: str):
    """An error group's table rows, one per cell, built here: through the
    template engine, the 500 rows of the first page were about half of the
    error groups' render after each new result. Each value is escaped as
    the template escaped it; operators, device types and statuses repeat,
    so each is escaped once."""
    prefix, query = cell_link_prefix(), conditional_escape(query)
    escaped: dict = {}

    def e(value) -> str:
        found = escaped.get(value)
        if found is None:
            found = escaped[value] = conditional_escape(value)
        return found

    return mark_safe(  # every value below is escaped
        "".join(
            f'\n        <tr><td>{e(c.operator)}</td><th scope="row">'
            f'<a href="{prefix}{c.shape_id}/{c.device_type_id}/?{query}">'
            f"{e(c.dims_key)} {e(c.dtype)}</a></th><td>{e(c.device_type)}</td>"
            f'<td class="c k-{e(c.status)}">{e(c.status)}</td></tr>\n      '
            for c in cells
        )
    )


def ago(moment: datetime, now: datetime | None = None) -> str:
    """'just now', '5 min ago', '3 h ago', '2 d ago', '4 mo ago', '1 y ago';
    'in 5 min' for a time ahead of this server's clock."""
    now = now or timezone.now()
    seconds = (now - moment).total_seconds()
    ahead = seconds < 0
    seconds = abs(seconds)
    for size, unit in ((31_536_000, "y"), (2_592_000, "mo"), (86_400, "d")):
        if seconds >= size:
            text = f"{int(seconds // size)} {unit}"
            break
    else:
        if seconds >= 3600:
            text = f"{int(seconds // 3600)} h"
        elif seconds >= 60:
            text = f"{int(seconds // 60)} min"
        else:
            return "just now"
    return f"in {text}" if ahead else f"{text} ago"


@register.filter
def when(moment: datetime | None):
    """A ``<time>`` reading '3 h ago', with the absolute UTC time on hover
    and in its datetime attribute; an em dash for no time."""
    if moment is None:
        return "—"
    utc = moment.astimezone(UTC)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        utc.isoformat(timespec="seconds").replace("+00:00", "Z"),
        utc.strftime("%Y-%m-%d %H:%M:%S UTC"),
        ago(utc),
    )


@register.filter
def toolchain_label(toolchain, hosts=None) -> str:
    """The toolchain as its TileLang version, the hosts that run it, torch
    and driver, and the start of its fingerprint. ``hosts``: toolchain id ->
    runner names (``queries.toolchain_hosts``)."""
    if toolchain is None:
        return "no toolchain"
    return toolchain.describe((hosts or {}).get(toolchain.pk, ()))


def percent_text(value: float) -> str:
    """A share as a whole percent that never rounds a part to 0% or 100%."""
    if value <= 0:
        return "0%"
    if value < 1:
        return "<1%"
    if value >= 100:
        return "100%"
    if value > 99:
        return ">99%"
    return f"{round(value)}%"


@register.filter
def percent_of(shares, outcome: str) -> str:
    return percent_text(shares.percent(outcome))


@register.filter
def bar_segments(shares) -> list[tuple[str, str, str]]:
    """(outcome, x, width) of a stacked bar 100 wide."""
    segments, x = [], 0.0
    for outcome, pct in shares.bar:
        segments.append((outcome, f"{x:.2f}", f"{pct:.2f}"))
        x += pct
    return segments


@register.filter
def status_kind(status: str) -> str:
    from matrix.queries import status_kind as kind

    return kind(status)


@register.filter
def status_text(status: str):
    """The status as its icon and short text: '✓ pass', '· not run'."""
    from matrix.queries import state_label

    icon, short, _ = state_label(status)
    return format_html('<span aria-hidden="true">{}</span> {}', icon, short)


@register.filter
def speed_mark(value: float | None, floor: float):
    """A speed-up as "▲1.04×", "≈0.98×" or "▼0.69×"; an em dash for none."""
    from django.utils.safestring import mark_safe

    from matrix.views.matrix_html import speed_text

    if value is None:
        return "—"
    return mark_safe(speed_text(value, floor))


@register.filter
def result_speedup(result, floor: float):
    """A result's speed-up over the reference, marked as in the matrix."""
    from matrix.serving import speedup

    return speed_mark(speedup(result.kernel_ms, result.reference_ms), floor)


@register.filter
def share_of(part: float, whole: float) -> str:
    """``part`` as a percent of ``whole``, as the shares read."""
    return percent_text(100 * part / whole) if whole else "0%"


@register.filter
def sure(confidence: float) -> str:
    """How sure a rank test is, in words a reviewer reads: '99.9% sure'
    (never 100%: a test on samples is never certain)."""
    return f"{min(confidence, 0.999) * 100:.1f}% sure"
