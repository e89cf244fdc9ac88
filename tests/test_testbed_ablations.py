"""The switches of `benchmarks/testbed_ablations.py` against hand-worked expectations."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from benchmarks.testbed_ablations import (
    PROMPT_SLOTS,
    authors_bfloat16_energy,
    authors_bfloat16_importance,
    authors_bfloat16_window_attention,
    authors_eviction_trigger,
    authors_order,
    authors_survivor_slots,
    authors_trigger,
    configured,
    range_in_cache_dtype,
    room_for_the_prompt,
    shared_projection,
    together,
)
from vase_triton import VaSEConfig, ops, reference
from vase_triton.cache import VaSECacheLayer
from vase_triton.cache_tensors import CacheTensors
from vase_triton.eval.runner import EvalSettings, Run
from vase_triton.ops.candidate_pool import pooled_candidates


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


def test_authors_order_of_a_top_k_policy_is_by_decreasing_score():
    """Temperature 0 (snapkv, rkv): the kept candidates are written by decreasing importance,
    after the sink and before the window; ours keeps them in slot order."""
    keys, values = torch.randn(1, 1, 10, 4), torch.randn(1, 1, 10, 4)
    importance = torch.tensor([[[0.0, 0.1, 0.9, 0.0, 0.5, 0.3, 0.2, 0.7, 0.0, 0.0]]])
    selection = dict(budget=6, window=2, n_sink=1, n_protect=0, temperature=0.0, seed=0)
    positions = []
    for order in (reference.survivor_slots, authors_survivor_slots):
        cache = CacheTensors.empty(1, 1, 10, 4, dtype=torch.float32, device="cpu")
        reference.append_(cache, keys, values, value_stat="range")
        with mock.patch.object(reference, "survivor_slots", order):
            reference.evict_(cache, importance, **selection)
        positions.append(cache.positions[0, 0, :6].tolist())
    assert positions == [[0, 2, 4, 7, 8, 9], [0, 2, 7, 4, 8, 9]]


def test_authors_bfloat16_window_attention_rounds_where_theirs_does(monkeypatch):
    """Against the same expression in float64 with a bfloat16 rounding after the matmul, the
    scaling, the softmax and each mean: equal up to a bfloat16 step or two (a float32 and a
    float64 accumulation can round apart); within a few percent of our float32 importance;
    queries outside `q_valid` and slots past the candidates count for nothing. Through the
    switch, the op the cache calls (PyTorch backend) returns it, and the pool's output is
    rounded to bfloat16."""
    monkeypatch.setenv("VASE_BACKEND", "torch")
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(3, 4, 5, 32, generator=generator)
    k = torch.randn(3, 2, 12, 32, generator=generator)
    candidate_lens = torch.tensor([12, 7, 0])
    q_valid = torch.tensor([[True] * 5, [False, True, True, True, True], [True] * 5])
    scale = 32**-0.5
    theirs = authors_bfloat16_window_attention(q, k, candidate_lens, scale=scale, q_valid=q_valid)

    def bf16(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(torch.bfloat16).double()

    logits = bf16(bf16(bf16(q).view(3, 2, 2, 5, 32) @ bf16(k).unsqueeze(2).transpose(-1, -2)) / 32**0.5)
    logits = logits.masked_fill(torch.arange(12) >= candidate_lens.view(3, 1, 1, 1, 1), float("-inf"))
    probabilities = bf16(torch.softmax(logits, dim=-1).nan_to_num(0.0))
    probabilities = torch.where(q_valid.view(3, 1, 1, 5, 1), probabilities, 0.0)
    expected = bf16(bf16(probabilities.mean(dim=-2)).mean(dim=2))
    assert theirs.dtype == torch.float32 and torch.equal(theirs, theirs.to(torch.bfloat16).float())
    torch.testing.assert_close(theirs.double(), expected, rtol=2**-6, atol=0.0)
    assert bool((theirs[1, :, 7:] == 0).all()) and bool((theirs[2] == 0).all())

    ours = reference.candidate_attention(q, k, candidate_lens, scale=scale, q_valid=q_valid)
    torch.testing.assert_close(theirs, ours, rtol=0.05, atol=0.0)
    assert not torch.equal(theirs, ours)
    poisoned = q.clone()
    poisoned[1, :, 0] = float("nan")  # row 1's first query is not valid
    assert torch.equal(authors_bfloat16_window_attention(poisoned, k, candidate_lens, scale=scale, q_valid=q_valid),
                       theirs)  # fmt: skip

    lengths = torch.tensor([12, 12, 12], dtype=torch.int32)
    pooled = pooled_candidates(ours, lengths, window=2, width=5)
    with authors_bfloat16_importance():
        assert torch.equal(ops.candidate_attention(q, k, candidate_lens, scale=scale, q_valid=q_valid), theirs)
        assert torch.equal(pooled_candidates(ours, lengths, window=2, width=5), pooled.to(torch.bfloat16).float())
    assert torch.equal(ops.candidate_attention(q, k, candidate_lens, scale=scale, q_valid=q_valid), ours)


def test_range_in_cache_dtype_rounds_a_bfloat16_range():
    """`1 - (-2^-8)` is `1 + 2^-8` in float32, a tie that bfloat16 (7 fraction bits) rounds to
    1; float32 values and the other statistics are unchanged."""
    magnitude = range_in_cache_dtype(reference.value_magnitude)
    values = torch.tensor([[1.0, -(2**-8), 0.5]])
    assert magnitude(values.to(torch.bfloat16), "range").tolist() == [1.0]
    assert reference.value_magnitude(values.to(torch.bfloat16), "range").tolist() == [1 + 2**-8]
    assert magnitude(values, "range").tolist() == [1 + 2**-8]
    for stat in ("absmax", "l2", "var"):
        assert torch.equal(magnitude(values.to(torch.bfloat16), stat),
                           reference.value_magnitude(values.to(torch.bfloat16), stat))  # fmt: skip


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


def test_together_turns_every_switch_and_undoes_them_all():
    settings = EvalSettings(model="testbed", max_new_tokens=8, batch_size=1, window=4, seed=0, sampling={})
    shipped = Run("rkv", 16).config(settings, 0)
    with together(authors_order, lambda: configured(n_sink=0, rkv_lambda=0.5)):
        switched = Run("rkv", 16).config(settings, 0)
        assert reference.survivor_slots is authors_survivor_slots
    assert (switched.n_sink, switched.rkv_lambda) == (0, 0.5)
    assert reference.survivor_slots is not authors_survivor_slots
    assert Run("rkv", 16).config(settings, 0) == shipped


def test_authors_bfloat16_energy_is_their_expression_rounded_to_bfloat16():
    """Against float64 of the same bfloat16-rounded keys, values and `G`: each of the five
    bfloat16 roundings (the two projections, their squared norms, the product, the
    normalisation) is within 2^-8 relative, so the whole stays within 8 x 2^-8 of it; the
    slots past a row's candidates score 0, and each row's candidates sum to 1."""
    generator = torch.Generator().manual_seed(11)
    keys, values = (torch.randn(2, 3, 40, 16, generator=generator) for _ in range(2))
    projection = torch.randn(2, 3, 16, 5, generator=generator) / 5**0.5
    lengths = torch.tensor([40, 23], dtype=torch.int32)
    energy = authors_bfloat16_energy(keys, values, projection, lengths, window=4)

    rounded = [tensor.to(torch.bfloat16).double() for tensor in (keys, values, projection)]
    expected = ((rounded[0] @ rounded[2]) ** 2).sum(-1) * ((rounded[1] @ rounded[2]) ** 2).sum(-1)
    candidates = torch.arange(40) < (lengths[:, None, None].long() - 4)
    expected = torch.where(candidates, expected, 0.0)
    expected = expected / expected.sum(-1, keepdim=True)
    assert energy.dtype == torch.float32
    assert bool((energy[1, :, 19:] == 0).all()) and bool((energy[0, :, :36] > 0).all())
    torch.testing.assert_close(energy.double(), expected, rtol=8 * 2**-8, atol=0.0)
    torch.testing.assert_close(energy.double().sum(-1), torch.ones(2, 3, dtype=torch.float64), rtol=0.0, atol=0.05)
    fp32 = reference.projected_energy(keys, values, projection, lengths, window=4)
    assert not torch.equal(energy, fp32 / fp32.sum(-1, keepdim=True))  # the switch changes the scores


@pytest.mark.parametrize("budget", [10, 12])
def test_authors_trigger_evicts_past_budget_at_each_multiple_of_window(monkeypatch, budget):
    """Decoding one token at a time from an empty layer (window 4): the authors' trigger leaves
    the lengths of `length += 1; if length > budget and length % window == 0: length = budget`
    after every step. At budget 10 that is an eviction of 2 tokens every 2 steps from step 12
    on; ours evicts 4 at capacity 14. At budget 12, a multiple of the window, both evict the
    same tokens between the same steps: ours at the start of the step after the one that
    filled the layer to capacity 16, theirs at the end of that one."""
    monkeypatch.setenv("VASE_BACKEND", "torch")  # the trigger is the same on either backend
    config = VaSEConfig(policy="snapkv", budget=budget, window=4)
    generator = torch.Generator().manual_seed(2)
    steps = [[torch.randn(1, 2, 1, 32, generator=generator) for _ in range(3)] for _ in range(30)]

    def lengths_after_each_step() -> list[int]:
        layer = VaSECacheLayer(config, batch_size=1, num_kv_heads=2, head_dim=32, dtype=torch.float32, device="cpu")
        lengths = []
        for query, key, value in steps:
            layer.decode(query, key, value, scale=32**-0.5)
            lengths.append(int(layer.lengths[0]))
        return lengths

    ours = lengths_after_each_step()
    monkeypatch.setattr(VaSECacheLayer, "decode_step", authors_eviction_trigger(VaSECacheLayer.decode_step))
    theirs = lengths_after_each_step()

    expected, length = [], 0
    for _ in steps:
        length += 1
        if length > budget and length % 4 == 0:
            length = budget
        expected.append(length)
    assert theirs == expected
    evicted_at_the_end_of_the_step = [budget if length == budget + 4 else length for length in ours]
    assert (evicted_at_the_end_of_the_step == theirs) == (budget % 4 == 0)
    if budget == 10:
        assert ours[13:16] == [14, 11, 12] and theirs[11:14] == [10, 11, 10]


@pytest.mark.parametrize("budget", [34, 50])
def test_room_for_the_prompt_moves_its_compression_to_the_first_eviction_while_decoding(monkeypatch, budget):
    """The testbed's 66-slot prompt under the authors' trigger (window 16). At 8x (budget 34,
    C = 50) it is compressed to 34 at prefill as shipped; at budget 50 it fills C = 66 and
    the first decode step evicts it to 50. Then each step adds one token and the length is
    cut back to the budget at the next multiple of 16. With room for the prompt the layer
    keeps all 66 slots until the length first passes the budget at a multiple of 16 (80,
    14 steps on), then follows the same cycle."""
    monkeypatch.setenv("VASE_BACKEND", "torch")
    config = VaSEConfig(policy="vase", budget=budget, window=16)
    generator = torch.Generator().manual_seed(4)
    prompt = [torch.randn(1, 4, PROMPT_SLOTS, 32, generator=generator)] + [
        torch.randn(1, 2, PROMPT_SLOTS, 32, generator=generator) for _ in range(2)
    ]
    steps = [[torch.randn(1, h, 1, 32, generator=generator) for h in (4, 2, 2)] for _ in range(20)]

    def lengths() -> list[int]:
        layer = VaSECacheLayer(config, batch_size=1, num_kv_heads=2, head_dim=32, dtype=torch.float32, device="cpu")
        layer.prefill(*prompt, scale=32**-0.5)
        seen = [int(layer.lengths[0])]
        for query, key, value in steps:
            layer.decode(query, key, value, scale=32**-0.5)
            seen.append(int(layer.lengths[0]))
        return seen

    with authors_trigger():
        shipped = lengths()
        with room_for_the_prompt():
            assert config.capacity == budget + 16 + 66
            roomy = lengths()
    assert config.capacity == budget + 16  # undone on exit

    def authors(length: int) -> list[int]:
        seen = [length]
        for _ in steps:
            length += 1
            if length > budget and length % 16 == 0:
                length = budget
            seen.append(length)
        return seen

    assert shipped == (authors(34) if budget == 34 else [66] + authors(50)[1:])
    assert roomy == authors(66) and roomy[:15] == list(range(66, 80)) + [budget]
