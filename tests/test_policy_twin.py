"""Every policy through `patch_qwen3` decodes exactly what an independent implementation does.

`policy_twin` implements each policy of the README's Policies from its definition, in float64
loops, inside an unpatched model. On the tiny random Qwen3, greedy decoding with at least
five evictions per layer must give the same tokens, and every layer and KV head must end
up holding tokens at the same positions. Stochastic policies draw the same noise on both
sides (the reference backend's uniforms; the Triton kernels draw philox numbers, so the
Triton run covers deterministic policies).
"""

from __future__ import annotations

import pytest
import torch

import vase_triton
from policy_twin import twin_greedy
from vase_triton import VaSECache, VaSEConfig
from vase_triton.demo_model import ByteTokenizer, tiny_qwen3

PROMPT = "The first four tokens are sinks; the rest must compete."
NEW_TOKENS = 44

CASES = [
    ("vase", "emitted", "torch"),
    ("vase", "recompute", "torch"),
    ("snapkv", "emitted", "torch"),
    ("snapkv", "recompute", "torch"),
    ("rkv", "emitted", "torch"),
    ("rkv", "recompute", "torch"),
    ("vase-dkv", "emitted", "torch"),
    ("h2o", "emitted", "torch"),
    ("tova", "emitted", "torch"),
    ("streaming", "emitted", "torch"),
    ("random", "emitted", "torch"),
    ("snapkv", "recompute", "triton"),
    ("h2o", "emitted", "triton"),
]


@pytest.mark.parametrize("policy, score_mode, backend", CASES, ids=["-".join(c) for c in CASES])
def test_generate_matches_the_independent_twin(policy, score_mode, backend, monkeypatch):
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    config = VaSEConfig(policy=policy, budget=40, window=8, n_sink=4, score_mode=score_mode, seed=3,
                        temperature=0.7 if policy == "vase" else 1.0)
    model = tiny_qwen3(seed=4)
    input_ids = ByteTokenizer()(PROMPT)["input_ids"]
    assert input_ids.shape[1] > config.capacity  # compressed at prefill, then evicted every 8 steps
    want, twin = twin_greedy(model, input_ids, config, NEW_TOKENS)

    vase_triton.patch_qwen3(model, config)
    cache = VaSECache.for_model(model, config, batch_size=1)
    out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                         max_new_tokens=NEW_TOKENS, do_sample=False, cache=cache)
    got = out[0, input_ids.shape[1]:].tolist()

    assert cache.n_evictions == twin.layers[0].n_evictions >= 5
    assert got == want
    for store, layer in zip(cache.stores, twin.layers):
        length = int(store.lengths[0])
        assert length == layer.length
        for h in range(store.num_kv_heads):
            assert store.positions[0, h, :length].tolist() == layer.positions[h], (store.layer_idx, h)
