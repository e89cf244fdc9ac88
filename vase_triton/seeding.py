"""Seeds of eviction randomness: one independent stream per (seed, layer, eviction, purpose).

Every random draw of an eviction (the Gumbel noise of sampling policies, the Gaussian
projection of `vase-dkv`) comes from a stream named by the user's `seed`, the layer,
the eviction counter of that layer and the purpose of the draw. Layers evict at the
same steps, so a stream that ignored the layer would keep the same slots in every layer.
"""

from __future__ import annotations

# Purposes of eviction draws: each gets its own stream for the same (seed, layer, eviction).
GUMBEL_STREAM = 0
PROJECTION_STREAM = 1

_MASK64 = 2**64 - 1


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def eviction_seed(seed: int, layer: int, eviction_index: int, stream: int = GUMBEL_STREAM) -> int:
    """A 63-bit seed for the draws of one eviction of one layer, in `[0, 2**63)`.

    Every input is folded in through splitmix64, so nearby tuples give unrelated seeds
    (the CPU generator and philox use all 64 bits; 63 keep it a non-negative int64).
    """
    for name, value in (("seed", seed), ("layer", layer), ("eviction_index", eviction_index), ("stream", stream)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name}: expected an int >= 0; got {value!r}")
    z = 0
    for value in (seed, layer, eviction_index, stream):
        z = _splitmix64(z ^ (value & _MASK64))
    return z >> 1
