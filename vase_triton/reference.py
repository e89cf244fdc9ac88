"""Pure-PyTorch twin of every op: the specification, the CPU path and the test oracle.

Everything here favours clarity over speed: attention materialises the full
score matrix, eviction uses `topk` / `sort` / `gather`. Optimised code never
imports this module; tests compare the Triton kernels against it in float64.

Shapes use `B` batch, `Hq` query heads, `Hkv` key/value heads (`Hq % Hkv == 0`,
`group = Hq // Hkv`), `Tq` queries, `Tk` keys, `C` cache capacity, `D` head dim.
"""

from __future__ import annotations

import math
from typing import Optional

import torch


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def attention_probabilities(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    scale: Optional[float] = None,
    causal: bool = True,
    kv_lens: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Softmax attention probabilities with end-aligned queries.

    Query `i` of sequence `b` sits at position `L_b - Tq + i`, where `L_b = kv_lens[b]`
    (or `Tk`). It sees keys `j < L_b`, and with `causal` only `j <= L_b - Tq + i`.
    A query that sees no key (possible only when `L_b < Tq`) gets all-zero probabilities.

    Args:
        q: `[B, Hq, Tq, D]`.
        k: `[B, Hkv, Tk, D]`.
        kv_lens: `[B]` int, valid keys per sequence, or None for all `Tk`.

    Returns:
        `[B, Hq, Tq, Tk]` probabilities in float32 (float64 for float64 inputs).
    """
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    acc = _accumulation_dtype(q.dtype)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    keys = k.to(acc).repeat_interleave(q_heads // kv_heads, dim=1)
    logits = torch.matmul(q.to(acc), keys.transpose(-1, -2)) * scale  # [B, Hq, Tq, Tk]

    if kv_lens is None:
        lens = torch.full((batch,), k_len, dtype=torch.long, device=q.device)
    else:
        lens = kv_lens.to(device=q.device, dtype=torch.long)
    key_idx = torch.arange(k_len, device=q.device)
    visible = key_idx.view(1, 1, k_len) < lens.view(batch, 1, 1)  # [B, 1, Tk]
    if causal:
        q_pos = lens.view(batch, 1) - q_len + torch.arange(q_len, device=q.device).view(1, q_len)
        visible = visible & (key_idx.view(1, 1, k_len) <= q_pos.view(batch, q_len, 1))  # [B, Tq, Tk]
    else:
        visible = visible.expand(batch, q_len, k_len)
    visible = visible.unsqueeze(1)  # [B, 1, Tq, Tk]

    logits = logits.masked_fill(~visible, float("-inf"))
    row_max = logits.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(logits - row_max)
    return weights / weights.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(acc).tiny)


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
    """Attention of `Tq` end-aligned queries over `Tk` keys, plus window importance scores.

    Args:
        q: `[B, Hq, Tq, D]`; k, v: `[B, Hkv, Tk, D]`; kv_lens: `[B]` int or None.
        score_window: number of last queries whose probabilities are summed into `scores`.

    Returns:
        out: `[B, Hq, Tq, D]` in `q.dtype` (zeros for a query that sees no key).
        lse: `[B, Hq, Tq]` float32 log-sum-exp of the scaled logits (`-inf` for such a query).
        scores: `[B, Hkv, Tk]` float32 when `score_window > 0`, else None: the probability
            mass each key receives from the last `score_window` queries of all query heads of
            its group. Each row sums to `score_window * Hq / Hkv` over the valid keys.
    """
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    acc = _accumulation_dtype(q.dtype)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    probs = attention_probabilities(q, k, scale=scale, causal=causal, kv_lens=kv_lens)
    values = v.to(acc).repeat_interleave(q_heads // kv_heads, dim=1)
    out = torch.matmul(probs, values).to(q.dtype)

    keys = k.to(acc).repeat_interleave(q_heads // kv_heads, dim=1)
    logits = torch.matmul(q.to(acc), keys.transpose(-1, -2)) * scale
    logits = logits.masked_fill(probs == 0, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1).to(torch.float32)

    scores = None
    if score_window > 0:
        window = probs[:, :, q_len - score_window :, :].sum(dim=2)  # [B, Hq, Tk]
        scores = window.view(batch, kv_heads, q_heads // kv_heads, k_len).sum(dim=2).to(torch.float32)
    return out, lse, scores


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    *,
    scale: Optional[float] = None,
    scores: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One decode step over a static cache; optionally accumulates importance in place.

    Args:
        q: `[B, Hq, 1, D]`.
        k_cache, v_cache: `[B, Hkv, C, D]`; only the first `cache_lens[b]` slots are read.
        cache_lens: `[B]` int, valid slots per sequence.
        scores: `[B, Hkv, C]` float32 or None. This step's probabilities, summed over the
            query heads of each KV group, are added into it; slots at or past
            `cache_lens[b]` are left unchanged.

    Returns:
        `[B, Hq, 1, D]` in `q.dtype`.
    """
    batch, q_heads = q.shape[0], q.shape[1]
    kv_heads, capacity = k_cache.shape[1], k_cache.shape[2]
    probs = attention_probabilities(q, k_cache, scale=scale, causal=False, kv_lens=cache_lens)
    values = v_cache.to(probs.dtype).repeat_interleave(q_heads // kv_heads, dim=1)
    out = torch.matmul(probs, values).to(q.dtype)
    if scores is not None:
        step = probs[:, :, 0, :].view(batch, kv_heads, q_heads // kv_heads, capacity).sum(dim=2)
        scores.add_(step.to(scores.dtype))
    return out
