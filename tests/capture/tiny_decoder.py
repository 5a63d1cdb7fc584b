"""A small Llama-shaped decoder, built in the tests so nothing is downloaded:
grouped-query attention, RMSNorm, a gated MLP and sampling over the vocabulary.
``build`` is the MODULE:FACTORY the capture CLI test names."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 160
    vocab: int = 100

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.attn_norm = nn.RMSNorm(c.hidden)
        # Biased q/k/v (as in Qwen2) so that linear reaches aten as addmm too.
        self.q = nn.Linear(c.hidden, c.heads * c.head_dim)
        self.k = nn.Linear(c.hidden, c.kv_heads * c.head_dim)
        self.v = nn.Linear(c.hidden, c.kv_heads * c.head_dim)
        self.o = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)
        self.mlp_norm = nn.RMSNorm(c.hidden)
        self.gate = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.attn_norm(x)

        def heads(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.view(b, s, n, self.c.head_dim).transpose(1, 2)

        q = heads(self.q(h), self.c.heads)
        k = heads(self.k(h), self.c.kv_heads)
        v = heads(self.v(h), self.c.kv_heads)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyDecoder(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = nn.RMSNorm(c.hidden)
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return torch.softmax(self.lm_head(self.norm(x)), dim=-1)


def build() -> TinyDecoder:
    torch.manual_seed(0)
    return TinyDecoder(Config())


def not_a_module() -> int:
    return 3


def one_block() -> Block:
    """A decoder block alone: it takes hidden states, not input ids."""
    torch.manual_seed(0)
    return Block(Config())


def build_half() -> TinyDecoder:
    """An fp16 model as a serving stack builds one: ``.half()``."""
    return build().half()
