"""Neighbours of served shapes: the sizes one step away from what a model
serves, where TileLang's shape bugs have shown (a kernel right on 4096 and
wrong on 4097). Each served shape gets, where they differ from it:

- ``+1`` and ``-1``: every varied dim one past and one short of its value,
  which a served size usually is a multiple of a tile: the boundaries;
- ``8 mod 16``: every varied dim moved to the nearest size that is 8 modulo
  16, half a vector or tile off;
- ``unit``: the leading dim 1 (one row, one batch, one decode token);
- ``one trip``: the last dim within one 16-wide tile, so that its loop runs
  once.

They are shapes of their own (``Shape.guards``), unserved and of no
weight: the gaps and Run missing include them, the served coverage does
not count them.
"""

from __future__ import annotations

from django.db import transaction

from matrix.models import Shape, dims_key

# Dims a neighbour may move: the attention kernels take head counts and
# head sizes they declare, so only batch and sequence move there.
VARIED = {"attention": ("B", "S"), "attention_causal": ("B", "S")}
TRIP = 16


def _nearest_8_mod_16(value: int) -> int:
    return value if value < 16 else value - (value - 8) % 16


def neighbours(operator: str, dims: dict[str, int]) -> dict[str, dict[str, int]]:
    """Rule -> dims of each neighbour of ``dims`` that differs from it."""
    varied = [d for d in dims if d in VARIED.get(operator, dims)]
    first, last = varied[0], varied[-1]

    def moved(change) -> dict[str, int]:
        return {d: max(1, change(v)) if d in varied else v for d, v in dims.items()}

    found = {
        "+1": moved(lambda v: v + 1),
        "-1": moved(lambda v: v - 1),
        "8 mod 16": moved(_nearest_8_mod_16),
        "unit": {**dims, first: 1},
        "one trip": {**dims, last: min(dims[last], TRIP)},
    }
    return {rule: near for rule, near in found.items() if near != dims}


@transaction.atomic
def neighbours_add() -> int:
    """A guard shape for every neighbour of every served shape that is not
    a shape yet; how many were added."""
    known = set(Shape.objects.values_list("operator_id", "dims_key", "dtype"))
    added = []
    for shape in Shape.objects.served().select_related("operator"):
        # In the operator's declared order (jsonb keeps keys in its own).
        declared = {d: shape.dims[d] for d in shape.operator.dims}
        for rule, dims in neighbours(shape.operator.name, declared).items():
            key = (shape.operator_id, dims_key(dims), shape.dtype)
            if key in known:
                continue
            known.add(key)
            added.append(
                Shape(
                    operator=shape.operator,
                    dims=dims,
                    dims_key=key[1],
                    dtype=shape.dtype,
                    guards=True,
                    source_profile=f"neighbour {rule}",
                )
            )
    Shape.objects.bulk_create(added)
    return len(added)
