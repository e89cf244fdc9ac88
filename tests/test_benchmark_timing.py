"""How a benchmark row is timed on CUDA, checked without a GPU: graph replays when the target
can be captured, eager calls (and a row that says so) when it cannot; the recorded samples are
exactly the measured ones (`benchmarks.timing`)."""

from __future__ import annotations

import types

import pytest

from benchmarks import timing
from benchmarks.records import Record

RECORD = Record("decode", "decode attention (one step)", "vase", "Qwen3-8B B16 C4160")
SAMPLES = [0.001, 0.002, 0.003]


class RecordingBenchmark:
    """The part of pytest-benchmark's fixture `timing.measure` uses; keeps the replayed durations."""

    enabled = True

    def __init__(self):
        self.extra_info: dict = {}
        self.durations: list[float] = []

    def pedantic(self, target, rounds: int, iterations: int, warmup_rounds: int) -> None:
        for _ in range(rounds):
            before = timing.replay_clock()
            target()
            self.durations.append(timing.replay_clock() - before)


@pytest.fixture
def fake_cuda(monkeypatch) -> dict:
    """CUDA reported present; `device_samples` returns `SAMPLES` and notes what it timed."""
    timed: dict = {}
    monkeypatch.setattr(timing.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda *args: None)

    def device_samples(target, **kwargs):
        timed["target"] = target
        return list(SAMPLES)

    monkeypatch.setattr(timing, "device_samples", device_samples)
    return timed


def test_a_capturable_target_is_timed_as_graph_replays(monkeypatch, fake_cuda):
    graph = types.SimpleNamespace(replay=lambda: None)
    monkeypatch.setattr(timing, "capture_graph", lambda target: graph)
    benchmark = RecordingBenchmark()

    result = timing.measure(benchmark, lambda: "out", RECORD, graph=True)

    assert result == "out"
    assert fake_cuda["target"] is graph.replay
    assert benchmark.extra_info["details"]["timing"] == timing.GRAPH_TIMING
    assert benchmark.durations == pytest.approx(SAMPLES)


def test_a_target_that_cannot_be_captured_is_timed_eagerly_and_says_so(monkeypatch, fake_cuda):
    monkeypatch.setattr(timing, "capture_graph", lambda target: None)
    benchmark = RecordingBenchmark()

    def target():
        return "out"

    timing.measure(benchmark, target, RECORD, graph=True)

    assert fake_cuda["target"] is target
    assert benchmark.extra_info["details"]["timing"] == timing.UNCAPTURED_TIMING
    assert benchmark.durations == pytest.approx(SAMPLES)


def test_eager_rows_never_try_a_graph(monkeypatch, fake_cuda):
    def no_capture(target):
        raise AssertionError("an eager row must not be captured")

    monkeypatch.setattr(timing, "capture_graph", no_capture)
    benchmark = RecordingBenchmark()

    def target():
        return "out"

    timing.measure(benchmark, target, RECORD)

    assert fake_cuda["target"] is target
    assert benchmark.extra_info["details"]["timing"] == timing.EAGER_TIMING
