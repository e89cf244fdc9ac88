"""GPU timing of one launch: replayed from a CUDA graph, L2 flushed, median of repeats.

The launch is captured into a CUDA graph when it can be (so the Python launcher's host
overhead, identical for every candidate, does not hide the kernel time), then timed
with `triton.testing.do_bench`: CUDA events around each run, a warm-up, the L2 cache
flushed before each run, the median of the repeats.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import triton.testing

from vase_triton.graph_capture import capture

WARMUP_MS = 10
REPEAT_MS = 40


def capture_graph(launch: Callable[[], object]) -> Optional[torch.cuda.CUDAGraph]:
    """`launch` captured into a CUDA graph (after one warm-up run on a side stream), or None
    when it cannot be captured (it synchronises with the host, say)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        capture(graph, launch, stream=side)
    except RuntimeError:
        torch.cuda.synchronize()
        return None
    return graph


def gpu_median_ms(launch: Callable[[], None], warmup_ms: int = WARMUP_MS, repeat_ms: int = REPEAT_MS) -> float:
    """Median time in milliseconds of `launch` on the current CUDA device."""
    graph = capture_graph(launch)
    run = graph.replay if graph is not None else launch
    return float(triton.testing.do_bench(run, warmup=warmup_ms, rep=repeat_ms, return_mode="median"))
