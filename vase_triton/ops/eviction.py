"""Public eviction op: argument checks, `torch.library` registration, backend dispatch.

`evict_` validates its arguments, then calls the custom op `vase_triton::evict_`, which
mutates the cache tensors in place and runs the Triton kernels or the PyTorch reference
as `vase_triton.backend` decides. Eviction runs eagerly between compiled decode steps;
the fake implementation keeps it traceable all the same.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from vase_triton import reference
from vase_triton.backend import use_triton
from vase_triton.validation import (
    check_exact,
    check_float_dtype,
    check_head_dim,
    check_rank,
    check_same_device,
    check_same_dtype,
    check_tensor,
)


@torch.library.custom_op(
    "vase_triton::evict_",
    mutates_args=("keys", "values", "scores", "magnitudes", "positions", "lengths"),
)
def _evict_op(
    keys: torch.Tensor,
    values: torch.Tensor,
    scores: torch.Tensor,
    magnitudes: torch.Tensor,
    positions: torch.Tensor,
    lengths: torch.Tensor,
    importance: torch.Tensor,
    noise: Optional[torch.Tensor],
    budget: int,
    window: int,
    n_sink: int,
    n_protect: int,
    temperature: float,
    seed: int,
    eviction_index: int,
    keep_scores: bool,
    trigger_length: int,
) -> None:
    if use_triton(keys.device):
        from vase_triton.kernels.eviction import evict_triton

        evict_triton(
            keys, values, scores, magnitudes, positions, lengths, importance,
            budget, window, n_sink, n_protect, temperature, seed, eviction_index,
            keep_scores, trigger_length, noise,
        )
        return
    reference.evict_(
        keys, values, scores, magnitudes, positions, lengths, importance,
        budget=budget, window=window, n_sink=n_sink, n_protect=n_protect, temperature=temperature,
        seed=seed, eviction_index=eviction_index, keep_scores=keep_scores,
        trigger_length=trigger_length, noise=noise,
    )


@_evict_op.register_fake
def _evict_fake(
    keys, values, scores, magnitudes, positions, lengths, importance, noise,
    budget, window, n_sink, n_protect, temperature, seed, eviction_index, keep_scores, trigger_length,
):
    return None


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}: expected an int; got {type(value).__name__} {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name}: expected {low} <= {name} <= {high}; got {value}")
    return value


def evict_(
    keys: torch.Tensor,
    values: torch.Tensor,
    scores: torch.Tensor,
    magnitudes: torch.Tensor,
    positions: torch.Tensor,
    lengths: torch.Tensor,
    importance: torch.Tensor,
    *,
    budget: int,
    window: int,
    n_sink: int,
    n_protect: int,
    temperature: float,
    seed: int,
    eviction_index: int,
    keep_scores: bool = False,
    trigger_length: Optional[int] = None,
    noise: Optional[torch.Tensor] = None,
) -> None:
    """Value-aware Gumbel eviction of one cache layer, in place.

    Every sequence `b` with `n = lengths[b] >= trigger_length` is shrunk to `budget` slots,
    independently per KV head row: the `window` most recent slots `[n - window, n)` stay; of
    the candidates `[0, n - window)` exactly `budget - window` stay: the sinks `[0, n_sink)`,
    then the `n_protect` other candidates of largest magnitude, then the remaining ones of
    largest key `log(importance) / temperature - log(-log(u))` (`u` philox-seeded by
    `(seed, eviction_index)`, or `noise`); with `temperature == 0` the key is `importance`
    (deterministic top-k). Non-positive importance ranks below every positive one; ties go
    to the earlier slot. Survivors move to slots `[0, budget)` in temporal order with their
    keys, values, magnitudes, positions and, with `keep_scores`, scores (otherwise reset to
    0); slots `[budget, N)` get position -1 and score 0; `lengths[b] = budget`. Other
    sequences are not touched. Nothing is read back to the host.

    Args:
        keys, values: `[B, Hkv, N, D]` fp16, bf16 or fp32, same dtype.
        scores: `[B, Hkv, N]` float32 accumulated attention.
        magnitudes: `[B, Hkv, N]` float32 value magnitudes.
        positions: `[B, Hkv, N]` int32 token positions (-1 in empty slots).
        lengths: `[B]` int32 valid slots per sequence, in `[0, N]` (not checked: that would
            read them back to the host; larger values act as `N`).
        importance: `[B, Hkv, N]` float32 policy importance (`vase_triton.policies`);
            must be non-negative when `temperature > 0`.
        budget: slots kept per evicted row, `window < budget <= N`.
        window: recent slots always kept, `>= 1`.
        n_sink, n_protect: sinks and value-protected candidates, `n_sink + n_protect <= budget - window`.
        temperature: Gumbel temperature `>= 0`; 0 selects deterministically.
        seed: philox seed in `[0, 2**31)`; eviction_index: eviction counter in `[0, 2**32)`.
        keep_scores: move scores with their tokens (h2o) instead of resetting them.
        trigger_length: evict rows with `lengths[b] >= trigger_length`, in `[budget, N]`; default `N`.
        noise: optional `[B, Hkv, N]` float32 uniforms replacing the philox draws (tests).
    """
    names = ("keys", "values", "scores", "magnitudes", "positions", "lengths", "importance", "noise")
    tensors = (keys, values, scores, magnitudes, positions, lengths, importance, noise)
    for name, tensor in zip(names[:-1], tensors[:-1]):
        check_tensor(name, tensor)
    check_rank("keys", keys, 4, "[B, Hkv, N, D]")
    check_rank("values", values, 4, "[B, Hkv, N, D]")
    check_float_dtype("keys", keys)
    check_float_dtype("values", values)
    check_same_dtype(("keys", "values"), (keys, values))
    if values.shape != keys.shape:
        raise ValueError(f"values: expected shape {list(keys.shape)} like keys; got {list(values.shape)}")
    check_head_dim("keys", keys.shape[-1])
    batch, kv_heads, num_slots, _ = keys.shape
    rows = (batch, kv_heads, num_slots)
    check_exact("scores", scores, rows, torch.float32, "[B, Hkv, N]")
    check_exact("magnitudes", magnitudes, rows, torch.float32, "[B, Hkv, N]")
    check_exact("positions", positions, rows, torch.int32, "[B, Hkv, N]")
    check_exact("importance", importance, rows, torch.float32, "[B, Hkv, N]")
    if noise is not None:
        check_exact("noise", noise, rows, torch.float32, "[B, Hkv, N]")
    check_same_device(names, tensors)

    if num_slots < 2:
        raise ValueError(f"keys: expected N >= 2 slots (a window and a kept candidate); got N={num_slots}")
    _check_int("window", window, 1, num_slots - 1)
    _check_int("budget", budget, window + 1, num_slots)
    _check_int("n_sink", n_sink, 0, budget - window)
    _check_int("n_protect", n_protect, 0, budget - window - n_sink)
    trigger_length = num_slots if trigger_length is None else trigger_length
    _check_int("trigger_length", trigger_length, budget, num_slots)
    _check_int("seed", seed, 0, 2**31 - 1)
    _check_int("eviction_index", eviction_index, 0, 2**32 - 1)
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
        raise TypeError(f"temperature: expected a float; got {type(temperature).__name__} {temperature!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature: expected a finite value >= 0; got {temperature}")
    if not isinstance(keep_scores, bool):
        raise TypeError(f"keep_scores: expected a bool; got {type(keep_scores).__name__}")
    # Shape and dtype only: checking the values would read them back to the host.
    check_exact("lengths", lengths, (batch,), torch.int32, "[B]")

    _evict_op(
        keys, values, scores, magnitudes, positions, lengths, importance, noise,
        budget, window, n_sink, n_protect, float(temperature), seed, eviction_index, keep_scores,
        trigger_length,
    )
