"""Seeds of the host-side random streams of eviction (the reference's uniforms, `vase-dkv` projections)."""

from __future__ import annotations


def eviction_generator_seed(seed: int, eviction_index: int) -> int:
    """A 64-bit generator seed mixing `(seed, eviction_index)` (splitmix64).

    Mixed rather than concatenated because the CPU generator keeps only the low 32 bits.
    """
    mask = 2**64 - 1
    z = ((seed << 32) + eviction_index + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)
