"""Per-policy importance scores: the only thing that differs between eviction policies.

Each policy maps the state of one cache layer to a `[B, Hkv, N]` float32 importance that
the fused eviction op (`vase_triton.ops.evict_`) turns into survivors: Gumbel-top-k
sampling for stochastic policies, deterministic top-k otherwise; sinks, the recent
window and (for `vase`) value-protected tokens are kept by the op itself. Every function
uses static shapes and torch ops only, and reads nothing back to the host.

Slot `s` of sequence `b` is valid when `s < lengths[b]`; the candidates are the valid
slots before the recent window, `s < lengths[b] - window`. Importance outside the valid
slots is 0.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from vase_triton.config import VaSEConfig
from vase_triton.seeding import eviction_generator_seed

PolicyImportance = Callable[..., torch.Tensor]


def _slot_mask(lengths: torch.Tensor, num_slots: int, offset: int, device: torch.device) -> torch.Tensor:
    """`[B, 1, N]` bool: slot < lengths[b] - offset."""
    slot = torch.arange(num_slots, device=device).view(1, 1, num_slots)
    return slot < (lengths.to(device=device, dtype=torch.long) - offset).view(-1, 1, 1)


def pooled_attention(config: VaSEConfig, scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Window attention smoothed along the slots by an average pool of width `config.pool_kernel`.

    Edges are zero-padded: slots outside `[0, lengths[b])` count as 0 and the divisor is
    always `pool_kernel`, so a slot at the edge of the sequence is smoothed towards 0.

    Args:
        scores: `[B, Hkv, N]` float32 accumulated attention; lengths: `[B]` int.

    Returns:
        `[B, Hkv, N]` float32, 0 at slots `>= lengths[b]`.
    """
    batch, kv_heads, num_slots = scores.shape
    valid = _slot_mask(lengths, num_slots, 0, scores.device)
    masked = scores.to(torch.float32) * valid
    width = config.pool_kernel
    pooled = F.avg_pool1d(
        masked.reshape(batch * kv_heads, 1, num_slots), kernel_size=width, stride=1,
        padding=width // 2, count_include_pad=True,
    ).view(batch, kv_heads, num_slots)
    return pooled * valid


def _window_attention(config, keys, values, scores, magnitudes, positions, lengths, eviction_index):
    return pooled_attention(config, scores, lengths)


def _accumulated_attention(config, keys, values, scores, magnitudes, positions, lengths, eviction_index):
    return scores.to(torch.float32) * _slot_mask(lengths, scores.shape[-1], 0, scores.device)


def _redundancy_aware_attention(config, keys, values, scores, magnitudes, positions, lengths, eviction_index):
    num_slots = scores.shape[-1]
    candidate = _slot_mask(lengths, num_slots, config.window, scores.device)  # [B, 1, N]
    tiny = torch.finfo(torch.float32).tiny
    attention = pooled_attention(config, scores, lengths) * candidate
    attention = attention / attention.sum(dim=-1, keepdim=True).clamp_min(tiny)

    unit = F.normalize(keys.to(torch.float32), dim=-1)  # [B, Hkv, N, D]
    total = (unit * candidate.unsqueeze(-1)).sum(dim=2, keepdim=True)  # [B, Hkv, 1, D]
    self_similarity = unit.square().sum(dim=-1)  # [B, Hkv, N]
    n_candidates = (lengths.to(device=scores.device, dtype=torch.float32) - config.window).view(-1, 1, 1)
    mean_similarity = ((unit * total).sum(dim=-1) - self_similarity) / (n_candidates - 1).clamp_min(1)
    redundancy = torch.softmax(mean_similarity.masked_fill(~candidate, -1e30), dim=-1) * candidate
    lam = float(config.rkv_lambda)
    return (lam * attention - (1.0 - lam) * redundancy) * candidate


def dkv_projection(config: VaSEConfig, head_dim: int, eviction_index: int, device: torch.device) -> torch.Tensor:
    """The `[D, dkv_rank]` Gaussian projection of eviction `eviction_index`, scaled by `1/sqrt(dkv_rank)`.

    Drawn on the CPU from a generator seeded by `(config.seed, eviction_index)`, so it is the
    same on every device and for every row of the layer.
    """
    generator = torch.Generator(device="cpu")
    generator.manual_seed(eviction_generator_seed(config.seed, eviction_index))
    projection = torch.randn(head_dim, config.dkv_rank, generator=generator, dtype=torch.float32)
    return (projection / math.sqrt(config.dkv_rank)).to(device)


def _projected_energy(config, keys, values, scores, magnitudes, positions, lengths, eviction_index):
    projection = dkv_projection(config, keys.shape[-1], eviction_index, keys.device)
    key_energy = (keys.to(torch.float32) @ projection).square().sum(dim=-1)  # [B, Hkv, N]
    value_energy = (values.to(torch.float32) @ projection).square().sum(dim=-1)  # [B, Hkv, N]
    candidate = _slot_mask(lengths, keys.shape[2], config.window, keys.device)
    energy = key_energy * value_energy * candidate
    return energy / energy.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)


def _recency(config, keys, values, scores, magnitudes, positions, lengths, eviction_index):
    valid = _slot_mask(lengths, positions.shape[-1], 0, positions.device)
    return (positions.to(torch.float32) + 1.0) * valid


def _uniform(config, keys, values, scores, magnitudes, positions, lengths, eviction_index):
    valid = _slot_mask(lengths, scores.shape[-1], 0, scores.device)
    return valid.expand(scores.shape).to(torch.float32)


POLICY_IMPORTANCE: dict[str, PolicyImportance] = {
    # window attention, average-pooled along the slots (sampled for vase)
    "vase": _window_attention,
    "snapkv": _window_attention,
    # attention accumulated since the token entered the cache (never reset for h2o)
    "h2o": _accumulated_attention,
    # attention of the last query only (the cache clears scores before each step)
    "tova": _accumulated_attention,
    # lam * normalised pooled attention - (1 - lam) * softmax of mean key cosine similarity
    "rkv": _redundancy_aware_attention,
    # ||k G||^2 * ||v G||^2 with a fresh Gaussian G per eviction, normalised per row
    "vase-dkv": _projected_energy,
    # position + 1: top-k keeps the most recent tokens
    "streaming": _recency,
    # ones: with Gumbel noise, uniform sampling
    "random": _uniform,
}


def policy_importance(
    config: VaSEConfig,
    keys: torch.Tensor,
    values: torch.Tensor,
    scores: torch.Tensor,
    magnitudes: torch.Tensor,
    positions: torch.Tensor,
    lengths: torch.Tensor,
    *,
    eviction_index: int,
) -> torch.Tensor:
    """Importance of every slot under `config.policy`, input of `vase_triton.ops.evict_`.

    Args:
        config: the layer's `VaSEConfig` (`policy`, `window`, `pool_kernel`, `rkv_lambda`,
            `dkv_rank`, `seed` are read).
        keys, values: `[B, Hkv, N, D]`; scores, magnitudes: `[B, Hkv, N]` float32;
        positions: `[B, Hkv, N]` int32; lengths: `[B]` int.
        eviction_index: how many evictions this layer has done (seeds `vase-dkv`).

    Returns:
        `[B, Hkv, N]` float32, contiguous. Non-negative for every policy but `rkv`, whose
        `lam * attention - (1 - lam) * redundancy` may be negative (it selects
        deterministically).
    """
    if not isinstance(config, VaSEConfig):
        raise TypeError(f"config: expected a VaSEConfig; got {type(config).__name__}")
    if config.policy not in POLICY_IMPORTANCE:
        raise ValueError(
            f"config.policy: expected one of {', '.join(POLICY_IMPORTANCE)} (policies that evict); "
            f"got {config.policy!r}"
        )
    if not isinstance(eviction_index, int) or isinstance(eviction_index, bool) or eviction_index < 0:
        raise ValueError(f"eviction_index: expected an int >= 0; got {eviction_index!r}")
    importance = POLICY_IMPORTANCE[config.policy](
        config, keys, values, scores, magnitudes, positions, lengths, eviction_index
    )
    return importance.to(torch.float32).contiguous()
