"""Argument checks shared by the public ops and the cache.

Every failure names the argument, what was expected and what was given. Checks
that would read a device value back to the host are skipped while tracing
under `torch.compile` and during CUDA graph capture.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# A cache may also hold float64 (the reference's precision in tests).
CACHE_DTYPES = FLOAT_DTYPES + (torch.float64,)
SUPPORTED_HEAD_DIMS = (32, 64, 128, 256)


def host_checks_allowed(tensor: torch.Tensor) -> bool:
    """Whether a check may read `tensor`'s values on the host (no tracing, no graph capture)."""
    if torch.compiler.is_compiling():
        return False
    if tensor.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    return True


def check_non_negative_int(name: str, value: object) -> int:
    """`value` must be an int (not a bool) `>= 0`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name}: expected an int >= 0; got {value!r}")
    return value


def check_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor; got {type(value).__name__}")
    return value


def check_rank(name: str, tensor: torch.Tensor, rank: int, layout: str) -> None:
    check_tensor(name, tensor)
    if tensor.dim() != rank:
        raise ValueError(f"{name}: expected a {rank}-d tensor {layout}; got shape {tuple(tensor.shape)}")


def check_exact(name: str, tensor: object, shape: Sequence[int], dtype: torch.dtype, layout: str) -> None:
    """`tensor` must be a tensor of exactly `shape` (spelled `layout`, e.g. `[B, Hkv, N]`) and `dtype`."""
    check_rank(name, tensor, len(shape), layout)
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {layout} = {list(shape)}; got {list(tensor.shape)}")
    if tensor.dtype != dtype:
        expected, got = (str(d).replace("torch.", "") for d in (dtype, tensor.dtype))
        raise TypeError(f"{name}: expected dtype {expected}; got {got}")


def check_float_dtype(name: str, tensor: torch.Tensor, allowed: Sequence[torch.dtype] = FLOAT_DTYPES) -> None:
    if tensor.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name}: expected dtype in ({names}); got {str(tensor.dtype).replace('torch.', '')}")


def check_same_dtype(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
    first = tensors[0]
    for name, tensor in zip(names[1:], tensors[1:]):
        if tensor.dtype != first.dtype:
            raise TypeError(
                f"{name}: expected the same dtype as {names[0]} ({first.dtype}); got {tensor.dtype}"
            )


def check_same_device(names: Sequence[str], tensors: Iterable[Optional[torch.Tensor]]) -> None:
    tensors = list(tensors)
    first = tensors[0]
    for name, tensor in zip(names[1:], tensors[1:]):
        if tensor is not None and tensor.device != first.device:
            raise ValueError(
                f"{name}: expected a tensor on {first.device} like {names[0]}; got one on {tensor.device}"
            )


def check_head_dim(name: str, head_dim: int) -> None:
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"{name}: expected head dim D in {SUPPORTED_HEAD_DIMS}; got D={head_dim}"
        )


def check_lengths(name: str, lens: torch.Tensor, batch: int, low: int, high: int) -> None:
    """`lens` must be `[batch]` int32/int64 with values in `[low, high]` (values checked eagerly)."""
    check_rank(name, lens, 1, "[B]")
    if lens.shape[0] != batch:
        raise ValueError(f"{name}: expected shape [B] = [{batch}]; got {tuple(lens.shape)}")
    if lens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: expected dtype int32 or int64; got {lens.dtype}")
    if host_checks_allowed(lens) and lens.numel() > 0:
        lo, hi = int(lens.min()), int(lens.max())
        if lo < low or hi > high:
            raise ValueError(f"{name}: expected values in [{low}, {high}]; got values in [{lo}, {hi}]")


def check_cache_tensors(cache: object, dtypes: Sequence[torch.dtype] = FLOAT_DTYPES) -> tuple[int, int, int, int]:
    """`cache` must be a `CacheTensors` of consistent shapes, dtypes and device; returns `(B, Hkv, N, D)`."""
    from vase_triton.cache_tensors import CacheTensors

    if not isinstance(cache, CacheTensors):
        raise TypeError(f"cache: expected a vase_triton.cache_tensors.CacheTensors; got {type(cache).__name__}")
    for name, tensor in zip(CacheTensors._fields, cache):
        check_tensor(f"cache.{name}", tensor)
    check_rank("cache.keys", cache.keys, 4, "[B, Hkv, N, D]")
    check_float_dtype("cache.keys", cache.keys, dtypes)
    batch, kv_heads, num_slots, head_dim = cache.keys.shape
    rows = (batch, kv_heads, num_slots)
    check_exact("cache.values", cache.values, cache.keys.shape, cache.keys.dtype, "[B, Hkv, N, D]")
    check_exact("cache.scores", cache.scores, rows, torch.float32, "[B, Hkv, N]")
    check_exact("cache.magnitudes", cache.magnitudes, rows, torch.float32, "[B, Hkv, N]")
    check_exact("cache.positions", cache.positions, rows, torch.int32, "[B, Hkv, N]")
    check_exact("cache.lengths", cache.lengths, (batch,), torch.int32, "[B]")
    check_exact("cache.next_positions", cache.next_positions, (batch,), torch.int32, "[B]")
    for name, tensor in zip(CacheTensors._fields, cache):  # every buffer is written in place
        if any(stride == 0 and size > 1 for stride, size in zip(tensor.stride(), tensor.shape)):
            raise ValueError(
                f"cache.{name}: expected buffers whose elements do not share memory; got a view with "
                f"stride {tensor.stride()} for shape {list(tensor.shape)} (an expanded tensor)"
            )
    if not torch.compiler.is_compiling():  # fake tensors under tracing have no storage
        first_element = {}
        for name, tensor in zip(CacheTensors._fields, cache):
            if tensor.numel() > 0:
                other = first_element.setdefault(tensor.data_ptr(), name)
                if other != name:
                    raise ValueError(
                        f"cache.{name}: expected its own buffer (it is written in place); got memory "
                        f"shared with cache.{other} (both start at the same element)"
                    )
    for name in ("lengths", "next_positions"):  # kernels index these [B] counters without strides
        if not getattr(cache, name).is_contiguous():
            raise ValueError(
                f"cache.{name}: expected a contiguous tensor (it is updated in place); "
                f"got a view with stride {getattr(cache, name).stride()}"
            )
    check_same_device([f"cache.{name}" for name in CacheTensors._fields], cache)
    return batch, kv_heads, num_slots, head_dim
