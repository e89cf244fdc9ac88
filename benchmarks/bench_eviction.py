"""Eviction benchmark: the fused Triton eviction against the PyTorch reference.

On CUDA the shape is one Qwen3-8B layer at budget 4096 (B=16, Hkv=8, C=4160 slots, D=128,
bf16) evicted by the `vase` rule: 4 sinks, `n_protect = budget // 4`, Gumbel sampling at
temperature 1 from philox, window 64. The reference is `vase_triton.reference.evict_`
(sorts, gathers, masked writes back). Without CUDA the same tests run once on a tiny shape
through the Triton interpreter as a smoke test.

Each timed call first refills `lengths` (one tiny fill kernel, in both variants) so that
every call evicts every row; the buffers' contents do not change the work done.
`bytes_moved` is the nominal traffic of one eviction in which every survivor moves: keys
and values of `budget` survivors read and written, importance and magnitudes read, the
per-token magnitudes and positions moved, scores and freed positions cleared.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from reporting import Timing, per_call, row_from_benchmark, run_timed
from vase_triton import reference
from vase_triton.cache_tensors import CacheTensors
from vase_triton.ops import evict_

ON_GPU = torch.cuda.is_available()
SUITE = "eviction"


@dataclass(frozen=True)
class EvictionShape:
    batch: int
    kv_heads: int
    budget: int
    window: int
    head_dim: int
    dtype: torch.dtype

    @property
    def slots(self) -> int:
        return self.budget + self.window

    def describe(self) -> str:
        name = str(self.dtype).replace("torch.", "")
        return f"B{self.batch} Hkv{self.kv_heads} C{self.slots} budget{self.budget} D{self.head_dim} {name}"

    def nominal_bytes(self) -> float:
        rows = self.batch * self.kv_heads
        element = torch.finfo(self.dtype).bits // 8
        kv = 2 * 2 * self.budget * self.head_dim * element  # keys + values, read + write
        inputs = 2 * 4 * self.slots  # importance and magnitudes read by the selection
        per_token = 2 * 2 * 4 * self.budget  # magnitudes and positions, read + write
        cleared = 4 * self.slots + 4 * self.window  # scores zeroed, freed positions set to -1
        return float(rows * (kv + inputs + per_token + cleared))


if ON_GPU:
    TIMING = Timing(rounds=30, warmup_rounds=5, calls=10)
    SHAPE = EvictionShape(16, 8, 4096, 64, 128, torch.bfloat16)
else:
    TIMING = Timing(rounds=1, warmup_rounds=0, calls=1)
    SHAPE = EvictionShape(2, 2, 40, 8, 64, torch.bfloat16)


def cache_layer(shape: EvictionShape, device: torch.device) -> tuple[CacheTensors, torch.Tensor]:
    """A full cache layer and an importance row, `[B, Hkv, C]`."""
    gen = torch.Generator(device=device).manual_seed(0)
    rows = (shape.batch, shape.kv_heads, shape.slots)
    keys = torch.randn(*rows, shape.head_dim, generator=gen, device=device).to(shape.dtype)
    values = torch.randn(*rows, shape.head_dim, generator=gen, device=device).to(shape.dtype)
    lengths = torch.full((shape.batch,), shape.slots, dtype=torch.int32, device=device)
    cache = CacheTensors(
        keys=keys,
        values=values,
        scores=torch.rand(rows, generator=gen, device=device),
        magnitudes=torch.rand(rows, generator=gen, device=device),
        positions=torch.arange(shape.slots, dtype=torch.int32, device=device).expand(rows).contiguous(),
        lengths=lengths,
        next_positions=lengths.clone(),
    )
    return cache, torch.rand(rows, generator=gen, device=device)


@pytest.mark.parametrize("implementation", ["triton", "reference"])
def test_eviction(benchmark, record_row, device, implementation: str):
    shape = SHAPE
    cache, importance = cache_layer(shape, device)
    op = evict_ if implementation == "triton" else reference.evict_
    kwargs = dict(
        budget=shape.budget, window=shape.window, n_sink=4, n_protect=shape.budget // 4, temperature=1.0, seed=0,
    )

    def evict():
        cache.lengths.fill_(shape.slots)
        op(cache, importance, **kwargs)

    run_timed(benchmark, TIMING, evict)
    assert bool((cache.lengths == shape.budget).all())
    assert bool((cache.positions[:, :, shape.budget:] == -1).all())
    name = "fused triton" if implementation == "triton" else "reference (sort + gather)"
    row = row_from_benchmark(benchmark, SUITE, name, shape.describe(), bytes_moved=shape.nominal_bytes())
    record_row(per_call(row, TIMING.calls))
