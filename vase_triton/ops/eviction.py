"""Public eviction op: argument checks, `torch.library` registration, backend dispatch.

`evict_` validates its arguments, then calls the custom op `vase_triton::evict_`, which
mutates the cache tensors in place, runs the Triton kernels or the PyTorch reference as
`vase_triton.backend` decides, and advances the device-side eviction counter. Eviction
runs between compiled decode steps (eagerly, or replayed from a CUDA graph); the fake
implementation keeps it traceable all the same.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from vase_triton import reference
from vase_triton.backend import use_triton
from vase_triton.cache_tensors import CacheTensors
from vase_triton.config import MIN_TEMPERATURE
from vase_triton.ops.library_op import library_op
from vase_triton.validation import check_cache_tensors, check_exact, check_head_dim, check_same_device


@library_op(
    "evict_",
    mutates_args=("keys", "values", "scores", "magnitudes", "positions", "lengths", "eviction_index"),
)
def _evict_op(
    keys: torch.Tensor,
    values: torch.Tensor,
    scores: torch.Tensor,
    magnitudes: torch.Tensor,
    positions: torch.Tensor,
    lengths: torch.Tensor,
    next_positions: torch.Tensor,
    importance: torch.Tensor,
    noise: Optional[torch.Tensor],
    budget: int,
    window: int,
    n_sink: int,
    n_protect: int,
    temperature: float,
    seed: int,
    eviction_index: torch.Tensor,
    keep_scores: bool,
    trigger_length: int,
) -> None:
    cache = CacheTensors(keys, values, scores, magnitudes, positions, lengths, next_positions)
    selection = dict(
        budget=budget, window=window, n_sink=n_sink, n_protect=n_protect, temperature=temperature, seed=seed,
        eviction_index=eviction_index, keep_scores=keep_scores, trigger_length=trigger_length, noise=noise,
    )
    if use_triton(keys.device):
        from vase_triton.kernels.eviction import evict_triton

        evict_triton(cache, importance, **selection)
    else:
        reference.evict_(cache, importance, **selection)
    eviction_index.add_(1)


@_evict_op.register_fake
def _evict_fake(
    keys, values, scores, magnitudes, positions, lengths, next_positions, importance, noise,
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
    cache: CacheTensors,
    importance: torch.Tensor,
    *,
    budget: int,
    window: int,
    n_sink: int,
    n_protect: int,
    temperature: float,
    seed: int,
    eviction_index: Optional[torch.Tensor] = None,
    keep_scores: bool = False,
    trigger_length: Optional[int] = None,
    noise: Optional[torch.Tensor] = None,
) -> None:
    """Value-aware Gumbel eviction of one cache layer, in place.

    Every sequence `b` with `n = lengths[b] >= trigger_length` is shrunk to `budget` slots,
    independently per KV head row: the `window` most recent slots `[n - window, n)` stay; of
    the candidates `[0, n - window)` exactly `budget - window` stay: the sinks `[0, n_sink)`;
    the candidates of largest value magnitude, `n_protect` in all with the sinks counted
    among them (the paper gives sinks infinite magnitude); then the remaining ones of largest
    key `log(importance) / temperature - log(-log(u))` (`u` drawn from stream `seed` at
    `eviction_index`, or `noise`). With `temperature < MIN_TEMPERATURE` (0 included) the key is `importance`
    (deterministic top-k). Non-positive importance ranks below every positive one; ties go
    to the earlier slot. Survivors move to slots `[0, budget)` in temporal order with their
    keys, values, magnitudes, positions and, with `keep_scores`, scores; without it every
    row's scores are reset to 0. Slots `[budget, N)` of evicted rows get position -1 and
    score 0; `lengths[b] = budget`. Other rows keep their slots. `eviction_index` is then
    advanced by one. The Triton path reads nothing back to the host, so an eviction can be
    captured in a CUDA graph and replayed with fresh draws.

    Args:
        cache: the layer's `CacheTensors`, `N` slots per row (`lengths` in `[0, N]`, not
            checked: that would read them back to the host; larger values act as `N`).
        importance: `[B, Hkv, N]` float32 policy importance (`vase_triton.policies`);
            must be non-negative when sampling. A NaN ranks with the non-positive ones (not
            checked: that would read it back to the host).
        budget: slots kept per evicted row, `window < budget <= N`.
        window: recent slots always kept, `>= 1`.
        n_sink: sinks, `<= budget - window`; n_protect: value-protected tokens, sinks
            included, `<= budget - window`.
        temperature: Gumbel temperature `>= 0`.
        seed: key of the layer's stream of draws in `[0, 2**63)` (`vase_triton.seeding.stream_key`).
        eviction_index: `[1]` int64 counter on the cache's device, `>= 0`, the draw of the stream
            this eviction takes (`vase_triton.seeding`); None draws at index 0 and keeps no
            count. A negative counter is refused by the reference when it draws (a temperature of
            at least `MIN_TEMPERATURE` and no `noise`); it is not checked otherwise, nor on the
            Triton path (that would read it back to the host), where it draws numbers of its own.
        keep_scores: move scores with their tokens (h2o) instead of resetting them.
        trigger_length: evict rows with `lengths[b] >= trigger_length`, in `[budget, N]`; default `N`.
        noise: optional `[B, Hkv, N]` float32 uniforms replacing the philox draws.

    Temporaries: `[B * Hkv, budget]` int32 survivor indices and `[B * Hkv]` flags on the
    Triton path, 1.0 MiB at the Qwen3-8B decode shape (B 16, Hkv 8, budget 2048); rows longer
    than the in-register limit (8192 slots, long prompts) add `[B * Hkv, N]` int32 keys and
    int8 states (5 MiB for one 128k-token prompt).
    """
    batch, kv_heads, num_slots, head_dim = check_cache_tensors(cache)
    check_head_dim("cache.keys", head_dim)
    rows = (batch, kv_heads, num_slots)
    check_exact("importance", importance, rows, torch.float32, "[B, Hkv, N]")
    if noise is not None:
        check_exact("noise", noise, rows, torch.float32, "[B, Hkv, N]")
    if eviction_index is None:
        eviction_index = torch.zeros(1, dtype=torch.int64, device=cache.keys.device)
    check_exact("eviction_index", eviction_index, (1,), torch.int64, "[1]")
    check_same_device(
        ("cache.keys", "importance", "noise", "eviction_index"), (cache.keys, importance, noise, eviction_index)
    )

    if num_slots < 2:
        raise ValueError(f"cache.keys: expected N >= 2 slots (a window and a kept candidate); got N={num_slots}")
    _check_int("window", window, 1, num_slots - 1)
    _check_int("budget", budget, window + 1, num_slots)
    _check_int("n_sink", n_sink, 0, budget - window)
    _check_int("n_protect", n_protect, 0, budget - window)
    trigger_length = num_slots if trigger_length is None else trigger_length
    _check_int("trigger_length", trigger_length, budget, num_slots)
    _check_int("seed", seed, 0, 2**63 - 1)
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
        raise TypeError(f"temperature: expected a float; got {type(temperature).__name__} {temperature!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature: expected a finite value >= 0; got {temperature}")
    if not isinstance(keep_scores, bool):
        raise TypeError(f"keep_scores: expected a bool; got {type(keep_scores).__name__}")
    temperature = float(temperature) if temperature >= MIN_TEMPERATURE else 0.0

    _evict_op(
        *cache, importance, noise, budget, window, n_sink, n_protect, temperature, seed, eviction_index,
        keep_scores, trigger_length,
    )
