"""Evictions of a whole cache replayed from one CUDA graph.

Under CUDA graphs (`compile_mode="reduce-overhead"`) a decode step replays without host
overhead, but an eviction run eagerly pays one Python call and about a dozen launches per
layer: 0.35–0.94 ms per layer on an H200, where its device work took about 0.15 ms.
`EvictionGraph` captures the device work of one eviction of every layer of a cache
(`VaSECacheLayer.evict_on_device`, layer after layer) and replays it:

- the first eviction runs eagerly, so that every kernel is compiled and every library
  initialised before anything is captured;
- the second is captured, then replayed, and so is every later one;
- what changes from one eviction to the next lives on the device (lengths, the eviction
  counter that keys the random draws); what a capture bakes in (buffer addresses,
  shapes, launch parameters) is fixed for the cache's lifetime, except the attention scale,
  whose change makes the next eviction capture anew;
- a capture that fails (a policy whose importance reads the device back to the host, say)
  is abandoned with a warning, and the cache's evictions stay eager.

The graph keeps the memory of the temporaries it captured (those of one layer's eviction,
reused from layer to layer) reserved in its own pool while it lives.
"""

from __future__ import annotations

import warnings
from typing import Optional, Sequence

import torch

from vase_triton.cache import VaSECacheLayer
from vase_triton.graph_capture import capture


def unsupported_reason(stores: Sequence[VaSECacheLayer]) -> Optional[str]:
    """Why the evictions of `stores` cannot be replayed from one CUDA graph, or None when they can."""
    if not stores:
        return "no layers"
    devices = {store.device for store in stores}
    if len(devices) != 1:
        return f"the layers are spread over {len(devices)} devices"
    device = next(iter(devices))
    if device.type != "cuda":
        return f"the layers are on {device.type}, not CUDA"
    if not all(store.config.evicts for store in stores):
        return "the policy never evicts"
    return None


class EvictionGraph:
    """One eviction of every layer of `stores` (one CUDA device), replayed from a CUDA graph.

    `run()` replaces calling `evict()` on each layer: same device work, same host bookkeeping.
    """

    def __init__(self, stores: Sequence[VaSECacheLayer]):
        reason = unsupported_reason(stores)
        if reason is not None:
            raise ValueError(f"stores: expected evicting layers on one CUDA device; {reason}")
        self.stores = tuple(stores)
        self.device = self.stores[0].device
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.failure: Optional[str] = None  # why capture failed; evictions stay eager then
        self._warm = False
        self._captured_scales: Optional[tuple] = None

    @property
    def replaying(self) -> bool:
        """Whether the next `run()` replays a captured graph."""
        return self.graph is not None and self._captured_scales == self._scales()

    def _scales(self) -> tuple:
        return tuple(store.scale for store in self.stores)

    def run(self) -> None:
        """Evict every layer once (replayed, or eagerly until a capture succeeds), then record it on the host."""
        if not self.replaying and self._warm and self.failure is None:
            self.graph = self._capture()
            self._captured_scales = self._scales()
        if self.replaying:
            self.graph.replay()
        else:
            self._evict_on_device()
            self._warm = True
        for store in self.stores:
            store.record_eviction()

    def _evict_on_device(self) -> None:
        for store in self.stores:
            store.evict_on_device()

    def _capture(self) -> Optional[torch.cuda.CUDAGraph]:
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: CUDA calls of other threads (a streamer's, say) may go on during capture.
            with torch.cuda.device(self.device):
                stream = torch.cuda.Stream(self.device)
                capture(graph, self._evict_on_device, stream=stream, capture_error_mode="thread_local")
        except Exception as error:  # any failure leaves the eviction to the eager path, which re-raises real errors
            torch.cuda.synchronize(self.device)
            self.failure = f"{type(error).__name__}: {error}"
            warnings.warn(
                f"evictions of policy {self.stores[0].config.policy!r} could not be captured in a CUDA graph "
                f"and run eagerly ({self.failure})",
                RuntimeWarning,
                stacklevel=3,
            )
            return None
        return graph
