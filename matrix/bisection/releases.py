"""TileLang releases in order, and the ones between two toolchains.

A release no runner has ever reported has no Toolchain row, yet it is one a
bisection must name as untested: the published releases are listed here,
and every version a toolchain row carries is added to them.
"""

from __future__ import annotations

import re

# TileLang's releases on the package index (2026-12): what `pip install
# tilelang==X` can build with scripts/make-toolchain-venv.
PUBLISHED = (
    "0.1.0",
    "0.1.1",
    "0.1.2",
    "0.1.2.post1",
    "0.1.3",
    "0.1.4",
    "0.1.5",
    "0.1.6.post1",
    "0.1.6.post2",
    "0.1.7",
    "0.1.7.post1",
    "0.1.7.post2",
    "0.1.7.post3",
    "0.1.8",
    "0.1.9",
    "0.1.10",
    "0.1.11",
    "0.1.12",
    "0.1.13",
    "0.1.14",
    "0.1.15",
)

_RELEASE = re.compile(r"^(\d+(?:\.\d+)*)(?:\.post(\d+))?$")


def release_key(version: str) -> tuple | None:
    """An order for release versions (``0.1.7.post2`` after ``0.1.7``,
    ``0.1.10`` after ``0.1.9``); None for a version that is not one (a
    local build, a pre-release), which no bisection can place."""
    match = _RELEASE.match(version or "")
    if match is None:
        return None
    numbers = tuple(int(n) for n in match.group(1).split("."))
    return numbers, int(match.group(2) or -1)


def releases_between(older: str, newer: str, known) -> list[str]:
    """The releases strictly between ``older`` and ``newer``, oldest first,
    from the published ones and ``known`` (versions toolchain rows hold)."""
    low, high = release_key(older), release_key(newer)
    versions = {v for v in (*PUBLISHED, *known) if release_key(v) is not None}
    return sorted((v for v in versions if low < release_key(v) < high), key=release_key)
