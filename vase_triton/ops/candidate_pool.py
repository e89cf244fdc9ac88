"""Public candidate-pool op of the window policies' importance: argument checks and backend dispatch.

The Triton kernel (`vase_triton.kernels.candidate_pool`) pools in one pass; the PyTorch
reference (`vase_triton.reference.pooled_candidates`) masks, pools with `avg_pool1d` and
masks again. Both give the same bits. Eviction runs outside compiled graphs, so this is a
plain function.
"""

from __future__ import annotations

import torch

from vase_triton import reference
from vase_triton.backend import use_triton
from vase_triton.ops.device_guard import on_tensors_device
from vase_triton.validation import check_exact, check_non_negative_int, check_rank, check_same_device


@on_tensors_device
def pooled_candidates(attention: torch.Tensor, lengths: torch.Tensor, *, window: int, width: int) -> torch.Tensor:
    """Average pool of width `width` along each row's candidates; 0 outside them.

    Args:
        attention: `[B, Hkv, N]` float32 observed attention (slots past the candidates are
            never read).
        lengths: `[B]` int32 valid slots per sequence; candidates are `[0, lengths[b] - window)`
            (values above `N` act as `N`; not checked, which would read them back to the host).
        window: recent slots that are not candidates, `>= 0`.
        width: odd pool width `>= 1`; slots past either end of the candidates count as 0 and
            the divisor is always `width`.

    Returns:
        `[B, Hkv, N]` float32.
    """
    check_rank("attention", attention, 3, "[B, Hkv, N]")
    check_exact("attention", attention, tuple(attention.shape), torch.float32, "[B, Hkv, N]")
    check_exact("lengths", lengths, (attention.shape[0],), torch.int32, "[B]")
    check_same_device(("attention", "lengths"), (attention, lengths))
    check_non_negative_int("window", window)
    if isinstance(width, bool) or not isinstance(width, int) or width < 1 or width % 2 == 0:
        raise ValueError(f"width: expected an odd int >= 1; got {width!r}")
    if use_triton(attention.device):
        from vase_triton.kernels.candidate_pool import pooled_candidates_triton

        return pooled_candidates_triton(attention, lengths, window, width)
    return reference.pooled_candidates(attention, lengths, window=window, width=width)
