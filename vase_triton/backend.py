"""Which implementation an op runs: the Triton kernels or the PyTorch reference.

`VASE_BACKEND` (see README, "Environment variables") chooses:

- `auto` (default): Triton on CUDA tensors; on CPU tensors Triton when the Triton
  interpreter is on (`TRITON_INTERPRET=1`, as Triton reads it), else the PyTorch reference.
- `triton`: always the Triton kernels (CPU tensors need `TRITON_INTERPRET=1`).
- `torch`: always the PyTorch reference.
"""

from __future__ import annotations

import os

import torch

BACKENDS = ("auto", "triton", "torch")


def interpreter_enabled() -> bool:
    """True when Triton kernels run in the CPU interpreter: `TRITON_INTERPRET` as Triton itself
    reads it (`1`, `true`, `on`; `0`, `false`, `off`, `2` are off)."""
    import triton

    return bool(triton.knobs.runtime.interpret)


def requested_backend() -> str:
    backend = os.environ.get("VASE_BACKEND", "auto").strip().lower() or "auto"
    if backend not in BACKENDS:
        raise ValueError(f"VASE_BACKEND: expected one of {', '.join(BACKENDS)}; got {backend!r}")
    return backend


def use_triton(device: torch.device) -> bool:
    """Whether ops on tensors of `device` run the Triton kernels."""
    backend = requested_backend()
    if backend == "torch":
        return False
    if device.type == "cuda":
        return True
    if backend == "triton":
        if not interpreter_enabled():
            raise RuntimeError(
                f"VASE_BACKEND=triton on {device.type} tensors needs the Triton interpreter: "
                "set TRITON_INTERPRET=1 before importing vase_triton"
            )
        return True
    return interpreter_enabled()
