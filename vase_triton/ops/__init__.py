"""Public ops. Shapes are `[B, H, T, D]`; each op has a twin in `vase_triton.reference`."""

from vase_triton.ops.attention import candidate_attention, decode_attention, prefill_attention
from vase_triton.ops.cache_append import append_
from vase_triton.ops.eviction import evict_

__all__ = ["prefill_attention", "decode_attention", "candidate_attention", "append_", "evict_"]
