"""The one interface every operator module implements.

Imported inside the sandboxed harness child, so: no Django, stdlib + torch +
tilelang only, and tilelang is imported lazily (a compile-only runner for
metal must not need a GPU to import an operator).

A TileLang program built by ``Operator.program`` takes its tensors in the order
``inputs + outputs``; the harness allocates the outputs itself (poisoned with
NaN) so an unwritten output can never look right.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BACKENDS = ("cuda", "hip", "metal", "c", "npu")
DTYPES = ("float16", "bfloat16", "float32")


class Unsupported(Exception):
    """The operator declines this (shape, dtype, target): production uses the
    reference. Raised by ``Operator.check``; never a crash."""


class MalformedShape(ValueError):
    """The shape does not fit the operator's declared dims: a malformed job."""


@dataclass(frozen=True)
class Tolerance:
    """Pass bounds for one dtype, with the reason recorded beside them."""

    rel_err: float  # bound on ||out - ref|| / ||ref|| (norm-relative)
    atol: float  # an element mismatches when |out - ref| > atol + rtol*|ref|
    rtol: float
    max_mismatch_ratio: float  # share of mismatching elements allowed
    reason: str


@dataclass(frozen=True)
class TensorSpec:
    """One kernel parameter. For inputs, ``scale`` and ``positive`` set the
    values ``Operator.make_inputs`` draws: magnitudes in [0.25, 1] * scale, so
    no element is ever zero and references stay well conditioned."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name: "float16", "bfloat16", "float32"
    scale: float = 1.0
    positive: bool = False


@dataclass
class Operator:
    """A named computation with one PyTorch reference and TileLang kernels.

    ``builders`` maps a backend ("c", "cuda", "hip", "metal") to a function
    ``(shape: dict, dtype: str, target: dict) -> tilelang PrimFunc``.
    """

    name: str
    dims: tuple[str, ...]
    dtypes: dict[str, tuple[str, ...]]  # backend -> dtypes it supports
    builders: dict[str, Callable[[dict, str, dict], Any]]
    inputs: Callable[[dict, str], list[TensorSpec]]
    outputs: Callable[[dict, str], list[TensorSpec]]
    reference: Callable[..., list[Any]]  # (*input tensors) -> output tensors
    flops: Callable[[dict], int]
    bytes_moved: Callable[[dict, str], int]
    tolerances: dict[str, Tolerance]
    description: str = ""
    default_shape: dict[str, int] = field(default_factory=dict)
    # extra refusals: (shape, dtype, target) -> reason or None
    refuse: Callable[[dict, str, dict], str | None] = lambda shape, dtype, t: None

    def validate_shape(self, shape: dict) -> dict[str, int]:
        """Return the shape with int dims, or raise MalformedShape."""
        if not isinstance(shape, dict):
            raise MalformedShape(f"{self.name}: shape must be an object of dims")
        missing = [d for d in self.dims if d not in shape]
        extra = [d for d in shape if d not in self.dims]
        if missing or extra:
            raise MalformedShape(
                f"{self.name} takes dims {list(self.dims)}; "
                f"missing {missing}, unexpected {extra}"
            )
        clean = {}
        for d in self.dims:
            v = shape[d]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise MalformedShape(f"{self.name}: dim {d} must be a positive int")
            clean[d] = v
        return clean

    def check(self, shape: dict, dtype: str, target: dict) -> None:
        """Raise Unsupported when the kernel does not declare this cell."""
        backend = target.get("kind")
        if backend not in self.builders:
            raise Unsupported(f"{self.name} has no kernel for backend {backend!r}")
        if dtype not in self.dtypes.get(backend, ()):
            raise Unsupported(
                f"{self.name} on {backend} supports {list(self.dtypes[backend])}, "
                f"not {dtype}"
            )
        reason = self.refuse(shape, dtype, target)
        if reason:
            raise Unsupported(reason)

    def program(self, shape: dict, dtype: str, target: dict):
        self.check(shape, dtype, target)
        return self.builders[target["kind"]](shape, dtype, target)

    def make_inputs(
        self, shape: dict, dtype: str, seed: int, device: str = "cpu"
    ) -> list[Any]:
        """Seeded inputs for one cell: the same (shape, dtype, seed) gives the
        same tensors on every host, and no element is zero or repeated
        constant, so an unwritten or constant output cannot match."""
        from runners.harness.tensors import seeded_inputs, spec_dict

        specs = [spec_dict(s) for s in self.inputs(shape, dtype)]
        return seeded_inputs(specs, seed, device)
