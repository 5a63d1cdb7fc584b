"""The recorder against a small decoder whose configuration fixes every call
it makes, plus the aten paths that decoder does not take on CPU."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from runners.capture import CallRecorder, trace_module
from tests.capture.tiny_decoder import Config, build


def implied_calls(c: Config, tokens: int, dtype: str) -> Counter:
    """What one forward of the decoder calls, from its configuration alone."""
    t, L, d = tokens, c.layers, c.head_dim
    calls = Counter()

    def gemm(n, k, count):
        calls[("gemm", (("M", t), ("N", n), ("K", k)), dtype)] += count

    gemm(c.heads * d, c.hidden, L)  # q
    gemm(c.kv_heads * d, c.hidden, 2 * L)  # k, v
    gemm(c.hidden, c.heads * d, L)  # o
    gemm(c.intermediate, c.hidden, 2 * L)  # gate, up
    gemm(c.hidden, c.intermediate, L)  # down
    gemm(c.vocab, c.hidden, 1)  # lm_head
    attention = (("B", 1), ("H", c.heads), ("HKV", c.kv_heads), ("S", t), ("D", d))
    calls[("attention_causal", attention, dtype)] += L
    calls[("rmsnorm", (("M", t), ("N", c.hidden)), dtype)] += 2 * L + 1
    calls[("elementwise_add", (("M", t), ("N", c.hidden)), dtype)] += 2 * L
    calls[("softmax", (("M", t), ("N", c.vocab)), dtype)] += 1
    return calls


def captured_calls(trace: dict, tokens: int) -> Counter:
    return Counter(
        {
            (c["operator"], tuple(c["dims"].items()), c["dtype"]): c["count"]
            for c in trace["calls"]
            if c["tokens"] == tokens
        }
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_it_captures_the_shapes_and_counts_the_configuration_implies(dtype):
    trace = trace_module(build(), tokens=[1, 5], model="tiny", dtype=dtype)

    name = str(dtype).removeprefix("torch.")
    assert trace["tokens"] == [1, 5]
    for tokens in (1, 5):
        assert captured_calls(trace, tokens) == implied_calls(Config(), tokens, name)
    assert trace["unmapped"] == []


def test_a_decomposed_attention_is_one_attention_not_its_bmm_and_softmax():
    q, kv = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    with torch.no_grad(), CallRecorder() as recorder:
        with sdpa_kernel(SDPBackend.MATH):
            F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)

    dims = (("B", 2), ("H", 4), ("HKV", 2), ("S", 5), ("D", 16))
    assert recorder.calls == Counter({("attention", dims, "float32"): 1})


def test_a_hand_written_rmsnorm_is_recognised_with_the_dtype_before_upcast():
    x, weight = torch.randn(3, 7, 64).half(), torch.ones(64).half()
    with torch.no_grad(), CallRecorder() as recorder:
        # The Llama form: upcast, mean of squares, rsqrt, scale, downcast.
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        weight * h.to(torch.float16)

    assert recorder.calls == Counter(
        {("rmsnorm", (("M", 21), ("N", 64)), "float16"): 1}
    )


def test_a_mean_of_squares_without_the_rsqrt_scaling_is_no_rmsnorm():
    x = torch.randn(4, 64)
    with torch.no_grad(), CallRecorder() as recorder:
        x * (x.pow(2).mean(-1, keepdim=True) + 1e-6)

    assert recorder.calls == Counter()


def test_a_fused_rms_norm_kernel_maps_to_rmsnorm():
    # CPU decomposes _fused_rms_norm before the recorder sees it; CUDA and MPS
    # dispatch it whole, so its handler is fed the op as those backends do.
    recorder = CallRecorder()
    x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    recorder.__torch_dispatch__(
        torch.ops.aten._fused_rms_norm.default, (), (x, [32], None, 1e-6)
    )

    assert recorder.calls == Counter(
        {("rmsnorm", (("M", 6), ("N", 32)), "bfloat16"): 1}
    )


def test_a_batched_matmul_is_one_gemm_per_batch_entry_unless_b_is_shared():
    a = torch.randn(2, 3, 4, 5)
    shared_b = torch.randn(5, 6).expand(3, 5, 6)
    with torch.no_grad(), CallRecorder() as recorder:
        torch.matmul(a, torch.randn(2, 3, 5, 6))
        torch.bmm(a[0], shared_b)

    assert recorder.calls == Counter(
        {
            ("gemm", (("M", 4), ("N", 6), ("K", 5)), "float32"): 6,
            ("gemm", (("M", 12), ("N", 6), ("K", 5)), "float32"): 1,
        }
    )


def test_calls_that_fit_no_operator_are_listed_as_unmapped_with_the_reason():
    q, cache = torch.randn(1, 4, 1, 16), torch.randn(1, 4, 9, 16)
    with torch.no_grad(), CallRecorder() as recorder:
        F.scaled_dot_product_attention(q, cache, cache)
        torch.softmax(torch.randn(3, 4), dim=0)

    assert recorder.calls == Counter()
    reasons = {reason for _, reason in recorder.unmapped}
    assert reasons == {
        "query and key lengths differ (decode against a cache)",
        "softmax over a dim other than the last",
    }
