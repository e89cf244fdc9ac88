"""Decode attention: one step over VaSE's static cache against attention over a dense cache.

Providers per shape (bf16, Qwen3 head layouts, every sequence holding all `C` slots):
`vase` (split-K kernel, preallocated workspace as in `VaSECacheLayer`), `vase+scores`
(the step also adds its probabilities into the `[B, Hkv, C]` score buffer: the `emitted`
score mode), PyTorch SDPA over a dense `[B, Hkv, C, D]` cache (`sdpa`, PyTorch's backend
choice, `enable_gqa`), flash-attn's `flash_attn_with_kvcache` when installed, and the PyTorch
reference. GB/s counts the keys and values of every slot plus query and output (and, for
`vase+scores`, the fp32 logits and scores it writes and reads).

`vase, S splits` rows time the same kernel with its key splits per (sequence, KV head)
forced (the heuristic's tiles otherwise; S counts the non-empty splits of whole key blocks
that 1, 2, 4, ..., 64 requested splits leave), at batches 1, 16 and 64 and the 4-KV-head
layout: against the `vase` row of the same shape they show what the heuristic's split count
(recorded in that row's details) leaves on the table. They run last, so that a time-limited
run keeps the comparisons with the alternatives.

On CUDA every provider is timed as replays of one step captured in a CUDA graph
(`timing.graph_samples`, L2 flushed before each replay): decode steps run under CUDA graphs
in generation (`compile_mode="reduce-overhead"`, and transformers' compiled `StaticCache`),
so the host's launch overhead, which eager calls pay and which differs between a Triton
launcher and a PyTorch op, is left out for all of them alike.
"""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import profiles, providers, timing
from benchmarks.records import COPY, DECODE_KERNEL, DECODE_SUITE, Record
from benchmarks.shapes import BATCH_SIZES, BUDGETS, QWEN3, TINY, CacheShape
from vase_triton import reference
from vase_triton.kernels.decode_attention import decode_attention_triton, decode_splits, decode_workspace

pytestmark = timing.REPLAYED

SUITE = DECODE_SUITE
KERNEL = DECODE_KERNEL

_QWEN3_8B = QWEN3["Qwen3-8B"]
SHAPES = profiles.pick({
    "smoke": [CacheShape(TINY, 2, 193), CacheShape(TINY, 2, 48, 16)],
    "gpu": [CacheShape(_QWEN3_8B, batch, 4096) for batch in BATCH_SIZES]
    + [CacheShape(_QWEN3_8B, 16, budget) for budget in (2048, 8192)]
    + [CacheShape(QWEN3["Qwen3-30B-A3B"], 16, 4096)],
    "full": [
        CacheShape(layout, batch, budget) for layout in QWEN3.values() for batch in BATCH_SIZES for budget in BUDGETS
    ],
})  # fmt: skip
ALTERNATIVES = ("sdpa", "flash-attn", "reference")
SPLIT_SHAPES = profiles.pick({
    "smoke": [CacheShape(TINY, 2, 193)],
    "gpu": [CacheShape(_QWEN3_8B, batch, 4096) for batch in (1, 16, 64)] + [CacheShape(QWEN3["Qwen3-30B-A3B"], 16, 4096)],
    "full": [CacheShape(layout, batch, 4096) for layout in QWEN3.values() for batch in BATCH_SIZES],
})  # fmt: skip
SPLIT_COUNTS = (1, 2, 4, 8, 16, 32, 64)

_inputs: dict[CacheShape, tuple[torch.Tensor, ...]] = {}


def decode_inputs(shape: CacheShape, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Random bf16 `q [B, Hq, 1, D]`, full `k_cache, v_cache [B, Hkv, C, D]` and `cache_lens [B]` = C."""
    if shape not in _inputs:
        _inputs.clear()
        layout = shape.layout
        gen = torch.Generator(device=device).manual_seed(0)
        cache = (shape.batch, layout.kv_heads, shape.capacity, layout.head_dim)
        q = torch.randn(shape.batch, layout.q_heads, 1, layout.head_dim, generator=gen, device=device).bfloat16()
        k_cache = torch.randn(cache, generator=gen, device=device).bfloat16()
        v_cache = torch.randn(cache, generator=gen, device=device).bfloat16()
        cache_lens = torch.full((shape.batch,), shape.capacity, dtype=torch.int32, device=device)
        _inputs[shape] = (q, k_cache, v_cache, cache_lens)
    return _inputs[shape]


def _record(shape: CacheShape, provider: str, compare_to=(), *, emit_scores: bool = False, **details) -> Record:
    return Record(
        SUITE, KERNEL, provider, shape.name, bytes_moved=shape.decode_bytes(emit_scores=emit_scores), roofline=COPY,
        compare_to=tuple(compare_to), details={"dtype": "bfloat16", **details},
    )  # fmt: skip


def _expected(shape: CacheShape, device: torch.device) -> torch.Tensor:
    q, k_cache, v_cache, cache_lens = decode_inputs(shape, device)
    scale = 1.0 / math.sqrt(shape.layout.head_dim)
    return decode_attention_triton(q, k_cache, v_cache, cache_lens, scale, None).float()


@pytest.mark.parametrize("with_scores", [False, True], ids=["no_scores", "scores"])
@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_decode_vase(benchmark, roofline, device, shape: CacheShape, with_scores: bool):
    q, k_cache, v_cache, cache_lens = decode_inputs(shape, device)
    layout = shape.layout
    scale = 1.0 / math.sqrt(layout.head_dim)
    workspace = decode_workspace(layout.q_heads, k_cache, q.dtype, emit_scores=with_scores)
    scores = torch.zeros(shape.batch, layout.kv_heads, shape.capacity, device=device) if with_scores else None

    def step() -> torch.Tensor:
        return decode_attention_triton(q, k_cache, v_cache, cache_lens, scale, scores, workspace=workspace)

    provider = "vase+scores" if with_scores else "vase"
    compare_to = ALTERNATIVES + (("vase",) if with_scores else ())
    splits = decode_splits(layout.q_heads, k_cache, q.dtype, emit_scores=with_scores)
    record = _record(shape, provider, compare_to, emit_scores=with_scores, num_splits=splits)
    out = timing.measure(benchmark, step, record, graph=True)
    assert torch.isfinite(out).all()
    if with_scores:
        # One more step into cleared scores adds one unit of probability per query head of the group.
        scores.zero_()
        step()
        sums = scores.sum(dim=-1)
        torch.testing.assert_close(sums, torch.full_like(sums, float(layout.group)), rtol=1e-3, atol=0)


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_decode_sdpa(benchmark, roofline, device, shape: CacheShape):
    q, k_cache, v_cache, _ = decode_inputs(shape, device)
    call, details = providers.sdpa(q, k_cache, v_cache, causal=False, backend=None)
    out = timing.measure(benchmark, call, _record(shape, "sdpa", **details), graph=True)
    torch.testing.assert_close(out.float(), _expected(shape, device), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_decode_flash_attn(benchmark, roofline, device, shape: CacheShape):
    if device.type != "cuda" or providers.flash_attn() is None:
        pytest.skip("flash-attn is not installed (or no CUDA device)")
    call = providers.flash_attn_decode(*decode_inputs(shape, device))
    record = _record(shape, "flash-attn", version=providers.flash_attn().__version__)
    out = timing.measure(benchmark, call, record, graph=True)
    torch.testing.assert_close(out.transpose(1, 2).float(), _expected(shape, device), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_decode_reference(benchmark, roofline, device, shape: CacheShape):
    q, k_cache, v_cache, cache_lens = decode_inputs(shape, device)
    scale = 1.0 / math.sqrt(shape.layout.head_dim)
    call = lambda: reference.decode_attention(q, k_cache, v_cache, cache_lens, scale=scale)  # noqa: E731
    out = timing.measure(benchmark, call, _record(shape, "reference"), graph=True)
    torch.testing.assert_close(out.float(), _expected(shape, device), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("requested", SPLIT_COUNTS, ids=[f"splits{count}" for count in SPLIT_COUNTS])
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=[s.name for s in SPLIT_SHAPES])
def test_decode_vase_splits(benchmark, roofline, device, shape: CacheShape, requested: int):
    q, k_cache, v_cache, cache_lens = decode_inputs(shape, device)
    layout = shape.layout
    scale = 1.0 / math.sqrt(layout.head_dim)
    # Whole key blocks per split: fewer splits may be non-empty than requested.
    left = {count: decode_splits(layout.q_heads, k_cache, q.dtype, emit_scores=False, num_splits=count)
            for count in SPLIT_COUNTS if count <= requested}  # fmt: skip
    splits = left.pop(requested)
    if splits in left.values():
        pytest.skip(f"{requested} splits requested leave {splits} non-empty, as a smaller request does")
    workspace = decode_workspace(layout.q_heads, k_cache, q.dtype, emit_scores=False, num_splits=requested)

    def step() -> torch.Tensor:
        return decode_attention_triton(
            q, k_cache, v_cache, cache_lens, scale, None, num_splits=requested, workspace=workspace
        )

    record = _record(shape, f"vase, {splits} split{'' if splits == 1 else 's'}", ("vase",), num_splits=splits)
    out = timing.measure(benchmark, step, record, graph=True)
    expected = reference.decode_attention(q, k_cache, v_cache, cache_lens, scale=scale)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
