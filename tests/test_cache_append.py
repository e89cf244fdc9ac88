"""Fused cache append (`vase_triton.ops.append_`) against the PyTorch reference."""

from __future__ import annotations

import pytest
import torch

from vase_triton import reference
from vase_triton.cache_tensors import CacheTensors
from vase_triton.kernels import cache_append as append_kernels
from vase_triton.ops import append_

# (B, Hkv, C, D, T_new, lengths, dtype, value_stat): every dtype, every statistic, D 64/128,
# Hkv 1/2/4/8, hostile lengths (1, 63, 111, 257), rows that exactly fill and rows that overflow,
# rows of one length.
CASES = [
    (4, 2, 260, 64, 3, [1, 63, 111, 257], torch.float64, "range"),
    (3, 1, 9, 128, 1, [0, 8, 9], torch.float64, "absmax"),
    (2, 4, 64, 64, 2, [63, 62], torch.float64, "l2"),
    (2, 8, 16, 128, 5, [11, 12], torch.float64, "var"),
    (4, 2, 258, 128, 3, [1, 63, 111, 257], torch.float16, "range"),
    (1, 8, 5, 64, 1, [4], torch.float16, "absmax"),
    (3, 2, 112, 64, 1, [111, 0, 112], torch.float16, "l2"),
    (2, 1, 7, 128, 7, [0, 1], torch.float16, "var"),
    (3, 4, 64, 128, 2, [1, 62, 63], torch.bfloat16, "range"),
    (2, 2, 33, 64, 4, [29, 30], torch.bfloat16, "absmax"),
    (1, 1, 1, 64, 1, [0], torch.bfloat16, "l2"),
    (4, 8, 20, 64, 1, [0, 5, 19, 20], torch.bfloat16, "var"),
    (2, 2, 40, 64, 3, [3, 38], torch.float32, "range"),
    # Rows of one length (a CPU writes them as one slice): fitting, filling exactly, overflowing.
    (3, 2, 40, 64, 2, [17, 17, 17], torch.float32, "range"),
    (2, 4, 10, 128, 3, [7, 7], torch.bfloat16, "var"),
    (2, 2, 10, 64, 3, [8, 8], torch.float16, "absmax"),
]


def _case_id(case) -> str:
    batch, heads, capacity, head_dim, new_len, lengths, dtype, stat = case
    dtype_name = {torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]
    return f"B{batch}-Hkv{heads}-C{capacity}-D{head_dim}-Tnew{new_len}-len{'_'.join(map(str, lengths))}-{dtype_name}-{stat}"


def _poisoned_cache(batch, heads, capacity, head_dim, lengths, dtype, device) -> CacheTensors:
    """Cache buffers with NaN in every float slot and recognisable counters."""
    slots = (batch, heads, capacity)
    lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    return CacheTensors(
        keys=torch.full(slots + (head_dim,), float("nan"), dtype=dtype, device=device),
        values=torch.full(slots + (head_dim,), float("nan"), dtype=dtype, device=device),
        scores=torch.full(slots, float("nan"), dtype=torch.float32, device=device),
        magnitudes=torch.full(slots, float("nan"), dtype=torch.float32, device=device),
        positions=torch.full(slots, -7, dtype=torch.int32, device=device),
        lengths=lens,
        next_positions=lens + 100 * torch.arange(batch, dtype=torch.int32, device=device),
    )


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_floating_point():
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    return torch.equal(a, b)


@pytest.mark.parametrize("tiles", ["default", "small"])
@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_append_matches_reference(case, tiles, device, monkeypatch):
    """`small` tiles spread the new tokens over several programs (the counters then advance after the kernel)."""
    if tiles == "small":
        monkeypatch.setattr(append_kernels, "_INTERPRETER_MAX_TILE", 256)
        monkeypatch.setattr(append_kernels, "_MAX_TILE", 256)
    batch, heads, capacity, head_dim, new_len, lengths, dtype, stat = case
    gen = torch.Generator().manual_seed(len(lengths) * 1000 + capacity)
    new_keys = torch.randn(batch, heads, new_len, head_dim, generator=gen).to(dtype=dtype, device=device)
    # Heavy-tailed values so that magnitudes differ between tokens.
    scale = torch.rand(batch, heads, new_len, 1, generator=gen) * 8
    new_values = (torch.randn(batch, heads, new_len, head_dim, generator=gen) * scale).to(dtype=dtype, device=device)

    ours = _poisoned_cache(batch, heads, capacity, head_dim, lengths, dtype, device)
    expected = _poisoned_cache(batch, heads, capacity, head_dim, lengths, dtype, device)
    before = CacheTensors(*(t.clone() for t in ours))
    append_(ours, new_keys, new_values, value_stat=stat)
    reference.append_(expected, new_keys, new_values, value_stat=stat)
    keys, values, scores, magnitudes, positions, lens, next_positions = ours

    # Counters: advanced by T_new exactly where the tokens fit.
    start = torch.tensor(lengths, dtype=torch.int32, device=device)
    fits = start + new_len <= capacity
    assert torch.equal(lens, torch.where(fits, start + new_len, start))
    assert torch.equal(next_positions, torch.where(fits, before.next_positions + new_len, before.next_positions))
    assert torch.equal(lens, expected.lengths) and torch.equal(next_positions, expected.next_positions)

    # Keys, values and positions bit-identical to the reference; untouched slots still poisoned.
    for name in ("keys", "values", "positions"):
        assert _bitwise_equal(getattr(ours, name), getattr(expected, name)), name
    assert scores.isnan().all(), "append must not touch scores"
    for b in range(batch):
        written = slice(lengths[b], lengths[b] + new_len)
        if bool(fits[b]):
            assert torch.equal(keys[b, :, written], new_keys[b])
            assert torch.equal(values[b, :, written], new_values[b])
            expected_pos = before.next_positions[b] + torch.arange(new_len, dtype=torch.int32, device=device)
            assert torch.equal(positions[b, :, written], expected_pos.expand(heads, new_len))
            untouched = torch.ones(capacity, dtype=torch.bool, device=device)
            untouched[written] = False
        else:
            untouched = torch.ones(capacity, dtype=torch.bool, device=device)
        assert keys[b][:, untouched].isnan().all() and values[b][:, untouched].isnan().all()
        assert magnitudes[b][:, untouched].isnan().all()
        assert (positions[b][:, untouched] == -7).all()

    # Magnitudes: as close to the float64 truth as PyTorch's own fp32 statistic (fp64 inputs: 1 ulp).
    written = ~magnitudes.isnan()
    assert torch.equal(written, ~expected.magnitudes.isnan())
    assert written.any() == fits.any()
    if fits.any():
        truth64 = new_values.double()  # [B, Hkv, T_new, D]
        truth = {
            "range": truth64.amax(-1) - truth64.amin(-1),
            "absmax": truth64.abs().amax(-1),
            "l2": truth64.norm(dim=-1),
            "var": truth64.var(-1, unbiased=False),
        }[stat]
        rows = fits.nonzero().flatten().tolist()
        for b in rows:
            got = magnitudes[b, :, lengths[b] : lengths[b] + new_len].double()
            torch_got = reference.value_magnitude(new_values[b], stat).double()
            torch_error = (torch_got - truth[b]).abs().max()
            ulp = torch.finfo(torch.float32).eps * truth[b].abs().max()
            assert (got - truth[b]).abs().max() <= 2 * torch_error + 2 * ulp


def test_append_repeated_steps_fill_exactly_to_capacity(device):
    """Decode-style appends: one token per call until the row is full, then nothing changes."""
    batch, heads, capacity, head_dim = 2, 2, 6, 64
    cache = _poisoned_cache(batch, heads, capacity, head_dim, [0, 3], torch.float16, device)
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randn(capacity, batch, heads, 1, head_dim, generator=gen).to(torch.float16).to(device)
    for step in range(capacity):
        append_(cache, tokens[step], tokens[step] * 2, value_stat="range")
    assert cache.lengths.tolist() == [6, 6]
    assert cache.next_positions.tolist() == [6, 106]
    assert torch.equal(cache.keys[0, :, :, :], tokens[:, 0, :, 0].transpose(0, 1))
    assert torch.equal(cache.keys[1, :, 3:], tokens[:3, 1, :, 0].transpose(0, 1))
    assert cache.positions[1, 0].tolist() == [-7, -7, -7, 103, 104, 105]


@pytest.mark.parametrize("tiles", ["default", "small"])
def test_rows_with_lengths_out_of_range_are_left_untouched(tiles, device, monkeypatch):
    """Lengths are not read back for validation: a negative one, or one near 2**31 (whose
    `length + T_new` overflows int32), must leave its row alone, not write outside it."""
    if tiles == "small":
        monkeypatch.setattr(append_kernels, "_INTERPRETER_MAX_TILE", 256)
        monkeypatch.setattr(append_kernels, "_MAX_TILE", 256)
    lengths = [-1, 2**31 - 1, 3, 2**31 - 3]
    cache = _poisoned_cache(4, 2, 8, 64, lengths, torch.float32, device)
    guarded = torch.full((2, 4, 2, 8, 64), 5.0, device=device)  # memory just before the keys holds 5s
    guarded[1] = float("nan")
    cache = cache._replace(keys=guarded[1])
    new = torch.randn(4, 2, 2, 64, generator=torch.Generator().manual_seed(0)).to(device)
    want = CacheTensors(*(t.clone() for t in cache))
    reference.append_(want, new, new, value_stat="range")
    append_(cache, new, new, value_stat="range")
    for name, got, expected in zip(CacheTensors._fields, cache, want):
        assert _bitwise_equal(got, expected), name
    assert cache.lengths.tolist() == [-1, 2**31 - 1, 5, 2**31 - 3]
    assert bool((guarded[0] == 5.0).all()) and bool(torch.isnan(cache.keys[[0, 1, 3]]).all())


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_cache_without_slots_is_left_untouched(backend, device, monkeypatch):
    """N = 0: every row overflows, so nothing is written and no counter moves, on both paths."""
    monkeypatch.setenv("VASE_BACKEND", backend)
    cache = _poisoned_cache(2, 2, 0, 64, [0, 0], torch.float32, device)
    new = torch.randn(2, 2, 1, 64, device=device)
    append_(cache, new, new, value_stat="range")
    assert cache.lengths.tolist() == [0, 0] and cache.next_positions.tolist() == [0, 100]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_an_empty_batch_is_a_no_op(backend, device, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", backend)
    cache = _poisoned_cache(0, 2, 8, 64, [], torch.float32, device)
    new = torch.randn(0, 2, 1, 64, device=device)
    append_(cache, new, new, value_stat="range")
    assert cache.lengths.shape == (0,) and cache.keys.shape == (0, 2, 8, 64)


def test_append_rejects_bad_arguments(device):
    cache = _poisoned_cache(2, 2, 8, 64, [0, 0], torch.float16, device)
    new = torch.zeros(2, 2, 1, 64, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="value_stat"):
        append_(cache, new, new, value_stat="median")
    with pytest.raises(ValueError, match="new_keys"):
        append_(cache, new[:, :1], new, value_stat="range")
    with pytest.raises(TypeError, match="new_values"):
        append_(cache, new, new.float(), value_stat="range")
    with pytest.raises(TypeError, match="cache.lengths"):
        append_(cache._replace(lengths=cache.lengths.long()), new, new, value_stat="range")
    with pytest.raises(ValueError, match="cache.magnitudes"):
        append_(cache._replace(magnitudes=cache.magnitudes[:, :, :4]), new, new, value_stat="range")
    with pytest.raises(TypeError, match="cache: expected a vase_triton.cache_tensors.CacheTensors"):
        append_(tuple(cache), new, new, value_stat="range")
    shared = cache.positions[:1].expand(2, -1, -1)  # both rows would write one memory
    with pytest.raises(ValueError, match="cache.positions: expected buffers whose elements do not share memory"):
        append_(cache._replace(positions=shared), new, new, value_stat="range")
    before = [buffer.clone() for buffer in cache]
    for field, other in (("values", cache.keys), ("magnitudes", cache.scores), ("next_positions", cache.lengths)):
        with pytest.raises(ValueError, match=f"cache.{field}: expected its own buffer.*shared with cache"):
            append_(cache._replace(**{field: other}), new, new, value_stat="range")
    for kept, now in zip(before, cache):  # refused before any write
        torch.testing.assert_close(now, kept, rtol=0, atol=0, equal_nan=True)
    interleaved = torch.zeros(2, 2, 8, 2, 64, dtype=torch.float16, device=device)  # keys and values side by side
    side_by_side = cache._replace(keys=interleaved[..., 0, :], values=interleaved[..., 1, :])
    append_(side_by_side, new + 1, new + 2, value_stat="range")
    assert bool((interleaved[:, :, 0, 0] == 1).all()) and bool((interleaved[:, :, 0, 1] == 2).all())


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's NumPy: inf - inf
@pytest.mark.parametrize("stat", ["range", "absmax", "l2", "var"])
def test_a_nan_or_inf_in_a_value_gives_the_magnitude_torch_gives(stat, device):
    """A NaN anywhere in a value vector makes its magnitude NaN, as `torch.amax` / `amin` make it
    (Triton's `tl.max` may drop a NaN); an inf gives the float64 magnitude (inf or NaN)."""
    gen = torch.Generator().manual_seed(5)
    values = torch.randn(1, 2, 4, 64, generator=gen, dtype=torch.float64)
    values[0, 0, 1, 7] = float("nan")
    values[0, 1, 2, 0] = float("inf")
    values[0, 1, 3, 5] = float("-inf")
    keys = torch.randn(1, 2, 4, 64, generator=gen, dtype=torch.float64)
    cache = CacheTensors.empty(1, 2, 8, 64, dtype=torch.float32, device=device)
    append_(cache, keys.float().to(device), values.float().to(device), value_stat=stat)
    expected = reference.value_magnitude(values, stat).double()  # float64 arithmetic, rounded to float32
    got = cache.magnitudes[..., :4].cpu().double()
    assert torch.equal(got.isnan(), expected.isnan()) and bool(got.isnan()[0, 0, 1])
    assert torch.equal(got.isinf(), expected.isinf())
    finite = expected.isfinite()
    torch.testing.assert_close(got[finite], expected[finite], rtol=1e-5, atol=0)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_new_tokens_in_the_projection_layout_are_appended_as_given(backend, device, monkeypatch):
    """A model's projections come out `[B, T, Hkv, D]`: the cache receives their transposed, strided views."""
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    gen = torch.Generator().manual_seed(3)
    new_keys = torch.randn(2, 3, 4, 64, generator=gen).to(device).transpose(1, 2)  # [B, Hkv, T, D]
    new_values = (torch.randn(2, 3, 4, 64, generator=gen) * 4).to(device).transpose(1, 2)
    assert not new_keys.is_contiguous()
    cache = _poisoned_cache(2, 4, 16, 64, [5, 13], torch.float32, device)
    append_(cache, new_keys, new_values, value_stat="range")
    assert cache.lengths.tolist() == [8, 16]
    for b, start in enumerate([5, 13]):
        assert torch.equal(cache.keys[b, :, start : start + 3], new_keys[b])
        assert torch.equal(cache.values[b, :, start : start + 3], new_values[b])
        value_range = new_values[b].double().amax(-1) - new_values[b].double().amin(-1)
        torch.testing.assert_close(cache.magnitudes[b, :, start : start + 3].double(), value_range, rtol=1e-6, atol=0)
