"""Attention benchmarks: prefill with and without window scores, PyTorch SDPA, split-K decode.

On CUDA the shapes are the production ones (Qwen3-8B heads: 32 query, 8 KV, D=128,
bf16): causal prefill at T=8192 and decode at B=16 over C=4160 slots. Without CUDA
the same tests run once on tiny shapes through the Triton interpreter as a smoke test.
The launchers are timed directly: the public ops add argument checks that read
`kv_lens` / `cache_lens` back to the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from reporting import Timing, per_call, row_from_benchmark, run_timed
from vase_triton.kernels.decode_attention import decode_attention_triton
from vase_triton.kernels.prefill_attention import prefill_attention_triton

ON_GPU = torch.cuda.is_available()
SUITE = "attention"


@dataclass(frozen=True)
class PrefillShape:
    batch: int
    q_heads: int
    kv_heads: int
    seq_len: int
    head_dim: int
    window: int

    def describe(self) -> str:
        return (
            f"B{self.batch} Hq{self.q_heads} Hkv{self.kv_heads} T{self.seq_len} D{self.head_dim} "
            f"W{self.window} bf16 causal"
        )

    def causal_flops(self) -> float:
        # QK^T and PV over the causal half: 2 matmuls x 2 flops x T^2/2 pairs x D.
        return 2.0 * self.batch * self.q_heads * self.seq_len * self.seq_len * self.head_dim


@dataclass(frozen=True)
class DecodeShape:
    batch: int
    q_heads: int
    kv_heads: int
    capacity: int
    head_dim: int

    def describe(self, scores: bool) -> str:
        return (
            f"B{self.batch} Hq{self.q_heads} Hkv{self.kv_heads} C{self.capacity} D{self.head_dim} bf16"
            f"{' +scores' if scores else ''}"
        )

    def bytes_moved(self, scores: bool) -> float:
        cache = 2.0 * self.batch * self.kv_heads * self.capacity * self.head_dim * 2  # K and V, bf16
        query_out = 2.0 * self.batch * self.q_heads * self.head_dim * 2
        score_rw = 2.0 * self.batch * self.kv_heads * self.capacity * 4 if scores else 0.0
        return cache + query_out + score_rw


if ON_GPU:
    TIMING_PREFILL = Timing(rounds=20, warmup_rounds=3, calls=2)
    TIMING_DECODE = Timing(rounds=30, warmup_rounds=5, calls=20)
    PREFILL = [PrefillShape(1, 32, 8, 8192, 128, 0), PrefillShape(1, 32, 8, 8192, 128, 64)]
    DECODE = DecodeShape(16, 32, 8, 4160, 128)
else:
    TIMING_PREFILL = TIMING_DECODE = Timing(rounds=1, warmup_rounds=0, calls=1)
    PREFILL = [PrefillShape(1, 4, 1, 128, 64, 0), PrefillShape(1, 4, 1, 128, 64, 64)]
    DECODE = DecodeShape(2, 4, 1, 257, 64)


def prefill_inputs(shape: PrefillShape, device: torch.device):
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(shape.batch, shape.q_heads, shape.seq_len, shape.head_dim, generator=gen, device=device)
    k = torch.randn(shape.batch, shape.kv_heads, shape.seq_len, shape.head_dim, generator=gen, device=device)
    v = torch.randn(shape.batch, shape.kv_heads, shape.seq_len, shape.head_dim, generator=gen, device=device)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


@pytest.mark.parametrize("shape", PREFILL, ids=[f"W{s.window}" for s in PREFILL])
def test_prefill(benchmark, record_row, device, shape: PrefillShape):
    q, k, v = prefill_inputs(shape, device)
    scale = 1.0 / math.sqrt(shape.head_dim)
    out, lse, scores = run_timed(
        benchmark, TIMING_PREFILL, lambda: prefill_attention_triton(q, k, v, None, scale, True, shape.window)
    )
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    if shape.window > 0:
        group = shape.q_heads // shape.kv_heads
        sums = scores.sum(dim=-1)
        torch.testing.assert_close(sums, torch.full_like(sums, float(shape.window * group)), rtol=1e-3, atol=0.0)
    row = row_from_benchmark(
        benchmark, SUITE, f"prefill triton W={shape.window}", shape.describe(), flops=shape.causal_flops()
    )
    record_row(per_call(row, TIMING_PREFILL.calls))


def test_prefill_sdpa(benchmark, record_row, device):
    shape = PREFILL[0]
    q, k, v = prefill_inputs(shape, device)
    group = shape.q_heads // shape.kv_heads
    keys, values = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    backends = [torch.nn.attention.SDPBackend.FLASH_ATTENTION] if ON_GPU else [torch.nn.attention.SDPBackend.MATH]

    def sdpa():
        with torch.nn.attention.sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q, keys, values, is_causal=True)

    out = run_timed(benchmark, TIMING_PREFILL, sdpa)
    expected, _, _ = prefill_attention_triton(q, k, v, None, 1.0 / math.sqrt(shape.head_dim), True, 0)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
    name = "prefill torch SDPA (flash)" if ON_GPU else "prefill torch SDPA (math)"
    row = row_from_benchmark(benchmark, SUITE, name, shape.describe(), flops=shape.causal_flops())
    record_row(per_call(row, TIMING_PREFILL.calls))


@pytest.mark.parametrize("with_scores", [False, True], ids=["no_scores", "scores"])
def test_decode(benchmark, record_row, device, with_scores: bool):
    shape = DECODE
    gen = torch.Generator(device=device).manual_seed(0)
    cache_shape = (shape.batch, shape.kv_heads, shape.capacity, shape.head_dim)
    q = torch.randn(shape.batch, shape.q_heads, 1, shape.head_dim, generator=gen, device=device).bfloat16()
    k_cache = torch.randn(cache_shape, generator=gen, device=device).bfloat16()
    v_cache = torch.randn(cache_shape, generator=gen, device=device).bfloat16()
    cache_lens = torch.full((shape.batch,), shape.capacity, dtype=torch.int32, device=device)
    scores = torch.zeros(shape.batch, shape.kv_heads, shape.capacity, device=device) if with_scores else None
    scale = 1.0 / math.sqrt(shape.head_dim)

    steps = []

    def step():
        steps.append(1)
        return decode_attention_triton(q, k_cache, v_cache, cache_lens, scale, scores)

    out = run_timed(benchmark, TIMING_DECODE, step)
    assert torch.isfinite(out).all()
    if with_scores:
        # Every step adds one unit of probability per query head of the group.
        sums = scores.sum(dim=-1)
        expected = float(len(steps) * (shape.q_heads // shape.kv_heads))
        torch.testing.assert_close(sums, torch.full_like(sums, expected), rtol=1e-3, atol=0.0)
    row = row_from_benchmark(
        benchmark,
        SUITE,
        "decode triton split-K",
        shape.describe(with_scores),
        bytes_moved=shape.bytes_moved(with_scores),
    )
    record_row(per_call(row, TIMING_DECODE.calls))
