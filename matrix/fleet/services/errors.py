"""The one error type of the runner services that Django does not have."""

from __future__ import annotations

from django.core.exceptions import ValidationError


class Conflict(ValidationError):
    """The request is well formed but clashes with what is stored."""
