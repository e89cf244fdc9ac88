"""The switches of `benchmarks/testbed_ablations.py` against hand-worked expectations."""

from __future__ import annotations

import torch

from benchmarks.testbed_ablations import authors_survivor_slots, configured, shared_projection
from vase_triton import reference
from vase_triton.cache_tensors import CacheTensors
from vase_triton.eval.runner import EvalSettings, Run


def _one_row(slots: list[int], size: int = 10) -> torch.Tensor:
    mask = torch.zeros(1, 1, size, dtype=torch.bool)
    mask[..., slots] = True
    return mask


def test_authors_order_is_sinks_protected_by_magnitude_sampled_by_key_then_window():
    magnitudes = torch.tensor([[[0.0, 0, 0, 5, 0, 0, 9, 0, 0, 0]]])
    keys = torch.tensor([[[0.0, 0, 0.1, 0, 0, 0.7, 0, -1, 0, 0]]])
    survivors = reference.Survivors(
        sinks=_one_row([0]), protected=_one_row([3, 6]), sampled=_one_row([2, 5, 7]), recent=_one_row([8, 9]),
        magnitudes=magnitudes, sampling_keys=keys,
    )  # fmt: skip
    assert authors_survivor_slots(survivors, 8).tolist() == [[[0, 6, 3, 5, 2, 7, 8, 9]]]
    assert reference.survivor_slots(survivors, 8).tolist() == [[[0, 2, 3, 5, 6, 7, 8, 9]]]


def test_authors_order_keeps_the_same_tokens_in_another_order(monkeypatch):
    generator = torch.Generator().manual_seed(3)
    tokens = [torch.randn(2, 2, 40, 8, generator=generator) for _ in range(2)]
    ours, theirs = (CacheTensors.empty(2, 2, 40, 8, dtype=torch.float32, device="cpu") for _ in range(2))
    for cache in (ours, theirs):
        reference.append_(cache, *tokens, value_stat="range")
    importance = torch.rand(2, 2, 40, generator=generator)
    selection = dict(budget=24, window=6, n_sink=2, n_protect=6, temperature=1.0, seed=5)
    reference.evict_(ours, importance, **selection)
    monkeypatch.setattr(reference, "survivor_slots", authors_survivor_slots)
    reference.evict_(theirs, importance, **selection)
    assert torch.equal(theirs.lengths, ours.lengths)
    assert torch.equal(theirs.positions.sort(dim=-1).values, ours.positions.sort(dim=-1).values)
    assert not torch.equal(theirs.positions, ours.positions)
    assert torch.equal(ours.positions[..., :24], ours.positions[..., :24].sort(dim=-1).values)  # temporal


def test_configuration_and_shared_projection_switches():
    settings = EvalSettings(model="testbed", max_new_tokens=8, batch_size=1, window=4, seed=0, sampling={})
    assert Run("vase", 16).config(settings, 0).resolved_n_protect == 4  # budget // 4
    assert Run("snapkv", 16).config(settings, 0).resolved_n_protect == 0
    with configured(protect_values=False):
        assert Run("vase", 16).config(settings, 0).resolved_n_protect == 0
    with configured(protect_values=True):
        assert Run("snapkv", 16).config(settings, 0).resolved_n_protect == 4
    shipped = Run("rkv", 16).config(settings, 0)
    with configured(n_sink=0, rkv_lambda=0.5):
        switched = Run("rkv", 16).config(settings, 0)
    assert (shipped.n_sink, shipped.rkv_lambda, switched.n_sink, switched.rkv_lambda) == (4, 0.1, 0, 0.5)
    assert Run("rkv", 16).config(settings, 0) == shipped  # the switch is undone on exit
    drawn = torch.randn(2, 3, 8, 4)
    shared = shared_projection(lambda: drawn)()
    assert torch.equal(shared, drawn[:, :1].expand(2, 3, 8, 4))
