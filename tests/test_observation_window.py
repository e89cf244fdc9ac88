"""Every eviction observes exactly the queries its policy's definition names (DESIGN.md §2).

A layer is driven through prefill and decode steps while every query is recorded by token.
At each eviction (prompt compression included) the attention the policy reads is checked
against a float64 recomputation from the recorded queries and the cache's own keys:

- window policies, `emitted`: the mean over the last `window` queries of the row (the
  first eviction's window reaches into the prompt), each query's softmax over the slots it
  saw (every slot up to its own: between evictions the cache only grows);
- window policies, `recompute`: the same queries, each softmax over the candidates only;
- `tova`: the last query; `h2o`: every query since the token entered, prompt included
  (scores move with their tokens, so it is checked on the first eviction, where all of
  them are still in the cache).

Cases cover GQA 1/2/4/8, ragged (left-padded) rows, prompts shorter and longer than the
capacity, first and later evictions, and both backends.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import pytest
import torch

from vase_triton.cache import VaSECacheLayer
from vase_triton.cache_tensors import CacheTensors
from vase_triton.config import VaSEConfig


@dataclass(frozen=True)
class Case:
    policy: str
    score_mode: str
    group: int
    kv_heads: int
    prompt_lengths: tuple[int, ...]  # real tokens per row, left-padded to the longest
    budget: int
    window: int
    backend: str

    @property
    def id(self) -> str:
        lens = "_".join(map(str, self.prompt_lengths))
        return (
            f"{self.policy}-{self.score_mode}-Hq{self.group * self.kv_heads}-Hkv{self.kv_heads}-T{lens}"
            f"-budget{self.budget}-W{self.window}-{self.backend}"
        )


CASES = [
    # prompt shorter than budget: the first window holds decode queries only
    Case("snapkv", "emitted", 1, 2, (5,), 16, 4, "torch"),
    # prompt between budget and C: the first window reaches into the prompt
    Case("vase", "emitted", 2, 2, (18, 3), 16, 4, "torch"),
    Case("rkv", "recompute", 4, 1, (18, 9), 16, 4, "torch"),
    # prompt longer than C: compressed at prefill with the last window prompt queries
    Case("snapkv", "recompute", 8, 1, (31, 23, 12), 16, 5, "torch"),
    Case("vase", "emitted", 4, 2, (29,), 16, 5, "torch"),
    Case("tova", "emitted", 2, 1, (26, 7), 16, 4, "torch"),
    Case("h2o", "emitted", 2, 2, (30, 14), 16, 4, "torch"),
    # the Triton kernels (interpreted on CPU)
    Case("vase", "emitted", 2, 1, (19, 6), 12, 3, "triton"),
    Case("snapkv", "recompute", 4, 1, (25, 11), 12, 3, "triton"),
    Case("h2o", "emitted", 1, 2, (9,), 12, 3, "triton"),
]
HEAD_DIM, SCALE, EVICTIONS = 32, 0.3, 4


def observation_truth(case, tensors, history) -> torch.Tensor:
    """Float64 attention of the policy's observation queries over `tensors`' slots, `[B, Hkv, N]`."""
    batch, kv_heads, num_slots, _ = tensors.keys.shape
    group, window = case.group, case.window
    truth = torch.zeros(batch, kv_heads, num_slots, dtype=torch.float64)
    for b in range(batch):
        n = int(tensors.lengths[b])
        for h in range(kv_heads):
            keys = tensors.keys[b, h].double().cpu()
            positions = tensors.positions[b, h].long().cpu()
            if case.policy == "tova":
                observed = range(n - 1, n)
            elif case.policy == "h2o":
                observed = range(n)
            else:
                observed = range(max(0, n - window), n)
            for slot in observed:
                queries = history[b][h * group : (h + 1) * group, int(positions[slot])].double()  # [group, D]
                seen = n - window if case.score_mode == "recompute" else slot + 1
                if seen <= 0:
                    continue
                probs = torch.softmax(queries @ keys[:seen].T * SCALE, dim=-1)  # [group, seen]
                truth[b, h, :seen] += probs.sum(dim=0)
    if case.policy == "h2o":
        return truth
    return truth / ((1 if case.policy == "tova" else window) * group)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_eviction_observes_exactly_its_queries(case: Case, device, monkeypatch) -> None:
    if case.backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    config = VaSEConfig(policy=case.policy, budget=case.budget, window=case.window, n_sink=2, score_mode=case.score_mode)
    batch, q_heads, kv_heads = len(case.prompt_lengths), case.group * case.kv_heads, case.kv_heads
    layer = VaSECacheLayer(config, batch_size=batch, num_kv_heads=kv_heads, head_dim=HEAD_DIM,
                           dtype=torch.float32, device=device)
    events = []
    policy_importance = layer.importance

    def recording_importance(tensors=None):
        tensors = layer.tensors if tensors is None else tensors
        events.append(([t.clone() for t in tensors], layer.observed_attention(tensors).clone()))
        return policy_importance(tensors)

    layer.importance = recording_importance

    prompt = max(case.prompt_lengths)
    steps = config.capacity - min(prompt, config.budget) + EVICTIONS * config.window
    gen = torch.Generator().manual_seed(zlib.crc32(case.id.encode()))
    total = prompt + steps
    query = torch.randn(batch, q_heads, total, HEAD_DIM, generator=gen)
    key = torch.randn(batch, kv_heads, total, HEAD_DIM, generator=gen)
    value = torch.randn(batch, kv_heads, total, HEAD_DIM, generator=gen)
    # Row b's real tokens are the last prompt_lengths[b] of the prompt, then the decode steps:
    # history[b][head, p] is the query of its p-th real token.
    history = [query[b, :, prompt - n :] for b, n in enumerate(case.prompt_lengths)]
    query, key, value = (t.to(device) for t in (query, key, value))
    lengths = torch.tensor(case.prompt_lengths, dtype=torch.int32, device=device)
    layer.prefill(query[:, :, :prompt], key[:, :, :prompt], value[:, :, :prompt], scale=SCALE, valid_lengths=lengths)
    for step in range(prompt, total):
        layer.decode(*(t[:, :, step : step + 1] for t in (query, key, value)), scale=SCALE)

    assert len(events) == layer.n_evictions >= EVICTIONS
    checked = events[:1] if case.policy == "h2o" else events
    for tensors, attention in checked:
        truth = observation_truth(case, CacheTensors(*tensors), history)
        got = attention.double().cpu()
        if case.score_mode == "recompute":  # defined on the candidates only
            candidates = torch.arange(got.shape[-1]).view(1, 1, -1) < (tensors[5].cpu().long() - case.window).view(-1, 1, 1)
            got = got * candidates
        torch.testing.assert_close(got, truth, rtol=2e-5, atol=2e-6)
