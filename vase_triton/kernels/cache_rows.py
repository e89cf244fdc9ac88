"""Device helpers of the kernels that score a cache layer's candidate slots, row by row.

A row is one `(b, kv_head)` of a `[B, Hkv, N, D]` buffer, flattened to `b * Hkv + kv_head`;
its candidates are slots `[0, min(lengths[b], N) - window)` (`vase_triton.policies`).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def candidate_row(row, num_heads, lengths_ptr, num_slots, window):
    """(batch, head, candidate count) of flattened row `row` (int64); the count may be <= 0."""
    batch = row // num_heads
    head = row % num_heads
    n_candidates = tl.minimum(tl.load(lengths_ptr + batch).to(tl.int32), num_slots) - window
    return batch, head, n_candidates


@triton.jit
def slot_tile(buffer_ptr, row_base, slots, dims, mask, stride_n, stride_d):
    """`[BLOCK_N, BLOCK_D]` float32 tile of one row's `slots` x `dims`, 0 where `mask` is False."""
    return tl.load(
        buffer_ptr + row_base + slots[:, None] * stride_n + dims[None, :] * stride_d, mask=mask, other=0.0
    ).to(tl.float32)
