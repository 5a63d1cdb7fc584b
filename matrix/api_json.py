"""The API's JSON is strict: no ``NaN``, ``Infinity`` or ``-Infinity``.

Python's json module writes them by default, and ``JSON.parse`` (and most
other parsers) then fails on the whole answer, so one bad number in one
row would break every client reading the API. Ingest refuses non-finite
numbers, but a row can still hold one (written before that check, or by
hand): such a value is answered as ``null``, "no value", which is what a
NaN or infinite measurement means."""

from __future__ import annotations

import json
import math

from ninja.renderers import JSONRenderer


def finite(value):
    """``value`` with every non-finite float, however deeply nested,
    replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


class StrictJSONRenderer(JSONRenderer):
    def render(self, request, data, *, response_status: int) -> str:
        # The walk only when a number is not finite: json refuses it first
        # (walking every answer was a tenth of a 500-cell matrix page).
        try:
            return json.dumps(data, cls=self.encoder_class, allow_nan=False)
        except ValueError:
            return json.dumps(finite(data), cls=self.encoder_class, allow_nan=False)
