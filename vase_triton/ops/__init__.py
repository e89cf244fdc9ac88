"""Public ops. Shapes are `[B, H, T, D]`; each op has a twin in `vase_triton.reference`."""

from vase_triton.ops.attention import decode_attention, prefill_attention

__all__ = ["prefill_attention", "decode_attention"]
