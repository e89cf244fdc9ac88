"""Prefill attention kernels against the float64 reference.

Every case runs the launcher on NaN-poisoned output buffers and compares out, lse
and window scores with `reference.prefill_attention` evaluated in float64. The
allowed error is twice what PyTorch itself reaches computing the same attention in
the input dtype, plus a small floor (the kernels' exponentials and divisions on a GPU
are not PyTorch's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

import vase_triton.ops
from vase_triton import reference
from vase_triton.kernels.prefill_attention import prefill_attention_triton

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class Case:
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    k_len: int
    head_dim: int
    causal: bool
    dtype: torch.dtype
    kv_lens: Optional[tuple[int, ...]]
    window: int

    @property
    def id(self) -> str:
        lens = "full" if self.kv_lens is None else "lens" + "_".join(map(str, self.kv_lens))
        return (
            f"B{self.batch}-Hq{self.q_heads}-Hkv{self.kv_heads}-Tq{self.q_len}-Tk{self.k_len}-D{self.head_dim}-"
            f"{'causal' if self.causal else 'noncausal'}-{lens}-W{self.window}-{DTYPE_NAMES[self.dtype]}"
        )


CASES = [
    Case(2, 4, 4, 1, 1, 64, True, torch.float32, None, 1),
    Case(2, 8, 4, 7, 63, 64, True, torch.float16, (1, 63), 3),
    Case(3, 8, 1, 63, 111, 128, False, torch.bfloat16, (0, 111, 70), 16),
    Case(1, 8, 2, 128, 257, 128, True, torch.bfloat16, None, 64),
    Case(2, 4, 1, 128, 1000, 64, True, torch.float32, (1000, 129), 128),
    Case(1, 2, 1, 63, 257, 32, False, torch.float16, None, 0),
    Case(2, 4, 2, 7, 111, 256, True, torch.float32, (111, 3), 7),
    Case(2, 2, 2, 1, 1000, 128, False, torch.float16, (1, 999), 1),
    Case(2, 8, 2, 63, 63, 64, True, torch.bfloat16, (63, 40), 5),
    Case(1, 8, 1, 7, 257, 128, True, torch.float32, (200,), 0),
    Case(2, 4, 1, 1, 63, 64, True, torch.bfloat16, (0, 1), 1),
    # Non-causal launches pack the group's query heads into the row blocks: a group of 3 whose
    # 192 rows end mid-block, and single queries of a group of 4.
    Case(2, 6, 2, 64, 257, 64, False, torch.bfloat16, (257, 1), 64),
    Case(1, 8, 2, 1, 111, 128, False, torch.float32, (111,), 1),
    # Odd GQA groups: 5 per KV head causal (query heads mapped to their KV head one by one),
    # 7 packed non-causal (441 rows: heads change mid-block and the last block is partial),
    # 6 with one query and an empty row.
    Case(2, 10, 2, 63, 111, 32, True, torch.float16, (111, 63), 9),
    Case(1, 7, 1, 63, 257, 32, False, torch.bfloat16, (257,), 16),
    Case(2, 6, 1, 1, 257, 32, True, torch.float32, (257, 0), 1),
    # 111 and 257 queries: several query blocks, the last one partial, over ragged keys.
    Case(2, 4, 1, 111, 111, 64, True, torch.float16, (111, 90), 16),
    Case(2, 2, 1, 257, 300, 64, True, torch.bfloat16, (300, 257), 64),
]


def make_inputs(case: Case, device: torch.device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(case.batch, case.q_heads, case.q_len, case.head_dim, generator=gen) * 1.5
    k = torch.randn(case.batch, case.kv_heads, case.k_len, case.head_dim, generator=gen)
    v = torch.randn(case.batch, case.kv_heads, case.k_len, case.head_dim, generator=gen)
    q, k, v = (t.to(device=device, dtype=case.dtype) for t in (q, k, v))
    kv_lens = None if case.kv_lens is None else torch.tensor(case.kv_lens, dtype=torch.int32, device=device)
    return q, k, v, kv_lens


def visibility(batch: int, q_len: int, k_len: int, causal: bool, kv_lens, device) -> torch.Tensor:
    """`[B, 1, Tq, Tk]` bool: which keys each end-aligned query sees."""
    lens = torch.full((batch,), k_len, device=device) if kv_lens is None else kv_lens.long()
    keys = torch.arange(k_len, device=device).view(1, 1, k_len)
    visible = keys < lens.view(batch, 1, 1)
    if causal:
        pos = lens.view(batch, 1, 1) - q_len + torch.arange(q_len, device=device).view(1, q_len, 1)
        visible = visible & (keys <= pos)
    return visible.expand(batch, q_len, k_len).unsqueeze(1)


def torch_same_dtype(q, k, v, scale, causal, kv_lens, window):
    """Attention computed by PyTorch in the input dtype: the accuracy baseline."""
    group = q.shape[1] // k.shape[1]
    keys = k.repeat_interleave(group, dim=1)
    values = v.repeat_interleave(group, dim=1)
    visible = visibility(q.shape[0], q.shape[2], k.shape[2], causal, kv_lens, q.device)
    logits = (torch.matmul(q, keys.transpose(-1, -2)) * scale).masked_fill(~visible, float("-inf"))
    probs = torch.softmax(logits.float(), dim=-1).nan_to_num(0.0).to(q.dtype)
    out = torch.matmul(probs, values)
    lse = torch.logsumexp(logits.float(), dim=-1)
    window_probs = probs[:, :, q.shape[2] - window :, :].float().sum(dim=2)
    scores = window_probs.view(k.shape[0], k.shape[1], group, k.shape[2]).sum(dim=2)
    return out, lse, scores


def max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference over finite entries (both sides must agree on infinities)."""
    actual, expected = actual.double(), expected.double()
    finite = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(actual), finite)
    assert torch.equal(actual[~finite], expected[~finite])
    if not finite.any():
        return 0.0
    return (actual[finite] - expected[finite]).abs().max().item()


def assert_close_to_reference(name, actual, baseline, expected):
    kernel_err = max_error(actual, expected)
    torch_err = max_error(baseline, expected)
    finite = expected[torch.isfinite(expected)]
    floor = 1e-5 * max(1.0, finite.abs().max().item() if finite.numel() else 0.0)
    assert kernel_err <= 2 * torch_err + floor, f"{name}: kernel error {kernel_err:.3e}, torch error {torch_err:.3e}"


def poisoned_outputs(case: Case, device):
    out_shape = (case.batch, case.q_heads, case.q_len, case.head_dim)
    out = torch.full(out_shape, float("nan"), dtype=case.dtype, device=device)
    lse = torch.full((case.batch, case.q_heads, case.q_len), float("nan"), device=device)
    score_len = case.k_len if case.window > 0 else 0
    scores = torch.full((case.batch, case.kv_heads, score_len), float("nan"), device=device)
    return out, lse, scores


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_prefill_matches_float64_reference(case: Case, device):
    q, k, v, kv_lens = make_inputs(case, device)
    scale = 1.0 / math.sqrt(case.head_dim)
    out_buf, lse_buf, scores_buf = poisoned_outputs(case, device)
    out, lse, scores = prefill_attention_triton(
        q, k, v, kv_lens, scale, case.causal, case.window, out=out_buf, lse=lse_buf, scores=scores_buf
    )
    assert out.data_ptr() == out_buf.data_ptr() and lse.data_ptr() == lse_buf.data_ptr()
    assert scores.data_ptr() == scores_buf.data_ptr() and scores.shape == scores_buf.shape
    assert not out.isnan().any() and not lse.isnan().any() and not scores.isnan().any()

    ref_out, ref_lse, ref_scores = reference.prefill_attention(
        q.double(), k.double(), v.double(), scale=scale, causal=case.causal, kv_lens=kv_lens, score_window=case.window
    )
    base_out, base_lse, base_scores = torch_same_dtype(q, k, v, scale, case.causal, kv_lens, case.window)
    assert_close_to_reference("out", out, base_out, ref_out)
    assert_close_to_reference("lse", lse, base_lse, ref_lse)

    unseen = torch.isinf(ref_lse)
    assert torch.equal(out[unseen], torch.zeros_like(out[unseen]))
    if case.window == 0:
        return
    assert_close_to_reference("scores", scores, base_scores, ref_scores)
    group = case.q_heads // case.kv_heads
    lens = [case.k_len] * case.batch if case.kv_lens is None else list(case.kv_lens)
    for b, length in enumerate(lens):
        assert torch.all(scores[b, :, length:] == 0.0)
        window_sees_keys = length >= case.window if case.causal else length >= 1
        if window_sees_keys:
            sums = scores[b, :, :length].double().sum(dim=-1)
            expected = torch.full_like(sums, float(case.window * group))
            torch.testing.assert_close(sums, expected, rtol=1e-4, atol=0.0)


@pytest.mark.parametrize("rows", [None, 1, 5])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reference_matches_pytorch_attention_in_float64(case: Case, rows: Optional[int], monkeypatch):
    """The reference against PyTorch's softmax and log-sum-exp over the whole `[Tq, Tk]`
    matrix, in float64: in one block of queries, one query per block, and blocks of 5 that
    split the score window and end on a partial block."""
    if rows is not None:
        monkeypatch.setattr(reference, "PREFILL_BLOCK_LOGITS", rows * case.batch * case.q_heads * case.k_len)
    q, k, v, kv_lens = (t if t is None else t.double() if t.is_floating_point() else t
                        for t in make_inputs(case, torch.device("cpu"), seed=3))  # fmt: skip
    scale = 1.0 / math.sqrt(case.head_dim)
    out, lse, scores = reference.prefill_attention(
        q, k, v, scale=scale, causal=case.causal, kv_lens=kv_lens, score_window=case.window
    )
    group = case.q_heads // case.kv_heads
    visible = visibility(case.batch, case.q_len, case.k_len, case.causal, kv_lens, q.device)
    keys, values = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    logits = (q @ keys.transpose(-1, -2) * scale).masked_fill(~visible, float("-inf"))
    probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # a query that sees no key: all zero
    torch.testing.assert_close(out, probs @ values, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse.double(), torch.logsumexp(logits, dim=-1), rtol=1e-6, atol=0.0)
    if case.window == 0:
        assert scores is None
        return
    window = probs[:, :, case.q_len - case.window :].sum(dim=2)  # [B, Hq, Tk]
    expected = window.view(case.batch, case.kv_heads, group, case.k_len).sum(dim=2)
    torch.testing.assert_close(scores.double(), expected, rtol=1e-6, atol=1e-6)


# Rows of one length with as many queries as keys (the fused CPU path's unmasked causal call)
# and with more keys than queries (its unmasked prefix merged with the causal part, one key of
# prefix included), and one query without a score window, over a row that sees no key.
FUSED_CASES = CASES + [
    Case(2, 8, 2, 257, 257, 64, True, torch.bfloat16, None, 64),
    Case(1, 4, 4, 111, 111, 32, True, torch.float32, (111,), 7),
    Case(2, 8, 2, 111, 300, 64, True, torch.float16, (300, 300), 16),
    Case(1, 4, 1, 63, 64, 64, True, torch.float32, None, 0),
    Case(2, 4, 1, 1, 63, 64, True, torch.float32, (0, 63), 0),
]


@pytest.mark.parametrize("rows", [None, 5])
@pytest.mark.parametrize("case", FUSED_CASES, ids=[c.id for c in FUSED_CASES])
def test_reference_fused_cpu_prefill_matches_float64(case: Case, rows: Optional[int], monkeypatch):
    """On a CPU, inputs other than float64 whose score window holds at most 3/4 of the queries
    take their output and log-sum-exp from PyTorch's fused attention (causal rows of one length
    with no fewer keys than queries without a mask, any other in masked blocks of
    `FUSED_PREFILL_ROWS` queries, here also 5); float64 and larger windows take the explicit
    path. Against float64, with NaN keys and inf values past every row's length, which must
    not reach the result."""
    if rows is not None:
        monkeypatch.setattr(reference, "FUSED_PREFILL_ROWS", rows)
    calls, unmasked_calls = [], []
    fused_op, unmasked = reference._CPU_FLASH_ATTENTION, reference._prefix_then_causal
    monkeypatch.setattr(reference, "_CPU_FLASH_ATTENTION", lambda *args, **kw: calls.append(1) or fused_op(*args, **kw))
    monkeypatch.setattr(reference, "_prefix_then_causal", lambda *args: unmasked_calls.append(1) or unmasked(*args))
    q, k, v, kv_lens = make_inputs(case, torch.device("cpu"), seed=7)
    scale = 1.0 / math.sqrt(case.head_dim)
    lens = torch.full((case.batch,), case.k_len) if kv_lens is None else kv_lens
    one_length = len(set(lens.tolist())) == 1 and case.q_len <= int(lens[0])
    past = torch.arange(case.k_len).view(1, 1, -1, 1) >= lens.view(-1, 1, 1, 1)
    poisoned_k, poisoned_v = k.masked_fill(past, float("nan")), v.masked_fill(past, float("inf"))
    out, lse, scores = reference.prefill_attention(
        q, poisoned_k, poisoned_v, scale=scale, causal=case.causal, kv_lens=kv_lens, score_window=case.window
    )
    fused = 4 * case.window <= 3 * case.q_len
    assert bool(calls) == fused, f"fused path ran: {bool(calls)}, expected {fused}"
    assert bool(unmasked_calls) == (fused and case.causal and one_length), "unmasked causal path"
    calls.clear()
    ref_out, ref_lse, ref_scores = reference.prefill_attention(
        q.double(), k.double(), v.double(), scale=scale, causal=case.causal, kv_lens=kv_lens, score_window=case.window
    )
    assert not calls, "float64 took the fused path"
    base_out, base_lse, base_scores = torch_same_dtype(q, k, v, scale, case.causal, kv_lens, case.window)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert_close_to_reference("out", out, base_out, ref_out)
    assert_close_to_reference("lse", lse, base_lse, ref_lse)
    unseen = torch.isinf(ref_lse)
    assert torch.equal(out[unseen], torch.zeros_like(out[unseen]))
    if case.window == 0:
        assert scores is None
    else:
        assert_close_to_reference("scores", scores, base_scores, ref_scores)


@pytest.mark.parametrize("case", CASES[1:4], ids=[c.id for c in CASES[1:4]])
def test_public_op_runs_the_kernel(case: Case, device):
    q, k, v, kv_lens = make_inputs(case, device, seed=1)
    scale = 1.0 / math.sqrt(case.head_dim)
    out, lse, scores = vase_triton.ops.prefill_attention(
        q, k, v, causal=case.causal, kv_lens=kv_lens, score_window=case.window
    )
    k_out, k_lse, k_scores = prefill_attention_triton(q, k, v, kv_lens, scale, case.causal, case.window)
    assert torch.equal(out, k_out) and torch.equal(lse, k_lse)
    if case.window == 0:
        assert scores is None
    else:
        assert torch.equal(scores, k_scores)


@pytest.mark.parametrize("case", [CASES[3], CASES[6]], ids=[CASES[3].id, CASES[6].id])
def test_non_contiguous_inputs(case: Case, device):
    q, k, v, kv_lens = make_inputs(case, device, seed=2)
    scale = 1.0 / math.sqrt(case.head_dim)
    # [B, T, H, D] storage viewed as [B, H, T, D], as projections produce it.
    q_t, k_t, v_t = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert not q_t.is_contiguous() and not k_t.is_contiguous()
    expected = prefill_attention_triton(q, k, v, kv_lens, scale, case.causal, case.window)
    actual = prefill_attention_triton(q_t, k_t, v_t, kv_lens, scale, case.causal, case.window)
    for a, e in zip(actual, expected):
        assert torch.equal(a, e)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_slots_past_kv_lens_are_never_read_and_no_keys_give_empty_outputs(backend, device, monkeypatch):
    """NaN keys and inf values past `kv_lens` change nothing (the reference too); Tq = Tk = 0 runs."""
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    case = CASES[4]
    q, k, v, lens = make_inputs(case, device, seed=5)
    lens = torch.tensor([case.k_len - 9] + [case.k_len] * (case.batch - 1), dtype=torch.int32, device=device)
    q = q[:, :, -3:]
    clean = vase_triton.ops.prefill_attention(q, k, v, kv_lens=lens, score_window=2)
    past = torch.arange(case.k_len, device=device).view(1, 1, -1, 1) >= lens.view(-1, 1, 1, 1)
    poisoned = vase_triton.ops.prefill_attention(
        q, k.masked_fill(past, float("nan")), v.masked_fill(past, float("inf")), kv_lens=lens, score_window=2
    )
    for got, want in zip(poisoned, clean):
        assert torch.equal(got, want)
    assert bool(torch.isfinite(poisoned[0]).all())
    out, lse, scores = vase_triton.ops.prefill_attention(q[:, :, :0], k[:, :, :0], v[:, :, :0])
    assert out.shape == q[:, :, :0].shape and lse.shape == q.shape[:2] + (0,) and scores is None


def test_int64_kv_lens_and_no_lens_agree(device):
    case = CASES[4]
    q, k, v, _ = make_inputs(case, device, seed=3)
    scale = 1.0 / math.sqrt(case.head_dim)
    full = torch.full((case.batch,), case.k_len, dtype=torch.int64, device=device)
    with_lens = prefill_attention_triton(q, k, v, full, scale, True, 4)
    without = prefill_attention_triton(q, k, v, None, scale, True, 4)
    for a, e in zip(with_lens, without):
        assert torch.equal(a, e)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")  # the interpreter's NumPy
def test_window_scores_stay_bounded_at_huge_logits(device):
    """Logits near 1e9 round the recomputed probabilities above 1 (a score of 256, then inf, when it
    was unclamped): each probability stays at most 1, so no key outscores every window query's mass."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 4, 40, 32, generator=gen).to(device) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    window, group = 8, 2
    for scale in (1e7, 1e8):
        _, _, scores = vase_triton.ops.prefill_attention(q, k, v, scale=scale, causal=True, score_window=window)
        assert torch.isfinite(scores).all()
        assert scores.max().item() <= window * group
