"""Score modes: what `recompute` and `emitted` cost per eviction, over one whole eviction period.

One timed call is one period of a `vase` layer: `window` decode steps (append + attention,
plus the mode's bookkeeping: `recompute` writes each query into its ring, `emitted` makes
decode attention write fp32 logits and add them into the scores) and the eviction that
closes it (`recompute` attends with the ring over the candidates first). `no observation`
is the same period under `random` with value protection, which observes nothing and selects
as `vase` does (Gumbel keys, the `n_protect` largest values): the floor both modes are
measured against. On CUDA the period is captured in a CUDA graph and replayed (as compiled
decoding runs it, host overhead excluded; `timing.graph_samples`); on CPU it runs eagerly.
The report divides by `window` (cost per decode step).
"""

from __future__ import annotations

import pytest

from benchmarks import profiles, timing
from benchmarks.cache_layers import prefilled_layer, scale_of, step_inputs
from benchmarks.records import Record
from benchmarks.shapes import QWEN3, TINY, CacheShape
from vase_triton.config import VaSEConfig

pytestmark = timing.REPLAYED

SUITE = "score-mode"
MODES = {
    "recompute": VaSEConfig(policy="vase", score_mode="recompute"),
    "emitted": VaSEConfig(policy="vase", score_mode="emitted"),
    "no observation": VaSEConfig(policy="random", protect_values=True),
}

SHAPES = profiles.pick({
    "smoke": [CacheShape(TINY, 2, 24, 8)],
    "gpu": [CacheShape(QWEN3["Qwen3-8B"], 16, 4096)],
    "full": [CacheShape(QWEN3[name], batch, budget) for name in ("Qwen3-8B", "Qwen3-14B")
             for batch in (1, 16, 64) for budget in (2048, 4096)],
})  # fmt: skip


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_eviction_period(benchmark, device, shape: CacheShape, mode: str):
    config = MODES[mode].replace(budget=shape.budget, window=shape.window)
    layer = prefilled_layer(shape, config, shape.budget, device)
    query, key, value = step_inputs(shape, device)
    scale = scale_of(shape)

    def period() -> None:
        for _ in range(shape.window):
            layer.prepare_decode_step()
            layer.decode_step(query, key, value, scale=scale)

    record = Record(
        SUITE, f"eviction period ({shape.window} decode steps + 1 eviction, vase)", mode, shape.name,
        compare_to=tuple(other for other in MODES if other != mode), per_step=shape.window,
        details={"dtype": "bfloat16", "policy": config.policy, "score_mode": config.score_mode},
    )  # fmt: skip
    timing.measure(benchmark, period, record, graph=True)
    period()
    assert layer.n_evictions >= 1
    assert bool((layer.lengths == shape.capacity).all())
