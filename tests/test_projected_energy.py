"""`vase_triton.ops.projected_energy` (`vase-dkv`'s importance) against a float64 twin.

The twin is the definition, `||k G||² · ||v G||²` per candidate slot, computed in float64
from the same inputs. Shapes are hostile (rows of 1, 63, 111 and 257 slots, ragged
lengths, lengths past `N`, empty candidate sets, head dims 64–256, ranks 1–33), every
key and value past the candidates is NaN, which must not leak, and the output starts
NaN-poisoned. The error allowed is four times what PyTorch's float32 reference reaches on
the same inputs, with a floor at float32's resolution.
"""

from __future__ import annotations

import pytest
import torch

from candidate_rows import Rows, assert_near_twin, poison_allocations, poison_past_candidates
from vase_triton import reference
from vase_triton.kernels import projected_energy as energy_kernels
from vase_triton.ops.projected_energy import projected_energy

CASES = [  # (rows, rank of the projection)
    (Rows(1, 1, 1, 64, 0, (1,), torch.float32), 20),
    (Rows(2, 2, 63, 64, 8, (63, 9), torch.bfloat16), 20),
    (Rows(3, 2, 111, 128, 16, (111, 40, 16), torch.float16), 1),
    (Rows(2, 4, 257, 128, 64, (257, 300), torch.bfloat16), 20),
    (Rows(1, 8, 257, 256, 32, (200,), torch.bfloat16), 33),
    (Rows(2, 1, 111, 64, 4, (0, 111), torch.float32), 17),
]


def make_inputs(rows: Rows, rank: int, device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    keys = poison_past_candidates((torch.randn(rows.shape, generator=gen) * 2).to(rows.dtype), rows)
    values = poison_past_candidates(torch.randn(rows.shape, generator=gen).to(rows.dtype), rows)
    projection = torch.randn(rows.batch, rows.kv_heads, rows.head_dim, rank, generator=gen) / rank**0.5
    lengths = torch.tensor(rows.lengths, dtype=torch.int32)
    return tuple(t.to(device) for t in (keys, values, projection, lengths))


@pytest.mark.parametrize("rows, rank", CASES, ids=[f"{rows.id}-R{rank}" for rows, rank in CASES])
def test_matches_float64_twin(rows: Rows, rank: int, device, monkeypatch) -> None:
    poison_allocations(monkeypatch, energy_kernels)
    keys, values, projection, lengths = make_inputs(rows, rank, device)
    got = projected_energy(keys, values, projection, lengths, window=rows.window)
    assert got.dtype == torch.float32 and got.shape == (rows.batch, rows.kv_heads, rows.slots)
    assert bool(torch.isfinite(got).all())

    truth = reference.projected_energy(
        keys.cpu().double(), values.cpu().double(), projection.cpu().double(), lengths.cpu(), window=rows.window
    )
    assert bool((got.cpu()[rows.past_candidates().expand_as(got)] == 0).all())
    torch_float32 = reference.projected_energy(
        keys.cpu(), values.cpu(), projection.cpu(), lengths.cpu(), window=rows.window
    )
    assert_near_twin(got, truth, torch_float32)


@pytest.mark.parametrize("block_d", [16, 32, 64])
def test_head_dim_slices_match_the_twin(block_d: int, device, monkeypatch) -> None:
    """The GPU launches walk D in slices (the interpreter's heuristic takes D whole): each slice
    width accumulates the same energies, NaN past the candidates still unread."""
    from vase_triton.kernels.projected_energy import EnergyConfig, projected_energy_triton

    poison_allocations(monkeypatch, energy_kernels)
    rows, rank = CASES[4]  # D = 256 in 4 to 16 slices, rank 33 padded to 64
    keys, values, projection, lengths = make_inputs(rows, rank, device)
    got = projected_energy_triton(keys, values, projection, lengths, rows.window, config=EnergyConfig(64, block_d, 4))
    truth = reference.projected_energy(
        keys.cpu().double(), values.cpu().double(), projection.cpu().double(), lengths.cpu(), window=rows.window
    )
    torch_float32 = reference.projected_energy(
        keys.cpu(), values.cpu(), projection.cpu(), lengths.cpu(), window=rows.window
    )
    assert bool((got.cpu()[rows.past_candidates().expand_as(got)] == 0).all())
    assert_near_twin(got, truth, torch_float32)


def test_dkv_importance_ranks_by_the_definition(device) -> None:
    """Through the policy: the normalised energy of each row sums to 1 and orders the slots as the twin does."""
    from vase_triton.config import VaSEConfig
    from vase_triton.policies import EvictionInputs, dkv_projection, policy_importance
    from vase_triton.cache_tensors import CacheTensors

    case = Rows(2, 2, 40, 64, 8, (40, 25), torch.float32)
    keys, values, _, lengths = make_inputs(case, 20, device, seed=3)
    scores = (case.batch, case.kv_heads, case.slots)
    cache = CacheTensors(
        torch.nan_to_num(keys), torch.nan_to_num(values), torch.zeros(scores, device=device),
        torch.zeros(scores, device=device), torch.zeros(scores, dtype=torch.int32, device=device), lengths, lengths.clone(),
    )  # fmt: skip
    config = VaSEConfig(policy="vase-dkv", budget=24, window=case.window, seed=4)
    inputs = EvictionInputs(cache=cache, attention=None, window=case.window, layer=1, eviction_index=2, seed=4)
    got = policy_importance(config, inputs).cpu().double()
    projection = dkv_projection(config, scores[:2], case.head_dim, layer=1, eviction_index=2, device=device)
    truth = reference.projected_energy(
        cache.keys.cpu().double(), cache.values.cpu().double(), projection.cpu().double(), lengths.cpu(),
        window=case.window,
    )  # fmt: skip
    truth = truth / truth.sum(dim=-1, keepdim=True)
    torch.testing.assert_close(got, truth, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(got.sum(dim=-1), torch.ones(scores[:2], dtype=torch.float64), rtol=1e-6, atol=0)


BAD = [
    ("values", lambda k, v, g, n: (k, v[..., :32], g, n), ValueError),
    ("values", lambda k, v, g, n: (k, v.double(), g, n), TypeError),
    ("projection", lambda k, v, g, n: (k, v, g.double(), n), TypeError),
    ("projection", lambda k, v, g, n: (k, v, g[:, :, :8], n), ValueError),
    ("projection", lambda k, v, g, n: (k, v, g[..., :0], n), ValueError),
    ("lengths", lambda k, v, g, n: (k, v, g, n.long()), TypeError),
    ("lengths", lambda k, v, g, n: (k, v, g, n[:1]), ValueError),
    ("keys", lambda k, v, g, n: (k[0], v, g, n), ValueError),
    ("keys", lambda k, v, g, n: (k.int(), v.int(), g, n), TypeError),
]


@pytest.mark.parametrize("name,corrupt,error", BAD, ids=[f"{n}{i}" for i, (n, _, _) in enumerate(BAD)])
def test_rejects_bad_inputs(name, corrupt, error) -> None:
    inputs = make_inputs(*CASES[1], "cpu")
    with pytest.raises(error, match=name):
        projected_energy(*corrupt(*inputs), window=8)
    with pytest.raises(ValueError, match="window"):
        projected_energy(*inputs, window=-1)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_float64_cache_gives_float32_energies(backend: str, device, monkeypatch) -> None:
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    rows = CASES[1][0]
    keys, values, projection, lengths = make_inputs(rows, 20, device)
    keys, values = keys.double(), values.double()
    got = projected_energy(keys, values, projection, lengths, window=rows.window)
    assert got.dtype == torch.float32
    truth = reference.projected_energy(keys.cpu(), values.cpu(), projection.cpu().double(), lengths.cpu(),
                                       window=rows.window)  # fmt: skip
    torch.testing.assert_close(got.cpu().double(), truth, rtol=1e-5, atol=1e-6)
