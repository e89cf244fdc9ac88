"""Seeds of eviction randomness: one independent stream per (seed, layer, purpose), one draw per eviction.

Every random draw of an eviction (the Gumbel noise of sampling policies, the Gaussian
projection of `vase-dkv`) comes from the stream of the user's `seed`, the layer, the
purpose of the draw and (under tensor parallelism) the first KV head the process holds,
at the eviction counter of that layer. Layers evict at the same
steps, so a stream that ignored the layer would keep the same slots in every layer.

The Triton kernels key philox with `stream_key(seed, layer, stream)` and put the eviction
counter in its counter words, read from a device tensor: the key is the same at every
eviction, so an eviction captured once in a CUDA graph draws fresh numbers at every replay.
Draws from a `torch.Generator` (the PyTorch reference) seed it with
`generator_seed(key, eviction_index)`.
"""

from __future__ import annotations

from vase_triton.validation import check_non_negative_int

# Purposes of eviction draws: each gets its own stream for the same (seed, layer).
GUMBEL_STREAM = 0
PROJECTION_STREAM = 1

_MASK64 = 2**64 - 1


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _fold(**values: int) -> int:
    """The inputs folded in through splitmix64, so that nearby tuples give unrelated results, in `[0, 2**63)`.

    The CPU generator and philox use all 64 bits; 63 keep the result a non-negative int64.
    """
    z = 0
    for name, value in values.items():
        z = _splitmix64(z ^ (check_non_negative_int(name, value) & _MASK64))
    return z >> 1


def stream_key(seed: int, layer: int, stream: int = GUMBEL_STREAM, kv_head_offset: int = 0) -> int:
    """The 63-bit key of one layer's stream of draws for one purpose (`GUMBEL_STREAM`, `PROJECTION_STREAM`).

    `kv_head_offset`: the model's index of the first KV head the cache holds (non-zero on
    the other ranks of a tensor-parallel model), so that ranks, whose local heads are
    numbered from 0 alike, draw independently. A cache of all the heads keeps the key it
    has always had.
    """
    if kv_head_offset == 0:
        return _fold(seed=seed, layer=layer, stream=stream)
    return _fold(seed=seed, layer=layer, stream=stream, kv_head_offset=kv_head_offset)


def generator_seed(key: int, eviction_index: int) -> int:
    """The 63-bit seed of a `torch.Generator` for the draws of eviction `eviction_index` of stream `key`."""
    return _fold(key=key, eviction_index=eviction_index)
