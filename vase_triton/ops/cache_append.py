"""Public cache-append op: argument checks, `torch.library` registration, backend dispatch.

`append_` validates shapes, dtypes and devices (never values: the counters stay on
device), then calls the custom op `vase_triton::append_`, which mutates the cache
buffers in place and runs the Triton kernel or the PyTorch reference as
`vase_triton.backend` decides. `append_op` is the op itself, unchecked, for a cache
layer's decode step (its buffers are checked when made, its inputs by `check_inputs`).
"""

from __future__ import annotations

import torch

from vase_triton import reference
from vase_triton.backend import use_triton
from vase_triton.cache_tensors import CacheTensors
from vase_triton.config import VALUE_STATS
from vase_triton.ops.library_op import library_op
from vase_triton.validation import CACHE_DTYPES, check_cache_tensors, check_rank, check_same_device, check_same_dtype


@library_op(
    "append_",
    mutates_args=("keys", "values", "magnitudes", "positions", "lengths", "next_positions"),
)
def append_op(
    keys: torch.Tensor,
    values: torch.Tensor,
    scores: torch.Tensor,
    magnitudes: torch.Tensor,
    positions: torch.Tensor,
    lengths: torch.Tensor,
    next_positions: torch.Tensor,
    new_keys: torch.Tensor,
    new_values: torch.Tensor,
    value_stat: str,
) -> None:
    cache = CacheTensors(keys, values, scores, magnitudes, positions, lengths, next_positions)
    if use_triton(keys.device):
        from vase_triton.kernels.cache_append import cache_append_triton

        cache_append_triton(cache, new_keys, new_values, value_stat)
        return
    reference.append_(cache, new_keys, new_values, value_stat=value_stat)


@append_op.register_fake
def _append_fake(keys, values, scores, magnitudes, positions, lengths, next_positions, new_keys, new_values, value_stat):
    return None


def append_(cache: CacheTensors, new_keys: torch.Tensor, new_values: torch.Tensor, *, value_stat: str) -> None:
    """Append `T_new` tokens to every sequence of a static KV cache, in place.

    Sequence `b` gets `new_keys[b]`, `new_values[b]` in slots `[lengths[b], lengths[b] + T_new)`
    of every KV head, their value magnitude (`value_stat` over D, in fp32) in `magnitudes` and
    positions `next_positions[b] + t` in `positions`; then `lengths[b]` and `next_positions[b]`
    advance by `T_new`. A sequence whose cache would overflow (`lengths[b] + T_new > N`), or
    whose length is negative, is left untouched, counters included. Scores are not touched. Everything is decided on device (no
    host reads), so the op can run inside `torch.compile` graphs and CUDA graphs.

    Args:
        cache: the layer's `CacheTensors` (keys/values `[B, Hkv, N, D]` fp16, bf16, fp32 or fp64).
        new_keys, new_values: `[B, Hkv, T_new, D]`, same dtype and device as `cache.keys`.
        value_stat: `range`, `absmax`, `l2` or `var`.
    """
    batch, kv_heads, _, head_dim = check_cache_tensors(cache, CACHE_DTYPES)
    check_rank("new_keys", new_keys, 4, "[B, Hkv, T_new, D]")
    check_rank("new_values", new_values, 4, "[B, Hkv, T_new, D]")
    check_same_dtype(("cache.keys", "new_keys", "new_values"), (cache.keys, new_keys, new_values))
    expected = (batch, kv_heads, new_keys.shape[2], head_dim)
    for name, tensor in (("new_keys", new_keys), ("new_values", new_values)):
        if tuple(tensor.shape) != expected:
            raise ValueError(
                f"{name}: expected shape [B, Hkv, T_new, D] = {list(expected)} matching the cache; "
                f"got {list(tensor.shape)}"
            )
    check_same_device(("cache.keys", "new_keys", "new_values"), (cache.keys, new_keys, new_values))
    if value_stat not in VALUE_STATS:
        raise ValueError(f"value_stat: expected one of {', '.join(VALUE_STATS)}; got {value_stat!r}")
    append_op(*cache, new_keys, new_values, value_stat)
