"""Public attention ops: argument checks, `torch.library` registration, backend dispatch.

`prefill_attention`, `decode_attention` and `candidate_attention` validate their
arguments, then call a custom op (`vase_triton::prefill_attention`, ...) that
`torch.compile` treats as one opaque node with a fake implementation (plain eager calls
skip the dispatcher: `vase_triton.ops.library_op`). The op runs the Triton kernels or
the PyTorch reference as `vase_triton.backend` decides. `decode_attention_op` and
`candidate_attention_op` are the ops themselves, unchecked, for the cache layers.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from vase_triton import reference
from vase_triton.backend import use_triton
from vase_triton.ops.library_op import library_op
from vase_triton.validation import (
    check_float_dtype,
    check_head_dim,
    check_lengths,
    check_rank,
    check_same_device,
    check_same_dtype,
    check_tensor,
)


@library_op("prefill_attention", mutates_args=())
def _prefill_attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_lens: Optional[torch.Tensor],
    scale: float,
    causal: bool,
    score_window: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if use_triton(q.device):
        from vase_triton.kernels.prefill_attention import prefill_attention_triton

        return prefill_attention_triton(q, k, v, kv_lens, scale, causal, score_window)
    out, lse, scores = reference.prefill_attention(
        q, k, v, scale=scale, causal=causal, kv_lens=kv_lens, score_window=score_window
    )
    if scores is None:
        scores = q.new_empty((k.shape[0], k.shape[1], 0), dtype=torch.float32)
    return out, lse, scores


@_prefill_attention_op.register_fake
def _prefill_attention_fake(q, k, v, kv_lens, scale, causal, score_window):
    batch, q_heads, q_len, _ = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty((batch, q_heads, q_len), dtype=torch.float32)
    scores = q.new_empty((batch, kv_heads, k_len if score_window > 0 else 0), dtype=torch.float32)
    return out, lse, scores


@library_op("decode_attention", mutates_args=("scores", "part_out", "part_lse", "logits"))
def decode_attention_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: float,
    scores: Optional[torch.Tensor],
    part_out: Optional[torch.Tensor],
    part_lse: Optional[torch.Tensor],
    logits: Optional[torch.Tensor],
) -> torch.Tensor:
    """`part_out`, `part_lse`, `logits`: a preallocated split-K workspace, or three Nones.

    Every argument is required: torch 2.11 indexes mutated arguments by schema position
    and fails on a call that leaves a defaulted one out.
    """
    if use_triton(q.device):
        from vase_triton.kernels.decode_attention import DecodeWorkspace, decode_attention_triton

        workspace = None if part_out is None else DecodeWorkspace(part_out, part_lse, logits)
        return decode_attention_triton(q, k_cache, v_cache, cache_lens, scale, scores, workspace=workspace)
    return reference.decode_attention(q, k_cache, v_cache, cache_lens, scale=scale, scores=scores)


@decode_attention_op.register_fake
def _decode_attention_fake(q, k_cache, v_cache, cache_lens, scale, scores, part_out, part_lse, logits):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@library_op("candidate_attention", mutates_args=())
def candidate_attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    candidate_lens: torch.Tensor,
    q_valid: Optional[torch.Tensor],
    scale: float,
) -> torch.Tensor:
    if use_triton(q.device):
        from vase_triton.kernels.prefill_attention import candidate_attention_triton

        return candidate_attention_triton(q, k, candidate_lens, scale, q_valid)
    return reference.candidate_attention(q, k, candidate_lens, scale=scale, q_valid=q_valid)


@candidate_attention_op.register_fake
def _candidate_attention_fake(q, k, candidate_lens, q_valid, scale):
    return q.new_empty((k.shape[0], k.shape[1], k.shape[2]), dtype=torch.float32)


def _check_heads(q: torch.Tensor, k: torch.Tensor, k_name: str) -> None:
    q_heads, kv_heads = q.shape[1], k.shape[1]
    if q_heads == 0:
        raise ValueError("q: expected at least one query head; got Hq=0")
    if kv_heads == 0 or q_heads % kv_heads != 0:
        raise ValueError(
            f"{k_name}: expected a number of KV heads dividing the {q_heads} query heads "
            f"(Hq % Hkv == 0); got Hkv={kv_heads}"
        )


def _check_kv_pair(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_name: str, v_name: str) -> None:
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"{k_name}: expected batch size {q.shape[0]} like q; got {k.shape[0]}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{k_name}: expected head dim {q.shape[-1]} like q; got {k.shape[-1]}")
    if v.shape != k.shape:
        raise ValueError(f"{v_name}: expected shape {tuple(k.shape)} like {k_name}; got {tuple(v.shape)}")
    _check_heads(q, k, k_name)


def _resolve_scale(scale: Optional[float], head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale: expected a finite positive float or None; got {scale!r}")
    return float(scale)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: Optional[float] = None,
    causal: bool = True,
    kv_lens: Optional[torch.Tensor] = None,
    score_window: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """FlashAttention-style forward that can also emit window importance scores.

    Queries are aligned to the end of the keys: query `i` of sequence `b` sits at
    position `kv_lens[b] - Tq + i`, so chunked prefill and decode are special cases.

    Args:
        q: `[B, Hq, Tq, D]` fp16, bf16 or fp32.
        k, v: `[B, Hkv, Tk, D]`, same dtype and device as `q`, `Hq % Hkv == 0`, `Tq <= Tk`.
        scale: softmax scale, default `1 / sqrt(D)`.
        causal: mask keys after each query's position.
        kv_lens: `[B]` int32/int64, valid keys per sequence in `[0, Tk]` (default: all `Tk`).
        score_window: `0 <= score_window <= Tq`; number of last queries whose probabilities
            are summed into `scores`.

    Returns:
        out: `[B, Hq, Tq, D]` in `q.dtype` (zeros for a query that sees no key).
        lse: `[B, Hq, Tq]` float32 log-sum-exp of the scaled logits.
        scores: `[B, Hkv, Tk]` float32 when `score_window > 0`, else None. Key `j` gets the
            probability mass of the last `score_window` queries of every query head of its
            group; rows sum to `score_window * Hq / Hkv` over valid keys, others are 0.
            Each probability is recomputed as `exp(logit - lse)` in fp32 (on the Triton path),
            so a logit of magnitude L carries a relative error of a few L * 2^-24: nothing
            measurable for a model's logits (tens to hundreds), about 1 % at L = 1e5, and
            meaningless scores near L = 1e7 (a scale far beyond `1 / sqrt(D)`), though each
            probability stays in [0, 1], so a score never exceeds `score_window * Hq / Hkv`.
    """
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        check_rank(name, tensor, 4, "[B, H, T, D]")
        check_float_dtype(name, tensor)
    check_same_dtype(("q", "k", "v"), (q, k, v))
    if kv_lens is not None:
        check_tensor("kv_lens", kv_lens)
    check_same_device(("q", "k", "v", "kv_lens"), (q, k, v, kv_lens))
    _check_kv_pair(q, k, v, "k", "v")
    check_head_dim("q", q.shape[-1])
    q_len, k_len = q.shape[2], k.shape[2]
    if q_len > k_len:
        raise ValueError(f"q: expected Tq <= Tk = {k_len} (queries align to the end of the keys); got Tq={q_len}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool; got {type(causal).__name__}")
    if not isinstance(score_window, int) or isinstance(score_window, bool):
        raise TypeError(f"score_window: expected an int; got {type(score_window).__name__}")
    if not 0 <= score_window <= q_len:
        raise ValueError(f"score_window: expected 0 <= score_window <= Tq = {q_len}; got {score_window}")
    if kv_lens is not None:
        check_lengths("kv_lens", kv_lens, q.shape[0], 0, k_len)
    scale = _resolve_scale(scale, q.shape[-1])
    out, lse, scores = _prefill_attention_op(q, k, v, kv_lens, scale, causal, score_window)
    return out, lse, (scores if score_window > 0 else None)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    *,
    scale: Optional[float] = None,
    scores: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One decode step of attention over a static cache (split-K on GPU).

    Args:
        q: `[B, Hq, 1, D]` fp16, bf16 or fp32.
        k_cache, v_cache: `[B, Hkv, C, D]`, same dtype and device as `q`.
        cache_lens: `[B]` int32/int64, valid slots per sequence in `[0, C]`.
        scale: softmax scale, default `1 / sqrt(D)`.
        scores: optional `[B, Hkv, C]` float32, contiguous. This step's probabilities,
            summed over each KV group's query heads, are added into it in place; slots at or
            past `cache_lens[b]` are never read as keys and never receive score.

    Returns:
        `[B, Hq, 1, D]` in `q.dtype`.
    """
    check_rank("q", q, 4, "[B, Hq, 1, D]")
    check_rank("k_cache", k_cache, 4, "[B, Hkv, C, D]")
    check_rank("v_cache", v_cache, 4, "[B, Hkv, C, D]")
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_float_dtype(name, tensor)
    check_same_dtype(("q", "k_cache", "v_cache"), (q, k_cache, v_cache))
    check_tensor("cache_lens", cache_lens)
    if scores is not None:
        check_tensor("scores", scores)
    check_same_device(("q", "k_cache", "v_cache", "cache_lens", "scores"), (q, k_cache, v_cache, cache_lens, scores))
    if q.shape[2] != 1:
        raise ValueError(f"q: expected one query per sequence, shape [B, Hq, 1, D]; got {tuple(q.shape)}")
    _check_kv_pair(q, k_cache, v_cache, "k_cache", "v_cache")
    check_head_dim("q", q.shape[-1])
    batch, kv_heads, capacity = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    check_lengths("cache_lens", cache_lens, batch, 0, capacity)
    if scores is not None:
        check_tensor("scores", scores)
        expected = (batch, kv_heads, capacity)
        if tuple(scores.shape) != expected:
            raise ValueError(f"scores: expected shape [B, Hkv, C] = {list(expected)}; got {list(scores.shape)}")
        if scores.dtype != torch.float32:
            raise TypeError(f"scores: expected dtype float32; got {scores.dtype}")
        if not scores.is_contiguous():
            raise ValueError("scores: expected a contiguous tensor (it is updated in place); got a strided view")
    scale = _resolve_scale(scale, q.shape[-1])
    return decode_attention_op(q, k_cache, v_cache, cache_lens, scale, scores, None, None, None)


def candidate_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    candidate_lens: torch.Tensor,
    *,
    scale: Optional[float] = None,
    q_valid: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Mean attention each candidate key receives from a window of queries (softmax over candidates only).

    The importance of `score_mode="recompute"` (the paper's definition): each query's softmax
    runs over keys `[0, candidate_lens[b])` only, then probabilities are averaged over the
    `W` queries and the query heads of each KV group. Runs the prefill kernels (a
    log-sum-exp pass without values, then the scores pass); no attention matrix is stored.
    The probabilities' accuracy is that of `prefill_attention`'s scores.

    Args:
        q: `[B, Hq, W, D]` window queries (after RoPE), fp16, bf16 or fp32.
        k: `[B, Hkv, N, D]` cached keys, same dtype and device, `Hq % Hkv == 0`.
        candidate_lens: `[B]` int32/int64 candidates per sequence, in `[0, N]`.
        scale: softmax scale, default `1 / sqrt(D)`.
        q_valid: optional `[B, W]` bool: queries that exist; the others contribute nothing
            (the mean still divides by `W`).

    Returns:
        `[B, Hkv, N]` float32: the valid queries' probability sums divided by `W * Hq / Hkv`,
        0 at slots `>= candidate_lens[b]`.
    """
    check_rank("q", q, 4, "[B, Hq, W, D]")
    check_rank("k", k, 4, "[B, Hkv, N, D]")
    for name, tensor in (("q", q), ("k", k)):
        check_float_dtype(name, tensor)
    check_same_dtype(("q", "k"), (q, k))
    check_tensor("candidate_lens", candidate_lens)
    if q_valid is not None:
        check_tensor("q_valid", q_valid)
    check_same_device(("q", "k", "candidate_lens", "q_valid"), (q, k, candidate_lens, q_valid))
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k: expected batch size {q.shape[0]} like q; got {k.shape[0]}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k: expected head dim {q.shape[-1]} like q; got {k.shape[-1]}")
    _check_heads(q, k, "k")
    check_head_dim("q", q.shape[-1])
    check_lengths("candidate_lens", candidate_lens, q.shape[0], 0, k.shape[2])
    if q_valid is not None:
        expected = (q.shape[0], q.shape[2])
        if tuple(q_valid.shape) != expected or q_valid.dtype != torch.bool:
            raise ValueError(
                f"q_valid: expected a bool tensor of shape [B, W] = {list(expected)}; "
                f"got {q_valid.dtype} {list(q_valid.shape)}"
            )
    scale = _resolve_scale(scale, q.shape[-1])
    return candidate_attention_op(q, k, candidate_lens, q_valid, scale)


def decode_workspace(q_heads: int, k_cache: torch.Tensor, dtype: torch.dtype, *, emit_scores: bool) -> tuple:
    """Preallocated split-K scratch for `decode_attention` steps over `k_cache` `[B, Hkv, C, D]`.

    Pass its three tensors as the last arguments of `decode_attention_op`
    so that a decode step allocates nothing; the PyTorch reference ignores them.
    """
    from vase_triton.kernels.decode_attention import decode_workspace as allocate

    return tuple(allocate(q_heads, k_cache, dtype, emit_scores=emit_scores))
