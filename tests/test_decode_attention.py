"""Split-K decode attention against the float64 reference, including score accumulation.

Outputs are compared with `reference.decode_attention` in float64 with an error bound
of twice PyTorch's own same-dtype error plus a small floor (the kernels' exponentials and
divisions on a GPU are not PyTorch's). Outputs and the split-K workspace start NaN-poisoned. Score buffers
start from random values with a sentinel past the valid slots: each call must add exactly
the reference probabilities on valid slots and leave every other slot untouched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

import vase_triton.ops
from vase_triton import reference
from vase_triton.kernels.decode_attention import decode_attention_triton

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
SENTINEL = -12345.0


@dataclass(frozen=True)
class Case:
    q_heads: int
    kv_heads: int
    capacity: int
    head_dim: int
    dtype: torch.dtype
    cache_lens: tuple[int, ...]
    num_splits: Optional[int]

    @property
    def batch(self) -> int:
        return len(self.cache_lens)

    @property
    def id(self) -> str:
        splits = "auto" if self.num_splits is None else str(self.num_splits)
        return (
            f"B{self.batch}-Hq{self.q_heads}-Hkv{self.kv_heads}-C{self.capacity}-D{self.head_dim}-"
            f"lens{'_'.join(map(str, self.cache_lens))}-S{splits}-{DTYPE_NAMES[self.dtype]}"
        )


CASES = [
    Case(4, 4, 1, 64, torch.float32, (1, 1), None),
    Case(8, 4, 63, 64, torch.float16, (1, 63), 1),
    Case(8, 1, 111, 128, torch.bfloat16, (0, 111, 70), None),
    Case(8, 2, 257, 128, torch.bfloat16, (257, 129), 3),
    Case(4, 1, 1000, 64, torch.float32, (1000, 517), 5),
    Case(2, 1, 257, 32, torch.float16, (200,), 2),
    Case(4, 2, 111, 256, torch.float32, (111, 3), 1),
    Case(2, 2, 1000, 128, torch.float16, (999, 1), None),
    Case(16, 2, 63, 64, torch.bfloat16, (40, 63), None),
    # Rows of one length, past which the fused CPU path reads nothing and masks nothing.
    Case(6, 3, 111, 64, torch.float16, (70, 70, 70), None),
    # Odd GQA groups (3, 5, 6, 7 query heads per KV head, padded to 16 rows in the kernels).
    Case(6, 2, 257, 32, torch.float16, (257, 0, 1), 3),
    Case(5, 1, 111, 64, torch.bfloat16, (63, 111), None),
    Case(12, 2, 63, 32, torch.float32, (1, 63), 2),
    Case(14, 2, 257, 32, torch.float32, (129, 257), 5),
    # 12 splits, which the combine stage reads 4 at a time at group 8 and D = 256: three tiles,
    # the second row's last splits and all but the first of the third's past their lengths.
    Case(16, 2, 1500, 256, torch.bfloat16, (1500, 700, 1), 12),
]


def make_inputs(case: Case, device: torch.device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    shape = (case.batch, case.kv_heads, case.capacity, case.head_dim)
    q = torch.randn(case.batch, case.q_heads, 1, case.head_dim, generator=gen) * 1.5
    k = torch.randn(shape, generator=gen)
    v = torch.randn(shape, generator=gen)
    q, k, v = (t.to(device=device, dtype=case.dtype) for t in (q, k, v))
    cache_lens = torch.tensor(case.cache_lens, dtype=torch.int32, device=device)
    return q, k, v, cache_lens


def initial_scores(case: Case, device: torch.device, lens: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    scores = torch.rand(case.batch, case.kv_heads, case.capacity, generator=gen)
    for b, length in enumerate(lens):
        scores[b, :, length:] = SENTINEL
    return scores.to(device)


def torch_same_dtype(q, k, v, cache_lens, scale):
    """Decode attention computed by PyTorch in the input dtype: the accuracy baseline."""
    group = q.shape[1] // k.shape[1]
    keys = k.repeat_interleave(group, dim=1)
    values = v.repeat_interleave(group, dim=1)
    visible = torch.arange(k.shape[2], device=q.device).view(1, 1, 1, -1) < cache_lens.view(-1, 1, 1, 1)
    logits = (torch.matmul(q, keys.transpose(-1, -2)) * scale).masked_fill(~visible, float("-inf"))
    probs = torch.softmax(logits.float(), dim=-1).nan_to_num(0.0).to(q.dtype)
    return torch.matmul(probs, values)


def assert_close_to_reference(actual, baseline, expected):
    kernel_err = (actual.double() - expected).abs().max().item()
    torch_err = (baseline.double() - expected).abs().max().item()
    floor = 1e-5 * max(1.0, expected.abs().max().item())
    assert kernel_err <= 2 * torch_err + floor, f"kernel error {kernel_err:.3e}, torch error {torch_err:.3e}"


def poisoned_workspace(case: Case, k: torch.Tensor, emit_scores: bool):
    """The split-K scratch of this case, NaN-filled: every entry read must have been written first."""
    from vase_triton.kernels.decode_attention import decode_workspace

    workspace = decode_workspace(case.q_heads, k, case.dtype, emit_scores=emit_scores, num_splits=case.num_splits)
    for scratch in workspace:
        scratch.fill_(float("nan"))
    return workspace


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decode_matches_float64_reference(case: Case, device):
    q, k, v, cache_lens = make_inputs(case, device)
    scale = 1.0 / math.sqrt(case.head_dim)
    out_buf = torch.full_like(q, float("nan"))
    scores = initial_scores(case, device, case.cache_lens)
    ref_scores = scores.double()

    out = decode_attention_triton(
        q, k, v, cache_lens, scale, scores, out=out_buf, num_splits=case.num_splits,
        workspace=poisoned_workspace(case, k, emit_scores=True),
    )  # fmt: skip
    assert out.data_ptr() == out_buf.data_ptr() and not out.isnan().any()
    # Without scores (the launch that emits nothing): as close to the reference.
    no_scores = decode_attention_triton(
        q, k, v, cache_lens, scale, None, out=torch.full_like(q, float("nan")), num_splits=case.num_splits,
        workspace=poisoned_workspace(case, k, emit_scores=False),
    )  # fmt: skip

    ref_out = reference.decode_attention(
        q.double(), k.double(), v.double(), cache_lens, scale=scale, scores=ref_scores
    )
    baseline = torch_same_dtype(q, k, v, cache_lens, scale)
    assert_close_to_reference(out, baseline, ref_out)
    assert_close_to_reference(no_scores, baseline, ref_out)
    empty = cache_lens == 0
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert torch.equal(no_scores[empty], torch.zeros_like(no_scores[empty]))
    torch.testing.assert_close(scores.double(), ref_scores, rtol=1e-5, atol=1e-6)
    for b, length in enumerate(case.cache_lens):
        assert torch.all(scores[b, :, length:] == SENTINEL)


@pytest.mark.parametrize("case", [CASES[3], CASES[4], CASES[8]], ids=[CASES[i].id for i in (3, 4, 8)])
def test_scores_accumulate_over_steps(case: Case, device):
    """Three steps with growing lengths, as decode appends tokens, into one buffer."""
    q, k, v, _ = make_inputs(case, device, seed=1)
    scale = 1.0 / math.sqrt(case.head_dim)
    steps = [tuple(max(0, n - 2 + i) for n in case.cache_lens) for i in range(3)]
    scores = initial_scores(case, device, steps[0])
    expected = scores.double()
    for i, lens in enumerate(steps):
        step_q = q * (1.0 + 0.25 * i)
        cache_lens = torch.tensor(lens, dtype=torch.int64, device=device)
        decode_attention_triton(step_q, k, v, cache_lens, scale, scores, num_splits=case.num_splits)
        reference.decode_attention(
            step_q.double(), k.double(), v.double(), cache_lens, scale=scale, scores=expected
        )
    torch.testing.assert_close(scores.double(), expected, rtol=1e-5, atol=1e-6)
    for b in range(case.batch):
        assert torch.all(scores[b, :, steps[-1][b] :] == SENTINEL)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 5])
def test_split_counts_agree_with_reference(num_splits: int, device):
    case = Case(8, 2, 513, 64, torch.float32, (513, 300), num_splits)
    q, k, v, cache_lens = make_inputs(case, device, seed=2)
    scale = 1.0 / math.sqrt(case.head_dim)
    scores = torch.zeros(case.batch, case.kv_heads, case.capacity, device=device)
    expected = scores.double()
    out = decode_attention_triton(q, k, v, cache_lens, scale, scores, num_splits=num_splits)
    ref_out = reference.decode_attention(q.double(), k.double(), v.double(), cache_lens, scale=scale, scores=expected)
    assert_close_to_reference(out, torch_same_dtype(q, k, v, cache_lens, scale), ref_out)
    torch.testing.assert_close(scores.double(), expected, rtol=1e-5, atol=1e-6)


def test_empty_cache_gives_zero_and_adds_nothing(device):
    case = Case(8, 2, 63, 64, torch.float16, (0, 0), None)
    q, k, v, cache_lens = make_inputs(case, device, seed=3)
    scores = initial_scores(case, device, case.cache_lens)
    before = scores.clone()
    out = decode_attention_triton(q, k, v, cache_lens, 0.125, scores, out=torch.full_like(q, float("nan")))
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(scores, before)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_slots_past_cache_lens_are_never_read_and_an_empty_capacity_gives_zero(backend, device, monkeypatch):
    """NaN keys and inf values past `cache_lens` change nothing (the reference too); C = 0 gives zeros."""
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    case = Case(4, 2, 63, 64, torch.float32, (63, 20), None)
    q, k, v, cache_lens = make_inputs(case, device, seed=4)
    past = torch.arange(case.capacity, device=device).view(1, 1, -1, 1) >= cache_lens.view(-1, 1, 1, 1)
    clean_scores, poisoned_scores = torch.zeros(2, 2, case.capacity, device=device), torch.zeros(2, 2, case.capacity, device=device)
    clean = vase_triton.ops.decode_attention(q, k, v, cache_lens, scores=clean_scores)
    poisoned = vase_triton.ops.decode_attention(
        q, k.masked_fill(past, float("nan")), v.masked_fill(past, float("inf")), cache_lens, scores=poisoned_scores
    )
    assert torch.equal(poisoned, clean) and torch.equal(poisoned_scores, clean_scores)
    assert bool(torch.isfinite(poisoned).all())
    zero = torch.zeros(2, dtype=torch.int32, device=device)
    empty = vase_triton.ops.decode_attention(q, k[:, :, :0], v[:, :, :0], zero)
    assert torch.equal(empty, torch.zeros_like(q))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_reads_a_nan_it_should_and_none_it_should_not(dtype):
    """On a CPU the reference multiplies by the values as they are and zeroes the unread slots
    only when the product is not finite: a NaN value in a read slot still makes the output of
    its row's KV group NaN (every probability there is > 0), while inf values past
    `cache_lens` in another row leave that row as it was."""
    case = Case(8, 2, 63, 64, dtype, (63, 20), None)
    q, k, v, cache_lens = make_inputs(case, torch.device("cpu"), seed=6)
    clean = reference.decode_attention(q, k, v, cache_lens)
    poisoned = v.clone()
    poisoned[0, 1, 5, 7] = float("nan")  # row 0 reads slot 5
    poisoned[1, :, 20:] = float("inf")  # row 1 reads slots 0-19
    out = reference.decode_attention(q, k, poisoned, cache_lens)
    assert bool(out[0, 4:, 0, 7].isnan().all()) and not bool(out[0, :4].isnan().any())
    assert torch.equal(out[0, 4:, 0, :7], clean[0, 4:, 0, :7]) and torch.equal(out[0, :4], clean[0, :4])
    assert torch.equal(out[1], clean[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_output_whose_sum_overflows_is_still_read(dtype):
    """The CPU reference checks its product by the finiteness of its sum. Finite outputs near
    the float32 limit overflow that sum; they must still come out right (through the path that
    zeroes unread slots), not be taken for the product of a NaN or inf past `cache_lens`."""
    case = Case(8, 2, 63, 64, dtype, (63, 20), None)
    q, k, _, cache_lens = make_inputs(case, torch.device("cpu"), seed=8)
    gen = torch.Generator().manual_seed(9)
    v = (1e37 * (1 + torch.rand(case.batch, case.kv_heads, case.capacity, case.head_dim, generator=gen))).to(dtype)
    v[1, :, 20:] = float("inf")  # row 1 reads slots 0-19
    out = reference.decode_attention(q, k, v, cache_lens)
    assert bool(torch.isfinite(out).all()) and out.to(torch.float32).sum().isinf()
    group = case.q_heads // case.kv_heads
    for row, length in enumerate(case.cache_lens):
        keys = k[row, :, :length].double().repeat_interleave(group, dim=0)  # [Hq, L, D]
        values = v[row, :, :length].double().repeat_interleave(group, dim=0)
        logits = (q[row].double() @ keys.transpose(-1, -2)) / math.sqrt(case.head_dim)  # [Hq, 1, L]
        expected = torch.softmax(logits, dim=-1) @ values  # [Hq, 1, D]
        torch.testing.assert_close(out[row].double(), expected, rtol=2e-2 if dtype == torch.bfloat16 else 1e-5, atol=0)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reference_fused_output_matches_the_explicit_path(case: Case):
    """On a CPU a step that keeps no scores takes PyTorch's fused attention (rows of at least
    one slot); a step that keeps them takes the explicit softmax. Both against float64, with
    NaN keys and inf values past every row's length, which neither may read."""
    q, k, v, cache_lens = make_inputs(case, torch.device("cpu"), seed=10)
    scale = 1.0 / math.sqrt(case.head_dim)
    past = torch.arange(case.capacity).view(1, 1, -1, 1) >= cache_lens.view(-1, 1, 1, 1)
    k, v = k.masked_fill(past, float("nan")), v.masked_fill(past, float("inf"))
    scores = torch.zeros(case.batch, case.kv_heads, case.capacity)
    explicit = reference.decode_attention(q, k, v, cache_lens, scale=scale, scores=scores)
    fused = reference.decode_attention(q, k, v, cache_lens, scale=scale)
    clean_k, clean_v = k.masked_fill(past, 0), v.masked_fill(past, 0)
    expected = reference.decode_attention(
        q.double(), clean_k.double(), clean_v.double(), cache_lens, scale=scale, scores=scores.double()
    )
    baseline = torch_same_dtype(q, clean_k, clean_v, cache_lens, scale)
    assert_close_to_reference(fused, baseline, expected)
    assert_close_to_reference(explicit, baseline, expected)
    # float64 through both paths: the same numbers to rounding.
    fused64 = reference.decode_attention(q.double(), k.double(), v.double(), cache_lens, scale=scale)
    torch.testing.assert_close(fused64, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_an_empty_batch_gives_an_empty_output(backend, device, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", backend)
    q = torch.randn(0, 8, 1, 64, device=device)
    k = torch.randn(0, 2, 63, 64, device=device)
    out = vase_triton.ops.decode_attention(q, k, k, torch.zeros(0, dtype=torch.int32, device=device))
    assert out.shape == (0, 8, 1, 64)


def test_strided_cache_views_are_read_in_place(device):
    """Caches viewed from a `[B, C, Hkv, D]` layout and from a larger capacity give the same result."""
    case = CASES[3]
    q, k, v, cache_lens = make_inputs(case, device, seed=4)
    scale = 1.0 / math.sqrt(case.head_dim)
    k_view = k.transpose(1, 2).contiguous().transpose(1, 2)
    v_big = torch.zeros(case.batch, case.kv_heads, case.capacity + 9, case.head_dim, dtype=case.dtype, device=device)
    v_big[:, :, : case.capacity] = v
    v_view = v_big[:, :, : case.capacity]
    assert not k_view.is_contiguous() and not v_view.is_contiguous()
    scores_a = torch.zeros(case.batch, case.kv_heads, case.capacity, device=device)
    scores_b = torch.zeros_like(scores_a)
    expected = decode_attention_triton(q, k, v, cache_lens, scale, scores_a, num_splits=2)
    actual = decode_attention_triton(q, k_view, v_view, cache_lens, scale, scores_b, num_splits=2)
    assert torch.equal(actual, expected) and torch.equal(scores_b, scores_a)


@pytest.mark.parametrize(
    "op_name", ["prefill_attention", "decode_attention", "candidate_attention", "append_", "evict_"]
)
def test_mutated_op_arguments_have_no_default(op_name):
    """torch 2.11 versions the arguments an op mutates by their schema position in the call's
    own arguments, so a mutated argument left to its default raised IndexError there (seen on
    an H200): each one must be passed explicitly."""
    schema = getattr(torch.ops.vase_triton, op_name).default._schema
    defaulted = [
        argument.name
        for argument in schema.arguments
        if argument.alias_info is not None and argument.alias_info.is_write and argument.has_default_value()
    ]
    assert defaulted == [], f"{op_name}: mutated arguments with a default: {defaulted}"


def test_public_op_runs_the_kernel(device):
    case = CASES[2]
    q, k, v, cache_lens = make_inputs(case, device, seed=5)
    scale = 1.0 / math.sqrt(case.head_dim)
    scores_op = initial_scores(case, device, case.cache_lens)
    scores_kernel = scores_op.clone()
    out = vase_triton.ops.decode_attention(q, k, v, cache_lens, scores=scores_op)
    expected = decode_attention_triton(q, k, v, cache_lens, scale, scores_kernel)
    assert torch.equal(out, expected) and torch.equal(scores_op, scores_kernel)


def test_preallocated_workspace_is_used_and_gives_the_same_result(device):
    """A NaN-poisoned workspace from `decode_workspace` is overwritten, not read, and reused as is."""
    from vase_triton.kernels.decode_attention import decode_workspace

    case = CASES[3]
    q, k, v, cache_lens = make_inputs(case, device, seed=6)
    scale = 1.0 / math.sqrt(case.head_dim)
    scores_alloc = initial_scores(case, device, case.cache_lens)
    scores_given = scores_alloc.clone()
    workspace = decode_workspace(case.q_heads, k, case.dtype, emit_scores=True)
    for scratch in workspace:
        scratch.fill_(float("nan"))
    pointers = [scratch.data_ptr() for scratch in workspace]
    expected = decode_attention_triton(q, k, v, cache_lens, scale, scores_alloc)
    actual = decode_attention_triton(q, k, v, cache_lens, scale, scores_given, workspace=workspace)
    assert torch.equal(actual, expected) and torch.equal(scores_given, scores_alloc)
    assert [scratch.data_ptr() for scratch in workspace] == pointers
    assert not torch.isnan(workspace.part_lse).all()

    wrong = workspace._replace(part_lse=workspace.part_lse[:, :, :0])
    with pytest.raises(ValueError, match="workspace.part_lse"):
        decode_attention_triton(q, k, v, cache_lens, scale, scores_given, workspace=wrong)
