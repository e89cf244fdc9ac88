"""Public projected-energy op of `vase-dkv`: argument checks and backend dispatch.

`projected_energy` scores every candidate slot of a cache layer by `||k G||² · ||v G||²`
for its row's Gaussian projection `G`; the Triton kernel reads the cache once in its own
dtype, the PyTorch reference (`vase_triton.reference.projected_energy`) converts it to
float32. Eviction runs outside compiled graphs, so this is a plain function.
"""

from __future__ import annotations

import torch

from vase_triton import reference
from vase_triton.backend import use_triton
from vase_triton.ops.device_guard import on_tensors_device
from vase_triton.validation import (
    CACHE_DTYPES, check_exact, check_float_dtype, check_non_negative_int, check_rank, check_same_device,
)


@on_tensors_device
def projected_energy(
    keys: torch.Tensor, values: torch.Tensor, projection: torch.Tensor, lengths: torch.Tensor, *, window: int
) -> torch.Tensor:
    """`||k G||² · ||v G||²` of every candidate slot `[0, lengths[b] - window)`, 0 elsewhere.

    Args:
        keys, values: `[B, Hkv, N, D]` cache buffers (fp16, bf16, fp32 or fp64; slots past
            the candidates are never read).
        projection: `[B, Hkv, D, R]` float32, one `G` per row.
        lengths: `[B]` int32 valid slots per sequence (values above `N` act as `N`; not
            checked, which would read them back to the host).
        window: recent slots that are not candidates, `>= 0`.

    Returns:
        `[B, Hkv, N]` float32.
    """
    check_rank("keys", keys, 4, "[B, Hkv, N, D]")
    check_float_dtype("keys", keys, CACHE_DTYPES)
    batch, kv_heads, num_slots, head_dim = keys.shape
    check_exact("values", values, tuple(keys.shape), keys.dtype, "[B, Hkv, N, D]")
    check_rank("projection", projection, 4, "[B, Hkv, D, R]")
    rank = projection.shape[-1]
    check_exact("projection", projection, (batch, kv_heads, head_dim, rank), torch.float32, "[B, Hkv, D, R]")
    check_exact("lengths", lengths, (batch,), torch.int32, "[B]")  # values stay on the device
    check_same_device(("keys", "values", "projection", "lengths"), (keys, values, projection, lengths))
    check_non_negative_int("window", window)
    if rank < 1:
        raise ValueError(f"projection: expected a rank R >= 1; got shape {list(projection.shape)}")
    if use_triton(keys.device):
        from vase_triton.kernels.projected_energy import projected_energy_triton

        return projected_energy_triton(keys, values, projection, lengths, window)
    return reference.projected_energy(keys, values, projection, lengths, window=window).to(torch.float32)
