"""Capture into a CUDA graph on a given stream, leaving the caller on its own stream.

`torch.cuda.graph` switches to its capture stream on entry and switches back only after
`capture_end()` succeeds: a capture that fails (a launch that synchronises with the host,
say) would leave every later call of the process on the capture stream. Its default
capture stream is also shared by the process and made on whichever device was current at
its first use, so callers name a stream of the device they capture on.
"""

from __future__ import annotations

from typing import Callable

import torch


def capture(graph: torch.cuda.CUDAGraph, launch: Callable[[], object], *, stream: torch.cuda.Stream, **options) -> None:
    """Record `launch()` into `graph` on `stream` (`options`: of `torch.cuda.graph`); raises what the capture raises."""
    with torch.cuda.stream(torch.cuda.current_stream(stream.device)):  # restored even when the capture fails
        with torch.cuda.graph(graph, stream=stream, **options):
            launch()
