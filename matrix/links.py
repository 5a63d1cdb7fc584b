"""Links to pages that lists repeat hundreds of times, resolved once."""

from __future__ import annotations

import functools

from django.urls import get_script_prefix, reverse


def cell_link_prefix() -> str:
    """'/cells/' however the URLconf mounts the cell page, resolved once per
    script prefix: a page listing hundreds of cells spent a fifth to a third
    of its time resolving the same URL pattern once per link."""
    return _cell_link_prefix(get_script_prefix())


@functools.cache
def _cell_link_prefix(script_prefix: str) -> str:
    return reverse("cell", args=[1, 1])[: -len("1/1/")]
