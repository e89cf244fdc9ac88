"""R-KV's key redundancy input: each candidate key's mean cosine similarity to the others.

With unit keys `u = k / max(||k||, 1e-12)` over the candidates `[0, lengths[b] - window)`
of a row and their sum `t`, key `i`'s summed similarity to the others is
`u_i · t - u_i · u_i`, so two passes over the keys suffice:

- `_unit_key_sum_kernel`, one program per (row `(b, kv_head)`, chunk of `CHUNK` slots),
  sums the chunk's unit keys; the launcher adds the chunks up (`[B * Hkv, D]` float32),
  in a fixed order, so the result does not depend on scheduling;
- `_mean_similarity_kernel`, one program per (block of `BLOCK_N` slots, row), divides
  `u_i · t - u_i · u_i` by `max(n_candidates - 1, 1)`; non-candidates get 0.

Keys are read twice in the cache dtype and never materialised in float32, where the
PyTorch path writes float32 unit keys (`[B, Hkv, N, D]`) and reads them three times.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from vase_triton.autotune.lookup import tuned_params
from vase_triton.autotune.shapes import SimilarityShape, dtype_name
from vase_triton.backend import interpreter_enabled
from vase_triton.kernels.cache_rows import candidate_row, slot_tile

_EPS = tl.constexpr(1e-12)  # as torch.nn.functional.normalize
# Slots of one unit-key sum program; float32 elements of a [BLOCK_N, D] key tile on GPU.
_CHUNK = 512
_TILE_ELEMENTS = 8192
_INTERPRETER_BLOCK_N = 512


@triton.jit
def _unit_keys(keys_ptr, row_base, slots, dims, candidate, in_dims, stride_kn, stride_kd):
    """`[BLOCK_N, BLOCK_D]` float32 unit keys of `slots` (zero rows outside the candidates)."""
    keys = slot_tile(keys_ptr, row_base, slots, dims, candidate[:, None] & in_dims[None, :], stride_kn, stride_kd)
    norm = tl.sqrt(tl.sum(keys * keys, axis=1))
    return keys / tl.maximum(norm, _EPS)[:, None]


@triton.jit
def _unit_key_sum_kernel(
    keys_ptr, lengths_ptr, partial_ptr,
    num_heads, num_slots, head_dim, window,
    stride_kb, stride_kh, stride_kn, stride_kd,
    CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    batch, head, n_candidates = candidate_row(row, num_heads, lengths_ptr, num_slots, window)
    row_base = batch * stride_kb + head * stride_kh
    dims = tl.arange(0, BLOCK_D)
    in_dims = dims < head_dim
    total = tl.zeros([BLOCK_D], tl.float32)
    for start in range(chunk * CHUNK, chunk * CHUNK + CHUNK, BLOCK_N):
        slots = start + tl.arange(0, BLOCK_N)
        unit = _unit_keys(keys_ptr, row_base, slots, dims, slots < n_candidates, in_dims, stride_kn, stride_kd)
        total += tl.sum(unit, axis=0)
    tl.store(partial_ptr + (row * tl.num_programs(1) + chunk) * BLOCK_D + dims, total)


@triton.jit
def _mean_similarity_kernel(
    keys_ptr, lengths_ptr, total_ptr, similarity_ptr,
    num_heads, num_slots, head_dim, window,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_sb, stride_sh, stride_sn,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(1).to(tl.int64)
    batch, head, n_candidates = candidate_row(row, num_heads, lengths_ptr, num_slots, window)
    slots = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    candidate = slots < n_candidates
    unit = _unit_keys(keys_ptr, batch * stride_kb + head * stride_kh, slots, dims, candidate, dims < head_dim,
                      stride_kn, stride_kd)  # fmt: skip
    total = tl.load(total_ptr + row * BLOCK_D + dims)  # [BLOCK_D]
    others = tl.sum(unit * total[None, :], axis=1) - tl.sum(unit * unit, axis=1)
    mean = others / tl.maximum(n_candidates - 1, 1).to(tl.float32)
    tl.store(
        similarity_ptr + batch * stride_sb + head * stride_sh + slots * stride_sn,
        tl.where(candidate, mean, 0.0), mask=slots < num_slots,
    )


class SimilarityConfig(NamedTuple):
    """Key-similarity launches: `BLOCK_N`-slot key tiles in both kernels, `CHUNK` slots per
    unit-key sum program (a multiple of `BLOCK_N`), and warps."""

    block_n: int
    chunk: int
    num_warps: int


def similarity_heuristic(shape: SimilarityShape) -> SimilarityConfig:
    """`_TILE_ELEMENTS // D` slots per tile (`_INTERPRETER_BLOCK_N` interpreted), `_CHUNK`-slot chunks, 4 warps."""
    block_d = triton.next_power_of_2(shape.head_dim)
    block_n = _INTERPRETER_BLOCK_N if interpreter_enabled() else max(16, min(_CHUNK, _TILE_ELEMENTS // block_d))
    block_n = min(block_n, triton.next_power_of_2(shape.num_slots))
    return SimilarityConfig(block_n, max(_CHUNK, block_n), 4)


def mean_key_similarity_triton(
    keys: torch.Tensor, lengths: torch.Tensor, window: int, config: Optional[SimilarityConfig] = None
) -> torch.Tensor:
    """`[B, Hkv, N]` float32 mean similarities of validated inputs.

    See `vase_triton.ops.key_similarity.mean_key_similarity`.

    `config`: launch parameters; None picks the tuned configuration of this shape, else the heuristic.
    """
    batch, num_heads, num_slots, head_dim = keys.shape
    similarity = torch.empty((batch, num_heads, num_slots), dtype=torch.float32, device=keys.device)
    rows = batch * num_heads
    if similarity.numel() == 0:
        return similarity
    lengths = lengths.contiguous()  # `candidate_row` indexes it without a stride
    if config is None:
        shape = SimilarityShape(batch, num_heads, num_slots, head_dim, dtype_name(keys.dtype))
        tuned = tuned_params("key_similarity", shape, keys.device)
        config = SimilarityConfig(**tuned) if tuned is not None else similarity_heuristic(shape)
    block_d = triton.next_power_of_2(head_dim)
    chunks = triton.cdiv(num_slots, config.chunk)
    partial = torch.empty((rows, chunks, block_d), dtype=torch.float32, device=keys.device)
    shared = (num_heads, num_slots, head_dim, window, *keys.stride())
    _unit_key_sum_kernel[(rows, chunks)](
        keys, lengths, partial, *shared, CHUNK=config.chunk, BLOCK_N=config.block_n, BLOCK_D=block_d,
        num_warps=config.num_warps,
    )  # fmt: skip
    total = partial.sum(dim=1)  # [B * Hkv, BLOCK_D], chunks added in order
    _mean_similarity_kernel[(triton.cdiv(num_slots, config.block_n), rows)](
        keys, lengths, total, similarity, *shared, *similarity.stride(), BLOCK_N=config.block_n, BLOCK_D=block_d,
        num_warps=config.num_warps,
    )  # fmt: skip
    return similarity
