"""How the suites time their targets and hand the samples to pytest-benchmark.

On CUDA a target is timed by `triton.testing.do_bench`: CUDA events around every call,
the L2 cache flushed before each, every repetition kept. Suites of work that runs under
CUDA graphs in generation (decode steps) time replays of the target captured in a CUDA
graph instead, so that the host's Python and launch overhead, which such replays do not
pay, stay out. A target with a `setup` (state each call must start from, restored
untimed) is timed the same way by hand, the setup run before the L2 flush and outside
the events. Each row states its method in `details["timing"]`. On CPU,
`time.perf_counter` around each call. The samples are then *replayed* through the
`benchmark` fixture, whose timer (`replay_clock`, set by the `REPLAYED` mark) advances
only by the durations handed to it, so pytest-benchmark's `stats` — and
`--benchmark-compare-fail` — describe the measured device times, not the host's view of
asynchronous launches.

`measure_roofline` measures the GPU's copy bandwidth and bf16 matmul rate the same way,
once per session, as the 100% that achieved rates are compared with.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import pytest
import torch

from benchmarks.records import Record
from vase_triton.autotune.timing import capture_graph

_clock = {"now": 0.0}
_pending: list[float] = []

EAGER_TIMING = "eager calls, triton.testing.do_bench: CUDA events, L2 flushed before each call"
GRAPH_TIMING = "CUDA graph replays, triton.testing.do_bench: CUDA events, L2 flushed before each replay"
UNCAPTURED_TIMING = EAGER_TIMING + " (the target could not be captured in a CUDA graph)"
HOST_TIMING = "time.perf_counter around each call"
SETUP_NOTE = "; a setup before each call, untimed"
L2_FLUSH_BYTES = 256 << 20  # as do_bench: more than any GPU's L2 cache

# Copy: two 1 GiB bf16 buffers; matmul: [8192, 8192] @ [8192, 8192] in bf16.
ROOFLINE_COPY_ELEMENTS = 1 << 29
ROOFLINE_MATMUL_SIZE = 8192


def replay_clock() -> float:
    """pytest-benchmark timer of the suites: the sum of the durations replayed so far, in seconds."""
    return _clock["now"]


def _replay_next() -> None:
    _clock["now"] += _pending.pop(0)


REPLAYED = pytest.mark.benchmark(timer=replay_clock)


def record_samples(benchmark, samples: Sequence[float], record: Record) -> None:
    """Store `record` as the row's `extra_info` and `samples` (seconds) as its timing rounds.

    With `--benchmark-disable` only `record` is stored.
    """
    benchmark.extra_info.update(record.to_extra_info())
    if not benchmark.enabled:
        benchmark.pedantic(lambda: None)
        return
    if not samples:
        raise ValueError("samples: expected at least one measured duration; got none")
    _pending[:] = [float(sample) for sample in samples]
    benchmark.pedantic(_replay_next, rounds=len(_pending), iterations=1, warmup_rounds=0)


def device_samples(
    target: Callable[[], Any], *, warmup_ms: float = 25, rep_ms: float = 100, setup: Optional[Callable[[], Any]] = None
) -> list[float]:
    """Seconds per call of `target` on CUDA: `do_bench` repetitions, CUDA events, L2 flushed before
    each; with `setup`, do_bench's method by hand, `setup` run untimed before each flush."""
    if setup is not None:
        return _samples_after_setup(target, setup, warmup_ms, rep_ms)
    from triton.testing import do_bench

    return [ms / 1e3 for ms in do_bench(target, warmup=warmup_ms, rep=rep_ms, return_mode="all")]


def _samples_after_setup(target: Callable[[], Any], setup: Callable[[], Any], warmup_ms: float, rep_ms: float):
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")

    def events(count: int) -> list[tuple[torch.cuda.Event, torch.cuda.Event]]:
        return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]

    def run(pair: Optional[tuple[torch.cuda.Event, torch.cuda.Event]] = None) -> None:
        setup()
        flush.zero_()
        if pair is not None:
            pair[0].record()
        target()
        if pair is not None:
            pair[1].record()

    probe = events(5)
    for pair in probe:
        run(pair)
    torch.cuda.synchronize()
    estimate_ms = max(statistics.median(start.elapsed_time(end) for start, end in probe), 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        run()
    timed = events(max(1, int(rep_ms / estimate_ms)))
    for pair in timed:
        run(pair)
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in timed]


def graph_samples(
    target: Callable[[], Any], *, warmup_ms: float = 25, rep_ms: float = 100, setup: Optional[Callable[[], Any]] = None
) -> Optional[list[float]]:
    """Seconds per replay of `target` captured once in a CUDA graph (`device_samples` of the replay).

    The replay runs the device work `target` enqueued, without its host-side Python and
    launch overhead, as under `torch.compile(mode="reduce-overhead")`; L2 is flushed before
    each replay (and `setup`, eager and untimed, runs before that). None when `target` cannot
    be captured.
    """
    graph = capture_graph(target)
    if graph is None:
        return None
    return device_samples(graph.replay, warmup_ms=warmup_ms, rep_ms=rep_ms, setup=setup)


def host_samples(target: Callable[[], Any], rounds: int, setup: Optional[Callable[[], Any]] = None) -> list[float]:
    """Seconds per call of `target` by `time.perf_counter` (CPU tensors), `setup` untimed before each."""
    samples = []
    for _ in range(rounds):
        if setup is not None:
            setup()
        start = time.perf_counter()
        target()
        samples.append(time.perf_counter() - start)
    return samples


def measure(
    benchmark, target: Callable[[], Any], record: Record, *, cpu_rounds: int = 1, graph: bool = False,
    setup: Optional[Callable[[], Any]] = None,
):
    """Run `target` once and return its result (for the test's checks), then time it and record the row.

    With `--benchmark-disable` only the single call runs. On CUDA, `graph=True` times replays
    of a CUDA graph of `target` (`graph_samples`), or eager calls when it cannot be captured;
    the row's `details["timing"]` says which. On CPU `cpu_rounds` timed calls follow the
    first (smoke runs: a check that the row is produced, not a measurement). `setup` runs,
    untimed, before every call and before the graph is captured.
    """
    prepare = setup if setup is not None else (lambda: None)
    prepare()
    if not benchmark.enabled:
        benchmark.extra_info.update(record.to_extra_info())
        return benchmark.pedantic(target)
    result = target()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        prepare()  # the state `target` is captured in
        samples, method = (graph_samples(target, setup=setup), GRAPH_TIMING) if graph else (None, EAGER_TIMING)
        if samples is None:
            samples, method = device_samples(target, setup=setup), (UNCAPTURED_TIMING if graph else EAGER_TIMING)
    else:
        samples, method = host_samples(target, cpu_rounds, setup), HOST_TIMING
    method += SETUP_NOTE if setup is not None else ""
    record = dataclasses.replace(record, details={**record.details, "timing": method})
    record_samples(benchmark, samples, record)
    return result


@dataclass(frozen=True)
class Roofline:
    """Peaks measured on this GPU in this session: copy bandwidth (read + write) and bf16 matmul rate."""

    copy_gbs: float
    matmul_tflops: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "copy_gbs": self.copy_gbs,
            "matmul_tflops": self.matmul_tflops,
            "method": (
                f"median of do_bench: copy of {ROOFLINE_COPY_ELEMENTS * 2 >> 30} GiB bf16 (bytes read + written); "
                f"bf16 matmul {ROOFLINE_MATMUL_SIZE}^3 (2 n^3 flops)"
            ),
        }


def measure_roofline(device: torch.device) -> Roofline:
    """Measure the copy bandwidth and the dense bf16 matmul rate of `device` (CUDA)."""
    return Roofline(copy_gbs=_copy_gbs(device), matmul_tflops=_matmul_tflops(device))


def _copy_gbs(device: torch.device) -> float:
    source = torch.empty(ROOFLINE_COPY_ELEMENTS, dtype=torch.bfloat16, device=device)
    destination = torch.empty_like(source)
    seconds = statistics.median(device_samples(lambda: destination.copy_(source)))
    return 2 * source.numel() * source.element_size() / seconds / 1e9


def _matmul_tflops(device: torch.device) -> float:
    n = ROOFLINE_MATMUL_SIZE
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    product = torch.empty(n, n, dtype=torch.bfloat16, device=device)
    seconds = statistics.median(device_samples(lambda: torch.matmul(a, b, out=product)))
    return 2.0 * n**3 / seconds / 1e12
