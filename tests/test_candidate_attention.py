"""`vase_triton.ops.candidate_attention` (the `recompute` importance) against a float64 twin.

The twin is the paper's formula written out: each window query's softmax over the
candidate keys `[0, candidate_lens[b])` only, averaged over the `W` queries and the query
heads of the KV group (invalid queries contribute 0, the divisor stays `W * group`). Keys
past the candidates are NaN-poisoned and must not leak, and the launcher's log-sum-exp
scratch starts NaN-poisoned. The error allowed is twice what PyTorch reaches computing the
same probabilities from inputs in the test dtype, plus a small floor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from candidate_rows import poison_allocations
from vase_triton import reference
from vase_triton.kernels import prefill_attention as prefill_kernels
from vase_triton.ops import candidate_attention

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class Case:
    batch: int
    q_heads: int
    kv_heads: int
    window: int
    slots: int
    head_dim: int
    dtype: torch.dtype
    candidate_lens: tuple[int, ...]
    valid: Optional[tuple[int, ...]]  # per row: how many of the last window queries exist

    @property
    def id(self) -> str:
        lens = "_".join(map(str, self.candidate_lens))
        valid = "all" if self.valid is None else "_".join(map(str, self.valid))
        return (
            f"B{self.batch}-Hq{self.q_heads}-Hkv{self.kv_heads}-W{self.window}-N{self.slots}-D{self.head_dim}-"
            f"{DTYPE_NAMES[self.dtype]}-cand{lens}-valid{valid}"
        )


CASES = [
    Case(1, 1, 1, 1, 1, 64, torch.float32, (1,), None),
    Case(2, 2, 1, 7, 63, 64, torch.float16, (55, 1), (7, 3)),
    Case(2, 8, 2, 16, 111, 128, torch.bfloat16, (95, 0), None),
    Case(3, 8, 8, 5, 257, 32, torch.float32, (252, 257, 100), (5, 1, 4)),
    Case(1, 8, 1, 64, 257, 128, torch.float16, (193,), None),
    Case(2, 4, 1, 3, 63, 256, torch.float32, (60, 17), (0, 3)),
    Case(2, 12, 4, 64, 111, 64, torch.bfloat16, (100, 47), (64, 20)),
    # GQA groups of 7 and 5: packed rows (7 x 9 queries, 5 x 1) that end mid-block.
    Case(2, 7, 1, 9, 257, 32, torch.float16, (257, 1), (9, 2)),
    Case(2, 10, 2, 1, 63, 64, torch.float32, (63, 0), None),
    # Windows of 63 and 111 queries (several query blocks, the last one ragged), GQA 6.
    Case(2, 6, 1, 63, 111, 64, torch.bfloat16, (100, 40), (63, 10)),
    Case(1, 4, 2, 111, 257, 64, torch.float32, (200,), (110,)),
    # Every row with the same candidates (the reference's CPU path without a mask): a row
    # with no valid query, candidates that fill every slot, a single candidate under GQA 8.
    Case(3, 8, 2, 64, 111, 64, torch.float32, (100, 100, 100), (64, 9, 0)),
    Case(2, 6, 3, 5, 63, 128, torch.bfloat16, (63, 63), None),
    Case(2, 8, 1, 1, 257, 32, torch.float16, (1, 1), (1, 1)),
]


def make_inputs(case: Case, device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(case.batch, case.q_heads, case.window, case.head_dim, generator=gen) * 1.5
    k = torch.randn(case.batch, case.kv_heads, case.slots, case.head_dim, generator=gen)
    lens = torch.tensor(case.candidate_lens, dtype=torch.int32)
    past = torch.arange(case.slots).view(1, 1, -1, 1) >= lens.view(-1, 1, 1, 1)
    k = k.masked_fill(past, float("nan"))  # never a candidate: must not leak
    q_valid = None
    if case.valid is not None:
        q_valid = torch.arange(case.window).view(1, -1) >= case.window - torch.tensor(case.valid).view(-1, 1)
    q, k = (t.to(device=device, dtype=case.dtype) for t in (q, k))
    return q, k, lens.to(device), None if q_valid is None else q_valid.to(device)


def paper_importance(q, k, lens, q_valid, scale) -> torch.Tensor:
    """Float64 loops: softmax over the candidates per (query, head), mean over window and group."""
    batch, q_heads, window, _ = q.shape
    kv_heads, slots = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    out = torch.zeros(batch, kv_heads, slots, dtype=torch.float64)
    for b in range(batch):
        n = int(lens[b])
        if n == 0:
            continue
        for head in range(q_heads):
            keys = k[b, head // group, :n].double()
            for t in range(window):
                if q_valid is not None and not bool(q_valid[b, t]):
                    continue
                probs = torch.softmax(keys @ q[b, head, t].double() * scale, dim=0)
                out[b, head // group, :n] += probs
    return out / (window * group)


def same_dtype_importance(q, k, lens, q_valid, scale) -> torch.Tensor:
    """PyTorch in the test dtype (logits in the dtype, softmax in fp32): the accuracy baseline."""
    group = q.shape[1] // k.shape[1]
    keys = torch.nan_to_num(k, nan=0.0).repeat_interleave(group, dim=1)
    logits = (q @ keys.transpose(-1, -2) * scale).float()  # [B, Hq, W, N]
    visible = torch.arange(k.shape[2], device=q.device).view(1, 1, 1, -1) < lens.view(-1, 1, 1, 1)
    probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0)
    if q_valid is not None:
        probs = probs * q_valid.view(q.shape[0], 1, -1, 1)
    summed = probs.sum(dim=2).view(k.shape[0], k.shape[1], group, -1).sum(dim=2)
    return summed / (q.shape[2] * group)


def assert_matches_the_paper(case: Case, got, q, k, lens, q_valid, scale: float) -> None:
    """`got` is float32 `[B, Hkv, N]`, within twice PyTorch's same-dtype error of the float64
    formula (plus a floor), and 0 past every row's candidates."""
    assert got.dtype == torch.float32 and got.shape == (case.batch, case.kv_heads, case.slots)
    baseline = same_dtype_importance(q, k, lens, q_valid, scale).cpu().double()  # on the inputs' device
    got, q, k, lens = got.cpu(), q.cpu(), k.cpu(), lens.cpu()
    truth = paper_importance(q, k, lens, None if q_valid is None else q_valid.cpu(), scale)
    error = (got.double() - truth).abs().max().item()
    torch_error = (baseline - truth).abs().max().item()
    assert error <= 2 * torch_error + 1e-6, (error, torch_error)
    past = torch.arange(case.slots).view(1, 1, -1) >= lens.view(-1, 1, 1)
    assert bool((got[past.expand_as(got)] == 0).all())


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matches_the_paper_formula_in_float64(case: Case, backend: str, device, monkeypatch) -> None:
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    poison_allocations(monkeypatch, prefill_kernels)
    q, k, lens, q_valid = make_inputs(case, device)
    scale = case.head_dim**-0.5
    got = candidate_attention(q, k, lens, scale=scale, q_valid=q_valid)
    assert bool(torch.isfinite(got).all())
    assert_matches_the_paper(case, got, q, k, lens, q_valid, scale)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_no_query_or_no_slot_gives_zeros(backend: str, device, monkeypatch) -> None:
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    q, k = torch.randn(2, 4, 3, 32, device=device), torch.randn(2, 2, 5, 32, device=device)
    lens = torch.tensor([3, 5], device=device)
    assert torch.equal(candidate_attention(q[:, :, :0], k, lens, scale=0.2), torch.zeros(2, 2, 5, device=device))
    assert candidate_attention(q, k[:, :, :0], lens * 0, scale=0.2).shape == (2, 2, 0)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_invalid_queries_contribute_nothing_even_when_not_finite(backend: str, device, monkeypatch) -> None:
    # A query-ring slot that holds no query may hold anything: NaN or inf there must give
    # the result of zeros there, not NaN (a product with 0 would not).
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 6, 32, generator=generator).to(device)
    k = torch.randn(2, 2, 9, 32, generator=generator).to(device)
    lens = torch.tensor([9, 4], device=device)
    q_valid = torch.tensor([[False, True, True, True, False, True], [True] * 5 + [False]], device=device)
    zeros = torch.where(q_valid.view(2, 1, 6, 1), q, 0.0)
    garbage = torch.where(q_valid.view(2, 1, 6, 1), q, torch.tensor([float("nan"), float("inf")] * 16, device=device))
    want = candidate_attention(zeros, k, lens, scale=0.2, q_valid=q_valid)
    assert bool(torch.isfinite(want).all())
    torch.testing.assert_close(candidate_attention(garbage, k, lens, scale=0.2, q_valid=q_valid), want, rtol=0, atol=0)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reference_cpu_path_for_shared_candidates(case: Case, monkeypatch) -> None:
    """On a CPU, inputs other than float64 whose rows all have the same positive number of
    candidates skip the mask (`_shared_candidate_attention`); others, and float64, keep it.
    Against the float64 formula, with NaN keys past the candidates and NaN in every absent
    query, neither of which may reach the result."""
    calls = []
    shared_path = reference._shared_candidate_attention
    monkeypatch.setattr(reference, "_shared_candidate_attention", lambda *a: calls.append(1) or shared_path(*a))
    q, k, lens, q_valid = make_inputs(case, torch.device("cpu"), seed=3)
    if q_valid is not None:
        q = q.masked_fill(~q_valid.view(case.batch, 1, case.window, 1), float("nan"))
    scale = case.head_dim**-0.5
    got = reference.candidate_attention(q, k, lens, scale=scale, q_valid=q_valid)
    shared = len(set(case.candidate_lens)) == 1 and case.candidate_lens[0] > 0
    assert bool(calls) == shared, f"shared path ran: {bool(calls)}, expected {shared}"
    calls.clear()
    reference.candidate_attention(q.double(), k.double(), lens, scale=scale, q_valid=q_valid)
    assert not calls, "float64 took the shared path"
    clean_q = q if q_valid is None else q.masked_fill(~q_valid.view(case.batch, 1, case.window, 1), 0.0)
    assert_matches_the_paper(case, got, clean_q, k, lens, q_valid, scale)


def test_reference_is_the_float64_formula() -> None:
    case = CASES[3]
    q, k, lens, q_valid = make_inputs(case, torch.device("cpu"), seed=4)
    got = reference.candidate_attention(q.double(), torch.nan_to_num(k.double()), lens, scale=0.3, q_valid=q_valid)
    truth = paper_importance(q, torch.nan_to_num(k), lens, q_valid, 0.3)
    torch.testing.assert_close(got.double(), truth, rtol=1e-6, atol=1e-9)


def test_compiles_without_graph_breaks(device) -> None:
    case = CASES[1]
    q, k, lens, q_valid = make_inputs(case, device)

    def score(q, k, lens, q_valid):
        return candidate_attention(q, k, lens, scale=0.125, q_valid=q_valid) * 2

    eager = score(q, k, lens, q_valid)
    compiled = torch.compile(score, fullgraph=True, backend="aot_eager")(q, k, lens, q_valid)
    torch.testing.assert_close(compiled, eager)


@pytest.mark.parametrize(
    "name, mutate",
    [
        ("q_valid", lambda a: {**a, "q_valid": a["q_valid"][:, :1]}),
        ("q_valid", lambda a: {**a, "q_valid": a["q_valid"].int()}),
        ("candidate_lens", lambda a: {**a, "candidate_lens": a["candidate_lens"] + 1000}),
        ("k", lambda a: {**a, "k": a["k"][:, :, :, :32]}),
        ("k", lambda a: {**a, "k": a["k"].float()}),
        ("q", lambda a: {**a, "q": a["q"][0]}),
    ],
    ids=["valid-shape", "valid-dtype", "lens-range", "k-dim", "k-dtype", "q-rank"],
)
def test_rejects_bad_arguments(name, mutate) -> None:
    q, k, lens, q_valid = make_inputs(CASES[1], torch.device("cpu"))
    args = mutate(dict(q=q, k=k, candidate_lens=lens, q_valid=q_valid))
    with pytest.raises((ValueError, TypeError), match=name):
        candidate_attention(args.pop("q"), args.pop("k"), args.pop("candidate_lens"), **args)
