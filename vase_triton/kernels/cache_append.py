"""Fused cache append: copy new keys/values into the next free slots, record their
value magnitude and position, and advance the per-sequence counters.

One program per sequence `b` handles all of its KV heads, so the program that
reads `lengths[b]` is also the only one that advances it: no cross-program race
and a single launch per decode step. A sequence whose cache would overflow
(`lengths[b] + T_new > C`) is left untouched, counters included.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vase_triton.config import VALUE_STATS

# Work per program is one [BLOCK_H, BLOCK_D] tile per new token: cap its size.
_MAX_TILE = 4096


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
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    batch = tl.program_id(0).to(tl.int64)
    length = tl.load(lengths_ptr + batch)
    next_position = tl.load(next_positions_ptr + batch)
    fits = length + new_len <= capacity

    # A sequence that would overflow writes no head at all.
    heads_written = tl.where(fits, num_heads, 0)

    offs_d = tl.arange(0, BLOCK_D).to(tl.int64)
    mask_d = offs_d < head_dim
    for head_start in range(0, num_heads, BLOCK_H):
        offs_h = (head_start + tl.arange(0, BLOCK_H)).to(tl.int64)
        mask_h = offs_h < heads_written
        mask_hd = mask_h[:, None] & mask_d[None, :]  # [BLOCK_H, BLOCK_D]
        for t in range(0, new_len):
            slot = (length + t).to(tl.int64)

            rows_h = offs_h[:, None]
            cols_d = offs_d[None, :]
            src_k = new_keys_ptr + batch * stride_nkb + rows_h * stride_nkh + t * stride_nkt + cols_d * stride_nkd
            src_v = new_values_ptr + batch * stride_nvb + rows_h * stride_nvh + t * stride_nvt + cols_d * stride_nvd
            k = tl.load(src_k, mask=mask_hd, other=0.0)  # [BLOCK_H, BLOCK_D]
            v = tl.load(src_v, mask=mask_hd, other=0.0)  # [BLOCK_H, BLOCK_D]
            dst_k = keys_ptr + batch * stride_kb + rows_h * stride_kh + slot * stride_kc + cols_d * stride_kd
            dst_v = values_ptr + batch * stride_vb + rows_h * stride_vh + slot * stride_vc + cols_d * stride_vd
            tl.store(dst_k, k, mask=mask_hd)
            tl.store(dst_v, v, mask=mask_hd)

            if ACC_FP64:
                vf = v.to(tl.float64)
            else:
                vf = v.to(tl.float32)
            if STAT == 0:  # range: max - min
                hi = tl.max(tl.where(mask_d[None, :], vf, float("-inf")), axis=1)
                lo = tl.min(tl.where(mask_d[None, :], vf, float("inf")), axis=1)
                magnitude = hi - lo  # [BLOCK_H]
            elif STAT == 1:  # absmax
                magnitude = tl.max(tl.abs(vf), axis=1)
            elif STAT == 2:  # l2 norm
                magnitude = tl.sqrt(tl.sum(vf * vf, axis=1))
            else:  # population variance
                mean = tl.sum(vf, axis=1) / head_dim
                centred = tl.where(mask_d[None, :], vf - mean[:, None], 0.0)
                magnitude = tl.sum(centred * centred, axis=1) / head_dim

            dst_m = magnitudes_ptr + batch * stride_mb + offs_h * stride_mh + slot * stride_mc
            dst_p = positions_ptr + batch * stride_pb + offs_h * stride_ph + slot * stride_pc
            tl.store(dst_m, magnitude.to(tl.float32), mask=mask_h)
            tl.store(dst_p, tl.zeros([BLOCK_H], dtype=tl.int32) + (next_position + t), mask=mask_h)

    tl.store(lengths_ptr + batch, tl.where(fits, length + new_len, length))
    tl.store(next_positions_ptr + batch, tl.where(fits, next_position + new_len, next_position))


def cache_append_triton(
    keys: torch.Tensor,
    values: torch.Tensor,
    magnitudes: torch.Tensor,
    positions: torch.Tensor,
    lengths: torch.Tensor,
    next_positions: torch.Tensor,
    new_keys: torch.Tensor,
    new_values: torch.Tensor,
    value_stat: str,
) -> None:
    """Launch the append kernel: one program per sequence of the `[B, Hkv, C, D]` cache."""
    batch, num_heads, capacity, head_dim = keys.shape
    new_len = new_keys.shape[2]
    if batch == 0 or new_len == 0:
        return
    block_d = triton.next_power_of_2(head_dim)
    block_h = max(1, min(triton.next_power_of_2(num_heads), _MAX_TILE // block_d))
    _cache_append_kernel[(batch,)](
        keys, values, magnitudes, positions, lengths, next_positions, new_keys, new_values,
        num_heads, capacity, new_len, head_dim,
        *keys.stride(), *values.stride(), *new_keys.stride(), *new_values.stride(),
        *magnitudes.stride(), *positions.stride(),
        STAT=VALUE_STATS.index(value_stat),
        ACC_FP64=keys.dtype == torch.float64,
        BLOCK_H=block_h,
        BLOCK_D=block_d,
    )
