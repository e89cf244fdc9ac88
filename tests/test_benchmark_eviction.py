"""`benchmarks/bench_eviction.py`: every timed call evicts from the prefilled state, and the
survivors its byte count charges are the ones that change slot."""

from __future__ import annotations

import pytest
import torch

from benchmarks.bench_eviction import TimedEviction
from benchmarks.cache_layers import prefilled_layer
from benchmarks.shapes import TINY, CacheShape
from vase_triton.config import VaSEConfig

SHAPE = CacheShape(TINY, 2, 48, 16)
ROWS = SHAPE.batch * TINY.kv_heads


def _layer(policy: str, device: torch.device = torch.device("cpu")):
    config = VaSEConfig(policy=policy, budget=SHAPE.budget, window=SHAPE.window)
    return config, prefilled_layer(SHAPE, config, SHAPE.capacity, device)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_every_call_of_streaming_moves_all_but_the_sinks(monkeypatch, device, backend: str) -> None:
    # Streaming keeps the sinks and the newest `budget - n_sink` tokens: every kept token
    # after the sinks slides down by `window` slots, at every call (the freed slots of the
    # previous call, position -1, would otherwise rank oldest and be all that is evicted).
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    config, layer = _layer("streaming", device)
    evict = TimedEviction(layer)
    counts = [evict.moved_survivors() for _ in range(3)]
    assert counts == [ROWS * (SHAPE.budget - config.n_sink)] * 3
    kept = torch.cat([torch.arange(config.n_sink), torch.arange(SHAPE.capacity - SHAPE.budget + config.n_sink,
                                                                 SHAPE.capacity)])  # fmt: skip
    assert torch.equal(layer.positions[..., : SHAPE.budget].cpu(), kept.to(torch.int32).expand(2, TINY.kv_heads, -1))


def test_survivors_that_stay_in_place_are_not_counted(monkeypatch) -> None:
    # Ranking the earliest candidates highest keeps slots [0, budget - window): only the
    # recent window moves, `window` slots per row.
    monkeypatch.setenv("VASE_BACKEND", "torch")
    _, layer = _layer("snapkv")
    earliest_first = torch.arange(SHAPE.capacity, 0, -1, dtype=torch.float32).expand(2, TINY.kv_heads, -1).contiguous()
    evict = TimedEviction(layer, importance=earliest_first)
    assert evict.moved_survivors() == ROWS * SHAPE.window
    assert evict.moved_survivors() == ROWS * SHAPE.window


def test_observed_scores_are_restored_before_each_call(monkeypatch) -> None:
    # `h2o` ranks by the scores buffer; given scores that favour the latest candidates, each
    # call keeps the sinks and the newest candidates, again and again, although an eviction
    # moves or clears the buffer.
    monkeypatch.setenv("VASE_BACKEND", "torch")
    config, layer = _layer("h2o")
    latest_first = torch.arange(SHAPE.capacity, dtype=torch.float32).expand(2, TINY.kv_heads, -1).contiguous()
    evict = TimedEviction(layer, observed=latest_first)
    assert [evict.moved_survivors() for _ in range(2)] == [ROWS * (SHAPE.budget - config.n_sink)] * 2


@pytest.mark.parametrize("policy", ["snapkv", "rkv"])
def test_every_call_starts_from_the_whole_prefilled_layer(monkeypatch, policy: str) -> None:
    # Policies that rank by the window's attention without noise would, on a layer whose keys a
    # previous call compacted, keep the survivors already in place: the restore puts back every
    # buffer, keys and values included, so each call moves what the first did.
    monkeypatch.setenv("VASE_BACKEND", "torch")
    _, layer = _layer(policy)
    prefilled = [buffer.clone() for buffer in layer.tensors]
    evict = TimedEviction(layer)
    first = evict.moved_survivors()
    assert first > ROWS * SHAPE.window and not torch.equal(layer.keys, prefilled[0])
    evict.restore()
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(layer.tensors, prefilled))
    assert [evict.moved_survivors() for _ in range(2)] == [first] * 2
