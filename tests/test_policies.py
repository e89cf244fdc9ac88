"""Policy importance (`vase_triton.policies`) against hand-computed float64 expectations."""

from __future__ import annotations

import math

import pytest
import torch

from vase_triton.config import VaSEConfig
from vase_triton.ops import evict_
from vase_triton.policies import POLICY_IMPORTANCE, dkv_projection, policy_importance

B, HKV, N, D = 2, 2, 9, 32
WINDOW = 2
LENGTHS = (9, 6)


def config(policy: str, **overrides) -> VaSEConfig:
    return VaSEConfig(policy=policy, budget=5, window=WINDOW, n_sink=1, n_protect=0 if policy == "vase" else None,
                      **overrides)


def state(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(B, HKV, N, D, generator=gen)
    values = torch.randn(B, HKV, N, D, generator=gen)
    scores = torch.rand(B, HKV, N, generator=gen)
    magnitudes = torch.rand(B, HKV, N, generator=gen)
    positions = (torch.arange(N, dtype=torch.int32) + 10).expand(B, HKV, N).contiguous()
    lengths = torch.tensor(LENGTHS, dtype=torch.int32)
    return keys, values, scores, magnitudes, positions, lengths


def importance(cfg: VaSEConfig, tensors, eviction_index: int = 0) -> torch.Tensor:
    return policy_importance(cfg, *tensors, eviction_index=eviction_index)


def expected_pool(scores: torch.Tensor, length: int, width: int) -> list[float]:
    """Zero-padded average pool of width `width` over the first `length` slots, 0 after."""
    s = [float(x) for x in scores[:length]]
    out = []
    for i in range(N):
        if i >= length:
            out.append(0.0)
            continue
        window = [s[j] for j in range(i - width // 2, i + width // 2 + 1) if 0 <= j < length]
        out.append(sum(window) / width)
    return out


@pytest.mark.parametrize("policy", ["vase", "snapkv"])
@pytest.mark.parametrize("width", [1, 3, 5])
def test_window_attention_is_pooled(policy: str, width: int) -> None:
    tensors = state()
    got = importance(config(policy, pool_kernel=width), tensors)
    assert got.dtype == torch.float32 and got.shape == (B, HKV, N)
    for b in range(B):
        for h in range(HKV):
            want = torch.tensor(expected_pool(tensors[2][b, h].double(), LENGTHS[b], width), dtype=torch.float64)
            torch.testing.assert_close(got[b, h].double(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("policy", ["h2o", "tova"])
def test_accumulated_attention_is_scores(policy: str) -> None:
    tensors = state()
    got = importance(config(policy), tensors)
    for b in range(B):
        want = tensors[2][b].clone()
        want[:, LENGTHS[b]:] = 0
        assert torch.equal(got[b], want)


@pytest.mark.parametrize("lam", [0.0, 0.1, 1.0])
def test_rkv_importance_minus_redundancy(lam: float) -> None:
    tensors = state(1)
    keys, scores = tensors[0], tensors[2]
    cfg = config("rkv", rkv_lambda=lam, pool_kernel=3)
    got = importance(cfg, tensors)
    for b in range(B):
        n_cand = LENGTHS[b] - WINDOW
        for h in range(HKV):
            pooled = expected_pool(scores[b, h].double(), LENGTHS[b], 3)[:n_cand]
            attention = [p / sum(pooled) for p in pooled]
            k = keys[b, h, :n_cand].double()
            cosine = [[float(k[i] @ k[j] / (k[i].norm() * k[j].norm())) for j in range(n_cand)] for i in range(n_cand)]
            mean_sim = [sum(cosine[i][j] for j in range(n_cand) if j != i) / (n_cand - 1) for i in range(n_cand)]
            top = max(mean_sim)
            exps = [math.exp(m - top) for m in mean_sim]
            redundancy = [e / sum(exps) for e in exps]
            want = [lam * a - (1 - lam) * r for a, r in zip(attention, redundancy)] + [0.0] * (N - n_cand)
            want = torch.tensor(want, dtype=torch.float64)
            torch.testing.assert_close(got[b, h].double(), want, rtol=1e-5, atol=1e-6)


def test_dkv_projected_energy_and_determinism() -> None:
    tensors = state(2)
    keys, values = tensors[0], tensors[1]
    cfg = config("vase-dkv", dkv_rank=4, seed=5)
    got = importance(cfg, tensors, eviction_index=3)
    g = dkv_projection(cfg, D, 3, torch.device("cpu")).double()
    assert g.shape == (D, 4)
    for b in range(B):
        n_cand = LENGTHS[b] - WINDOW
        for h in range(HKV):
            energy = []
            for i in range(n_cand):
                kg, vg = keys[b, h, i].double() @ g, values[b, h, i].double() @ g
                energy.append(float((kg**2).sum() * (vg**2).sum()))
            want = [e / sum(energy) for e in energy] + [0.0] * (N - n_cand)
            want = torch.tensor(want, dtype=torch.float64)
            torch.testing.assert_close(got[b, h].double(), want, rtol=1e-5, atol=1e-7)
    # The projection is a function of (seed, eviction_index) only.
    assert torch.equal(importance(cfg, tensors, eviction_index=3), got)
    assert not torch.equal(importance(cfg, tensors, eviction_index=4), got)
    assert not torch.equal(importance(cfg.replace(seed=6), tensors, eviction_index=3), got)
    # Its entries have variance 1 / rank.
    big = dkv_projection(cfg.replace(dkv_rank=20), 256, 0, torch.device("cpu"))
    assert abs(float(big.var()) - 1 / 20) < 0.01


def test_streaming_keeps_most_recent(device) -> None:
    tensors = state(3)
    cfg = config("streaming")
    got = importance(cfg, tensors)
    for b in range(B):
        want = torch.tensor([float(10 + i + 1) if i < LENGTHS[b] else 0.0 for i in range(N)])
        assert torch.equal(got[b, 0], want)
    keys, values, scores, magnitudes, positions, lengths = (t.clone().to(device) for t in tensors)
    evict_(keys, values, scores, magnitudes, positions, lengths, got.to(device), budget=cfg.budget,
           window=cfg.window, n_sink=cfg.n_sink, n_protect=0, temperature=0.0, seed=0, eviction_index=0,
           trigger_length=cfg.budget + 1)
    # Sequence 0 (9 tokens): sink 0 and the 4 most recent tokens survive.
    assert positions[0, :, : cfg.budget].cpu().tolist() == [[10, 15, 16, 17, 18]] * HKV
    # Sequence 1 (6 tokens): sink 0 and tokens 2..5.
    assert positions[1, :, : cfg.budget].cpu().tolist() == [[10, 12, 13, 14, 15]] * HKV


def test_random_is_uniform() -> None:
    got = importance(config("random"), state())
    for b in range(B):
        want = torch.tensor([1.0 if i < LENGTHS[b] else 0.0 for i in range(N)]).expand(HKV, N)
        assert torch.equal(got[b], want)


def test_registry_covers_every_evicting_policy() -> None:
    from vase_triton.config import POLICIES

    assert set(POLICY_IMPORTANCE) == {p for p in POLICIES if p != "full"}


def test_rejects_unknown_policies() -> None:
    tensors = state()
    with pytest.raises(ValueError, match="config.policy"):
        importance(VaSEConfig(policy="full", budget=5, window=WINDOW, n_sink=1), tensors)
    bogus = config("snapkv")
    object.__setattr__(bogus, "policy", "bogus")
    with pytest.raises(ValueError, match="bogus"):
        importance(bogus, tensors)
    with pytest.raises(TypeError, match="config"):
        policy_importance({"policy": "vase"}, *tensors, eviction_index=0)
    with pytest.raises(ValueError, match="eviction_index"):
        importance(config("vase"), tensors, eviction_index=-1)
