"""Option values management commands check as they parse them, so a bad
one is refused in one line before any work. (A leading underscore: Django
takes every other module here for a command.)"""

from __future__ import annotations

import argparse

# Ids are stored in signed 64-bit columns; SQLite fails on a larger number
# with an OverflowError instead of finding nothing.
ID_MAX = 2**63 - 1


def is_ascii_number(text: str) -> bool:
    """Digits 0-9 only: str.isdigit() also takes "²", which int() refuses."""
    return text.isascii() and text.isdigit()


def database_id(text: str) -> int:
    """An id as an option takes it: a whole number from 1 to ID_MAX."""
    stripped = text.strip()
    if not is_ascii_number(stripped) or not 1 <= int(stripped) <= ID_MAX:
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
