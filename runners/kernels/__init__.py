"""The operator library: one module per operator, all behind ``Operator``.

``OPERATORS`` maps an operator name to its ``Operator``; ``get(name)``
raises a ``KeyError`` naming the known operators.
"""

from __future__ import annotations

from . import (
    attention,
    attention_causal,
    elementwise_add,
    gemm,
    rmsnorm,
    row_sum,
    softmax,
)
from .base import Operator

OPERATORS: dict[str, Operator] = {
    module.OPERATOR.name: module.OPERATOR
    for module in (
        elementwise_add,
        row_sum,
        softmax,
        rmsnorm,
        gemm,
        attention,
        attention_causal,
    )
}


def get(name: str) -> Operator:
    try:
        return OPERATORS[name]
    except KeyError:
        known = ", ".join(sorted(OPERATORS))
        raise KeyError(f"unknown operator {name!r}; known: {known}") from None
