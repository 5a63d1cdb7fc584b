"""Tensors that cross the boundary between a submitted kernel's executor
and the judge, as files of raw little-endian bytes read back by spec
(name, shape, dtype); nothing is unpickled.

The judge draws each input set with ``seeded_inputs`` (what
``Operator.make_inputs`` draws, then shaped as runners.harness.distributions
says) and writes it; the executor reads the inputs,
runs the kernel on NaN-poisoned outputs and writes them; the supervisor
copies them to the judge.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def spec_dict(spec) -> dict:
    """A TensorSpec as the JSON a child receives."""
    return {
        "name": spec.name,
        "shape": list(spec.shape),
        "dtype": spec.dtype,
        "scale": spec.scale,
        "positive": spec.positive,
    }


def byte_size(spec: dict) -> int:
    count = 1
    for dim in spec["shape"]:
        count *= dim
    return count * ELEMENT_BYTES[spec["dtype"]]


def input_name(input_set: int, index: int) -> str:
    return f"in-{input_set}-{index}.bin"


# The outputs the executor's last timed call wrote, on input set 0: judged
# like the others, so a kernel cannot be right once and fast afterwards.
TIMED_SET = "timed"


def output_name(input_set: int | str, index: int) -> str:
    return f"{input_set}-{index}.bin"


def run_set(input_set: int, run: int) -> str:
    """The outputs of one of several runs on an input set."""
    return f"{input_set}.{run}"


def write_tensor(path, tensor) -> None:
    """``tensor``'s bytes into a new file at ``path``, readable by all (the
    next process runs as another uid)."""
    import torch

    flat = tensor.detach().contiguous().cpu().reshape(-1)
    flat.view(torch.uint8).numpy().tofile(str(path))
    os.chmod(path, 0o644)


def read_tensor(path, spec: dict, device: str = "cpu"):
    """The tensor ``spec`` describes, from the file at ``path`` (which must
    hold exactly its bytes), on ``device``; None when there is no such
    file."""
    import torch

    size = byte_size(spec)
    if not os.path.isfile(path) or os.path.getsize(path) != size:
        return None
    dtype = getattr(torch, spec["dtype"])
    count = size // ELEMENT_BYTES[spec["dtype"]]
    flat = torch.from_file(str(path), shared=False, size=count, dtype=dtype)
    return flat.reshape(tuple(spec["shape"])).to(device)


@dataclass(frozen=True)
class Distribution:
    """How an operator's first input (its activations) is shaped after the
    seeded draw, so that a pass means right on what real models send, not
    only on friendly values: ``uniform`` is the draw itself; ``large``
    multiplies it by ``factor`` (softmax logits of +-100, past float32's
    exp range); ``zero_rows`` zeroes every third row (padding);
    ``constant_rows`` makes every third row (another third) one value
    repeated (a variance of zero, a uniform softmax); ``outliers``
    multiplies four channels of the last dim by ``factor``; ``heavy_tails``
    maps the draw to a Pareto tail of index 2 (most values near the scale, a
    few up to ``factor`` times it); ``near_limit`` scales the draw until its
    largest value is ``factor`` of the dtype's largest finite one;
    ``row_limit`` scales it until the largest row's sum of magnitudes,
    times the largest magnitude of the other inputs, is ``factor`` of the
    dtype's largest finite value (a row sum or a matmul's output that far
    up, which float32 accumulation reaches exactly and half-precision
    accumulation does not); ``square_limit`` scales it until the largest
    row's sum of squares is ``factor`` of float32's largest value (the
    accumulator an RMS norm needs), each value kept within ``factor`` of the
    dtype's own largest; ``infinities`` sets every seventh value to +inf and
    the next-but-two to -inf, where the reference's result is infinite too;
    ``nan`` sets one value of every fifth row (of the last, in two to four
    rows) to NaN, where the reference's result is NaN too (a kernel whose
    max or clamp drops NaN is wrong there); and ``masked`` sets the first third of every row to -inf, as a
    left-padded batch's attention mask or a constrained decoder's token mask
    does (the rest of the row stays finite, so the reference is defined)."""

    name: str
    factor: float = 1.0

    @property
    def label(self) -> str:
        words = self.name.replace("_", " ")
        if self.name == "near_limit":
            return f"near the dtype's limit ({self.factor:.0%} of it)"
        if self.name == "row_limit":
            return f"row sums at {self.factor:.0%} of the dtype's limit"
        if self.name == "square_limit":
            return f"squares at {self.factor:.0%} of float32's limit"
        if self.name == "nan":
            return "NaN"
        return f"{words} x{self.factor:g}" if self.factor != 1.0 else words

    def shape(self, tensor, others: float = 1.0) -> None:
        """Shape ``tensor`` in place; ``others`` bounds the magnitude of the
        operator's other inputs (their scale)."""
        if self.name == "large":
            tensor.mul_(self.factor)
        elif self.name == "zero_rows" and tensor.dim() >= 2:
            tensor.view(-1, tensor.shape[-1])[2::3] = 0
        elif self.name == "masked" and tensor.dim() >= 2:
            tensor[..., : tensor.shape[-1] // 3] = float("-inf")
        elif self.name == "constant_rows" and tensor.dim() >= 2:
            rows = tensor.view(-1, tensor.shape[-1])
            rows[1::3] = rows[1::3, :1]
        elif self.name == "outliers":
            last = tensor.shape[-1]
            for column in sorted({0, last // 3, 2 * last // 3, last - 1}):
                tensor[..., column].mul_(self.factor)
        elif self.name == "heavy_tails":
            _heavy_tails(tensor, self.factor)
        elif self.name == "near_limit":
            import torch

            largest = tensor.abs().max().float().item()
            if largest > 0:
                limit = torch.finfo(tensor.dtype).max * self.factor
                tensor.mul_(limit / largest)
        elif self.name in ("row_limit", "square_limit"):
            _rows_near_limit(tensor, self.name, self.factor, others)
        elif self.name == "infinities":
            flat = tensor.view(-1)
            flat[::7] = float("inf")
            flat[3::7] = float("-inf")
        elif self.name == "nan":
            import torch

            rows = tensor.view(-1, tensor.shape[-1] if tensor.dim() >= 2 else 1)
            # Fewer than five rows: the last, where another row stays to
            # show what was written (one row alone judges nothing).
            count = rows.shape[0]
            start = 4 if count >= 5 else count - 1 if count >= 2 else count
            picked = torch.arange(start, count, 5, device=rows.device)
            rows[picked, (picked * 7) % rows.shape[1]] = float("nan")


UNIFORM = Distribution("uniform")


def _rows_near_limit(tensor, kind: str, factor: float, others: float) -> None:
    """Scale ``tensor`` so its largest row's sum of magnitudes (times
    ``others``) or of squares reaches ``factor`` of the limit, no value past
    ``factor`` of the dtype's largest. Sums are taken in float64 a row block
    at a time, so a large activation needs no float64 copy of itself."""
    import torch

    rows = tensor.view(-1, tensor.shape[-1] if tensor.dim() >= 2 else 1)
    per_block = max(1, DEVICE_CHUNK_ELEMENTS // rows.shape[1])
    largest_sum = largest_value = 0.0
    for start in range(0, rows.shape[0], per_block):
        block = rows[start : start + per_block].abs().double()
        largest_value = max(largest_value, block.max().item())
        sums = block.square().sum(-1) if kind == "square_limit" else block.sum(-1)
        largest_sum = max(largest_sum, sums.max().item())
    if largest_sum <= 0:
        return
    own_limit = torch.finfo(tensor.dtype).max * factor
    if kind == "square_limit":
        wanted = (torch.finfo(torch.float32).max * factor / largest_sum) ** 0.5
    else:
        wanted = own_limit / (largest_sum * others)
    tensor.mul_(min(wanted, own_limit / largest_value))


def _heavy_tails(tensor, cap: float) -> None:
    """The draw's magnitudes, which lie evenly in [0.25, 1) * scale, mapped
    to scale * (1 - u) ** -0.5 for u evenly in [0, 1): a Pareto tail of index
    2 (the median 1.4x the scale, one value in a hundred past 10x), capped at
    ``cap`` times the scale; signs kept. In place, a piece at a time."""
    import torch

    flat = tensor.view(-1)
    scale = tensor.abs().max().float().item()
    if scale <= 0:
        return
    for start in range(0, flat.numel(), DEVICE_CHUNK_ELEMENTS):
        piece = flat[start : start + DEVICE_CHUNK_ELEMENTS]
        values = piece.float()
        unit = ((values.abs() / scale - 0.25) / 0.75).clamp(0.0, 1.0)
        tail = (1.0 - unit).clamp_min(cap**-2).rsqrt() * scale
        piece.copy_(torch.copysign(tail, values))


def distribution_dict(distribution: Distribution) -> dict:
    return {"name": distribution.name, "factor": distribution.factor}


MASK32 = 0xFFFFFFFF
# Elements hashed at a time: cache-sized pieces on a CPU (a fresh 128 MB
# temporary per operation costs more in page faults than the arithmetic),
# large ones on a GPU (fewer kernel launches).
CHUNK_ELEMENTS = {"cpu": 1 << 15}
DEVICE_CHUNK_ELEMENTS = 1 << 24


def hash32(x):
    """A 32-bit integer hash (Wellons' lowbias32) of ints in [0, 2**32): a
    Python int or an int64 tensor, with the same bits either way and on every
    device, because every intermediate fits in int64 (nothing overflows)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _mul32(x, constant: int):
    """``x * constant mod 2**32`` in two 16-bit halves of the constant."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & MASK32


def stream_key(seed: int, number: int) -> int:
    """Where input ``number`` of a cell seeded ``seed`` starts its stream."""
    key = hash32(seed & MASK32) ^ hash32((seed >> 32) & MASK32 ^ 0x5BD1E995)
    return hash32(key ^ hash32(number + 1))


def seeded_inputs(
    specs: list[dict],
    seed: int,
    device: str,
    distribution: Distribution = UNIFORM,
) -> list:
    """The inputs of one cell, drawn from a counter-based hash of (seed,
    input, element): the same tensors on every host and device, made on the
    device itself (a 500M-element GEMM weight in milliseconds on a GPU, not
    seconds on the host). Magnitudes lie in [0.25, 1) * scale, so no element
    is zero; the sign is the hash's top bit unless the spec is positive.
    ``distribution`` then shapes the first input."""
    import torch

    tensors = []
    for number, spec in enumerate(specs):
        out = torch.empty(
            tuple(spec["shape"]), dtype=getattr(torch, spec["dtype"]), device=device
        )
        flat, key = out.view(-1), stream_key(seed, number)
        chunk = CHUNK_ELEMENTS.get(str(device), DEVICE_CHUNK_ELEMENTS)
        for start in range(0, flat.numel(), chunk):
            stop = min(start + chunk, flat.numel())
            index = torch.arange(start, stop, dtype=torch.int64, device=device)
            bits = hash32((index + key) & MASK32)
            unit = (bits & 0xFFFFFF).to(torch.float32) * 2.0**-24
            values = (0.25 + 0.75 * unit) * spec["scale"]
            if not spec["positive"]:
                values = torch.where((bits >> 31).bool(), -values, values)
            flat[start:stop] = values
        tensors.append(out)
    if tensors:
        distribution.shape(tensors[0], other_scale(specs))
    return tensors


def other_scale(specs: list[dict]) -> float:
    """The magnitude bound of every input but the first (the one a
    distribution shapes)."""
    return max((s["scale"] for s in specs[1:]), default=1.0)


def poisoned_outputs(specs: list[dict], device: str) -> list:
    import torch

    return [
        torch.full(
            tuple(s["shape"]),
            float("nan"),
            dtype=getattr(torch, s["dtype"]),
            device=device,
        )
        for s in specs
    ]
