"""attention: non-causal scaled dot-product attention with grouped KV heads.

Layout: q and out are [B, H, S, D]; k and v are [B, HKV, S, D]. Query head h
reads KV head h // (H // HKV), so HKV < H is grouped-query attention and
HKV == H is plain multi-head attention. Scale 1 / sqrt(D).

GPU: flash-style. One block owns ``block_m`` query rows of one (batch, head)
and streams KV in ``block_n`` blocks through a ``T.Pipelined`` loop: scores
by ``T.gemm`` into a float32 fragment, an online softmax (running max and
sum, rescaling the output accumulator when the max grows by more than a
factor 2^8), probabilities cast to the input dtype for the second
``T.gemm``. Keys past S are masked to -inf, query rows past S are never
stored. Causal attention (see ``attention_causal``) also stops the KV loop
at the block's diagonal. On CUDA, exp2 is the bare hardware instruction
(``common.FAST_EXP2``); on Hopper, non-causal attention keeps its queries in
registers for the score gemm.

float32 (cuda, hip): the same loop with both products on the CUDA cores in
float32 FMA through shared memory, where the tensor cores would round the
operands to tf32, a different operator than the float32 reference (and
than PyTorch's float32 SDPA).

CPU (``c``): one query row per program, scores in a local buffer, float32.
Metal: no kernel, since TileLang 0.1.15 cannot lower ``T.reduce_*`` there.
"""

from __future__ import annotations

from .base import Operator, TensorSpec, Tolerance
from .common import (
    CPU_DTYPES,
    FAST_EXP2,
    FAST_EXP2_SOURCE,
    GPU_DTYPES,
    LOG2E,
    element_size,
    language,
)

DIMS = ("B", "H", "HKV", "S", "D")
STALE_MAX_LOG2 = 8.0  # how far (in powers of two) the running max may lag
CPU_MAX_SEQ = 8192  # the c kernel keeps one row of scores on the stack


def tile_config(
    shape: dict, target: dict, causal: bool = False, dtype: str = "float16"
) -> dict:
    """Tiles, pipeline depth and threads; ``overlap`` runs each KV block's
    softmax while the tensor cores still work on the previous block (Hopper's
    asynchronous wgmma), and ``q_regs`` feeds the score gemm its queries from
    registers rather than shared memory. ``bench/kernel_tune.py`` measured the
    choices (docs/evidence/*-h200-kernel-tune-*.json): overlap took
    non-causal attention from 0.86-0.87x to 0.90-0.91x SDPA (round 1); the
    bare exp2, the stale running max and the shared-memory epilogue took it
    on to 0.98-1.03x, and causal attention from 0.89x to 1.00-1.03x (rounds
    7-9); queries in registers took non-causal attention from 0.980-0.994x
    to 0.995-1.004x over five alternating rounds, where causal attention at
    B=4 lost 0.7-1.8% with them and keeps them in shared memory (round 14)."""
    S, D = shape["S"], shape["D"]
    hopper = target["kind"] == "cuda" and target.get("arch", "").startswith("sm_90")
    common = dict(overlap=False, q_regs=False, simt=False)
    if dtype == "float32":
        return dict(common, block_m=64, block_n=32, stages=1, threads=256, simt=True)
    if target["kind"] == "hip":
        return dict(common, block_m=128, block_n=64, stages=1, threads=256)
    if S <= 64:
        return dict(common, block_m=64, block_n=64, stages=1, threads=128)
    if D > 128:
        return dict(common, block_m=128, block_n=64, stages=2, threads=256)
    return dict(
        common,
        block_m=128,
        block_n=128,
        stages=2,
        threads=256,
        overlap=hopper,
        q_regs=hopper and not causal,
    )


def gpu_builder(causal: bool):
    def build(shape: dict, dtype: str, target: dict, config: dict | None = None):
        T = language(target)
        B, H, HKV, S, D = (shape[d] for d in DIMS)
        cfg = {**tile_config(shape, target, causal, dtype), **(config or {})}
        block_m, block_n = cfg["block_m"], cfg["block_n"]
        stages, threads = cfg["stages"], cfg["threads"]
        overlap = cfg["overlap"]
        # Only the hand-pipelined loop reads the queries from registers.
        q_regs = cfg["q_regs"] and overlap
        simt = cfg["simt"]
        scale = D**-0.5 * LOG2E  # softmax in base 2: exp2 is one instruction
        ragged_kv = S % block_n != 0
        neg_inf = -T.infinity("float32")
        cuda = target["kind"] == "cuda"
        exp2 = (lambda x: T.call_extern("float32", FAST_EXP2, x)) if cuda else T.exp2
        if q_regs:
            from tilelang.layout import make_swizzled_layout

        @T.macro
        def mask_scores(scores, bx, kb):
            # After the score gemm (which starts from zero by itself): only
            # blocks that cross the diagonal (causal) or the end of the keys
            # (ragged) hold scores to mask; the rest skip this.
            if causal:
                if (kb + 1) * block_n > bx * block_m:
                    for i, j in T.Parallel(block_m, block_n):
                        scores[i, j] = T.if_then_else(
                            bx * block_m + i >= kb * block_n + j, scores[i, j], neg_inf
                        )
            elif ragged_kv:
                if (kb + 1) * block_n > S:
                    for i, j in T.Parallel(block_m, block_n):
                        scores[i, j] = T.if_then_else(
                            kb * block_n + j < S, scores[i, j], neg_inf
                        )

        @T.macro
        def online_softmax(scores, row_max, prev_max, rescale, block_sum, row_sum):
            # Running max and sum. The max only moves when a block's scores
            # exceed it by more than 2^STALE_MAX_LOG2 (weights up to 256 are
            # exact in fp16, bf16 and the float32 sums), so after the first
            # blocks ``rescale`` is exactly 1 and the output accumulator is
            # left alone. x * scale - max * scale is one fused multiply-add.
            T.copy(row_max, prev_max)
            T.reduce_max(scores, row_max, dim=1, clear=False)
            for i in T.Parallel(block_m):
                row_max[i] = T.if_then_else(
                    (row_max[i] - prev_max[i]) * scale <= STALE_MAX_LOG2,
                    prev_max[i],
                    row_max[i],
                )
                rescale[i] = T.if_then_else(
                    row_max[i] == prev_max[i],
                    1.0,
                    exp2(prev_max[i] * scale - row_max[i] * scale),
                )
            for i, j in T.Parallel(block_m, block_n):
                scores[i, j] = exp2(scores[i, j] * scale - row_max[i] * scale)
            T.reduce_sum(scores, block_sum, dim=1)
            for i in T.Parallel(block_m):
                row_sum[i] = row_sum[i] * rescale[i] + block_sum[i]

        @T.macro
        def rescale_output(acc, rescale, moved):
            # A warp multiplies its rows of the accumulator only when one of
            # them changed its max (a warp-uniform branch).
            moved[0] = 0
            for i in T.Parallel(block_m):
                moved[0] = moved[0] | T.Cast("int32", rescale[i] != 1.0)
            if T.any_sync(moved[0]) != 0:
                for i, j in T.Parallel(block_m, D):
                    acc[i, j] *= rescale[i]

        @T.prim_func
        def attention(
            Q: T.Tensor((B, H, S, D), dtype),
            K: T.Tensor((B, HKV, S, D), dtype),
            V: T.Tensor((B, HKV, S, D), dtype),
            Out: T.Tensor((B, H, S, D), dtype),
        ):
            with T.Kernel(T.ceildiv(S, block_m), H, B, threads=threads) as (
                bx,
                head,
                batch,
            ):
                if cuda:
                    T.import_source(FAST_EXP2_SOURCE)
                q_tile = T.alloc_shared((block_m, D), dtype)
                k_tile = T.alloc_shared((block_n, D), dtype)
                v_tile = T.alloc_shared((block_n, D), dtype)
                scores = T.alloc_fragment((block_m, block_n), "float32")
                probs = T.alloc_fragment((block_m, block_n), dtype)
                acc = T.alloc_fragment((block_m, D), "float32")
                row_max = T.alloc_fragment((block_m,), "float32")
                prev_max = T.alloc_fragment((block_m,), "float32")
                rescale = T.alloc_fragment((block_m,), "float32")
                block_sum = T.alloc_fragment((block_m,), "float32")
                row_sum = T.alloc_fragment((block_m,), "float32")
                moved = T.alloc_local((1,), "int32")

                # head * HKV // H is head // (H // HKV), the query group's KV
                # head, spelled with HKV because TileLang resolves the string
                # annotations against the names the body uses.
                kv = head * HKV // H
                if q_regs:
                    # No gemm reads q_tile now, so TileLang would lay it out
                    # in rows and load it without TMA: swizzle it, ask for TMA.
                    T.annotate_layout({q_tile: make_swizzled_layout(q_tile)})
                    T.copy(
                        Q[batch, head, bx * block_m, 0],
                        q_tile,
                        annotations={"prefer_instruction": "tma"},
                    )
                else:
                    T.copy(Q[batch, head, bx * block_m, 0], q_tile)
                T.fill(acc, 0)
                T.fill(row_sum, 0)
                T.fill(row_max, neg_inf)
                kv_blocks = (
                    T.min(T.ceildiv(S, block_n), T.ceildiv((bx + 1) * block_m, block_n))
                    if causal
                    else T.ceildiv(S, block_n)
                )
                if overlap:
                    # Software-pipelined by hand, as Hopper's asynchronous
                    # wgmma allows: iteration kb issues the score gemm for
                    # block kb and P @ V for block kb - 1 together, and runs
                    # block kb's softmax while P @ V is still on the tensor
                    # cores. One extra iteration drains the last P @ V; at
                    # either end the idle gemm reads a real block (clamped
                    # index) and its result is discarded or multiplied by
                    # all-zero probabilities, so nothing undefined enters.
                    # (Issuing the idle gemms conditionally measured slower.)
                    T.fill(probs, 0)
                    tile_done = T.alloc_local((2,), dtype)
                    if q_regs:
                        q_frag = T.alloc_fragment((block_m, D), dtype)
                        T.copy(q_tile, q_frag)
                    for kb in T.Pipelined(kv_blocks + 1, num_stages=stages):
                        T.copy(
                            K[batch, kv, T.min(kb, kv_blocks - 1) * block_n, 0], k_tile
                        )
                        T.copy(V[batch, kv, T.max(kb - 1, 0) * block_n, 0], v_tile)
                        T.wgmma_gemm(
                            q_frag if q_regs else q_tile,
                            k_tile,
                            scores,
                            transpose_B=True,
                            clear_accum=True,
                            policy=T.GemmWarpPolicy.FullRow,
                        )
                        T.wgmma_gemm(
                            probs, v_tile, acc, policy=T.GemmWarpPolicy.FullRow
                        )
                        T.wait_wgmma(1)  # scores in; P @ V may still run
                        # The warp-specialized pipeline hands a tile back to
                        # the loader after its last read in the loop body;
                        # these reads place that after each gemm's wait.
                        tile_done[0] = k_tile[0, 0]
                        if kb < kv_blocks:
                            mask_scores(scores, bx, kb)
                            online_softmax(
                                scores, row_max, prev_max, rescale, block_sum, row_sum
                            )
                        T.wait_wgmma(0)  # P @ V done: probs and acc are free
                        tile_done[1] = v_tile[0, 0]
                        if kb < kv_blocks:
                            rescale_output(acc, rescale, moved)
                            T.copy(scores, probs)
                elif simt:
                    p_tile = T.alloc_shared((block_m, block_n), dtype)
                    for kb in T.serial(kv_blocks):
                        T.copy(K[batch, kv, kb * block_n, 0], k_tile)
                        T.copy(V[batch, kv, kb * block_n, 0], v_tile)
                        for i, j in T.Parallel(block_m, block_n):
                            scores[i, j] = 0.0
                            for d in T.serial(D):
                                scores[i, j] += q_tile[i, d] * k_tile[j, d]
                        mask_scores(scores, bx, kb)
                        online_softmax(
                            scores, row_max, prev_max, rescale, block_sum, row_sum
                        )
                        rescale_output(acc, rescale, moved)
                        T.copy(scores, p_tile)
                        for i, d in T.Parallel(block_m, D):
                            for j in T.serial(block_n):
                                acc[i, d] += p_tile[i, j] * v_tile[j, d]
                else:
                    for kb in T.Pipelined(kv_blocks, num_stages=stages):
                        T.copy(K[batch, kv, kb * block_n, 0], k_tile)
                        T.gemm(
                            q_tile,
                            k_tile,
                            scores,
                            transpose_B=True,
                            clear_accum=True,
                            policy=T.GemmWarpPolicy.FullRow,
                        )
                        mask_scores(scores, bx, kb)
                        online_softmax(
                            scores, row_max, prev_max, rescale, block_sum, row_sum
                        )
                        T.copy(scores, probs)
                        rescale_output(acc, rescale, moved)
                        T.copy(V[batch, kv, kb * block_n, 0], v_tile)
                        T.gemm(probs, v_tile, acc, policy=T.GemmWarpPolicy.FullRow)
                for i in T.Parallel(block_m):
                    row_sum[i] = 1 / row_sum[i]
                for i, j in T.Parallel(block_m, D):
                    acc[i, j] *= row_sum[i]
                # The queries are spent: their tile stages the output, so the
                # store leaves in whole rows (a TMA store on Hopper) rather
                # than as the accumulator's scattered 4-byte pieces.
                T.copy(acc, q_tile)
                T.copy(q_tile, Out[batch, head, bx * block_m, 0])

        return attention

    return build


def c_builder(causal: bool):
    def build(shape: dict, dtype: str, target: dict):
        T = language(target)
        B, H, HKV, S, D = (shape[d] for d in DIMS)
        scale = D**-0.5

        @T.prim_func
        def attention(
            Q: T.Tensor((B, H, S, D), dtype),
            K: T.Tensor((B, HKV, S, D), dtype),
            V: T.Tensor((B, HKV, S, D), dtype),
            Out: T.Tensor((B, H, S, D), dtype),
        ):
            with T.Kernel(S, H, B) as (row, head, batch):
                scores = T.alloc_local((S,), "float32")
                stats = T.alloc_local((2,), "float32")  # max, then sum
                kv = head * HKV // H  # = head // (H // HKV)
                kv_len = row + 1 if causal else S
                stats[0] = -T.infinity("float32")
                for j in T.serial(kv_len):
                    scores[j] = 0.0
                    for d in T.serial(D):
                        scores[j] += Q[batch, head, row, d] * K[batch, kv, j, d]
                    scores[j] = scores[j] * scale
                    stats[0] = T.max(stats[0], scores[j])
                stats[1] = 0.0
                for j in T.serial(kv_len):
                    scores[j] = T.exp(scores[j] - stats[0])
                    stats[1] += scores[j]
                for d in T.serial(D):
                    Out[batch, head, row, d] = T.cast(0.0, dtype)
                    for j in T.serial(kv_len):
                        Out[batch, head, row, d] += scores[j] * V[batch, kv, j, d]
                    Out[batch, head, row, d] = Out[batch, head, row, d] / stats[1]

        return attention

    return build


def _refuse(shape: dict, dtype: str, target: dict) -> str | None:
    if shape["H"] % shape["HKV"]:
        return "attention needs H to be a multiple of HKV (whole query groups)"
    if target["kind"] == "c":
        if shape["S"] > CPU_MAX_SEQ:
            return (
                f"attention on c keeps a row of scores on the stack: S <= {CPU_MAX_SEQ}"
            )
        return None
    if shape["D"] % 16 or shape["D"] > 256:
        return (
            "attention on GPUs needs head dim D a multiple of 16 and at most 256 "
            "(tensor-core k-dim and the shared-memory budget)"
        )
    return None


def _inputs(shape: dict, dtype: str) -> list[TensorSpec]:
    B, H, HKV, S, D = (shape[d] for d in DIMS)
    # Queries scaled by 2: scores spread over a few units, so softmax is
    # neither flat nor one-hot.
    return [
        TensorSpec("q", (B, H, S, D), dtype, scale=2.0),
        TensorSpec("k", (B, HKV, S, D), dtype),
        TensorSpec("v", (B, HKV, S, D), dtype),
    ]


def _outputs(shape: dict, dtype: str) -> list[TensorSpec]:
    B, H, _, S, D = (shape[d] for d in DIMS)
    return [TensorSpec("out", (B, H, S, D), dtype)]


def reference_for(causal: bool):
    def reference(q, k, v):
        import torch

        group = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        if causal:
            S = q.shape[2]
            keep = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        return [torch.softmax(scores, dim=-1) @ v]

    return reference


def _flops(shape: dict, causal: bool) -> int:
    B, H, _, S, D = (shape[d] for d in DIMS)
    pairs = S * (S + 1) // 2 if causal else S * S
    return 4 * B * H * pairs * D


def _bytes(shape: dict, dtype: str) -> int:
    B, H, HKV, S, D = (shape[d] for d in DIMS)
    return (2 * B * H * S * D + 2 * B * HKV * S * D) * element_size(dtype)


# The probabilities are rounded to the input dtype before the P @ V gemm, so
# each output element carries that rounding (averaged over the keys) on top
# of its own: about twice the output-only bound.
TOLERANCES = {
    "float16": Tolerance(
        rel_err=2e-3,
        atol=2e-3,
        rtol=1e-2,
        max_mismatch_ratio=1e-3,
        reason="float32 softmax and accumulation; probabilities and output "
        "rounded to fp16 (2^-11 each)",
    ),
    "bfloat16": Tolerance(
        rel_err=1.6e-2,
        atol=1.6e-2,
        rtol=5e-2,
        max_mismatch_ratio=1e-3,
        reason="float32 softmax and accumulation; probabilities and output "
        "rounded to bf16 (2^-8 each)",
    ),
    "float32": Tolerance(
        rel_err=1e-5,
        atol=1e-5,
        rtol=1e-4,
        max_mismatch_ratio=0.0,
        reason="float32 end to end; libm exp and summation order differ",
    ),
}


def make_operator(causal: bool) -> Operator:
    kind = "causal" if causal else "non-causal"
    return Operator(
        name="attention_causal" if causal else "attention",
        dims=DIMS,
        dtypes={"cuda": GPU_DTYPES, "hip": GPU_DTYPES, "c": CPU_DTYPES},
        builders={
            "cuda": gpu_builder(causal),
            "hip": gpu_builder(causal),
            "c": c_builder(causal),
        },
        inputs=_inputs,
        outputs=_outputs,
        reference=reference_for(causal),
        flops=lambda s: _flops(s, causal),
        bytes_moved=_bytes,
        tolerances=TOLERANCES,
        refuse=_refuse,
        description=f"{kind} SDPA, q/out [B,H,S,D], k/v [B,HKV,S,D], GQA when HKV<H",
        default_shape={"B": 1, "H": 32, "HKV": 8, "S": 4096, "D": 128},
    )


OPERATOR = make_operator(causal=False)
