"""Every eviction observes exactly the queries its policy's definition names (README, Policies).

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


def observation_truth(case, tensors, history, observed_queries=None) -> torch.Tensor:
    """Float64 attention of the policy's observation queries over `tensors`' slots, `[B, Hkv, N]`.

    `observed_queries`: how many of the last queries a window policy observes (`window` if None).
    """
    batch, kv_heads, num_slots, _ = tensors.keys.shape
    group, window = case.group, case.window
    observed_queries = window if observed_queries is None else observed_queries
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
                observed = range(max(0, n - observed_queries), n)
            for slot in observed:
                queries = history[b][h * group : (h + 1) * group, int(positions[slot])].double()  # [group, D]
                seen = n - window if case.score_mode == "recompute" else slot + 1
                if seen <= 0:
                    continue
                probs = torch.softmax(queries @ keys[:seen].T * SCALE, dim=-1)  # [group, seen]
                truth[b, h, :seen] += probs.sum(dim=0)
    if case.policy == "h2o":
        return truth
    return truth / ((1 if case.policy == "tova" else observed_queries) * group)


def recording_layer(case: Case, device, **config_options) -> tuple[VaSECacheLayer, list]:
    """A layer of `case`, and the list into which it records (buffers, observed attention) at each eviction."""
    config = VaSEConfig(policy=case.policy, budget=case.budget, window=case.window, n_sink=2,
                        score_mode=case.score_mode, **config_options)
    layer = VaSECacheLayer(config, batch_size=len(case.prompt_lengths), num_kv_heads=case.kv_heads,
                           head_dim=HEAD_DIM, dtype=torch.float32, device=device)
    events = []
    policy_importance = layer.importance

    def recording_importance(tensors=None, **kwargs):
        tensors = layer.tensors if tensors is None else tensors
        events.append(([t.clone() for t in tensors], layer.observed_attention(tensors, **kwargs).clone()))
        return policy_importance(tensors, **kwargs)

    layer.importance = recording_importance
    return layer, events


def random_tokens(case: Case, total: int, device) -> tuple[torch.Tensor, ...]:
    """Queries, keys, values of `total` tokens (the prompt left-padded), and each row's query history.

    Row b's real tokens are the last prompt_lengths[b] of the prompt, then the tokens after
    it: history[b][head, p] is the query of its p-th real token.
    """
    batch, prompt = len(case.prompt_lengths), max(case.prompt_lengths)
    gen = torch.Generator().manual_seed(zlib.crc32(case.id.encode()))
    query = torch.randn(batch, case.group * case.kv_heads, total, HEAD_DIM, generator=gen)
    key = torch.randn(batch, case.kv_heads, total, HEAD_DIM, generator=gen)
    value = torch.randn(batch, case.kv_heads, total, HEAD_DIM, generator=gen)
    history = [query[b, :, prompt - n :] for b, n in enumerate(case.prompt_lengths)]
    return (*(t.to(device) for t in (query, key, value)), history)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_eviction_observes_exactly_its_queries(case: Case, device, monkeypatch) -> None:
    if case.backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    layer, events = recording_layer(case, device)
    config = layer.config
    prompt = max(case.prompt_lengths)
    total = prompt + config.capacity - min(prompt, config.budget) + EVICTIONS * config.window
    query, key, value, history = random_tokens(case, total, device)
    lengths = torch.tensor(case.prompt_lengths, dtype=torch.int32, device=device)
    layer.prefill(query[:, :, :prompt], key[:, :, :prompt], value[:, :, :prompt], scale=SCALE, valid_lengths=lengths)
    for step in range(prompt, total):
        layer.decode(*(t[:, :, step : step + 1] for t in (query, key, value)), scale=SCALE)

    assert len(events) == layer.n_evictions >= EVICTIONS
    checked = events[:1] if case.policy == "h2o" else events
    for tensors, attention in checked:
        check_observation(case, tensors, attention, history)


def check_observation(case, tensors, attention, history, observed_queries=None) -> None:
    """The recorded eviction input `attention` against `observation_truth` (candidates only for `recompute`)."""
    truth = observation_truth(case, CacheTensors(*tensors), history, observed_queries)
    got = attention.double().cpu()
    if case.score_mode == "recompute":  # defined on the candidates only
        candidates = torch.arange(got.shape[-1]).view(1, 1, -1) < (tensors[5].cpu().long() - case.window).view(-1, 1, 1)
        got = got * candidates
    torch.testing.assert_close(got, truth, rtol=2e-5, atol=2e-6)


TURN_CASES = [
    Case("vase", "emitted", 2, 2, (26, 19), 16, 8, "torch"),
    Case("rkv", "emitted", 1, 2, (26, 19), 16, 8, "torch"),
    Case("vase", "recompute", 2, 2, (26, 19), 16, 8, "torch"),
    Case("snapkv", "emitted", 2, 1, (26, 19), 16, 8, "triton"),
]


@pytest.mark.parametrize("case", TURN_CASES, ids=[c.id for c in TURN_CASES])
def test_chunked_prompt_and_short_new_turn_observe_their_window(case: Case, device, monkeypatch) -> None:
    """Chunks of 8 with C = 24: a 26-token prompt would end on a 2-token chunk that compresses.

    Its chunks are cut so that the compressing one holds the last `window` = 8 queries, which
    both modes then observe exactly. After 5 decode steps a 5-token new turn overflows the
    layer: `recompute` observes the last 8 queries (3 decode, 5 of the turn) from its ring,
    `emitted` the turn's 5 only (its buffer cannot drop the decode queries it holds), never
    more. Decode evictions after it observe the whole window again.
    """
    if case.backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    window = case.window
    layer, events = recording_layer(case, device, prefill_chunk_size=8)
    prompt, decode_before, turn, decode_after = max(case.prompt_lengths), 5, 5, 2 * window + 1
    assert layer.chunk_bounds(prompt) == [(0, 8), (8, 16), (16, 18), (18, 26)]
    total = prompt + decode_before + turn + decode_after
    query, key, value, history = random_tokens(case, total, device)
    lengths = torch.tensor(case.prompt_lengths, dtype=torch.int32, device=device)
    layer.prefill(query[:, :, :prompt], key[:, :, :prompt], value[:, :, :prompt], scale=SCALE, valid_lengths=lengths)
    for step in range(prompt, prompt + decode_before):
        layer.decode(*(t[:, :, step : step + 1] for t in (query, key, value)), scale=SCALE)
    start = prompt + decode_before
    assert layer.length_bound + turn > layer.capacity and turn < window
    layer.extend(*(t[:, :, start : start + turn] for t in (query, key, value)), scale=SCALE)
    for step in range(start + turn, total):
        layer.decode(*(t[:, :, step : step + 1] for t in (query, key, value)), scale=SCALE)

    assert len(events) == layer.n_evictions == 4
    turn_observes = turn if case.score_mode == "emitted" else window
    for index, (tensors, attention) in enumerate(events):
        check_observation(case, tensors, attention, history, turn_observes if index == 1 else window)


@pytest.mark.parametrize("chunk", [8, 11, 16])
def test_chunk_bounds_never_end_a_longer_input_on_a_short_compression(chunk: int) -> None:
    """Every start length and input length up to 3C: contiguous chunks of at most `chunk`
    tokens, and a chunk shorter than `window` compresses only when it is the whole input."""
    from vase_triton.cache import chunk_bounds

    budget, window = 16, 8
    capacity = budget + window
    for length_bound in range(capacity + 1):
        for new_tokens in range(1, 3 * capacity):
            bounds = chunk_bounds(length_bound, new_tokens, capacity=capacity, window=window, chunk=chunk)
            assert [start for start, _ in bounds] == [0] + [stop for _, stop in bounds[:-1]]
            assert bounds[-1][1] == new_tokens
            assert all(0 < stop - start <= chunk for start, stop in bounds)
            length = length_bound
            for start, stop in bounds:
                compress = length + stop - start > capacity
                assert not (compress and stop - start < window and len(bounds) > 1), (length_bound, new_tokens, bounds)
                length = budget if compress else length + stop - start
