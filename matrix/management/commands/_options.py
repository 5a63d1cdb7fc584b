"""Option values management commands check as they parse them, so a bad
one is refused in one line before any work. (A leading underscore: Django
takes every other module here for a command.)"""

from __future__ import annotations

import argparse

from matrix.models import ID_MAX
from runners.cli import not_empty  # noqa: F401 (one rule for every command)


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
