"""What a benchmark JSON says about where and how it was measured (`benchmarks.environment`)."""

from __future__ import annotations

import types

import pytest
import torch

from benchmarks import environment


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    properties = types.SimpleNamespace(total_memory=141 << 30, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *args: properties)


@pytest.mark.parametrize("on_gpu", [False, True], ids=["cpu", "cuda"])
def test_the_timing_named_covers_the_end_to_end_suites(request, on_gpu):
    """The end-to-end suites time each generated token by `decoding.StepClock` (a CUDA event, or
    `time.perf_counter` on CPU, at every token), not by `do_bench` around calls: the timing a run
    states must say so next to the kernel suites' method."""
    if on_gpu:
        request.getfixturevalue("fake_gpu")
    timing = environment.describe("gpu" if on_gpu else "smoke", None)["timing"]

    kernel_method = "triton.testing.do_bench" if on_gpu else "time.perf_counter around each call"
    token_method = "a CUDA event" if on_gpu else "time.perf_counter"
    assert f"kernel suites: {kernel_method}" in timing
    assert f"end-to-end suites: {token_method} at every generated token" in timing
