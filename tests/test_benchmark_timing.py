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
        timed["target"], timed["setup"] = target, kwargs.get("setup")
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


def test_a_setup_reaches_the_timer_and_the_row_says_so(monkeypatch, fake_cuda):
    graph = types.SimpleNamespace(replay=lambda: None)
    monkeypatch.setattr(timing, "capture_graph", lambda target: graph)
    calls: list[str] = []
    benchmark = RecordingBenchmark()

    timing.measure(benchmark, lambda: calls.append("target"), RECORD, graph=True, setup=lambda: calls.append("setup"))

    assert calls == ["setup", "target", "setup"]  # the first call, then the state the graph is captured in
    assert fake_cuda["target"] is graph.replay and fake_cuda["setup"] is not None
    assert benchmark.extra_info["details"]["timing"] == timing.GRAPH_TIMING + timing.SETUP_NOTE


def test_on_cpu_the_setup_runs_untimed_before_every_call(monkeypatch):
    monkeypatch.setattr(timing.torch.cuda, "is_available", lambda: False)
    clock = {"now": 0.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["now"])
    calls: list[str] = []

    def setup():
        calls.append("setup")
        clock["now"] += 5.0  # would show in the samples if it were timed

    def target():
        calls.append("target")
        clock["now"] += 0.25

    benchmark = RecordingBenchmark()
    timing.measure(benchmark, target, RECORD, cpu_rounds=3, setup=setup)
    assert calls == ["setup", "target"] * 4
    assert benchmark.durations == pytest.approx([0.25] * 3)
    assert benchmark.extra_info["details"]["timing"] == timing.HOST_TIMING + timing.SETUP_NOTE


def test_timing_with_a_setup_keeps_it_outside_the_events(monkeypatch):
    """do_bench's method by hand: five probes estimate the call, then warm-up calls and timed ones;
    every call after its setup and the L2 flush, the events around the call alone."""
    log: list[str] = []

    class FakeEvent:
        def __init__(self, enable_timing: bool):
            assert enable_timing

        def record(self) -> None:
            log.append("event")

        def elapsed_time(self, end) -> float:
            return 0.5  # ms

    real_empty = timing.torch.empty
    monkeypatch.setattr(timing.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(timing.torch, "empty", lambda *args, device=None, **kwargs: real_empty(*args, **kwargs))
    monkeypatch.setattr(timing, "L2_FLUSH_BYTES", 16)
    samples = timing.device_samples(lambda: log.append("call"), setup=lambda: log.append("setup"),
                                    warmup_ms=1, rep_ms=2)  # fmt: skip
    timed_call = ["setup", "event", "call", "event"]
    assert log == timed_call * 5 + ["setup", "call"] * 2 + timed_call * 4
    assert samples == pytest.approx([0.5e-3] * 4)
