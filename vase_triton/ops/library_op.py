"""The library's ops as `torch.library` custom ops that eager calls reach without the dispatcher.

`library_op(name, mutates_args=...)` registers a function as `vase_triton::<name>` and
returns a `LibraryOp`. While `torch.compile` or `torch.export` traces, under a dispatch
mode (fake tensors, flop counting) and for tensor subclasses or inputs that need
gradients, a call goes through the registered op: one opaque node in a graph, with its
fake implementation. A plain eager call runs the function itself: the dispatcher's layers
(autograd, in-place version counters, a dynamo-disabled wrapper) cost about 45 µs a call
on a small CPU, more than half of a small decode step's append, and give these calls
nothing (no gradients; the ops mutate only the library's own buffers).

Triton launches a kernel on the current CUDA device, whatever device its tensors are on;
every call therefore runs with its first CUDA tensor's device current (a model spread
over several GPUs by `device_map` calls the ops with the current device left at cuda:0).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode


class LibraryOp:
    """A registered op (`.op`, a `torch.library.CustomOpDef`) and the function it runs (`.function`)."""

    def __init__(self, name: str, function: Callable, mutates_args: Sequence[str]):
        self.function = on_tensors_device(function)
        self.op = torch.library.custom_op(f"vase_triton::{name}", function, mutates_args=tuple(mutates_args))
        self.op.register_kernel("cuda")(self.function)

    def register_fake(self, fake: Callable) -> Callable:
        """Register `fake` as the op's implementation on fake tensors (for tracing)."""
        return self.op.register_fake(fake)

    def __call__(self, *args: Any) -> Any:
        if torch.compiler.is_compiling() or _needs_dispatcher(args):
            return self.op(*args)
        return self.function(*args)


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
        if isinstance(arg, torch.Tensor):
            device = arg.device
            if device.type == "cuda":
                return device
    return None


def _needs_dispatcher(args: tuple) -> bool:
    if _get_current_dispatch_mode() is not None:
        return True
    grad = torch.is_grad_enabled()
    return any(
        isinstance(arg, torch.Tensor) and (type(arg) is not torch.Tensor or (grad and arg.requires_grad))
        for arg in args
    )


def library_op(name: str, *, mutates_args: Sequence[str]) -> Callable[[Callable], LibraryOp]:
    """Decorator: register the function as `vase_triton::<name>` (see `LibraryOp`)."""
    return lambda function: LibraryOp(name, function, mutates_args)
