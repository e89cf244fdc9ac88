"""Standard normal draws on the device, keyed by a stream key and a device-side eviction counter.

`_gaussian_kernel` fills a flat float32 buffer, `BLOCK_N` elements per program: element
`i` takes two of the philox words an eviction draws at offset `i` (`eviction_philox`:
counters `(i, eviction index, 0, 0)` under the stream's key) and turns them into one
normal by the Box-Muller transform. The eviction index is read from device memory, so a
draw captured in a CUDA graph is a fresh one at every replay.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vase_triton.kernels.eviction import eviction_philox

# The smallest normal float32: keeps log(u) finite (|z| <= 13.2).
_U_MIN = tl.constexpr(1.1754943508222875e-38)
_BLOCK_N = 1024  # elements per program


@triton.jit
def _gaussian_kernel(out_ptr, numel, philox_key, eviction_index_ptr, BLOCK_N: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    radius_bits, angle_bits, _, _ = eviction_philox(philox_key, offsets, eviction_index_ptr)
    radius = tl.sqrt(-2.0 * tl.log(tl.maximum(tl.uint_to_uniform_float(radius_bits), _U_MIN)))
    normal = radius * tl.cos(tl.uint_to_uniform_float(angle_bits) * 6.283185307179586)  # angle 2*pi*u
    tl.store(out_ptr + offsets, normal, mask=offsets < numel)


def gaussian_triton(out: torch.Tensor, seed: int, eviction_index: torch.Tensor) -> None:
    """Fill contiguous float32 `out` with N(0, 1) draws of stream key `seed` at `eviction_index` (`[1]` int64)."""
    numel = out.numel()
    if numel == 0:
        return
    _gaussian_kernel[(triton.cdiv(numel, _BLOCK_N),)](out, numel, seed, eviction_index, BLOCK_N=_BLOCK_N)
