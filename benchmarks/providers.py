"""The attention a user would run instead of ours: PyTorch SDPA and flash-attn, set up once per shape.

Each factory takes VaSE's `[B, H, T, D]` tensors, prepares the provider's own layout
outside the timed region, and returns a zero-argument call plus what it ran
(`details` for the record). flash-attn is optional: `flash_attn()` is None when it is not
installed, and its rows are then absent from the report.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def flash_attn() -> Optional[Any]:
    """The `flash_attn` module, or None when it is not installed."""
    try:
        import flash_attn as module
    except ImportError:
        return None
    return module


def sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, backend: Optional[SDPBackend]
) -> tuple[Callable[[], torch.Tensor], dict[str, Any]]:
    """`F.scaled_dot_product_attention` over `q [B, Hq, Tq, D]`, `k, v [B, Hkv, Tk, D]`.

    Uses `enable_gqa=True` when `backend` (None: PyTorch's choice) accepts it; otherwise K/V
    are expanded to `Hq` heads once, outside the timed call. Returns the call and details.
    """

    def call_with(keys: torch.Tensor, values: torch.Tensor, gqa: bool) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
                return F.scaled_dot_product_attention(q, keys, values, is_causal=causal, enable_gqa=gqa)

        return call

    details = {"backend": backend.name if backend is not None else "auto"}
    native = call_with(k, v, gqa=True)
    try:
        native()
    except RuntimeError:
        group = q.shape[1] // k.shape[1]
        details["gqa"] = "K/V expanded to the query heads"
        return call_with(k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), gqa=False), details
    details["gqa"] = "enable_gqa"
    return native, details


def flash_attn_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> Callable[[], torch.Tensor]:
    """flash-attn's `flash_attn_func` on `[B, T, H, D]` copies of the inputs; its output is `[B, Tq, Hq, D]`."""
    module = flash_attn()
    q_, k_, v_ = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return lambda: module.flash_attn_func(q_, k_, v_, causal=causal)


def flash_attn_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_lens: torch.Tensor
) -> Callable[[], torch.Tensor]:
    """flash-attn's `flash_attn_with_kvcache` over `[B, C, Hkv, D]` copies of the cache; output `[B, 1, Hq, D]`."""
    module = flash_attn()
    q_, k_, v_ = (t.transpose(1, 2).contiguous() for t in (q, k_cache, v_cache))
    lens = cache_lens.to(torch.int32)
    return lambda: module.flash_attn_with_kvcache(q_, k_, v_, cache_seqlens=lens)
