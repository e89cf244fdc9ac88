"""The Gumbel-top-k selection samples without replacement with probability ∝ importance.

Set-up: every row has 8 candidates with fixed weights `w`, keeps 3 of them (no sinks, no
value protection, a window of 1), and rows draw independent noise (the kernel's philox
stream is indexed by row and slot; the reference's generator draws one tensor). Over
`R = 4096` rows the number of rows keeping candidate `i` is Binomial(R, p_i), where `p_i`
is the EXACT inclusion probability of sequential sampling without replacement ∝ `w`,
obtained by enumerating all 8·7·6 ordered draws.

Test: per-candidate two-sided binomial z-test (normal approximation; every `R·p_i·(1-p_i)`
here is above 100), Bonferroni-corrected over the 8 candidates at a family-wise
false-alarm rate of 1e-6, i.e. `|z_i| <= Φ⁻¹(1 - 1e-6 / 16) ≈ 5.3`. Seeds are fixed, so the
outcome is reproducible. Temperature `tau` must sample ∝ `w**(1/tau)` (same test), and
a larger `tau` must flatten the inclusion probabilities.
"""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import pytest
import torch

from vase_triton import reference
from vase_triton.cache import VaSECacheLayer
from vase_triton.cache_tensors import CacheTensors
from vase_triton.config import VaSEConfig
from vase_triton.ops import evict_
from vase_triton.seeding import stream_key

WEIGHTS = (0.5, 1.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0)
KEEP = 3
WINDOW = 1
BATCH, KV_HEADS, HEAD_DIM = 64, 64, 32  # 4096 rows
FAMILY_ALPHA = 1e-6


def exact_inclusion(weights: tuple[float, ...], keep: int) -> list[float]:
    """P(candidate i is among `keep` draws without replacement, each draw ∝ remaining weight)."""
    total = sum(weights)
    inclusion = [0.0] * len(weights)
    for draw in itertools.permutations(range(len(weights)), keep):
        prob, left = 1.0, total
        for i in draw:
            prob *= weights[i] / left
            left -= weights[i]
        for i in draw:
            inclusion[i] += prob
    return inclusion


def sample_inclusion(weights, device, *, temperature=1.0, seed=0, layer=0, eviction_index=0, backend="kernel"):
    """Rows (of R) keeping each candidate, and the `[R, 8]` kept mask."""
    n_candidates = len(weights)
    slots = n_candidates + WINDOW
    shape = (BATCH, KV_HEADS, slots)
    keys = torch.zeros(*shape, HEAD_DIM, device=device)
    values = torch.zeros_like(keys)
    scores = torch.zeros(shape, device=device)
    magnitudes = torch.zeros(shape, device=device)
    positions = torch.arange(slots, dtype=torch.int32, device=device).expand(shape).contiguous()
    lengths = torch.full((BATCH,), slots, dtype=torch.int32, device=device)
    importance = torch.tensor(list(weights) + [1.0] * WINDOW, device=device).expand(shape).contiguous()
    op = evict_ if backend == "kernel" else reference.evict_
    cache = CacheTensors(keys, values, scores, magnitudes, positions, lengths, lengths.clone())
    op(
        cache, importance, budget=KEEP + WINDOW, window=WINDOW, n_sink=0, n_protect=0, temperature=temperature,
        seed=stream_key(seed, layer), eviction_index=torch.tensor([eviction_index], device=device),
    )
    kept_slots = positions[:, :, :KEEP].reshape(-1, KEEP).long().cpu()
    kept = torch.zeros(kept_slots.shape[0], n_candidates, dtype=torch.bool)
    kept.scatter_(1, kept_slots, True)
    return kept.sum(dim=0), kept


def assert_binomial(counts: torch.Tensor, probabilities: list[float]) -> None:
    rows = BATCH * KV_HEADS
    limit = NormalDist().inv_cdf(1 - FAMILY_ALPHA / (2 * len(probabilities)))
    for i, (count, p) in enumerate(zip(counts.tolist(), probabilities)):
        z = (count - rows * p) / math.sqrt(rows * p * (1 - p))
        assert abs(z) <= limit, f"candidate {i}: {count}/{rows} kept, expected p={p:.4f}, z={z:.2f}"


@pytest.mark.parametrize("backend", ["kernel", "reference"])
@pytest.mark.parametrize("temperature", [1.0, 3.0], ids=["tau1", "tau3"])
def test_inclusion_matches_sampling_without_replacement(backend: str, temperature: float, device) -> None:
    counts, kept = sample_inclusion(WEIGHTS, device, temperature=temperature, seed=11, backend=backend)
    assert bool((kept.sum(dim=1) == KEEP).all())
    tempered = tuple(w ** (1.0 / temperature) for w in WEIGHTS)
    assert_binomial(counts, exact_inclusion(tempered, KEEP))


def test_exact_inclusion_sums_to_keep() -> None:
    probabilities = exact_inclusion(WEIGHTS, KEEP)
    assert math.isclose(sum(probabilities), KEEP, rel_tol=1e-12)
    assert exact_inclusion((1.0,) * 8, KEEP) == pytest.approx([KEEP / 8] * 8, rel=1e-12)


def test_larger_temperature_flattens(device) -> None:
    counts_cold, _ = sample_inclusion(WEIGHTS, device, temperature=0.5, seed=3)
    counts_warm, _ = sample_inclusion(WEIGHTS, device, temperature=4.0, seed=3)
    # The heaviest candidate loses inclusion, the lightest gains, and the spread shrinks.
    assert counts_warm[-1] < counts_cold[-1]
    assert counts_warm[0] > counts_cold[0]
    assert counts_warm.float().std() < counts_cold.float().std()


def test_tiny_temperature_is_top_k(device) -> None:
    counts, _ = sample_inclusion(WEIGHTS, device, temperature=1e-3, seed=5)
    rows = BATCH * KV_HEADS
    assert counts.tolist() == [0] * 5 + [rows] * 3


def test_same_seed_same_draw_other_seed_other_draw(device) -> None:
    _, first = sample_inclusion(WEIGHTS, device, seed=21, eviction_index=4)
    _, again = sample_inclusion(WEIGHTS, device, seed=21, eviction_index=4)
    _, other_seed = sample_inclusion(WEIGHTS, device, seed=22, eviction_index=4)
    _, other_eviction = sample_inclusion(WEIGHTS, device, seed=21, eviction_index=5)
    _, other_layer = sample_inclusion(WEIGHTS, device, seed=21, layer=1, eviction_index=4)
    assert torch.equal(first, again)
    # Independent draws agree on a row with probability well below 1/2: most rows differ.
    for other in (other_seed, other_eviction, other_layer):
        assert (first != other).any(dim=1).float().mean() > 0.5
    # Rows are independent streams, not copies of one draw.
    assert (first != first[:1]).any(dim=1).float().mean() > 0.5


def exact_same_set_probability(weights: tuple[float, ...], keep: int) -> float:
    """P(two independent draws of `keep` without replacement ∝ `weights` keep the same set)."""
    total = sum(weights)
    set_probability: dict[frozenset, float] = {}
    for draw in itertools.permutations(range(len(weights)), keep):
        prob, left = 1.0, total
        for i in draw:
            prob *= weights[i] / left
            left -= weights[i]
        set_probability[frozenset(draw)] = set_probability.get(frozenset(draw), 0.0) + prob
    return sum(p * p for p in set_probability.values())


@pytest.mark.parametrize("backend", ["kernel", "reference"])
def test_sequences_and_kv_heads_draw_independently(backend: str, device) -> None:
    """The noise is independent per sequence AND per KV head (README, Policies), not shared along either.

    Disjoint pairs of rows that differ only in the sequence (`(2i, h)`, `(2i+1, h)`), or only
    in the KV head (`(b, 2j)`, `(b, 2j+1)`), keep the same set as independent draws do: the
    count of such pairs is Binomial(pairs, q) with `q` the exact probability that two draws
    agree (about 0.11 here); noise shared along that dimension makes every pair agree.
    """
    _, kept = sample_inclusion(WEIGHTS, device, seed=13, eviction_index=1, backend=backend)
    kept = kept.view(BATCH, KV_HEADS, len(WEIGHTS))
    q = exact_same_set_probability(WEIGHTS, KEEP)
    limit = NormalDist().inv_cdf(1 - FAMILY_ALPHA / 4)
    for name, first, second in (
        ("sequences", kept[0::2], kept[1::2]),
        ("kv heads", kept[:, 0::2], kept[:, 1::2]),
    ):
        same = (first == second).all(dim=-1)
        pairs = same.numel()
        z = (float(same.sum()) - pairs * q) / math.sqrt(pairs * q * (1 - q))
        assert abs(z) <= limit, f"{name}: {int(same.sum())}/{pairs} pairs keep the same set, expected q={q:.4f}"


@pytest.mark.parametrize("holders", [((0, 0), (1, 0)), ((0, 0), (0, 8))], ids=["layers", "tensor-parallel-ranks"])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_layers_draw_independently(backend, holders, device, monkeypatch) -> None:
    """Two layers holding the same tokens keep overlapping sets as independent uniform draws would.

    The layers differ by index, or only by the model's first KV head they hold (two ranks of
    a tensor-parallel model: both number their local heads from 0).

    Policy `random` keeps `m` of the `n` non-sink candidates uniformly. For independent draws
    the overlap of two layers' keep sets in a row is hypergeometric: mean `m²/n`, variance
    `m²(n-m)²/(n²(n-1))`; identical draws would overlap in all `m`. Over `R` rows the summed
    overlap is tested with a z-score at the 1e-6 false-alarm level (|z| <= 5.3).
    """
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    batch, kv_heads, head_dim = 16, 8, 32
    config = VaSEConfig(policy="random", budget=28, window=4, n_sink=2, seed=3)
    gen = torch.Generator().manual_seed(0)
    tokens = config.capacity
    query = torch.randn(batch, kv_heads, tokens, head_dim, generator=gen).to(device)
    key = torch.randn(batch, kv_heads, tokens, head_dim, generator=gen).to(device)
    kept = []
    for layer_idx, kv_head_offset in holders:
        layer = VaSECacheLayer(config, batch_size=batch, num_kv_heads=kv_heads, head_dim=head_dim,
                               dtype=torch.float32, device=device, layer_idx=layer_idx, kv_head_offset=kv_head_offset)
        layer.prefill(query, key, key, scale=0.2)
        layer.evict()
        kept.append(layer.positions[:, :, config.n_sink : config.budget - config.window].reshape(batch * kv_heads, -1))
    n = tokens - config.window - config.n_sink
    m = config.budget - config.window - config.n_sink
    overlap = torch.tensor([len(set(a.tolist()) & set(b.tolist())) for a, b in zip(*kept)], dtype=torch.float64)
    rows = overlap.numel()
    mean, variance = m * m / n, m * m * (n - m) ** 2 / (n * n * (n - 1))
    z = (float(overlap.sum()) - rows * mean) / math.sqrt(rows * variance)
    assert abs(z) <= 5.3, (float(overlap.mean()), mean, z)
    assert float(overlap.mean()) < m - 1



@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_counter_on_the_device_picks_the_draw_and_advances(backend, device, monkeypatch) -> None:
    """An eviction draws at the counter it reads and advances it: evictions sharing one counter
    (as replays of a captured eviction do) draw exactly as calls at indices 0, 1, 2."""
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    counter = torch.zeros(1, dtype=torch.int64, device=device)
    shape = (BATCH, KV_HEADS, len(WEIGHTS) + WINDOW)
    importance = torch.tensor(list(WEIGHTS) + [1.0] * WINDOW, device=device).expand(shape).contiguous()
    draws = []
    for index in range(3):
        positions = torch.arange(shape[-1], dtype=torch.int32, device=device).expand(shape).contiguous()
        lengths = torch.full((BATCH,), shape[-1], dtype=torch.int32, device=device)
        zeros = torch.zeros(shape, device=device)
        cache = CacheTensors(
            torch.zeros(*shape, HEAD_DIM, device=device), torch.zeros(*shape, HEAD_DIM, device=device),
            zeros, zeros.clone(), positions, lengths, lengths.clone(),
        )  # fmt: skip
        evict_(cache, importance, budget=KEEP + WINDOW, window=WINDOW, n_sink=0, n_protect=0, temperature=1.0,
               seed=stream_key(9, 0), eviction_index=counter)
        assert int(counter.item()) == index + 1
        kept = torch.zeros(BATCH * KV_HEADS, len(WEIGHTS), dtype=torch.bool)
        kept.scatter_(1, positions[:, :, :KEEP].reshape(-1, KEEP).long().cpu(), True)
        _, at_index = sample_inclusion(WEIGHTS, device, seed=9, eviction_index=index)
        assert torch.equal(kept, at_index)
        draws.append(kept)
    assert (draws[0] != draws[1]).any(dim=1).float().mean() > 0.5


def test_op_on_the_torch_backend_draws_as_the_reference(device, monkeypatch) -> None:
    monkeypatch.setenv("VASE_BACKEND", "torch")
    _, through_op = sample_inclusion(WEIGHTS, device, seed=4, eviction_index=2, backend="kernel")
    _, direct = sample_inclusion(WEIGHTS, device, seed=4, eviction_index=2, backend="reference")
    assert torch.equal(through_op, direct)
