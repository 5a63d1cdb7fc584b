"""Seeded inputs: a counter-based hash made on the device itself, the same
on every host and device. Here the tensor path is checked against plain
Python integers (no int64 overflow anywhere); on the H200, test_gpu checks
CUDA against the CPU."""

from __future__ import annotations

import pytest

from runners.harness.tensors import MASK32, hash32, seeded_inputs, stream_key

torch = pytest.importorskip("torch")


def python_value(seed: int, number: int, index: int, scale: float, positive: bool):
    bits = hash32((index + stream_key(seed, number)) & MASK32)
    value = (0.25 + 0.75 * ((bits & 0xFFFFFF) * 2.0**-24)) * scale
    return value if positive or not bits >> 31 else -value


def test_the_tensor_hash_equals_the_integer_hash_across_the_whole_range():
    samples = [0, 1, 2, 0xFFFF, 0x10000, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1]
    got = hash32(torch.tensor(samples, dtype=torch.int64)).tolist()
    assert got == [hash32(x) for x in samples]
    assert all(0 <= x <= MASK32 for x in got)
    assert len(set(got)) == len(samples)


def test_inputs_are_the_hash_rounded_to_the_dtype():
    specs = [
        {"shape": [3, 5], "dtype": "float32", "scale": 0.5, "positive": False},
        {"shape": [7], "dtype": "float32", "scale": 2.0, "positive": True},
    ]
    first, second = seeded_inputs(specs, seed=2**40 + 3, device="cpu")
    for number, (tensor, spec) in enumerate(zip((first, second), specs, strict=True)):
        expected = [
            python_value(2**40 + 3, number, i, spec["scale"], spec["positive"])
            for i in range(tensor.numel())
        ]
        assert tensor.reshape(-1).tolist() == pytest.approx(expected, rel=1e-6)


def test_values_are_never_zero_take_both_signs_and_stay_in_range():
    spec = {"shape": [300_000], "dtype": "bfloat16", "scale": 3.0, "positive": False}
    (values,) = seeded_inputs([spec], seed=11, device="cpu")
    magnitude = values.float().abs()
    assert bool((magnitude >= 0.75 * 0.99).all()) and bool((magnitude <= 3.0).all())
    negative = (values < 0).float().mean().item()
    assert 0.45 < negative < 0.55
    # Chunks must not repeat: the second chunk is not the first again.
    assert not torch.equal(values[:1000], values[1 << 15 : (1 << 15) + 1000])


def test_another_seed_or_input_position_is_another_stream():
    spec = {"shape": [64], "dtype": "float32", "scale": 1.0, "positive": False}
    a, b = seeded_inputs([spec, spec], seed=5, device="cpu")
    (c,) = seeded_inputs([spec], seed=6, device="cpu")
    assert not torch.equal(a, b) and not torch.equal(a, c)
