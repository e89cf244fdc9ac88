"""Test set-up: run the Triton kernels in the CPU interpreter on machines without CUDA.

`TRITON_INTERPRET` is read when `@triton.jit` decorates a kernel, so it is set
here, before any test module imports `vase_triton.kernels`.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
