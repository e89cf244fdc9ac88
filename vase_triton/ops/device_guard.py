"""Every op runs with its tensors' GPU current.

Triton launches a kernel on the current CUDA device, whatever device its tensors are on, and
a model spread over several GPUs by `device_map` calls its layers with the current device
left at the first. `on_tensors_device` wraps an op so that its kernels launch on the device
of its first CUDA tensor argument; a call on the current device, or on CPU tensors, costs
one comparison.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch


def on_tensors_device(function: Callable) -> Callable:
    """`function`, run with the device of its first CUDA tensor argument current."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        device = _first_cuda_device(args)
        if device is None or device.index == torch.cuda.current_device():
            return function(*args, **kwargs)
        with torch.cuda.device(device):
            return function(*args, **kwargs)

    return run


def _first_cuda_device(args: tuple) -> Optional[torch.device]:
    for arg in args:
        if isinstance(arg, torch.Tensor) and arg.is_cuda:  # `is_cuda` costs a fifth of building `.device`
            return arg.device
    return None
