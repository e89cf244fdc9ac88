"""`vase_triton.ops.projected_energy` (`vase-dkv`'s importance) against a float64 twin.

The twin is the definition, `||k G||² · ||v G||²` per candidate slot, computed in float64
from the same inputs. Shapes are hostile (rows of 1, 63, 111 and 257 slots, ragged
lengths, lengths past `N`, empty candidate sets, head dims 64–256, ranks 1–33), and every
key and value past the candidates is NaN, which must not leak. The error allowed is four
times what PyTorch's float32 reference reaches on the same inputs, with a floor at
float32's resolution.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from vase_triton import reference
from vase_triton.ops.projected_energy import projected_energy

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class Case:
    batch: int
    kv_heads: int
    slots: int
    head_dim: int
    rank: int
    window: int
    lengths: tuple[int, ...]
    dtype: torch.dtype

    @property
    def id(self) -> str:
        lengths = "_".join(map(str, self.lengths))
        return (
            f"B{self.batch}H{self.kv_heads}N{self.slots}D{self.head_dim}R{self.rank}W{self.window}"
            f"L{lengths}-{DTYPE_NAMES[self.dtype]}"
        )


CASES = [
    Case(1, 1, 1, 64, 20, 0, (1,), torch.float32),
    Case(2, 2, 63, 64, 20, 8, (63, 9), torch.bfloat16),
    Case(3, 2, 111, 128, 1, 16, (111, 40, 16), torch.float16),
    Case(2, 4, 257, 128, 20, 64, (257, 300), torch.bfloat16),
    Case(1, 8, 257, 256, 33, 32, (200,), torch.bfloat16),
    Case(2, 1, 111, 64, 17, 4, (0, 111), torch.float32),
]


def make_inputs(case: Case, device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    shape = (case.batch, case.kv_heads, case.slots, case.head_dim)
    keys = (torch.randn(shape, generator=gen) * 2).to(case.dtype)
    values = torch.randn(shape, generator=gen).to(case.dtype)
    projection = torch.randn(case.batch, case.kv_heads, case.head_dim, case.rank, generator=gen) / case.rank**0.5
    lengths = torch.tensor(case.lengths, dtype=torch.int32)
    slot = torch.arange(case.slots).view(1, 1, -1, 1)
    outside = slot >= (lengths.clamp_max(case.slots) - case.window).view(-1, 1, 1, 1)
    keys = keys.masked_fill(outside, float("nan"))  # never a candidate: must not leak
    values = values.masked_fill(outside, float("nan"))
    return tuple(t.to(device) for t in (keys, values, projection, lengths))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matches_float64_twin(case: Case, device) -> None:
    keys, values, projection, lengths = make_inputs(case, device)
    got = projected_energy(keys, values, projection, lengths, window=case.window)
    assert got.dtype == torch.float32 and got.shape == (case.batch, case.kv_heads, case.slots)
    assert bool(torch.isfinite(got).all())

    truth = reference.projected_energy(
        keys.cpu().double(), values.cpu().double(), projection.cpu().double(), lengths.cpu(), window=case.window
    )
    n_candidates = (lengths.cpu().clamp_max(case.slots) - case.window).clamp_min(0)
    outside = torch.arange(case.slots).view(1, 1, -1) >= n_candidates.view(-1, 1, 1)
    assert bool((got.cpu()[outside.expand_as(got)] == 0).all())
    torch_float32 = reference.projected_energy(
        keys.cpu(), values.cpu(), projection.cpu(), lengths.cpu(), window=case.window
    ).double()
    scale = truth.abs().amax().clamp_min(1e-30)
    allowed = max(4 * float((torch_float32 - truth).abs().max() / scale), 4 * torch.finfo(torch.float32).eps)
    error = float((got.cpu().double() - truth).abs().max() / scale)
    assert error <= allowed, (error, allowed)


def test_dkv_importance_ranks_by_the_definition(device) -> None:
    """Through the policy: the normalised energy of each row sums to 1 and orders the slots as the twin does."""
    from vase_triton.config import VaSEConfig
    from vase_triton.policies import EvictionInputs, dkv_projection, policy_importance
    from vase_triton.cache_tensors import CacheTensors

    case = Case(2, 2, 40, 64, 20, 8, (40, 25), torch.float32)
    keys, values, _, lengths = make_inputs(case, device, seed=3)
    rows = (case.batch, case.kv_heads, case.slots)
    cache = CacheTensors(
        torch.nan_to_num(keys), torch.nan_to_num(values), torch.zeros(rows, device=device),
        torch.zeros(rows, device=device), torch.zeros(rows, dtype=torch.int32, device=device), lengths, lengths.clone(),
    )  # fmt: skip
    config = VaSEConfig(policy="vase-dkv", budget=24, window=case.window, seed=4)
    inputs = EvictionInputs(cache=cache, attention=None, window=case.window, layer=1, eviction_index=2, seed=4)
    got = policy_importance(config, inputs).cpu().double()
    projection = dkv_projection(config, rows[:2], case.head_dim, layer=1, eviction_index=2, device=device)
    truth = reference.projected_energy(
        cache.keys.cpu().double(), cache.values.cpu().double(), projection.cpu().double(), lengths.cpu(),
        window=case.window,
    )  # fmt: skip
    truth = truth / truth.sum(dim=-1, keepdim=True)
    torch.testing.assert_close(got, truth, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(got.sum(dim=-1), torch.ones(rows[:2], dtype=torch.float64), rtol=1e-6, atol=0)


BAD = [
    ("values", lambda k, v, g, n: (k, v[..., :32], g, n), ValueError),
    ("values", lambda k, v, g, n: (k, v.double(), g, n), TypeError),
    ("projection", lambda k, v, g, n: (k, v, g.double(), n), TypeError),
    ("projection", lambda k, v, g, n: (k, v, g[:, :, :8], n), ValueError),
    ("projection", lambda k, v, g, n: (k, v, g[..., :0], n), ValueError),
    ("lengths", lambda k, v, g, n: (k, v, g, n.long()), TypeError),
    ("lengths", lambda k, v, g, n: (k, v, g, n[:1]), ValueError),
    ("keys", lambda k, v, g, n: (k[0], v, g, n), ValueError),
]


@pytest.mark.parametrize("name,corrupt,error", BAD, ids=[f"{n}{i}" for i, (n, _, _) in enumerate(BAD)])
def test_rejects_bad_inputs(name, corrupt, error) -> None:
    inputs = make_inputs(CASES[1], "cpu")
    with pytest.raises(error, match=name):
        projected_energy(*corrupt(*inputs), window=8)
    with pytest.raises(ValueError, match="window"):
        projected_energy(*inputs, window=-1)
