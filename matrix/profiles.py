"""Built-in model profiles: the operator calls a model makes per forward step.

Dimensions are the models' public configurations. A profile expands, for each
token count (tokens in one forward step: a decode batch or a prefill chunk),
to (operator, dims, weight) where weight is calls per forward step.
"""

from __future__ import annotations

from dataclasses import dataclass

TOKEN_COUNTS = (1, 16, 512, 4096)


@dataclass(frozen=True)
class DenseDecoder:
    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layers: int

    def calls(self, tokens: int) -> list[tuple[str, dict, float]]:
        t, h, L = tokens, self.hidden, self.layers
        qkv = (self.heads + 2 * self.kv_heads) * self.head_dim
        return [
            ("rmsnorm", {"M": t, "N": h}, 2 * L + 1),
            ("elementwise_add", {"M": t, "N": h}, 2 * L),
            ("gemm", {"M": t, "N": qkv, "K": h}, L),  # fused q/k/v projection
            ("gemm", {"M": t, "N": h, "K": self.heads * self.head_dim}, L),  # o_proj
            ("gemm", {"M": t, "N": 2 * self.intermediate, "K": h}, L),  # gate+up
            ("gemm", {"M": t, "N": h, "K": self.intermediate}, L),  # down
            ("gemm", {"M": t, "N": self.vocab, "K": h}, 1),  # lm_head
            (
                "attention_causal",
                {
                    "B": 1,
                    "H": self.heads,
                    "HKV": self.kv_heads,
                    "S": t,
                    "D": self.head_dim,
                },
                L,
            ),
            ("softmax", {"M": t, "N": self.vocab}, 1),  # sampling over the vocabulary
        ]


@dataclass(frozen=True)
class MixtureOfExperts(DenseDecoder):
    experts: int = 8
    experts_per_token: int = 2

    def calls(self, tokens: int) -> list[tuple[str, dict, float]]:
        dense = [
            c
            for c in super().calls(tokens)
            if c[1].get("K") != self.intermediate
            and c[1].get("N") != 2 * self.intermediate
        ]
        # tokens * top_k routed rows spread over the experts: with fewer rows
        # than experts only that many experts run, one row each.
        routed = tokens * self.experts_per_token
        active = min(self.experts, routed)
        rows = max(1, routed // self.experts)
        L = self.layers
        experts = [
            (
                "gemm",
                {"M": rows, "N": 2 * self.intermediate, "K": self.hidden},
                L * active,
            ),
            ("gemm", {"M": rows, "N": self.hidden, "K": self.intermediate}, L * active),
            ("gemm", {"M": tokens, "N": self.experts, "K": self.hidden}, L),  # router
            ("softmax", {"M": tokens, "N": self.experts}, L),
        ]
        return dense + experts


PROFILES = {
    "llama-3-8b": DenseDecoder(
        name="llama-3-8b",
        hidden=4096,
        intermediate=14336,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=128256,
        layers=32,
    ),
    "mixtral-8x7b": MixtureOfExperts(
        name="mixtral-8x7b",
        hidden=4096,
        intermediate=14336,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=32000,
        layers=32,
        experts=8,
        experts_per_token=2,
    ),
    # A different attention layout: 28 query heads over 4 KV heads (7:1).
    "qwen2.5-7b": DenseDecoder(
        name="qwen2.5-7b",
        hidden=3584,
        intermediate=18944,
        heads=28,
        kv_heads=4,
        head_dim=128,
        vocab=152064,
        layers=28,
    ),
}
SERVED_DTYPES = ("float16", "bfloat16")


def served_shapes(profile: str, tokens=TOKEN_COUNTS, dtypes=SERVED_DTYPES):
    """Yield (operator, dims, dtype, weight) for a built-in profile, merging
    identical shapes (their weights add up)."""
    merged: dict[tuple, float] = {}
    for t in tokens:
        for op, dims, weight in PROFILES[profile].calls(t):
            for dtype in dtypes:
                key = (op, tuple(dims.items()), dtype)
                merged[key] = merged.get(key, 0.0) + weight
    for (op, dims, dtype), weight in merged.items():
        yield op, dict(dims), dtype, weight


def served_calls(profile: str, tokens=TOKEN_COUNTS, dtypes=SERVED_DTYPES):
    """Yield (operator, dims, dtype, calls, tokens): the calls of one forward
    step of each token count, identical shapes within a step merged. The
    rows ``shape_import`` takes to keep each step's counts apart."""
    for t in tokens:
        merged: dict[tuple, float] = {}
        for op, dims, weight in PROFILES[profile].calls(t):
            for dtype in dtypes:
                key = (op, tuple(dims.items()), dtype)
                merged[key] = merged.get(key, 0.0) + weight
        for (op, dims, dtype), calls in merged.items():
            yield op, dict(dims), dtype, calls, t
