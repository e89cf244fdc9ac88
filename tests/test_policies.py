"""Policies as specs (`vase_triton.policies`): importance against hand-computed float64
expectations, the registry, and value protection as an orthogonal flag."""

from __future__ import annotations

import math

import pytest
import torch

from vase_triton.cache import VaSECacheLayer
from vase_triton.cache_tensors import CacheTensors
from vase_triton.config import VaSEConfig
from vase_triton.ops import evict_
from vase_triton.policies import (
    OBSERVE_WINDOW,
    POLICIES,
    EvictionInputs,
    Policy,
    dkv_projection,
    get_policy,
    pooled_candidate_attention,
    policy_importance,
    register_policy,
)

B, HKV, N, D = 2, 2, 9, 32
WINDOW = 2
LENGTHS = (9, 6)


def config(policy: str, **overrides) -> VaSEConfig:
    return VaSEConfig(policy=policy, budget=5, window=WINDOW, n_sink=1, **overrides)


def state(seed: int = 0) -> tuple[CacheTensors, torch.Tensor]:
    """Random cache buffers with `LENGTHS` valid slots, and a random observed attention."""
    gen = torch.Generator().manual_seed(seed)
    cache = CacheTensors(
        keys=torch.randn(B, HKV, N, D, generator=gen),
        values=torch.randn(B, HKV, N, D, generator=gen),
        scores=torch.rand(B, HKV, N, generator=gen),
        magnitudes=torch.rand(B, HKV, N, generator=gen),
        positions=(torch.arange(N, dtype=torch.int32) + 10).expand(B, HKV, N).contiguous(),
        lengths=torch.tensor(LENGTHS, dtype=torch.int32),
        next_positions=torch.tensor([n + 10 for n in LENGTHS], dtype=torch.int32),
    )
    return cache, torch.rand(B, HKV, N, generator=gen)


def importance(cfg: VaSEConfig, seed: int = 0, *, layer: int = 0, eviction_index: int = 0) -> torch.Tensor:
    cache, attention = state(seed)
    inputs = EvictionInputs(cache, attention, cfg.window, layer, eviction_index, cfg.seed)
    return policy_importance(cfg, inputs)


def expected_candidate_pool(attention: torch.Tensor, n_candidates: int, width: int) -> list[float]:
    """Zero-padded average pool of width `width` over the first `n_candidates` slots, 0 after."""
    a = [float(x) for x in attention[:n_candidates]]
    out = []
    for i in range(N):
        if i >= n_candidates:
            out.append(0.0)
            continue
        neighbours = [a[j] for j in range(i - width // 2, i + width // 2 + 1) if 0 <= j < n_candidates]
        out.append(sum(neighbours) / width)
    return out


@pytest.mark.parametrize("policy", ["vase", "snapkv"])
@pytest.mark.parametrize("width", [1, 3, 5])
def test_window_attention_is_pooled_over_candidates_only(policy: str, width: int) -> None:
    got = importance(config(policy, pool_kernel=width))
    _, attention = state()
    assert got.dtype == torch.float32 and got.shape == (B, HKV, N)
    for b in range(B):
        for h in range(HKV):
            want = expected_candidate_pool(attention[b, h].double(), LENGTHS[b] - WINDOW, width)
            torch.testing.assert_close(got[b, h].double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=1e-7)


def test_pool_ignores_the_window_attention() -> None:
    """Huge attention on the recent window must not leak into the last candidates."""
    cache, attention = state()
    attention[:, :, -WINDOW:] = 1e6
    cfg = config("snapkv", pool_kernel=5)
    pooled = pooled_candidate_attention(cfg, EvictionInputs(cache, attention, WINDOW, 0, 0, 0))
    assert float(pooled.max()) < 1.0


@pytest.mark.parametrize("policy", ["h2o", "tova"])
def test_observed_attention_policies_rank_by_attention(policy: str) -> None:
    got = importance(config(policy))
    _, attention = state()
    for b in range(B):
        want = attention[b].clone()
        want[:, LENGTHS[b] - WINDOW :] = 0
        assert torch.equal(got[b], want)


@pytest.mark.parametrize("lam", [0.0, 0.1, 1.0])
def test_rkv_is_mean_attention_minus_redundancy(lam: float) -> None:
    cfg = config("rkv", rkv_lambda=lam, pool_kernel=3)
    got = importance(cfg, seed=1)
    cache, attention = state(1)
    for b in range(B):
        n_cand = LENGTHS[b] - WINDOW
        for h in range(HKV):
            # The attention is the mean over the observation queries: no renormalisation.
            pooled = expected_candidate_pool(attention[b, h].double(), n_cand, 3)[:n_cand]
            k = cache.keys[b, h, :n_cand].double()
            cosine = [[float(k[i] @ k[j] / (k[i].norm() * k[j].norm())) for j in range(n_cand)] for i in range(n_cand)]
            mean_sim = [sum(cosine[i][j] for j in range(n_cand) if j != i) / (n_cand - 1) for i in range(n_cand)]
            top = max(mean_sim)
            exps = [math.exp(m - top) for m in mean_sim]
            redundancy = [e / sum(exps) for e in exps]
            want = [lam * a - (1 - lam) * r for a, r in zip(pooled, redundancy)] + [0.0] * (N - n_cand)
            torch.testing.assert_close(got[b, h].double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-6)


def test_dkv_projected_energy_with_one_projection_per_layer_row_and_head() -> None:
    cfg = config("vase-dkv", dkv_rank=4, seed=5)
    got = importance(cfg, seed=2, layer=1, eviction_index=3)
    cache, _ = state(2)
    g = dkv_projection(cfg, (B, HKV), D, layer=1, eviction_index=3, device="cpu").double()
    assert g.shape == (B, HKV, D, 4)
    for b in range(B):
        n_cand = LENGTHS[b] - WINDOW
        for h in range(HKV):
            energy = []
            for i in range(n_cand):
                kg, vg = cache.keys[b, h, i].double() @ g[b, h], cache.values[b, h, i].double() @ g[b, h]
                energy.append(float((kg**2).sum() * (vg**2).sum()))
            want = [e / sum(energy) for e in energy] + [0.0] * (N - n_cand)
            torch.testing.assert_close(got[b, h].double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-7)
    # Rows and heads draw different projections.
    assert not torch.equal(g[0, 0], g[0, 1]) and not torch.equal(g[0, 0], g[1, 0])
    # A function of (seed, layer, eviction_index): same inputs, same draw; any change, a new one.
    assert torch.equal(importance(cfg, seed=2, layer=1, eviction_index=3), got)
    assert not torch.equal(importance(cfg, seed=2, layer=1, eviction_index=4), got)
    assert not torch.equal(importance(cfg, seed=2, layer=2, eviction_index=3), got)
    assert not torch.equal(importance(cfg.replace(seed=6), seed=2, layer=1, eviction_index=3), got)
    # A tensor-parallel rank holding the model's heads from 4 on draws its own projections.
    rank = dkv_projection(cfg, (B, HKV), D, layer=1, eviction_index=3, device="cpu", kv_head_offset=4).double()
    assert not torch.equal(rank[0, 0], g[0, 0])
    # Entries have variance 1 / rank.
    big = dkv_projection(cfg.replace(dkv_rank=20), (4, 4), 256, layer=0, eviction_index=0, device="cpu")
    assert abs(float(big.var()) - 1 / 20) < 0.01


def test_streaming_keeps_sinks_and_the_most_recent(device) -> None:
    cfg = config("streaming")
    got = importance(cfg, seed=3)
    for b in range(B):
        want = torch.tensor([float(10 + i + 1) if i < LENGTHS[b] - WINDOW else 0.0 for i in range(N)])
        assert torch.equal(got[b, 0], want)
    cache, _ = state(3)
    cache = CacheTensors(*(t.clone().to(device) for t in cache))
    evict_(cache, got.to(device), budget=cfg.budget, window=cfg.window, n_sink=cfg.n_sink, n_protect=0,
           temperature=0.0, seed=0, trigger_length=cfg.budget + 1)
    # Sequence 0 (9 tokens): sink 0 and the 4 most recent tokens survive.
    assert cache.positions[0, :, : cfg.budget].cpu().tolist() == [[10, 15, 16, 17, 18]] * HKV
    # Sequence 1 (6 tokens): sink 0 and tokens 2..5.
    assert cache.positions[1, :, : cfg.budget].cpu().tolist() == [[10, 12, 13, 14, 15]] * HKV


def test_random_is_uniform_over_candidates() -> None:
    got = importance(config("random"))
    for b in range(B):
        want = torch.tensor([1.0 if i < LENGTHS[b] - WINDOW else 0.0 for i in range(N)]).expand(HKV, N)
        assert torch.equal(got[b], want)


POLICY_TABLE = {
    # name: (observation, stochastic, protects values by default, keeps scores, resets every step)
    "vase": ("window", True, True, False, False),
    "vase-dkv": ("nothing", False, False, False, False),
    "rkv": ("window", False, False, False, False),
    "snapkv": ("window", False, False, False, False),
    "h2o": ("all-queries", False, False, True, False),
    "tova": ("last-query", False, False, False, True),
    "streaming": ("nothing", False, False, False, False),
    "random": ("nothing", True, False, False, False),
    "full": ("nothing", False, False, False, False),
}


@pytest.mark.parametrize("name", list(POLICY_TABLE))
def test_registry_entries_match_design(name: str) -> None:
    policy = POLICIES[name]
    observation, stochastic, protect, keeps, resets = POLICY_TABLE[name]
    assert (policy.observation, policy.stochastic, policy.protect_values) == (observation, stochastic, protect)
    assert (policy.keeps_scores, policy.resets_scores_every_step) == (keeps, resets)
    assert policy.evicts == (name != "full")
    assert policy.stores_queries("recompute") == (observation == "window")
    assert policy.decode_emits_scores("emitted") == (observation != "nothing")
    assert policy.decode_emits_scores("recompute") == (observation in ("last-query", "all-queries"))
    assert set(POLICIES) == set(POLICY_TABLE)


def test_a_new_policy_is_one_registry_entry(device, monkeypatch) -> None:
    """A policy keeping the candidates of smallest key norm, registered and run through a layer."""
    monkeypatch.setenv("VASE_BACKEND", "torch")

    def small_keys(cfg, inputs):
        return -inputs.cache.keys.float().norm(dim=-1).mul(inputs.candidates).sub(1e4 * ~inputs.candidates)

    register_policy(Policy("test-small-keys", small_keys, "nothing", stochastic=False, protect_values=False,
                           summary="test: smallest key norms"))
    try:
        cfg = VaSEConfig(policy="test-small-keys", budget=6, window=2, n_sink=0)
        layer = VaSECacheLayer(cfg, batch_size=1, num_kv_heads=1, head_dim=32, dtype=torch.float32, device=device)
        keys = torch.arange(1, 9, dtype=torch.float32).view(1, 1, 8, 1).expand(1, 1, 8, 32).flip(2).contiguous()
        layer.prefill(torch.ones_like(keys), keys.to(device), keys.to(device), scale=0.1)
        layer.evict()
        # Candidates 0..5 have norms decreasing with the slot: the 4 last candidates survive.
        assert layer.positions[0, 0, :6].tolist() == [2, 3, 4, 5, 6, 7]
        with pytest.raises(ValueError, match="already registered"):
            register_policy(POLICIES["test-small-keys"])
    finally:
        from vase_triton.policies import _REGISTRY

        _REGISTRY.pop("test-small-keys")


def test_a_replaced_policy_serves_new_caches_and_refuses_old_ones(monkeypatch) -> None:
    """`register_policy(..., replace=True)`: a patched generate makes a cache for the new policy
    (as a fresh model patched with it would), and a cache built before is refused in one line."""
    import vase_triton
    from vase_triton.demo_model import ByteTokenizer, tiny_qwen3
    from vase_triton.integrations.hf_cache import VaSECache
    from vase_triton.policies import _REGISTRY

    monkeypatch.setenv("VASE_BACKEND", "torch")

    def key_norm(cfg, inputs):
        return inputs.cache.keys.float().norm(dim=-1) * inputs.candidates

    def attention(cfg, inputs):
        return inputs.attention * inputs.candidates

    inputs = ByteTokenizer()(["hello world, this is a long prompt here"])
    settings = dict(max_new_tokens=40, do_sample=False)
    register_policy(Policy("test-swapped", key_norm, "nothing", stochastic=False, protect_values=False, summary="a"))
    try:
        model = tiny_qwen3()
        vase_triton.patch_qwen3(model, policy="test-swapped", budget=24, window=8)
        model.generate(**inputs, **settings)
        old = VaSECache.for_model(model, model._vase_patch_state.config, batch_size=1)
        # The new one observes the window, which a cache made for the old one does not keep.
        register_policy(Policy("test-swapped", attention, "window", stochastic=False, protect_values=False,
                               summary="b"), replace=True)  # fmt: skip
        swapped = model.generate(**inputs, **settings)
        fresh = tiny_qwen3()
        vase_triton.patch_qwen3(fresh, policy="test-swapped", budget=24, window=8)
        assert torch.equal(swapped, fresh.generate(**inputs, **settings))
        with pytest.raises(RuntimeError, match="built for policy 'test-swapped' as registered before"):
            model.generate(**inputs, **settings, cache=old)
    finally:
        _REGISTRY.pop("test-swapped")


def test_registry_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="replace: expected True or False; got 'no'"):
        register_policy(POLICIES["vase"], replace="no")
    with pytest.raises(ValueError, match=r"policy: expected one of vase.*; got \['x'\]"):
        get_policy(["x"])
    for flag in ("stochastic", "protect_values"):
        with pytest.raises(ValueError, match=f"{flag}: a policy that never evicts neither samples"):
            Policy("test-never", None, "nothing", **{"stochastic": False, "protect_values": False, flag: True},
                   summary="")  # fmt: skip


def test_value_protection_is_an_orthogonal_flag() -> None:
    assert VaSEConfig(policy="snapkv", protect_values=True, budget=128, window=16).resolved_n_protect == 32
    assert VaSEConfig(policy="vase", protect_values=False, budget=128, window=16).resolved_n_protect == 0
    assert VaSEConfig(policy="vase", budget=128, window=16).resolved_n_protect == 32
    with pytest.raises(ValueError, match="protect_values=True"):
        VaSEConfig(policy="snapkv", n_protect=8)


def test_policy_errors_are_clear() -> None:
    cache, attention = state()
    with pytest.raises(ValueError, match="never does"):
        policy_importance(VaSEConfig(policy="full"), EvictionInputs(cache, attention, WINDOW, 0, 0, 0))
    with pytest.raises(ValueError, match="needs attention"):
        policy_importance(config("snapkv"), EvictionInputs(cache, None, WINDOW, 0, 0, 0))
    with pytest.raises(ValueError, match="policy: expected one of vase"):
        VaSEConfig(policy="bogus")
    with pytest.raises(ValueError, match="observation"):
        Policy("x", None, OBSERVE_WINDOW, stochastic=False, protect_values=False, summary="")


@pytest.mark.parametrize("reads", [["pool_kernel"], ("budget",), ("pool_kernel", "lambda")])
def test_a_policy_reads_only_the_settings_a_policy_may_read(reads) -> None:
    with pytest.raises(ValueError, match=r"reads: expected a tuple of names in pool_kernel, rkv_lambda, dkv_rank"):
        Policy("x", lambda config, inputs: None, "nothing", stochastic=False, protect_values=False, summary="",
               reads=reads)  # fmt: skip


@pytest.mark.parametrize(
    "field, given",
    [("stochastic", "False"), ("protect_values", 1), ("needs_noise", None), ("summary", 3)],
)
def test_policy_flags_and_summary_are_type_checked(field: str, given) -> None:
    fields = dict(name="x", importance=lambda config, inputs: None, observation="nothing", stochastic=False,
                  protect_values=False, summary="")
    fields[field] = given
    with pytest.raises(TypeError, match=rf"{field}: expected .*; got {given!r}"):
        Policy(**fields)
