"""Fused cache append: copy new keys/values into the next free slots, record their
value magnitude and position, and advance the per-sequence counters.

`_cache_append_kernel` runs one program per (sequence `b`, block of `BLOCK_T` new
tokens) and walks the KV heads in blocks of `BLOCK_H`, moving `[BLOCK_H, BLOCK_T,
BLOCK_D]` tiles: a decode step (one token) is one program per sequence over all its
heads, a prompt is spread over many programs. Every program reads `lengths[b]` to find
its slots, so the counters may only advance once all have read them: with a single token
block the program advances them itself (one launch per decode step); with several, the
launcher advances them after the kernel. A sequence whose cache would overflow
(`lengths[b] + T_new > N`) is left untouched, counters included.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from vase_triton.autotune.lookup import tuned_params
from vase_triton.autotune.shapes import AppendShape, dtype_name
from vase_triton.backend import interpreter_enabled
from vase_triton.cache_tensors import CacheTensors
from vase_triton.config import VALUE_STATS

# Elements of one [BLOCK_H, BLOCK_T, BLOCK_D] tile (per program iteration).
_MAX_TILE = 4096
_INTERPRETER_MAX_TILE = 65536


@triton.jit
def _cache_append_kernel(
    # pointers
    keys_ptr,
    values_ptr,
    magnitudes_ptr,
    positions_ptr,
    lengths_ptr,
    next_positions_ptr,
    new_keys_ptr,
    new_values_ptr,
    # sizes
    num_heads,
    capacity,
    new_len,
    head_dim,
    # strides
    stride_kb, stride_kh, stride_kc, stride_kd,
    stride_vb, stride_vh, stride_vc, stride_vd,
    stride_nkb, stride_nkh, stride_nkt, stride_nkd,
    stride_nvb, stride_nvh, stride_nvt, stride_nvd,
    stride_mb, stride_mh, stride_mc,
    stride_pb, stride_ph, stride_pc,
    # meta-parameters
    STAT: tl.constexpr,
    ACC_FP64: tl.constexpr,
    UPDATE_COUNTERS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    batch = tl.program_id(0).to(tl.int64)
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    length = tl.load(lengths_ptr + batch)
    next_position = tl.load(next_positions_ptr + batch)
    fits = (length >= 0) & (length <= capacity - new_len)  # no int32 overflow for lengths near 2**31

    offs_d = tl.arange(0, BLOCK_D).to(tl.int64)
    mask_d = offs_d < head_dim
    mask_t = offs_t < tl.where(fits, new_len, 0)  # a sequence that would overflow writes nothing
    slots = (length + offs_t).to(tl.int64)  # [BLOCK_T]
    tok = offs_t.to(tl.int64)[None, :, None]  # [1, BLOCK_T, 1]
    dim = offs_d[None, None, :]  # [1, 1, BLOCK_D]
    for head_start in range(0, num_heads, BLOCK_H):
        offs_h = (head_start + tl.arange(0, BLOCK_H)).to(tl.int64)  # [BLOCK_H]
        head = offs_h[:, None, None]  # [BLOCK_H, 1, 1]
        mask_ht = (offs_h < num_heads)[:, None] & mask_t[None, :]  # [BLOCK_H, BLOCK_T]
        mask = mask_ht[:, :, None] & mask_d[None, None, :]  # [BLOCK_H, BLOCK_T, BLOCK_D]
        src_k = new_keys_ptr + batch * stride_nkb + head * stride_nkh + tok * stride_nkt + dim * stride_nkd
        src_v = new_values_ptr + batch * stride_nvb + head * stride_nvh + tok * stride_nvt + dim * stride_nvd
        k = tl.load(src_k, mask=mask, other=0.0)  # [BLOCK_H, BLOCK_T, BLOCK_D]
        v = tl.load(src_v, mask=mask, other=0.0)  # [BLOCK_H, BLOCK_T, BLOCK_D]
        slot = slots[None, :, None]
        tl.store(keys_ptr + batch * stride_kb + head * stride_kh + slot * stride_kc + dim * stride_kd, k, mask=mask)
        tl.store(values_ptr + batch * stride_vb + head * stride_vh + slot * stride_vc + dim * stride_vd, v, mask=mask)

        if ACC_FP64:
            vf = v.to(tl.float64)
        else:
            vf = v.to(tl.float32)
        in_d = mask_d[None, None, :]
        if STAT == 0:  # range: max - min
            hi = tl.max(tl.where(in_d, vf, float("-inf")), axis=2)
            lo = tl.min(tl.where(in_d, vf, float("inf")), axis=2)
            magnitude = hi - lo  # [BLOCK_H, BLOCK_T]
        elif STAT == 1:  # absmax
            magnitude = tl.max(tl.abs(vf), axis=2)
        if STAT <= 1:  # tl.max / tl.min may drop a NaN; torch's amax / amin keep it
            magnitude = tl.where(tl.sum((vf != vf).to(tl.int32), axis=2) > 0, float("nan"), magnitude)
        elif STAT == 2:  # l2 norm
            magnitude = tl.sqrt(tl.sum(vf * vf, axis=2))
        else:  # population variance
            mean = tl.sum(vf, axis=2) / head_dim
            centred = tl.where(in_d, vf - mean[:, :, None], 0.0)
            magnitude = tl.sum(centred * centred, axis=2) / head_dim

        slot_ht = slots[None, :]  # [1, BLOCK_T]
        dst_m = magnitudes_ptr + batch * stride_mb + offs_h[:, None] * stride_mh + slot_ht * stride_mc
        dst_p = positions_ptr + batch * stride_pb + offs_h[:, None] * stride_ph + slot_ht * stride_pc
        position = tl.zeros([BLOCK_H, BLOCK_T], dtype=tl.int32) + (next_position + offs_t)[None, :]
        tl.store(dst_m, magnitude.to(tl.float32), mask=mask_ht)
        tl.store(dst_p, position, mask=mask_ht)

    if UPDATE_COUNTERS:
        tl.store(lengths_ptr + batch, tl.where(fits, length + new_len, length))
        tl.store(next_positions_ptr + batch, tl.where(fits, next_position + new_len, next_position))


class AppendConfig(NamedTuple):
    """Append launch: `[BLOCK_H, BLOCK_T]` (head, token) pairs per tile of `next_power_of_2(D)` dims, and warps."""

    block_h: int
    block_t: int
    num_warps: int


def append_heuristic(shape: AppendShape) -> AppendConfig:
    """All heads of one token per tile when decoding, token blocks otherwise, 4 warps."""
    block_d = triton.next_power_of_2(shape.head_dim)
    pairs = max(1, (_INTERPRETER_MAX_TILE if interpreter_enabled() else _MAX_TILE) // block_d)  # (head, token) pairs
    block_h = max(1, min(triton.next_power_of_2(shape.kv_heads), pairs))
    block_t = max(1, min(triton.next_power_of_2(shape.new_len), pairs // block_h))
    return AppendConfig(block_h, block_t, 4)


def cache_append_triton(
    cache: CacheTensors,
    new_keys: torch.Tensor,
    new_values: torch.Tensor,
    value_stat: str,
    *,
    config: Optional[AppendConfig] = None,
) -> None:
    """Launch the append kernel on a validated cache (`[B, Hkv, N, D]`) and `[B, Hkv, T_new, D]` new tokens.

    `config`: launch parameters; None picks the tuned configuration of this shape, else the heuristic.
    """
    keys, values, _, magnitudes, positions, lengths, next_positions = cache
    batch, num_heads, capacity, head_dim = keys.shape
    new_len = new_keys.shape[2]
    if batch == 0 or new_len == 0:
        return
    if config is None:
        shape = AppendShape(batch, num_heads, new_len, head_dim, dtype_name(keys.dtype))
        tuned = tuned_params("append", shape, keys.device)
        config = AppendConfig(**tuned) if tuned is not None else append_heuristic(shape)
    block_t = config.block_t
    token_blocks = triton.cdiv(new_len, block_t)
    _cache_append_kernel[(batch, token_blocks)](
        keys, values, magnitudes, positions, lengths, next_positions, new_keys, new_values,
        num_heads, capacity, new_len, head_dim,
        *keys.stride(), *values.stride(), *new_keys.stride(), *new_values.stride(),
        *magnitudes.stride(), *positions.stride(),
        STAT=VALUE_STATS.index(value_stat),
        ACC_FP64=keys.dtype == torch.float64,
        UPDATE_COUNTERS=token_blocks == 1,
        BLOCK_H=config.block_h,
        BLOCK_T=block_t,
        BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=config.num_warps,
    )  # fmt: skip
    if token_blocks > 1:
        fits = (lengths >= 0) & (lengths <= capacity - new_len)
        step = torch.where(fits, new_len, 0).to(lengths.dtype)
        lengths.add_(step)
        next_positions.add_(step)
