"""Public mean-key-similarity op of `rkv`'s redundancy: argument checks and backend dispatch.

The Triton kernels (`vase_triton.kernels.key_similarity`) read the keys twice in their
own dtype; the PyTorch reference (`vase_triton.reference.mean_key_similarity`) builds
float32 unit keys. Eviction runs outside compiled graphs, so this is a plain function.
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
def mean_key_similarity(keys: torch.Tensor, lengths: torch.Tensor, *, window: int) -> torch.Tensor:
    """Each candidate key's mean cosine similarity to the other candidates of its row, 0 elsewhere.

    Args:
        keys: `[B, Hkv, N, D]` cache keys (fp16, bf16, fp32 or fp64; slots past the
            candidates are never read).
        lengths: `[B]` int32 valid slots per sequence; candidates are `[0, lengths[b] - window)`
            (values above `N` act as `N`; not checked, which would read them back to the host).
        window: recent slots that are not candidates, `>= 0`.

    Returns:
        `[B, Hkv, N]` float32.
    """
    check_rank("keys", keys, 4, "[B, Hkv, N, D]")
    check_float_dtype("keys", keys, CACHE_DTYPES)
    check_exact("lengths", lengths, (keys.shape[0],), torch.int32, "[B]")
    check_same_device(("keys", "lengths"), (keys, lengths))
    check_non_negative_int("window", window)
    if use_triton(keys.device):
        from vase_triton.kernels.key_similarity import mean_key_similarity_triton

        return mean_key_similarity_triton(keys, lengths, window)
    return reference.mean_key_similarity(keys, lengths, window=window).to(torch.float32)
