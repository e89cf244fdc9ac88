"""Cache layers in a known state for the eviction and score-mode suites."""

from __future__ import annotations

import math

import torch

from benchmarks.shapes import CacheShape
from vase_triton.cache import VaSECacheLayer
from vase_triton.config import VaSEConfig


def prefilled_layer(shape: CacheShape, config: VaSEConfig, tokens: int, device: torch.device) -> VaSECacheLayer:
    """A `VaSECacheLayer` of `shape` holding a random bf16 prompt of `tokens` tokens (`<= C`, so uncompressed)."""
    layout = shape.layout
    layer = VaSECacheLayer(
        config, batch_size=shape.batch, num_kv_heads=layout.kv_heads, head_dim=layout.head_dim,
        dtype=torch.bfloat16, device=device, num_query_heads=layout.q_heads,
    )  # fmt: skip
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(shape.batch, layout.q_heads, tokens, layout.head_dim, generator=gen, device=device).bfloat16()
    k = torch.randn(shape.batch, layout.kv_heads, tokens, layout.head_dim, generator=gen, device=device).bfloat16()
    v = torch.randn(shape.batch, layout.kv_heads, tokens, layout.head_dim, generator=gen, device=device).bfloat16()
    layer.prefill(q, k, v, scale=scale_of(shape))
    return layer


def scale_of(shape: CacheShape) -> float:
    return 1.0 / math.sqrt(shape.layout.head_dim)


def step_inputs(shape: CacheShape, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random bf16 `q [B, Hq, 1, D]`, `k, v [B, Hkv, 1, D]` of one decode step."""
    layout = shape.layout
    gen = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(shape.batch, layout.q_heads, 1, layout.head_dim, generator=gen, device=device).bfloat16()
    k = torch.randn(shape.batch, layout.kv_heads, 1, layout.head_dim, generator=gen, device=device).bfloat16()
    v = torch.randn(shape.batch, layout.kv_heads, 1, layout.head_dim, generator=gen, device=device).bfloat16()
    return q, k, v
