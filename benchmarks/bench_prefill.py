"""Prefill attention: VaSE's kernel with and without window scores against what users run instead.

Providers per shape (causal, bf16, Qwen3 head layouts): `vase` (score_window 0), `vase+scores`
(score_window 64: the prefill kernel also emits the window importance), PyTorch SDPA
(`sdpa`: the flash backend on CUDA), flash-attn's `flash_attn_func` when installed, and the
PyTorch reference (`reference`, an explicit softmax over blocks of queries: timed only up to 8k
tokens, to keep the suite short).
The launchers are timed directly. TFLOP/s counts the causal half (`2 B Hq T^2 D`) for every
provider, the score pass of `vase+scores` included in its time but not in its work.
"""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import profiles, providers, timing
from benchmarks.records import MATMUL, Record
from benchmarks.shapes import PROMPT_LENGTHS, QWEN3, TINY, WINDOW, PrefillShape
from vase_triton import reference
from vase_triton.kernels.prefill_attention import prefill_attention_triton

pytestmark = timing.REPLAYED

SUITE = "prefill"
KERNEL = "prefill attention (causal)"
REFERENCE_MAX_TOKENS = 8192

SHAPES = profiles.pick({
    "smoke": [PrefillShape(TINY, 1, 128)],
    "gpu": [PrefillShape(QWEN3["Qwen3-8B"], 1, tokens) for tokens in (2048, 8192, 32768)]
    + [PrefillShape(QWEN3["Qwen3-30B-A3B"], 1, 8192)],
    "full": [PrefillShape(layout, 1, tokens) for layout in QWEN3.values() for tokens in PROMPT_LENGTHS],
})  # fmt: skip
SCORE_WINDOW = min(WINDOW, min(shape.tokens for shape in SHAPES))
ALTERNATIVES = ("sdpa", "flash-attn", "reference")

_inputs: dict[PrefillShape, tuple[torch.Tensor, ...]] = {}


def prefill_inputs(shape: PrefillShape, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random bf16 `q [B, Hq, T, D]`, `k, v [B, Hkv, T, D]`, shared by the providers of one shape."""
    if shape not in _inputs:
        _inputs.clear()
        layout = shape.layout
        gen = torch.Generator(device=device).manual_seed(0)
        sizes = [(shape.batch, heads, shape.tokens, layout.head_dim) for heads in (layout.q_heads, layout.kv_heads)]
        q = torch.randn(sizes[0], generator=gen, device=device).bfloat16()
        k = torch.randn(sizes[1], generator=gen, device=device).bfloat16()
        v = torch.randn(sizes[1], generator=gen, device=device).bfloat16()
        _inputs[shape] = (q, k, v)
    return _inputs[shape]


def _record(shape: PrefillShape, provider: str, compare_to=(), **details) -> Record:
    return Record(
        SUITE, KERNEL, provider, shape.name, flops=shape.causal_flops(), roofline=MATMUL,
        compare_to=tuple(compare_to), details={"dtype": "bfloat16", **details},
    )  # fmt: skip


def _expected(shape: PrefillShape, device: torch.device) -> torch.Tensor:
    q, k, v = prefill_inputs(shape, device)
    out, _, _ = prefill_attention_triton(q, k, v, None, 1.0 / math.sqrt(shape.layout.head_dim), True, 0)
    return out.float()


@pytest.mark.parametrize("with_scores", [False, True], ids=["no_scores", "scores"])
@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_prefill_vase(benchmark, roofline, device, shape: PrefillShape, with_scores: bool):
    q, k, v = prefill_inputs(shape, device)
    window = SCORE_WINDOW if with_scores else 0
    scale = 1.0 / math.sqrt(shape.layout.head_dim)
    provider = "vase+scores" if with_scores else "vase"
    compare_to = ALTERNATIVES + (("vase",) if with_scores else ())
    record = _record(shape, provider, compare_to, score_window=window)
    out, lse, scores = timing.measure(
        benchmark, lambda: prefill_attention_triton(q, k, v, None, scale, True, window), record
    )
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    if with_scores:
        # Each of the window's queries adds one unit of probability per query head of the group.
        sums = scores.sum(dim=-1)
        torch.testing.assert_close(sums, torch.full_like(sums, float(window * shape.layout.group)), rtol=1e-3, atol=0)


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_prefill_sdpa(benchmark, roofline, device, shape: PrefillShape):
    q, k, v = prefill_inputs(shape, device)
    backend = torch.nn.attention.SDPBackend.FLASH_ATTENTION if device.type == "cuda" else None
    call, details = providers.sdpa(q, k, v, causal=True, backend=backend)
    out = timing.measure(benchmark, call, _record(shape, "sdpa", **details))
    torch.testing.assert_close(out.float(), _expected(shape, device), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_prefill_flash_attn(benchmark, roofline, device, shape: PrefillShape):
    if device.type != "cuda" or providers.flash_attn() is None:
        pytest.skip("flash-attn is not installed (or no CUDA device)")
    q, k, v = prefill_inputs(shape, device)
    call = providers.flash_attn_prefill(q, k, v, causal=True)
    out = timing.measure(benchmark, call, _record(shape, "flash-attn", version=providers.flash_attn().__version__))
    torch.testing.assert_close(out.transpose(1, 2).float(), _expected(shape, device), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_prefill_reference(benchmark, roofline, device, shape: PrefillShape):
    if shape.tokens > REFERENCE_MAX_TOKENS:
        pytest.skip(f"the reference's explicit softmax is timed only up to {REFERENCE_MAX_TOKENS} tokens")
    q, k, v = prefill_inputs(shape, device)
    scale = 1.0 / math.sqrt(shape.layout.head_dim)
    call = lambda: reference.prefill_attention(q, k, v, scale=scale, causal=True)  # noqa: E731
    out, _, _ = timing.measure(benchmark, call, _record(shape, "reference"))
    torch.testing.assert_close(out.float(), _expected(shape, device), rtol=2e-2, atol=2e-2)
