"""Eviction per policy: importance, selection and compaction of one full cache layer, against the reference.

Before each timed call the prefilled layer is restored whole (keys, values, magnitudes,
positions, scores, `lengths` = `C`; untimed: `timing.measure`'s setup), as the decode steps
since the previous eviction would have left it, and the call runs `VaSECacheLayer.evict()`:
the policy's importance (for window policies the `recompute` scores: the ring of the last
`window` queries attending over the candidates), then the fused select-and-compact (`vase`)
or the PyTorch reference of every op (`reference`, `VASE_BACKEND=torch`). Without that
restore, the slots an eviction frees would enter the next one with position -1 and score 0
(`streaming`, `h2o` and `tova` would evict them and move only the window), and the survivors
of one call would sit compacted in place at the next (`snapkv` and `rkv`, which rank them
without noise, would keep them and move almost nothing). `vase` rows are timed as CUDA-graph
replays, as generation under CUDA graphs runs them (`vase_triton.eviction_graph`); the
reference reads its eviction counter back to the host, which no capture allows, so its rows
are timed as eager calls, launch overhead included (each row states its timing). An eviction
comes once every `window` decode steps: the report divides by `window` and shows the result
as a percentage of one decode attention step of the same shape (the decode suite's `vase`
row). GB/s counts the select-and-compact traffic only (`CacheShape.eviction_bytes`), with
the survivors that change slot (the only ones compaction copies) counted on one call.

`eviction vase (emitted)` is `vase` under `score_mode="emitted"`: its importance is the
window attention that decode accumulated in the score buffer, so the eviction reads no
keys before compacting. Before each timed call that buffer is restored from a fixed draw
of uniform scores (continuous, so sampled evictions spread over the row as real ones do; an
eviction clears the buffer). Its percentage is of the decode step that emits those scores
(the decode suite's `vase+scores` row).

`eviction vase: importance (recompute)` and `eviction vase: select + compact` split a `vase`
eviction in two: the importance alone (`VaSECacheLayer.importance()`, the two passes of
the ring's queries over the candidate keys; TFLOP/s of their matmuls), and the eviction
given that importance (against the reference given the same), so that a run shows which
part an eviction's time goes to. `eviction vase-dkv: importance` times `vase-dkv`'s importance
alone (a fresh Gaussian projection, the projected energies of every candidate's key and
value, their normalisation; GB/s of its reads and writes, `CacheShape.projected_energy_bytes`).
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch

from benchmarks import profiles, timing
from benchmarks.cache_layers import prefilled_layer
from benchmarks.records import COPY, DECODE_KERNEL, DECODE_SUITE, MATMUL, Record
from benchmarks.shapes import BATCH_SIZES, BUDGETS, QWEN3, TINY, CacheShape
from vase_triton.cache import VaSECacheLayer
from vase_triton.cache_tensors import CacheTensors
from vase_triton.config import VaSEConfig
from vase_triton.policies import POLICIES

pytestmark = timing.REPLAYED

SUITE = "eviction"
EVICTING = [name for name, policy in POLICIES.items() if policy.evicts]

SHAPES = profiles.pick({
    "smoke": [CacheShape(TINY, 2, 48, 16)],
    "gpu": [CacheShape(QWEN3["Qwen3-8B"], 16, budget) for budget in (2048, 4096)],
    "full": [
        CacheShape(layout, batch, budget) for layout in QWEN3.values() for batch in BATCH_SIZES for budget in BUDGETS
    ],
})  # fmt: skip


class TimedEviction:
    """One timed call on the full, prefilled `layer`: evict (ranking by `importance` when given),
    after `restore()` put back the layer's buffers as they were before the first call (with the
    scores `observed` instead, when given).

    importance, observed: `[B, Hkv, C]` float32, or None.
    """

    def __init__(self, layer: VaSECacheLayer, importance: Optional[torch.Tensor] = None,
                 observed: Optional[torch.Tensor] = None) -> None:  # fmt: skip
        self.layer = layer
        self.importance = importance
        prefilled = CacheTensors(*(buffer.clone() for buffer in layer.tensors))  # positions distinct in each row
        self.prefilled = prefilled if observed is None else prefilled._replace(scores=observed)

    def restore(self) -> None:
        """The layer as prefilled: full (`C` tokens in every row), scores as observed."""
        self.layer.tensors.fill_(self.prefilled)

    def __call__(self) -> None:
        # Host state that evict() reads: set in the call, since a CUDA graph captures what the call
        # sees after the capture's warm-up eviction, not what `restore` left.
        self.layer.length_bound = self.layer.capacity
        self.layer.evict(self.importance)

    def moved_survivors(self) -> int:
        """Survivors that change slot in one call, over all rows (compaction copies only those):
        a destination slot whose position changed received a survivor from another slot."""
        self.restore()
        self()
        budget = self.layer.config.budget
        return int((self.layer.positions[..., :budget] != self.prefilled.positions[..., :budget]).sum())


def _time_eviction(benchmark, device, monkeypatch, shape: CacheShape, config: VaSEConfig, implementation: str,
                   kernel: str, decode_provider: str, observed: Optional[torch.Tensor] = None,
                   given_importance: bool = False) -> None:
    """Time `evict()` of a full layer of `shape` under `config`, as the `kernel` row of `implementation`.

    observed: scores restored into the layer before each eviction (`emitted`), or None.
    given_importance: compute the policy's importance once, before timing, and give it to each
        eviction (which then times selection and compaction alone).
    decode_provider: the decode suite's row whose step time the per-step cost is a percentage of.
    """
    layer = prefilled_layer(shape, config, shape.capacity, device)
    importance = layer.importance() if given_importance else None
    if implementation == "reference":
        monkeypatch.setenv("VASE_BACKEND", "torch")

    evict = TimedEviction(layer, importance, observed)
    record = Record(
        SUITE, kernel, implementation, shape.name,
        bytes_moved=shape.eviction_bytes(evict.moved_survivors()), roofline=COPY,
        compare_to=("reference",) if implementation == "vase" else (),
        per_step=shape.window, relative_to=(DECODE_SUITE, DECODE_KERNEL, decode_provider, shape.name),
        details={"dtype": "bfloat16", "score_mode": config.score_mode, "n_protect": config.resolved_n_protect},
    )  # fmt: skip
    timing.measure(benchmark, evict, record, graph=implementation == "vase", setup=evict.restore)
    assert bool((layer.lengths == shape.budget).all())
    assert bool((layer.positions[:, :, shape.budget :] == -1).all())


@pytest.mark.parametrize("implementation", ["vase", "reference"])
@pytest.mark.parametrize("policy", EVICTING)
@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_eviction(benchmark, roofline, device, monkeypatch, shape: CacheShape, policy: str, implementation: str):
    config = VaSEConfig(policy=policy, budget=shape.budget, window=shape.window)
    _time_eviction(benchmark, device, monkeypatch, shape, config, implementation, f"eviction {policy}", "vase")


@pytest.mark.parametrize("implementation", ["vase", "reference"])
@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_emitted_eviction(benchmark, roofline, device, monkeypatch, shape: CacheShape, implementation: str):
    config = VaSEConfig(policy="vase", score_mode="emitted", budget=shape.budget, window=shape.window)
    generator = torch.Generator(device=device).manual_seed(2)
    observed = torch.rand((shape.batch, shape.layout.kv_heads, shape.capacity), generator=generator, device=device)
    _time_eviction(
        benchmark, device, monkeypatch, shape, config, implementation, "eviction vase (emitted)", "vase+scores", observed
    )


# Policies whose importance is timed alone, and their rows.
IMPORTANCE_ROWS = {"vase": "eviction vase: importance (recompute)", "vase-dkv": "eviction vase-dkv: importance"}


@pytest.mark.parametrize("policy", list(IMPORTANCE_ROWS))
@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_eviction_importance(benchmark, roofline, device, shape: CacheShape, policy: str):
    config = VaSEConfig(policy=policy, budget=shape.budget, window=shape.window)
    layer = prefilled_layer(shape, config, shape.capacity, device)
    if policy == "vase":
        work = dict(flops=shape.recompute_flops(), roofline=MATMUL)
    else:
        work = dict(bytes_moved=shape.projected_energy_bytes(config.dkv_rank), roofline=COPY)
    record = Record(
        SUITE, IMPORTANCE_ROWS[policy], "vase", shape.name, **work, per_step=shape.window,
        relative_to=(DECODE_SUITE, DECODE_KERNEL, "vase", shape.name), details={"dtype": "bfloat16"},
    )  # fmt: skip
    importance = timing.measure(benchmark, layer.importance, record, graph=True)
    candidates = importance[:, :, : shape.budget].double()
    assert bool(torch.isfinite(candidates).all()) and bool((candidates >= 0).all())
    if policy == "vase-dkv":  # energies normalised over each row's candidates
        torch.testing.assert_close(candidates.sum(dim=-1), torch.ones_like(candidates[..., 0]), rtol=1e-5, atol=1e-5)
    assert int(layer.n_evictions) == 0, "computing the importance must not evict"


@pytest.mark.parametrize("implementation", ["vase", "reference"])
@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_eviction_given_its_importance(benchmark, roofline, device, monkeypatch, shape: CacheShape,
                                       implementation: str):  # fmt: skip
    config = VaSEConfig(policy="vase", budget=shape.budget, window=shape.window)
    _time_eviction(benchmark, device, monkeypatch, shape, config, implementation, "eviction vase: select + compact",
                   "vase", given_importance=True)  # fmt: skip
