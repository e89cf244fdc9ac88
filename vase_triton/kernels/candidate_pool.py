"""Average pool of window-attention importance along each row's candidates, in one pass.

`_candidate_pool_kernel` runs one program per (block of `BLOCK_N` slots, row
`(b, kv_head)`): each output slot adds the `WIDTH` attention values centred on it, left
to right, reading only candidates (`[0, min(lengths[b], N) - window)`; the rest count as
0), and divides by `WIDTH` (correctly rounded); slots outside the candidates score 0.
That is the order and rounding of PyTorch's `avg_pool1d` with `count_include_pad`, so
the result equals the reference (`vase_triton.reference.pooled_candidates`) bit for bit,
where the PyTorch path takes five launches (mask, pool, mask again).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vase_triton.backend import interpreter_enabled
from vase_triton.kernels.cache_rows import candidate_row

# Slots per program: GPU programs stay small (many rows, short rows); the interpreter takes fewer, larger ones.
_BLOCK_N = 1024
_INTERPRETER_BLOCK_N = 4096


@triton.jit
def _candidate_pool_kernel(
    attention_ptr, lengths_ptr, pooled_ptr,
    num_heads, num_slots, window,
    stride_ab, stride_ah, stride_an,
    stride_pb, stride_ph, stride_pn,
    WIDTH: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(1).to(tl.int64)
    batch, head, n_candidates = candidate_row(row, num_heads, lengths_ptr, num_slots, window)
    slots = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_base = attention_ptr + batch * stride_ab + head * stride_ah
    total = tl.zeros([BLOCK_N], tl.float32)
    for offset in tl.static_range(WIDTH):
        neighbour = slots + (offset - WIDTH // 2)
        seen = (neighbour >= 0) & (neighbour < n_candidates)
        total += tl.load(row_base + neighbour * stride_an, mask=seen, other=0.0)
    pooled = tl.where(slots < n_candidates, tl.math.div_rn(total, tl.full([BLOCK_N], WIDTH, tl.float32)), 0.0)
    tl.store(pooled_ptr + batch * stride_pb + head * stride_ph + slots * stride_pn, pooled, mask=slots < num_slots)


def pooled_candidates_triton(attention: torch.Tensor, lengths: torch.Tensor, window: int, width: int) -> torch.Tensor:
    """`[B, Hkv, N]` float32 pooled importance of validated inputs.

    See `vase_triton.ops.candidate_pool.pooled_candidates`.
    """
    batch, num_heads, num_slots = attention.shape
    pooled = torch.empty((batch, num_heads, num_slots), dtype=torch.float32, device=attention.device)
    if pooled.numel() == 0:
        return pooled
    lengths = lengths.contiguous()  # `candidate_row` indexes it without a stride
    block_n = _INTERPRETER_BLOCK_N if interpreter_enabled() else _BLOCK_N
    block_n = min(block_n, triton.next_power_of_2(num_slots))
    grid = (triton.cdiv(num_slots, block_n), batch * num_heads)
    _candidate_pool_kernel[grid](
        attention, lengths, pooled,
        num_heads, num_slots, window,
        *attention.stride(), *pooled.stride(),
        WIDTH=width, BLOCK_N=block_n, num_warps=4,
    )  # fmt: skip
    return pooled
