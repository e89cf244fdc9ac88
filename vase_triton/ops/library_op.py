"""The library's ops as `torch.library` custom ops that eager calls reach without the dispatcher.

`library_op(name, mutates_args=...)` registers a function as `vase_triton::<name>` and
returns a `LibraryOp`. While `torch.compile` or `torch.export` traces, under a dispatch
mode (fake tensors, flop counting) and for tensor subclasses or inputs that need
gradients, a call goes through the registered op: one opaque node in a graph, with its
fake implementation. A plain eager call runs the function itself: the dispatcher's layers
(autograd, in-place version counters, a dynamo-disabled wrapper) cost about 45 µs a call
on a small CPU, more than half of a small decode step's append, and give these calls
nothing (no gradients; the ops mutate only the library's own buffers).

Both ways run the function with its tensors' GPU current (`on_tensors_device`): the eager
call directly, the dispatcher as the op's CUDA kernel.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from vase_triton.ops.device_guard import on_tensors_device


class LibraryOp:
    """A registered op (`.op`, a `torch.library.CustomOpDef` named `.name`) and the function it
    runs (`.function`)."""

    def __init__(self, name: str, function: Callable, mutates_args: Sequence[str]):
        self.name = f"vase_triton::{name}"
        self.function = on_tensors_device(function)
        self.op = torch.library.custom_op(self.name, function, mutates_args=tuple(mutates_args))
        self.op.register_kernel("cuda")(self.function)

    def register_fake(self, fake: Callable) -> Callable:
        """Register `fake` as the op's implementation on fake tensors (for tracing)."""
        return self.op.register_fake(fake)

    def __call__(self, *args: Any) -> Any:
        if torch.compiler.is_compiling() or _needs_dispatcher(args):
            return self.op(*args)
        return self.function(*args)


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
