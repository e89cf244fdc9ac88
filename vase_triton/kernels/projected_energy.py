"""Projected energy of `vase-dkv`: `||k G||² · ||v G||²` of every candidate slot in one pass.

`_projected_energy_kernel` runs one program per (block of `BLOCK_N` slots, row
`(b, kv_head)`): it loads the row's projection `G` (`[D, R]`, `R` padded with zeros to
`BLOCK_R >= 16` for the tensor cores) once, then the keys and values of its slots, and
multiplies both by `G` with float32 accuracy (3xTF32 on the tensor cores). Slots outside
the candidates `[0, lengths[b] - window)` are not read and score 0. Each key and value is
read once in the cache dtype, where the PyTorch path converts the whole cache to float32
and runs two batched matmuls.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from vase_triton.autotune.lookup import tuned_params
from vase_triton.autotune.shapes import EnergyShape, dtype_name
from vase_triton.backend import interpreter_enabled
from vase_triton.kernels.cache_rows import candidate_row, slot_tile

# Float32 elements of a [BLOCK_N, D] tile per program on GPU, at 4 warps: the tiles of keys
# and values and their 3xTF32 splits stay in registers (sm_90, D <= 128: 64 slots per
# program, no spills, see benchmarks/audits; 32 slots or 8 warps spill at D = 128).
# The interpreter takes fewer, larger programs.
_TILE_ELEMENTS = 8192
_INTERPRETER_BLOCK_N = 512
_MIN_DOT = 16  # smallest tl.dot dimension


@triton.jit
def _energy(projection, buffer_ptr, row_base, slots, dims, mask, stride_n, stride_d):
    """`||x G||²` of the `[BLOCK_N]` rows `x` of one buffer's tile (3xTF32: float32 accuracy)."""
    tile = slot_tile(buffer_ptr, row_base, slots, dims, mask, stride_n, stride_d)  # [BLOCK_N, BLOCK_D]
    projected = tl.dot(tile, projection, input_precision="tf32x3")  # [BLOCK_N, BLOCK_R]
    return tl.sum(projected * projected, axis=1)


@triton.jit
def _projected_energy_kernel(
    keys_ptr, values_ptr, projection_ptr, lengths_ptr, energy_ptr,
    num_heads, num_slots, head_dim, rank, window,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gd, stride_gr,
    stride_eb, stride_eh, stride_en,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(1).to(tl.int64)
    batch, head, n_candidates = candidate_row(row, num_heads, lengths_ptr, num_slots, window)
    slots = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    ranks = tl.arange(0, BLOCK_R)
    candidate = slots < n_candidates
    in_dims = dims < head_dim

    projection = tl.load(
        projection_ptr + batch * stride_gb + head * stride_gh + dims[:, None] * stride_gd + ranks[None, :] * stride_gr,
        mask=in_dims[:, None] & (ranks[None, :] < rank), other=0.0,
    )  # [BLOCK_D, BLOCK_R]
    tile_mask = candidate[:, None] & in_dims[None, :]
    key_energy = _energy(projection, keys_ptr, batch * stride_kb + head * stride_kh, slots, dims, tile_mask,
                         stride_kn, stride_kd)  # fmt: skip
    value_energy = _energy(projection, values_ptr, batch * stride_vb + head * stride_vh, slots, dims, tile_mask,
                           stride_vn, stride_vd)  # fmt: skip
    energy = tl.where(candidate, key_energy * value_energy, 0.0)
    tl.store(energy_ptr + batch * stride_eb + head * stride_eh + slots * stride_en, energy, mask=slots < num_slots)


class EnergyConfig(NamedTuple):
    """Projected-energy launch: `BLOCK_N` slots per program, and warps."""

    block_n: int
    num_warps: int


def energy_heuristic(shape: EnergyShape) -> EnergyConfig:
    """`_TILE_ELEMENTS // D` slots (64 at most) at 4 warps on GPU; `_INTERPRETER_BLOCK_N` under the interpreter."""
    block_d = max(_MIN_DOT, triton.next_power_of_2(shape.head_dim))
    block_n = _INTERPRETER_BLOCK_N if interpreter_enabled() else max(_MIN_DOT, min(64, _TILE_ELEMENTS // block_d))
    return EnergyConfig(min(block_n, max(_MIN_DOT, triton.next_power_of_2(shape.num_slots))), 4)


def projected_energy_triton(
    keys: torch.Tensor,
    values: torch.Tensor,
    projection: torch.Tensor,
    lengths: torch.Tensor,
    window: int,
    config: Optional[EnergyConfig] = None,
) -> torch.Tensor:
    """`[B, Hkv, N]` float32 energies of validated inputs (see `vase_triton.ops.projected_energy`).

    `config`: launch parameters; None picks the tuned configuration of this shape, else the heuristic.
    """
    batch, num_heads, num_slots, head_dim = keys.shape
    rank = projection.shape[-1]
    energy = torch.empty((batch, num_heads, num_slots), dtype=torch.float32, device=keys.device)
    if energy.numel() == 0:
        return energy
    if config is None:
        shape = EnergyShape(batch, num_heads, num_slots, head_dim, rank, dtype_name(keys.dtype))
        tuned = tuned_params("projected_energy", shape, keys.device)
        config = EnergyConfig(**tuned) if tuned is not None else energy_heuristic(shape)
    block_d = max(_MIN_DOT, triton.next_power_of_2(head_dim))
    block_r = max(_MIN_DOT, triton.next_power_of_2(rank))
    grid = (triton.cdiv(num_slots, config.block_n), batch * num_heads)
    _projected_energy_kernel[grid](
        keys, values, projection, lengths, energy,
        num_heads, num_slots, head_dim, rank, window,
        *keys.stride(), *values.stride(), *projection.stride(), *energy.stride(),
        BLOCK_N=config.block_n, BLOCK_D=block_d, BLOCK_R=block_r, num_warps=config.num_warps,
    )  # fmt: skip
    return energy
