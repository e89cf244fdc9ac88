"""Projected energy of `vase-dkv`: `||k G||² · ||v G||²` of every candidate slot in one pass.

`_projected_energy_kernel` runs one program per (block of `BLOCK_N` slots, row
`(b, kv_head)`): it walks the head dim in `BLOCK_D`-wide slices, multiplying each slice
of its slots' keys and values by the matching rows of the row's projection `G` (`[D, R]`,
`R` padded with zeros to `BLOCK_R >= 16` for the tensor cores) with float32 accuracy
(3xTF32 on the tensor cores) and accumulating `[BLOCK_N, BLOCK_R]` products, so its
registers do not grow with `D`. Slots outside the candidates `[0, lengths[b] - window)`
are not read and score 0. Each key and value is read once in the cache dtype, where the
PyTorch path converts the whole cache to float32 and runs two batched matmuls.
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

# GPU launch without tuning: 64 slots in 32-wide head-dim slices at 4 warps (sm_90a: 154
# registers at any D under Triton 3.9, 148 under 3.6, no spills; the whole D = 128 tile at
# once took 243 and spilled at D = 256, see benchmarks/audits). The interpreter takes
# fewer, larger programs.
_BLOCK_N = 64
_BLOCK_D = 32
_INTERPRETER_BLOCK_N = 512
_MIN_DOT = 16  # smallest tl.dot dimension


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
    slice_dims = tl.arange(0, BLOCK_D)
    ranks = tl.arange(0, BLOCK_R)
    candidate = slots < n_candidates
    key_base = batch * stride_kb + head * stride_kh
    value_base = batch * stride_vb + head * stride_vh
    projection_base = projection_ptr + batch * stride_gb + head * stride_gh

    # x G accumulated over BLOCK_D-wide slices of the head dim: one slice of the key, value
    # and projection tiles is live at a time.
    projected_keys = tl.zeros([BLOCK_N, BLOCK_R], dtype=tl.float32)
    projected_values = tl.zeros([BLOCK_N, BLOCK_R], dtype=tl.float32)
    for start_d in range(0, head_dim, BLOCK_D):
        dims = start_d + slice_dims
        in_dims = dims < head_dim
        projection = tl.load(
            projection_base + dims[:, None] * stride_gd + ranks[None, :] * stride_gr,
            mask=in_dims[:, None] & (ranks[None, :] < rank), other=0.0,
        )  # [BLOCK_D, BLOCK_R]
        tile_mask = candidate[:, None] & in_dims[None, :]
        keys = slot_tile(keys_ptr, key_base, slots, dims, tile_mask, stride_kn, stride_kd)  # [BLOCK_N, BLOCK_D]
        projected_keys = tl.dot(keys, projection, projected_keys, input_precision="tf32x3")
        values = slot_tile(values_ptr, value_base, slots, dims, tile_mask, stride_vn, stride_vd)
        projected_values = tl.dot(values, projection, projected_values, input_precision="tf32x3")
    key_energy = tl.sum(projected_keys * projected_keys, axis=1)
    value_energy = tl.sum(projected_values * projected_values, axis=1)
    energy = tl.where(candidate, key_energy * value_energy, 0.0)
    tl.store(energy_ptr + batch * stride_eb + head * stride_eh + slots * stride_en, energy, mask=slots < num_slots)


class EnergyConfig(NamedTuple):
    """Projected-energy launch: `BLOCK_N` slots per program, `BLOCK_D`-wide head-dim slices, and warps."""

    block_n: int
    block_d: int
    num_warps: int


def energy_heuristic(shape: EnergyShape) -> EnergyConfig:
    """`_BLOCK_N` slots in `_BLOCK_D`-wide slices at 4 warps on GPU; under the interpreter
    `_INTERPRETER_BLOCK_N` slots and the whole head dim in one slice."""
    slots = max(_MIN_DOT, triton.next_power_of_2(shape.num_slots))
    head_dim = max(_MIN_DOT, triton.next_power_of_2(shape.head_dim))
    if interpreter_enabled():
        return EnergyConfig(min(_INTERPRETER_BLOCK_N, slots), head_dim, 4)
    return EnergyConfig(min(_BLOCK_N, slots), min(_BLOCK_D, head_dim), 4)


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
    lengths = lengths.contiguous()  # `candidate_row` indexes it without a stride
    if config is None:
        shape = EnergyShape(batch, num_heads, num_slots, head_dim, rank, dtype_name(keys.dtype))
        tuned = tuned_params("projected_energy", shape, keys.device)
        config = EnergyConfig(**tuned) if tuned is not None else energy_heuristic(shape)
    block_r = max(_MIN_DOT, triton.next_power_of_2(rank))
    grid = (triton.cdiv(num_slots, config.block_n), batch * num_heads)
    _projected_energy_kernel[grid](
        keys, values, projection, lengths, energy,
        num_heads, num_slots, head_dim, rank, window,
        *keys.stride(), *values.stride(), *projection.stride(), *energy.stride(),
        BLOCK_N=config.block_n, BLOCK_D=config.block_d, BLOCK_R=block_r, num_warps=config.num_warps,
    )  # fmt: skip
    return energy
