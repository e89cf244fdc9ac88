"""`vase_triton.ops.candidate_pool.pooled_candidates` (the window policies' smoothing)
against a float64 twin and the reference.

The twin is the definition written out slot by slot in float64: the sum of the `width`
attention values centred on a candidate, counting slots outside the candidates as 0,
divided by `width`. Rows are hostile (1, 63, 111 and 257 slots, ragged lengths, lengths
past `N`, rows with no or one candidate, widths 1 to 7), the attention past the
candidates is NaN, which must not leak, and the output starts NaN-poisoned. The kernel
adds in the reference's order and rounds its division, so it must also equal the float32
PyTorch reference bit for bit: the two backends then rank candidates identically.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from candidate_rows import poison_allocations
from vase_triton import reference
from vase_triton.kernels import candidate_pool as pool_kernels
from vase_triton.ops.candidate_pool import pooled_candidates


@dataclass(frozen=True)
class Case:
    kv_heads: int
    slots: int
    window: int
    lengths: tuple[int, ...]
    width: int

    @property
    def id(self) -> str:
        return f"H{self.kv_heads}N{self.slots}W{self.window}L{'_'.join(map(str, self.lengths))}w{self.width}"


CASES = [
    Case(1, 1, 0, (1,), 5),
    Case(2, 63, 8, (63, 9, 8), 5),
    Case(3, 111, 16, (111, 17, 0), 3),
    Case(2, 257, 64, (257, 300, 70), 7),
    Case(4, 257, 32, (200, 33), 1),
    Case(1, 111, 4, (111, 6), 5),
]


def make_inputs(case: Case, device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    batch = len(case.lengths)
    attention = torch.rand(batch, case.kv_heads, case.slots, generator=gen) ** 3  # skewed, as attention is
    n_candidates = (torch.tensor(case.lengths).clamp_max(case.slots) - case.window).clamp_min(0)
    past = torch.arange(case.slots).view(1, 1, -1) >= n_candidates.view(-1, 1, 1)
    attention = attention.masked_fill(past, float("nan"))
    return attention.to(device), torch.tensor(case.lengths, dtype=torch.int32, device=device)


def twin(attention: torch.Tensor, lengths: torch.Tensor, window: int, width: int) -> torch.Tensor:
    """The definition, slot by slot, in float64."""
    batch, heads, slots = attention.shape
    out = torch.zeros(batch, heads, slots, dtype=torch.float64)
    half = width // 2
    for b in range(batch):
        n = max(0, min(int(lengths[b]), slots) - window)
        for h in range(heads):
            row = attention[b, h].double()
            for i in range(n):
                out[b, h, i] = sum(float(row[j]) for j in range(max(0, i - half), min(n, i + half + 1))) / width
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matches_the_float64_twin_and_the_reference_bit_for_bit(case: Case, device, monkeypatch) -> None:
    poison_allocations(monkeypatch, pool_kernels)
    attention, lengths = make_inputs(case, device)
    got = pooled_candidates(attention, lengths, window=case.window, width=case.width)
    assert got.dtype == torch.float32 and got.shape == attention.shape
    assert bool(torch.isfinite(got).all())
    truth = twin(attention.cpu(), lengths.cpu(), case.window, case.width)
    torch.testing.assert_close(got.cpu().double(), truth, rtol=4 * torch.finfo(torch.float32).eps, atol=0)
    assert bool((got.cpu()[truth == 0] == 0).all())
    expected = reference.pooled_candidates(attention.cpu(), lengths.cpu(), window=case.window, width=case.width)
    assert torch.equal(got.cpu(), expected)


def test_strided_lengths_read_as_their_values(device) -> None:
    case = Case(2, 111, 16, (111, 40), 5)
    attention, lengths = make_inputs(case, device, seed=2)
    strided = torch.stack([lengths, torch.full_like(lengths, 111)], dim=1)[:, 0]
    assert not strided.is_contiguous()
    got = pooled_candidates(attention, strided, window=case.window, width=case.width)
    assert torch.equal(got, pooled_candidates(attention, lengths, window=case.window, width=case.width))


def test_the_window_attention_never_reaches_the_candidates(device) -> None:
    case = Case(2, 111, 16, (111, 40), 5)
    attention, lengths = make_inputs(case, device, seed=1)
    attention = torch.nan_to_num(attention, nan=1e6)  # huge attention on the window and past the length
    got = pooled_candidates(attention, lengths, window=case.window, width=case.width)
    assert float(got.max()) < 1.0


@pytest.mark.parametrize(
    "change, fragment",
    [
        (dict(attention=torch.zeros(2, 3, 8, dtype=torch.float64)), "attention: expected dtype float32"),
        (dict(attention=torch.zeros(2, 8)), "attention: expected a 3-d tensor"),
        (dict(lengths=torch.zeros(2, dtype=torch.int64)), "lengths: expected dtype int32"),
        (dict(lengths=torch.zeros(3, dtype=torch.int32)), "lengths: expected shape [B] = [2]"),
        (dict(width=4), "width: expected an odd int >= 1; got 4"),
        (dict(width=True), "width: expected an odd int >= 1; got True"),
        (dict(window=-1), "window: expected an int >= 0; got -1"),
    ],
    ids=["attention-dtype", "attention-rank", "lengths-dtype", "lengths-shape", "even-width", "bool-width", "window"],
)
def test_bad_arguments_are_named(change, fragment) -> None:
    arguments = dict(attention=torch.zeros(2, 3, 8), lengths=torch.full((2,), 8, dtype=torch.int32), window=2, width=5)
    arguments.update(change)
    with pytest.raises((TypeError, ValueError), match=fragment.replace("[", r"\[").replace("]", r"\]")):
        pooled_candidates(arguments.pop("attention"), arguments.pop("lengths"), **arguments)
