"""The `vase` attention function registered with transformers' `AttentionInterface`.

transformers calls it from each attention module with the states after q/k-norm and
RoPE. With a `VaSECache` (handed down as the `vase_cache` keyword by the patched
model forward) it runs attention over the static cache; without one (e.g.
`use_cache=False` or a `DynamicCache`) it is plain causal attention over the keys given.
"""

from __future__ import annotations

from typing import Optional

import torch

from vase_triton.ops.attention import prefill_attention

ATTENTION_NAME = "vase"


def vase_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    scaling: Optional[float] = None,
    dropout: float = 0.0,
    vase_cache=None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention for one layer.

    Args:
        query: `[B, Hq, T, D]`; key, value: `[B, Hkv, T, D]` (new tokens with a VaSE cache,
            all tokens so far otherwise).

    Returns:
        `([B, T, Hq, D], None)`, the layout transformers' attention modules expect.
    """
    if dropout:
        raise ValueError(f"dropout: the vase attention is for inference and supports no dropout; got {dropout}")
    if vase_cache is not None:
        out = vase_cache.attend(module.layer_idx, query, key, value, scaling)
    else:
        out, _, _ = prefill_attention(query, key, value, scale=scaling, causal=True)
    return out.transpose(1, 2), None


def register_attention() -> None:
    """Make `attn_implementation="vase"` known to transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, vase_attention_forward)
