"""attention_causal: causal scaled dot-product attention with grouped KV heads.

Same layout and kernels as ``attention`` (q/out [B, H, S, D], k/v
[B, HKV, S, D], GQA when HKV < H); query i attends to keys 0..i. The GPU
kernel masks the diagonal block and skips KV blocks wholly above it.
"""

from __future__ import annotations

from .attention import make_operator

OPERATOR = make_operator(causal=True)
