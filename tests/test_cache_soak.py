"""Soak: thousands of decode steps with evictions for every policy, on tiny shapes.

Checks after every step that outputs are finite and lengths stay within capacity, and at
every eviction that positions are consistent (strictly increasing per row, below the next
position, sinks are positions 0..n_sink-1). The long runs use the PyTorch reference ops;
a shorter run covers the Triton kernels (interpreted on CPU).
"""

from __future__ import annotations

import pytest
import torch

from cache_testing import check_row_order
from vase_triton.cache import VaSECacheLayer
from vase_triton.config import POLICIES, VaSEConfig

BATCH, Q_HEADS, KV_HEADS, HEAD_DIM = 2, 2, 1, 32
PROMPT = 5


def _check_positions(layer: VaSECacheLayer) -> None:
    assert bool((layer.lengths <= layer.capacity).all())
    check_row_order(layer)
    positions = layer.positions.long()
    n_sink = layer.config.n_sink
    sinks = torch.arange(n_sink, device=positions.device).expand(positions.shape[0], positions.shape[1], n_sink)
    assert torch.equal(positions[:, :, :n_sink], sinks)


def _soak(policy: str, steps: int, device: torch.device, seed: int) -> VaSECacheLayer:
    config = VaSEConfig(policy=policy, budget=16, window=8, n_sink=3, seed=seed)
    capacity = PROMPT + steps if policy == "full" else None
    layer = VaSECacheLayer(
        config, batch_size=BATCH, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, dtype=torch.float16,
        device=device, capacity=capacity,
    )
    gen = torch.Generator().manual_seed(seed)

    def tokens(count, heads):
        # Occasional large-magnitude values, as in real models.
        spread = torch.where(torch.rand(count, BATCH, heads, 1, 1, generator=gen) < 0.05, 30.0, 1.0)
        return (torch.randn(count, BATCH, heads, 1, HEAD_DIM, generator=gen) * spread).to(device=device, dtype=torch.float16)

    query, key, value = tokens(PROMPT, Q_HEADS), tokens(PROMPT, KV_HEADS), tokens(PROMPT, KV_HEADS)
    layer.prefill(*(t.squeeze(3).permute(1, 2, 0, 3) for t in (query, key, value)), scale=HEAD_DIM**-0.5)
    chunk = 500
    for start in range(0, steps, chunk):
        count = min(chunk, steps - start)
        query, key, value = tokens(count, Q_HEADS), tokens(count, KV_HEADS), tokens(count, KV_HEADS)
        for i in range(count):
            evictions = layer.n_evictions
            out = layer.decode(query[i], key[i], value[i], scale=HEAD_DIM**-0.5)
            assert bool(torch.isfinite(out).all())
            assert layer.length_bound <= layer.capacity
            assert bool((layer.lengths <= layer.length_bound).all())
            if layer.n_evictions != evictions:
                _check_positions(layer)
                assert bool(torch.isfinite(layer.scores).all()) and bool(torch.isfinite(layer.magnitudes).all())
    _check_positions(layer)
    assert bool((layer.next_positions == PROMPT + steps).all())
    return layer


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_soak_every_policy_reference_ops(device, monkeypatch, policy):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    steps = 5000
    layer = _soak(policy, steps, device, seed=list(POLICIES).index(policy))
    if policy == "full":
        assert layer.n_evictions == 0 and bool((layer.lengths == PROMPT + steps).all())
    else:
        config = layer.config
        # An eviction runs before a step that finds the layer full.
        assert layer.n_evictions == (PROMPT + steps - config.budget - 1) // config.window


@pytest.mark.parametrize("policy", ["vase", "rkv"])
def test_soak_triton_kernels(device, policy):
    steps = 120
    layer = _soak(policy, steps, device, seed=7)
    assert layer.n_evictions == (PROMPT + steps - layer.config.budget - 1) // layer.config.window
