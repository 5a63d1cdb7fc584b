"""What the CSV downloads share: text cells a spreadsheet will not run, file
names a browser will not misread, and a named toolchain that must exist.

Device type, toolchain and model names come from runners and importers, so
any of them may start like a formula. OWASP's CSV-injection guidance: a
cell that starts with = + - @, a tab or a carriage return is prefixed with
a single quote, which spreadsheets show as text.
"""

from __future__ import annotations

import re

from django.http import HttpResponse

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
UNSAFE_IN_NAMES = re.compile(r"[^A-Za-z0-9._-]+")


def spreadsheet_safe(value) -> str:
    """A text cell a spreadsheet shows as text, never runs as a formula."""
    text = str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def download_name(stem: str, name: str, suffix: str = ".csv") -> str:
    """``stem-name.suffix`` with anything but letters, digits, dots, dashes
    and underscores in ``name`` made a dash: no quote, slash or line break
    of a toolchain's name reaches the Content-Disposition header."""
    cleaned = UNSAFE_IN_NAMES.sub("-", name).strip(".-")[:80] or "unnamed"
    return f"{stem}-{cleaned}{suffix}"


def unknown_toolchain(params, filters, toolchains) -> HttpResponse | None:
    """A 404 in words where the query names a toolchain this server does not
    have: a script asking for one must not get the current one's rows."""
    asked = params.get("toolchain")
    if not asked or (filters.toolchain and asked == filters.toolchain.name):
        return None
    known = ", ".join(t.name for t in toolchains[:20]) or "none yet"
    return HttpResponse(
        f"no toolchain named {asked[:120]!r}; this server has: {known}\n",
        status=404,
        content_type="text/plain; charset=utf-8",
    )
