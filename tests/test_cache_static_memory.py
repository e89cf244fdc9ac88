"""`VaSECacheLayer` memory is static: no buffer is ever reallocated, and `decode_step`
compiles into one graph that matches eager execution."""

from __future__ import annotations

import pytest
import torch

from cache_testing import BUFFERS
from vase_triton.cache import VaSECacheLayer
from vase_triton.config import VaSEConfig

def _stream(batch, q_heads, kv_heads, tokens, head_dim, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    shape_q, shape_kv = (tokens, batch, q_heads, 1, head_dim), (tokens, batch, kv_heads, 1, head_dim)
    return (
        torch.randn(shape_q, generator=gen).to(dtype=dtype, device=device),
        torch.randn(shape_kv, generator=gen).to(dtype=dtype, device=device),
        torch.randn(shape_kv, generator=gen).to(dtype=dtype, device=device),
    )


def _pointers(layer: VaSECacheLayer) -> list:
    return [buffer.data_ptr() for buffer in layer.buffers()]


@pytest.mark.parametrize("policy, score_mode", [("vase", "emitted"), ("rkv", "recompute")])
def test_thousands_of_steps_never_reallocate(device, monkeypatch, policy, score_mode):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    config = VaSEConfig(policy=policy, budget=16, window=4, n_sink=2, score_mode=score_mode)
    layer = VaSECacheLayer(
        config, batch_size=2, num_kv_heads=2, head_dim=64, dtype=torch.float16, device=device, num_query_heads=4
    )
    pointers = _pointers(layer)
    memory_bytes = layer.memory_bytes
    cache_bytes = 2 * (2 * 2 * 20 * 64 * 2) + 2 * (2 * 2 * 20 * 4) + 2 * 2 * 20 * 4 + 2 * 2 * 4
    counter_bytes = 8
    ring_bytes = 2 * 4 * 4 * 64 * 2 + 2 * 4 + 8 if score_mode == "recompute" else 0
    part_out, part_lse, logits = layer._workspace
    assert logits.shape == (2, 4, 20 if score_mode == "emitted" else 0)
    workspace_bytes = sum(t.numel() * t.element_size() for t in (part_out, part_lse, logits))
    assert memory_bytes == cache_bytes + counter_bytes + ring_bytes + workspace_bytes
    steps = 2000
    query, key, value = _stream(2, 4, 2, steps + 9, 64, torch.float16, device, seed=0)
    prompt = (t[:9].squeeze(3).permute(1, 2, 0, 3) for t in (query, key, value))
    layer.prefill(*prompt, scale=0.125)

    for step in range(9, steps + 9):
        layer.decode(query[step], key[step], value[step], scale=0.125)
        if step == 40 and device.type == "cuda":
            torch.cuda.synchronize()
            baseline = torch.cuda.memory_allocated(device)
    assert layer.n_evictions == (steps + 9 - config.budget - 1) // config.window
    assert _pointers(layer) == pointers
    if device.type == "cuda":
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated(device) == baseline
    layer.reset()
    assert _pointers(layer) == pointers
    assert layer.memory_bytes == memory_bytes
    assert layer.length_bound == 0 and bool((layer.positions == -1).all()) and bool((layer.lengths == 0).all())


COMPILE_CASES = [
    ("vase", "emitted", "torch", 24),
    ("snapkv", "recompute", "torch", 12),
    ("tova", "emitted", "torch", 12),
    ("vase-dkv", "emitted", "torch", 12),
    ("h2o", "emitted", "triton", 7),
]


@pytest.mark.parametrize(
    "policy, score_mode, backend, steps", COMPILE_CASES, ids=[f"{p}-{m}-{b}-steps{n}" for p, m, b, n in COMPILE_CASES]
)
def test_decode_step_compiles_to_one_graph_matching_eager(device, monkeypatch, policy, score_mode, backend, steps):
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    config = VaSEConfig(policy=policy, budget=12, window=4, n_sink=2, score_mode=score_mode)
    layers = [
        VaSECacheLayer(config, batch_size=2, num_kv_heads=1, head_dim=64, dtype=torch.float32, device=device)
        for _ in range(2)
    ]
    query, key, value = _stream(2, 2, 1, steps + 10, 64, torch.float32, device, seed=1)
    for layer in layers:
        layer.prefill(*(t[:10].squeeze(3).permute(1, 2, 0, 3) for t in (query, key, value)), scale=0.125)
    eager, compiled_layer = layers
    pointers = _pointers(compiled_layer)

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(compiled_layer.decode_step, fullgraph=True, backend="aot_eager")
    for step in range(10, 10 + steps):
        expected = eager.decode(query[step], key[step], value[step], scale=0.125)
        compiled_layer.prepare_decode_step()
        got = compiled(query[step], key[step], value[step], scale=0.125)
        assert torch.equal(got, expected)
        for name in BUFFERS:
            assert torch.equal(getattr(compiled_layer, name), getattr(eager, name)), name
        if score_mode == "recompute":
            assert torch.equal(compiled_layer.query_ring, eager.query_ring)
            assert torch.equal(compiled_layer.query_valid, eager.query_valid)
    assert eager.n_evictions == compiled_layer.n_evictions
    assert eager.n_evictions > 0 or steps < config.window
    counters = torch._dynamo.utils.counters
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 1
    assert _pointers(compiled_layer) == pointers


def test_model_cache_shares_one_decode_workspace_and_counts_every_buffer(device):
    from vase_triton import VaSECache

    config = VaSEConfig(budget=16, window=4, score_mode="recompute")
    cache = VaSECache(config, num_layers=3, batch_size=2, num_kv_heads=2, head_dim=64, dtype=torch.float16,
                      device=device, num_query_heads=8)
    workspaces = [store.buffers()[-3:] for store in cache.stores]
    assert all(w[0].data_ptr() == workspaces[0][0].data_ptr() for w in workspaces)
    per_layer_cache = 2 * (2 * 2 * 20 * 64 * 2) + 2 * (2 * 2 * 20 * 4) + 2 * 2 * 20 * 4 + 2 * 2 * 4
    eviction_counter = 8
    ring = 2 * 8 * 4 * 64 * 2 + 2 * 4 + 8
    workspace = sum(t.numel() * t.element_size() for t in workspaces[0])
    assert cache.memory_bytes == 3 * (per_layer_cache + eviction_counter + ring) + workspace

