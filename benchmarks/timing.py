"""How the suites time their targets and hand the samples to pytest-benchmark.

On CUDA a target is timed by `triton.testing.do_bench`: CUDA events around every call,
the L2 cache flushed before each, every repetition kept. Suites of work that runs under
CUDA graphs in generation (decode steps) time replays of the target captured in a CUDA
graph instead, so that the host's Python and launch overhead, which such replays do not
pay, stay out. Each row states its method in `details["timing"]`. On CPU,
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


def device_samples(target: Callable[[], Any], *, warmup_ms: float = 25, rep_ms: float = 100) -> list[float]:
    """Seconds per call of `target` on CUDA: `do_bench` repetitions, CUDA events, L2 flushed before each."""
    from triton.testing import do_bench

    return [ms / 1e3 for ms in do_bench(target, warmup=warmup_ms, rep=rep_ms, return_mode="all")]


def graph_samples(target: Callable[[], Any], *, warmup_ms: float = 25, rep_ms: float = 100) -> Optional[list[float]]:
    """Seconds per replay of `target` captured once in a CUDA graph (`device_samples` of the replay).

    The replay runs the device work `target` enqueued, without its host-side Python and
    launch overhead, as under `torch.compile(mode="reduce-overhead")`; L2 is flushed before
    each replay. None when `target` cannot be captured.
    """
    graph = capture_graph(target)
    if graph is None:
        return None
    return device_samples(graph.replay, warmup_ms=warmup_ms, rep_ms=rep_ms)


def host_samples(target: Callable[[], Any], rounds: int) -> list[float]:
    """Seconds per call of `target` by `time.perf_counter` (CPU tensors)."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        target()
        samples.append(time.perf_counter() - start)
    return samples


def measure(benchmark, target: Callable[[], Any], record: Record, *, cpu_rounds: int = 1, graph: bool = False):
    """Run `target` once and return its result (for the test's checks), then time it and record the row.

    With `--benchmark-disable` only the single call runs. On CUDA, `graph=True` times replays
    of a CUDA graph of `target` (`graph_samples`), or eager calls when it cannot be captured;
    the row's `details["timing"]` says which. On CPU `cpu_rounds` timed calls follow the
    first (smoke runs: a check that the row is produced, not a measurement).
    """
    if not benchmark.enabled:
        benchmark.extra_info.update(record.to_extra_info())
        return benchmark.pedantic(target)
    result = target()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        samples, method = (graph_samples(target), GRAPH_TIMING) if graph else (None, EAGER_TIMING)
        if samples is None:
            samples, method = device_samples(target), (UNCAPTURED_TIMING if graph else EAGER_TIMING)
    else:
        samples, method = host_samples(target, cpu_rounds), HOST_TIMING
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
