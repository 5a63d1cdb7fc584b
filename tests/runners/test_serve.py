"""A small Llama-like model served through a manifest on this CPU: real
TileLang kernels compiled for target c where the manifest approves the
cell, PyTorch everywhere else, with the reason logged once."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[2]
# Read once, when tilelang is first imported: reruns reuse compiled kernels.
os.environ.setdefault("TILELANG_CACHE_DIR", str(REPO / "var" / "tilelang-cache-tests"))

from runners.dispatch import (  # noqa: E402
    FORMAT,
    REFERENCE,
    TILELANG,
    host_toolchain_fingerprint,
    library_revisions,
)
from runners.harness.compare import compare_one  # noqa: E402
from runners.kernels import get  # noqa: E402
from runners.serve import (  # noqa: E402
    CAPTURE_REASON,
    ROUTED_OPERATORS,
    Router,
    host_device,
)

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, VOCAB = 32, 4, 2, 8, 48, 40
TOKENS = 8
QKV = (HEADS + 2 * KV_HEADS) * HEAD_DIM
SLOW = "pass on tilelang-0.1.15, but 0.69× of the reference"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = nn.RMSNorm(HIDDEN, eps=1e-6)
        self.qkv = nn.Linear(HIDDEN, QKV, bias=False)
        self.o = nn.Linear(HIDDEN, HIDDEN)  # biased: no kernel takes it
        self.mlp_norm = nn.RMSNorm(HIDDEN, eps=1e-6)
        self.gate_up = nn.Linear(HIDDEN, 2 * INTERMEDIATE, bias=False)
        self.down = nn.Linear(INTERMEDIATE, HIDDEN, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(
            [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1
        )
        q, k, v = (t.view(b, s, -1, HEAD_DIM).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm = nn.RMSNorm(HIDDEN, eps=1e-5)  # not the kernel's eps
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return torch.softmax(self.lm_head(self.norm(x)), dim=-1)


def gemm(n: int, k: int) -> tuple[str, dict]:
    return "gemm", {"M": TOKENS, "N": n, "K": k}


ROWS = {"M": TOKENS, "N": HIDDEN}
ATTENTION = {"B": 1, "H": HEADS, "HKV": KV_HEADS, "S": TOKENS, "D": HEAD_DIM}
SERVED = [  # approved as tilelang, and taken
    ("rmsnorm", ROWS),
    gemm(QKV, HIDDEN),
    gemm(HIDDEN, INTERMEDIATE),
    ("attention_causal", ATTENTION),
    ("elementwise_add", ROWS),
]


@pytest.fixture(scope="module")
def host():
    target, device_type = host_device("c")
    return target, device_type, host_toolchain_fingerprint()


@pytest.fixture(scope="module")
def manifest(host):
    _, device_type, fingerprint = host
    revisions = library_revisions(*ROUTED_OPERATORS)

    def entry(operator, dims, choice=TILELANG, reason="validated", sha=None):
        return {
            "operator": operator,
            "dtype": "float32",
            "device_type": device_type,
            "backend": "c",
            "shape_rule": {"dims": dims},
            "choice": choice,
            "reason": reason,
            "kernel_sha256": sha or revisions[operator],
        }

    return {
        "format": FORMAT,
        "toolchain": {"name": "tilelang-0.1.15-cpu", "fingerprint": fingerprint},
        "entries": [
            *(entry(op, dims) for op, dims in SERVED),
            entry(*gemm(HIDDEN, HIDDEN)),  # the biased o projection
            entry(*gemm(2 * INTERMEDIATE, HIDDEN), REFERENCE, SLOW),
            entry(*gemm(VOCAB, HIDDEN), sha="0" * 64),  # another revision
            # No entry for softmax over the vocabulary.
        ],
    }


def new_router(host, manifest, **kwargs) -> Router:
    target, device_type, fingerprint = host
    return Router.from_manifest(
        manifest,
        target=target,
        device_type=device_type,
        toolchain_fingerprint=fingerprint,
        **kwargs,
    )


def inputs(tokens: int = TOKENS) -> torch.Tensor:
    return torch.randn(1, tokens, HIDDEN, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def served(host, manifest):
    """The model, its unpatched output, and a checked router that has run
    it once ahead of time and then twice more."""
    torch.manual_seed(0)
    model = Decoder().eval()
    with torch.no_grad():
        expected = model(inputs())
        router = new_router(host, manifest, checked=True)
        router.prepare(model, inputs())
        compiled_ahead = dict(router.report.compiled)
        with router:
            outputs = [model(inputs()), model(inputs())]
    return {
        "model": model,
        "router": router,
        "expected": expected,
        "outputs": outputs,
        "compiled_ahead": compiled_ahead,
    }


def cell(operator: str, dims: dict) -> tuple:
    return (operator, "float32", tuple(sorted(dims.items())))


def test_the_model_gives_its_own_output_within_the_cells_tolerance(served):
    report = served["router"].report
    assert report.mismatches == {}
    # Every TileLang call was also held to its cell's tolerance on its own.
    assert set(report.checked) == {cell(op, dims) for op, dims in SERVED}
    softmax = get("softmax").tolerances["float32"]
    for out in served["outputs"]:
        comparison = compare_one("probs", out, served["expected"], softmax)
        assert comparison.verdict(softmax) is None, comparison


def test_approved_cells_run_kernels_compiled_once_ahead_of_time(served):
    report = served["router"].report
    assert set(served["compiled_ahead"]) == {cell(op, dims) for op, dims in SERVED}
    assert report.compiled == served["compiled_ahead"]
    calls = {(op, path): tally.calls for (op, path), tally in report.tallies.items()}
    # Two forwards: per block 2 norms, qkv, down, attention and 2 adds.
    assert calls == {
        ("rmsnorm", TILELANG): 8,
        ("rmsnorm", REFERENCE): 2,
        ("gemm", TILELANG): 8,
        ("gemm", REFERENCE): 10,
        ("attention_causal", TILELANG): 4,
        ("elementwise_add", TILELANG): 8,
        ("softmax", REFERENCE): 2,
    }
    # The served weights now hold B[K, N] row-major for the kernel; the
    # others are as the model made them.
    block = served["model"].blocks[0]
    assert block.qkv.weight.t().is_contiguous()
    assert block.down.weight.t().is_contiguous()
    assert block.gate_up.weight.is_contiguous()
    assert served["model"].lm_head.weight.is_contiguous()


def test_each_other_call_falls_back_with_its_reason_logged_once(host, manifest, caplog):
    torch.manual_seed(0)
    model = Decoder().eval()
    router = new_router(host, manifest)
    caplog.set_level(logging.INFO, logger="tilematrix.serve")
    with torch.no_grad(), router:
        model(inputs())
        model(inputs())
    logged = [r.getMessage() for r in caplog.records if r.name == "tilematrix.serve"]
    reasons = {
        "gemm {'M': 8, 'N': 32, 'K': 32}": "linear with a bias",
        "gemm {'M': 8, 'N': 96, 'K': 32}": SLOW,
        "gemm {'M': 8, 'N': 40, 'K': 32}": "is not the revision validated",
        "rmsnorm {'M': 8, 'N': 32}": "eps 1e-05 where the kernel's is 1e-06",
        "softmax {'M': 8, 'N': 40}": "has no approved entry for x86-64 CPU · c",
    }
    assert len(logged) == len(reasons), logged
    for call, reason in reasons.items():
        operator, dims = call.split(" ", 1)
        [line] = [
            m
            for m in logged
            if m.startswith(f"reference for {operator} ") and f"dims={dims}" in m
        ]
        assert reason in line
    assert (
        router.report.fallbacks[
            ("gemm", "float32", (("M", 8), ("N", 96), ("K", 32)), SLOW)
        ]
        == 4
    )


def test_a_shape_not_in_the_manifest_takes_the_reference(served):
    router, model = served["router"], served["model"]
    router.report.clear_counts()
    with torch.no_grad():
        with router:
            out = model(inputs(tokens=5))
    assert router.report.calls(TILELANG) == 0
    reasons = {reason for (*_, reason) in router.report.fallbacks}
    assert any("{'M': 5, 'N': 32} has no approved entry" in r for r in reasons)
    assert not any("K': 48" in str(key) for key in router.report.compiled)
    torch.manual_seed(0)
    with torch.no_grad():
        # The same model as built, before any weight was laid out anew.
        expected = Decoder().eval()(inputs(tokens=5))
    torch.testing.assert_close(out, expected)


def test_nothing_compiles_under_cuda_graph_capture(host, manifest, monkeypatch):
    torch.manual_seed(0)
    model = Decoder().eval()
    router = new_router(host, manifest)
    monkeypatch.setattr(router, "_capturing", lambda: True)
    with torch.no_grad():
        expected = model(inputs())
        with router:
            out = model(inputs())
    assert router.report.compiled == {}
    assert router.report.calls(TILELANG) == 0
    reasons = {(op, reason) for (op, _, _, reason) in router.report.fallbacks}
    assert ("attention_causal", CAPTURE_REASON) in reasons
    assert ("gemm", CAPTURE_REASON) in reasons
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_calls_no_kernel_takes_stay_on_pytorch(served):
    router = served["router"]
    router.report.clear_counts()
    strided = torch.randn(HIDDEN, TOKENS).t()  # an approved add's shape
    weight = torch.randn(HIDDEN, requires_grad=True)
    with router:
        torch.testing.assert_close(strided + strided, 2 * strided)
        x = torch.randn(TOKENS, HIDDEN)
        F.rms_norm(x, (HIDDEN,), weight, eps=1e-6).sum().backward()
    assert weight.grad is not None
    assert router.report.calls(TILELANG) == 0
    reasons = {reason for (*_, reason) in router.report.fallbacks}
    assert reasons == {
        "non-contiguous operands: copying them would cost more than the kernel",
        "autograd is recording: the kernels have no backward",
    }


def test_a_router_entered_twice_routes_each_call_once(served):
    router, model = served["router"], served["model"]
    router.report.clear_counts()
    with torch.no_grad(), router, router:
        model(inputs())
    # One forward: 5 norms, 9 linears, 2 attentions, 4 adds and a softmax.
    assert router.report.calls() == 21
    assert router.report.calls(TILELANG) == 14


def test_a_router_that_serves_nothing_here_stays_off_the_stack(host, manifest, caplog):
    target, device_type, _ = host
    other_toolchain = Router.from_manifest(
        manifest,
        target=target,
        device_type=device_type,
        toolchain_fingerprint="0" * 64,
    )
    torch.manual_seed(0)
    model = Decoder().eval()
    caplog.set_level(logging.INFO, logger="tilematrix.serve")
    with torch.no_grad():
        expected = model(inputs())
        with other_toolchain:
            assert not torch._C._is_torch_function_mode_enabled()
            out = model(inputs())
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert other_toolchain.idle
    assert "is not the one validated" in other_toolchain.idle_reason()
    assert other_toolchain.report.calls() == 0
    [line] = [r.getMessage() for r in caplog.records if r.name == "tilematrix.serve"]
    assert line.startswith("serving nothing by TileLang: toolchain 000000000000")


def test_cells_given_restrict_serving_to_them(host, manifest):
    rows = ("rmsnorm", ROWS, "float32")
    only_norms = new_router(host, manifest, cells=[rows])
    torch.manual_seed(0)
    model = Decoder().eval()
    with torch.no_grad(), only_norms:
        model(inputs())
    calls = only_norms.report.calls
    assert calls(TILELANG) == calls(TILELANG, "rmsnorm") == 4
    assert calls(REFERENCE, "gemm") == 9
    # A model none of whose cells the manifest approves: nothing to route.
    other_model = new_router(
        host, manifest, cells=[("rmsnorm", {"M": 3, "N": 7}, "float32")]
    )
    assert other_model.idle
    assert "approves none of the 1 cells given" in other_model.idle_reason()


def test_cells_validated_on_another_backend_never_run_here(host, manifest):
    _, _, fingerprint = host
    cuda_type = "NVIDIA H200 · sm_90a · cuda"
    on_cuda = {
        **manifest,
        "entries": [{**e, "device_type": cuda_type} for e in manifest["entries"]],
    }
    router = Router.from_manifest(
        on_cuda,
        target={"kind": "c"},
        device_type=cuda_type,
        toolchain_fingerprint=fingerprint,
    )
    assert router.idle
    assert router.idle_reason() == (
        f"{cuda_type} was validated on another backend than this router's target, c"
    )
