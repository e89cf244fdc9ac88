"""Public Gaussian draw of an eviction: argument checks and backend dispatch.

`standard_normal_` fills a tensor from one layer's stream at the eviction counter held on
the device (`vase_triton.seeding`): the Triton kernel reads the counter on the device, so
that an eviction drawing a `vase-dkv` projection can be captured in a CUDA graph; the
PyTorch reference reads it back and seeds a `torch.Generator`. The two backends draw
different numbers from the same distribution.
"""

from __future__ import annotations

import torch

from vase_triton import reference
from vase_triton.backend import use_triton
from vase_triton.ops.device_guard import on_tensors_device
from vase_triton.validation import check_exact, check_same_device


@on_tensors_device
def standard_normal_(out: torch.Tensor, *, seed: int, eviction_index: torch.Tensor) -> torch.Tensor:
    """Fill `out` with independent N(0, 1) draws, in place, and return it.

    Args:
        out: contiguous float32 tensor of any shape.
        seed: stream key in `[0, 2**63)` (`vase_triton.seeding.stream_key`).
        eviction_index: `[1]` int64 on `out`'s device, `>= 0`, the draw of the stream (not
            advanced; a negative one is refused by the reference, not checked by the kernel).
    """
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out: expected a torch.Tensor; got {type(out).__name__}")
    if out.dtype != torch.float32 or not out.is_contiguous():
        contiguous = out.is_contiguous()
        raise ValueError(f"out: expected a contiguous float32 tensor; got {out.dtype}, contiguous={contiguous}")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise ValueError(f"seed: expected an int in [0, 2**63); got {seed!r}")
    check_exact("eviction_index", eviction_index, (1,), torch.int64, "[1]")
    check_same_device(("out", "eviction_index"), (out, eviction_index))
    if use_triton(out.device):
        from vase_triton.kernels.gaussian import gaussian_triton

        gaussian_triton(out, seed, eviction_index)
    else:
        index = int(eviction_index.item())
        out.copy_(reference.standard_normal(out.shape, out.device, seed=seed, eviction_index=index))
    return out
