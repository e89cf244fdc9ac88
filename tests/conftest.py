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


@pytest.fixture
def one_thread():
    """The reference ops on these tiny tensors are dominated by thread wake-ups: run them on one thread."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
