"""Tensors that cross the boundary between the untrusted child and the judge.

The untrusted child gets tensor specs (name, shape, dtype, scale, sign), never
the operator module with its reference: it draws the inputs from the seed
with ``seeded_inputs``, which draws exactly what ``Operator.make_inputs``
draws, and writes each output as raw little-endian bytes. The judge reads
them back by spec; nothing is unpickled.
"""

from __future__ import annotations

ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def spec_dict(spec) -> dict:
    """A TensorSpec as the JSON the untrusted child receives."""
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


def output_name(input_set: int, index: int) -> str:
    return f"{input_set}-{index}.bin"


def seeded_inputs(specs: list[dict], seed: int, device: str) -> list:
    import torch

    generator = torch.Generator(device="cpu").manual_seed(seed)
    tensors = []
    for spec in specs:
        shape = tuple(spec["shape"])
        magnitude = 0.25 + 0.75 * torch.rand(
            shape, generator=generator, dtype=torch.float32
        )
        values = magnitude * spec["scale"]
        if not spec["positive"]:
            sign = torch.randint(0, 2, shape, generator=generator, dtype=torch.int8)
            values = torch.where(sign.bool(), values, -values)
        tensors.append(values.to(getattr(torch, spec["dtype"])).to(device))
    return tensors


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


def to_bytes(tensor) -> bytes:
    import torch

    flat = tensor.detach().contiguous().cpu().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def from_bytes(data: bytes, spec: dict):
    """The output a spec describes; NaN-filled (never written) if ``data``
    is None or not exactly the right size."""
    import torch

    dtype = getattr(torch, spec["dtype"])
    if data is None or len(data) != byte_size(spec):
        return torch.full(tuple(spec["shape"]), float("nan"), dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(tuple(spec["shape"]))
