"""Option values management commands check as they parse them, so a bad
one is refused in one line before any work. (A leading underscore: Django
takes every other module here for a command.)"""

from __future__ import annotations

import argparse

from matrix.models import ID_MAX


def database_id(text: str) -> int:
    """An id as an option takes it: a whole number from 1 to ID_MAX."""
    stripped = text.strip()
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
    if not (stripped.isascii() and stripped.isdigit()) or not (
        1 <= int(stripped) <= ID_MAX
    ):
        raise argparse.ArgumentTypeError(
            f"takes an id, a whole number from 1 to {ID_MAX}; got {text!r}"
        )
    return int(stripped)


def not_empty(text: str) -> str:
    """A value given but empty is refused: dropped, it would quietly widen a
    filter to everything or fall back to a default nobody asked for."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text
