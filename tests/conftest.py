"""Test set-up: run the Triton kernels in the CPU interpreter on machines without CUDA.

`TRITON_INTERPRET` is read when `@triton.jit` decorates a kernel, so it is set
here, before any test module imports `vase_triton.kernels`. PyTorch runs on one
thread: every tensor here is tiny, and waking a second thread per op costs far more
than it saves (10-30x on the tiny model when another process holds the other core).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def model():
    """The built-in tiny random Qwen3 (2 layers, 4 query / 2 KV heads, D 64), fp32 on CPU."""
    from vase_triton.demo_model import tiny_qwen3

    return tiny_qwen3(seed=1)


@pytest.fixture
def tokenizer():
    """The built-in byte tokenizer (left padding)."""
    from vase_triton.demo_model import ByteTokenizer

    return ByteTokenizer()


@pytest.fixture
def saved_model_dir(tmp_path):
    """A tiny Qwen3 and a character-level fast tokenizer saved as a local model directory."""
    from model_dirs import save_model_dir

    return save_model_dir(tmp_path)


class FakeCudaDevices:
    """`torch.cuda.current_device` and `torch.cuda.device` of a machine whose current GPU is `current`.

    `switched_to` lists the device index of every `torch.cuda.device` block entered.
    """

    def __init__(self, monkeypatch) -> None:
        self.current = 0
        self.switched_to: list[int] = []
        devices = self

        class DeviceGuard:
            def __init__(self, device) -> None:
                self.index = torch.device(device).index

            def __enter__(self) -> None:
                devices.switched_to.append(self.index)
                self.previous, devices.current = devices.current, self.index

            def __exit__(self, *exc) -> None:
                devices.current = self.previous

        monkeypatch.setattr(torch.cuda, "current_device", lambda: devices.current)
        monkeypatch.setattr(torch.cuda, "device", DeviceGuard)


@pytest.fixture
def fake_cuda_devices(monkeypatch) -> FakeCudaDevices:
    """A fake multi-GPU device state (see `FakeCudaDevices`), current device 0."""
    return FakeCudaDevices(monkeypatch)
