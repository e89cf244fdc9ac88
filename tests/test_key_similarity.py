"""`vase_triton.ops.key_similarity.mean_key_similarity` (the input of `rkv`'s redundancy) against a float64 twin.

The twin is the definition written out pair by pair: the mean over the other candidates of
the cosine similarity of two keys, in float64. Shapes are hostile (rows of 1, 63, 111 and
257 slots, ragged lengths, lengths past `N`, rows with no or one candidate, head dims
64–256), a zero key (similarity 0 to everything) sits among the candidates, and every key
past the candidates is NaN, which must not leak; the output and the launcher's scratch start
NaN-poisoned. The error allowed is four times what the
PyTorch reference reaches in float32 on the same keys, with a floor at float32's resolution.
"""

from __future__ import annotations

import pytest
import torch

from candidate_rows import Rows, assert_near_twin, poison_allocations, poison_past_candidates
from vase_triton import reference
from vase_triton.kernels import key_similarity as similarity_kernels
from vase_triton.ops.key_similarity import mean_key_similarity

CASES = [
    Rows(1, 1, 1, 64, 0, (1,), torch.float32),
    Rows(2, 2, 63, 64, 8, (63, 9), torch.bfloat16),
    Rows(3, 2, 111, 128, 16, (111, 17, 16), torch.float16),
    Rows(2, 4, 257, 128, 64, (257, 300), torch.bfloat16),
    Rows(1, 3, 257, 256, 32, (200,), torch.bfloat16),
    Rows(2, 1, 111, 64, 4, (0, 111), torch.float32),
]


def make_keys(rows: Rows, device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    # A shared direction makes the similarities large and unequal, as in real keys.
    keys = torch.randn(rows.shape, generator=gen)
    keys += 2 * torch.randn(rows.batch, rows.kv_heads, 1, rows.head_dim, generator=gen)
    keys[:, :, min(2, rows.slots - 1)] = 0.0  # a zero key
    keys = poison_past_candidates(keys.to(rows.dtype), rows)
    return keys.to(device), torch.tensor(rows.lengths, dtype=torch.int32, device=device)


def twin(keys: torch.Tensor, lengths: torch.Tensor, window: int) -> torch.Tensor:
    """The definition, pair by pair, in float64."""
    batch, heads, slots, _ = keys.shape
    out = torch.zeros(batch, heads, slots, dtype=torch.float64)
    for b in range(batch):
        n = max(0, min(int(lengths[b]), slots) - window)
        for h in range(heads):
            k = keys[b, h, :n].double()
            norms = k.norm(dim=-1).clamp_min(1e-12)
            cosine = (k @ k.T) / (norms[:, None] * norms[None, :])
            for i in range(n):
                out[b, h, i] = (cosine[i].sum() - cosine[i, i]) / max(n - 1, 1)
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matches_float64_twin(case: Rows, device, monkeypatch) -> None:
    poison_allocations(monkeypatch, similarity_kernels)
    keys, lengths = make_keys(case, device)
    got = mean_key_similarity(keys, lengths, window=case.window)
    assert got.dtype == torch.float32 and got.shape == (case.batch, case.kv_heads, case.slots)
    assert bool(torch.isfinite(got).all())
    truth = twin(keys.cpu(), lengths.cpu(), case.window)
    assert_near_twin(got, truth, reference.mean_key_similarity(keys.cpu(), lengths.cpu(), window=case.window))
    assert bool((got.cpu()[truth == 0] == 0).all())  # non-candidates, the zero key, single candidates


def test_rkv_redundancy_is_the_softmax_of_the_similarity(device) -> None:
    from vase_triton.policies import key_redundancy

    case = CASES[3]
    keys, lengths = make_keys(case, device, seed=2)
    keys = torch.nan_to_num(keys)
    got = key_redundancy(keys, lengths, case.window).cpu().double()
    truth = twin(keys.cpu(), lengths.cpu(), case.window)
    for b, length in enumerate(case.lengths):
        n = min(length, case.slots) - case.window
        want = torch.softmax(truth[b, :, :n], dim=-1)
        torch.testing.assert_close(got[b, :, :n], want, rtol=1e-5, atol=1e-7)
        assert bool((got[b, :, n:] == 0).all())


@pytest.mark.parametrize(
    "name,corrupt,error",
    [
        ("keys", lambda k, n: (k[0], n), ValueError),
        ("keys", lambda k, n: (k > 0, n), TypeError),
        ("keys", lambda k, n: (k.int(), n), TypeError),
        ("lengths", lambda k, n: (k, n.long()), TypeError),
        ("lengths", lambda k, n: (k, n[:1]), ValueError),
    ],
)
def test_rejects_bad_inputs(name, corrupt, error) -> None:
    keys, lengths = make_keys(CASES[1], "cpu")
    with pytest.raises(error, match=name):
        mean_key_similarity(*corrupt(keys, lengths), window=8)
    with pytest.raises(ValueError, match="window"):
        mean_key_similarity(keys, lengths, window=-2)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_float64_cache_gives_float32_similarities(backend: str, device, monkeypatch) -> None:
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    keys, lengths = make_keys(CASES[1], device)
    keys = keys.double()
    got = mean_key_similarity(keys, lengths, window=CASES[1].window)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu().double(), twin(keys.cpu(), lengths.cpu(), CASES[1].window),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
