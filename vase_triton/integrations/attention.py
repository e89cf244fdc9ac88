"""The `vase` attention functions registered with transformers' `AttentionInterface`.

transformers calls them from each attention module with the states after q/k-norm and
RoPE. With a `VaSECache` (handed down as the `vase_cache` keyword by the patched model
forward) attention runs over the static cache. Without one (no cache, `use_cache=False`,
a `DynamicCache`, the inner model called directly) they are exactly the attention the
model had before patching: its implementation's function with its implementation's
mask (padding, packed sequences), because each original implementation gets its own
registered name whose mask function is the original's.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

import torch
from transformers.utils import logging

ATTENTION_NAME = "vase"
_logger = logging.get_logger(__name__)


def attention_name(original: Optional[str]) -> str:
    """The registered name that runs VaSE over `original` (`vase` over sdpa, `vase_over_<name>` otherwise).

    `flash` is spelled out of the name: transformers gives names containing it special
    checks meant for flash-attention kernels.
    """
    if original in (None, "sdpa"):
        return ATTENTION_NAME
    return "vase_over_" + original.replace("flash_attention", "fa")


def _original_attention(module: torch.nn.Module, original: Optional[str]) -> Callable:
    """The function the unpatched module would call: its modeling file's eager attention, or the registered one."""
    from transformers import AttentionInterface

    if original in (None, "eager"):
        return sys.modules[type(module).__module__].eager_attention_forward
    return AttentionInterface()[original]


def _make_attention(original: Optional[str]) -> Callable:
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
            query: `[B, Hq, T, D]`; key, value: `[B, Hkv, T, D]` (the new tokens with a VaSE
                cache, all tokens so far otherwise).

        Returns:
            `([B, T, Hq, D], None)`, the layout transformers' attention modules expect.
        """
        if vase_cache is None:
            return _original_attention(module, original)(
                module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
            )
        if dropout:
            raise ValueError(f"dropout: the VaSE cache path is for inference and supports no dropout; got {dropout}")
        if kwargs.get("output_attentions", False):
            _logger.warning_once(
                "`vase` attention does not return attention weights: with `output_attentions=True`, the layers "
                "that run over a VaSECache add nothing to the outputs' `attentions`."
            )
        out = vase_cache.attend(module.layer_idx, query, key, value, scaling)
        return out.transpose(1, 2), None

    return vase_attention_forward


def register_attention(original: Optional[str]) -> str:
    """Register (idempotently) the VaSE attention over `original` and its mask function; returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = attention_name(original)
    AttentionInterface.register(name, _make_attention(original))
    masks = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    mask_source = "eager" if original is None else original
    if mask_source in masks:
        AttentionMaskInterface.register(name, masks[mask_source])
    return name
