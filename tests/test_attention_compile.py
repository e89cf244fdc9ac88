"""The public attention ops trace into one `torch.compile` graph and match eager."""

from __future__ import annotations

import pytest
import torch

from vase_triton.ops import decode_attention, prefill_attention


def attention_step(q, k, v, kv_lens, q_step, k_cache, v_cache, cache_lens, scores):
    out, lse, window_scores = prefill_attention(q, k, v, kv_lens=kv_lens, score_window=4)
    step = decode_attention(q_step, k_cache, v_cache, cache_lens, scores=scores)
    return out * 2.0, lse, window_scores.sum(dim=-1), step + 1.0


def make_inputs(device: torch.device):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 7, 64, generator=gen)
    k = torch.randn(2, 2, 63, 64, generator=gen)
    v = torch.randn(2, 2, 63, 64, generator=gen)
    q_step = torch.randn(2, 4, 1, 64, generator=gen)
    k_cache = torch.randn(2, 2, 111, 64, generator=gen)
    v_cache = torch.randn(2, 2, 111, 64, generator=gen)
    tensors = [t.to(device) for t in (q, k, v, q_step, k_cache, v_cache)]
    kv_lens = torch.tensor([63, 40], dtype=torch.int32, device=device)
    cache_lens = torch.tensor([111, 1], dtype=torch.int32, device=device)
    scores = torch.rand(2, 2, 111, generator=gen).to(device)
    q, k, v, q_step, k_cache, v_cache = tensors
    return q, k, v, kv_lens, q_step, k_cache, v_cache, cache_lens, scores


def test_one_graph_without_breaks(device):
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(attention_step)(*make_inputs(device))
    assert explanation.graph_count == 1
    assert explanation.graph_break_count == 0


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_fullgraph_compile_matches_eager(backend: str, device):
    torch._dynamo.reset()
    inputs = make_inputs(device)
    eager_scores = inputs[-1].clone()
    compiled_scores = inputs[-1].clone()
    expected = attention_step(*inputs[:-1], eager_scores)
    compiled = torch.compile(attention_step, backend=backend, fullgraph=True)
    actual = compiled(*inputs[:-1], compiled_scores)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled_scores, eager_scores, rtol=1e-5, atol=1e-6)
    assert not torch.equal(compiled_scores, inputs[-1])
