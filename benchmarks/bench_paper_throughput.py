"""The VaSE paper's throughput protocol, so that our numbers can be read next to its table.

Batch 16, 256 prompt tokens, 16,384 generated tokens, greedy; decode time only (the steps
after the first token, CUDA events) and peak allocated memory. Full cache
(`transformers` `DynamicCache`, SDPA kept off cuDNN) against `vase` at budget 4096 and `vase-dkv` at budget
2048, on the Qwen3-14B configuration with random weights unless `VASE_BENCH_CHECKPOINT`
names a local Qwen3-14B checkpoint: throughput does not depend on the weights. The paper (Qwen3-14B,
one GPU) reports 132.9 / 333.4 / 410.9 tokens/s and 68.7 / 39.6 / 33.9 GB of peak allocated memory,
in GiB (the authors' throughput script divides `torch.cuda.max_memory_allocated()` by 1024³).

The `full` profile runs the protocol (about 40 minutes on one H200, most of it the full
cache). The `gpu` profile estimates it in minutes (not among `gpu_check.sh`'s default
steps: its `paper` step, in a call of its own, or this file on its own): each method's
step time is measured at six lengths from 64 to 16,384 generated tokens, each on its own
(64 timed steps, after one untimed, from a prompt that ends just before it,
`DecodeSetting.sample_steps`; a VaSE cache past its budget evicts once in them), and the
decode time of the whole run is the sum of the step times interpolated between them
(`decoding.estimated_decode_seconds`); its peak memory is the largest of the sampled
decode steps'. The rows say which they are. `smoke` runs the
estimate on the tiny model.
"""

from __future__ import annotations

import pytest

from benchmarks import profiles, timing
from benchmarks.decoding import HF_DYNAMIC_NO_CUDNN, DecodeSetting, build_model, estimated_decode_seconds, generate_timed
from benchmarks.decoding import FULL_CACHE_PROMPT_CHUNK, model_dtype, vase_method
from benchmarks.records import Record
from benchmarks.shapes import QWEN3, TINY

pytestmark = timing.REPLAYED

SUITE = "paper-throughput"
KERNEL = "paper protocol: greedy, decode time only"
# The full cache: transformers' DynamicCache with SDPA off cuDNN, whose plan per new key
# length would cost each step more than its attention does on Hopper (`decoding.HF_DYNAMIC_NO_CUDNN`).
FULL_CACHE = HF_DYNAMIC_NO_CUDNN
# The paper's Qwen3-14B figures: (tokens/s, peak memory in GiB) of its full cache and two VaSE methods.
PAPER_FULL_CACHE = (132.9, 68.7)
PAPER = {"vase-4096": (333.4, 39.6), "vase-dkv-2048": (410.9, 33.9)}

SETTING, METHODS = profiles.pick({
    "smoke": (
        DecodeSetting(TINY, 2, batch=2, prompt_tokens=16, new_tokens=96, checkpoints=(16, 48, 96), sample_steps=16,
                       prompt_chunk=32),
        [FULL_CACHE, vase_method(48), vase_method(32, "vase-dkv")],
    ),
    "gpu": (
        DecodeSetting(QWEN3["Qwen3-14B"], QWEN3["Qwen3-14B"].num_layers, batch=16, prompt_tokens=256,
                      new_tokens=16384, checkpoints=(64, 2048, 4096, 8192, 12288, 16384), sample_steps=64,
                      prompt_chunk=FULL_CACHE_PROMPT_CHUNK),
        [vase_method(4096), vase_method(2048, "vase-dkv"), FULL_CACHE],
    ),
    "full": (
        DecodeSetting(QWEN3["Qwen3-14B"], QWEN3["Qwen3-14B"].num_layers, batch=16, prompt_tokens=256,
                      new_tokens=16384, checkpoints=(16384,)),
        [FULL_CACHE, vase_method(4096), vase_method(2048, "vase-dkv")],
    ),
})  # fmt: skip


@pytest.fixture(scope="module")
def model(device):
    return build_model(SETTING.layout, SETTING.num_layers, device, model_dtype(device))


@pytest.mark.parametrize("method", METHODS, ids=[m.name for m in METHODS])
def test_paper_throughput(benchmark, device, monkeypatch, model, method):
    if device.type == "cpu":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    trace = generate_timed(model, method, SETTING, device)
    if trace.sampled:
        decode_seconds = estimated_decode_seconds(trace.points, SETTING.new_tokens, SETTING.batch)
        tokens_per_s = (SETTING.new_tokens - 1) * SETTING.batch / decode_seconds
    else:
        decode_seconds, tokens_per_s = trace.decode_seconds, trace.tokens_per_s
    paper = None
    if SETTING.layout.name == "Qwen3-14B":
        paper = PAPER_FULL_CACHE if method == FULL_CACHE else PAPER.get(method.name)
    record = Record(
        SUITE, KERNEL, method.name, SETTING.name,
        compare_to=(FULL_CACHE.name,) if method.cache == "vase" else (),
        details={
            **trace.details,
            "dtype": str(model.dtype).replace("torch.", ""),
            "layers": model.config.num_hidden_layers,
            "generated": SETTING.new_tokens if trace.sampled else trace.generated,
            "estimated_from": [point.generated for point in trace.points] if trace.sampled else None,
            "curve_measure": SETTING.describe_curve(),
            "decode_seconds": decode_seconds,
            "tokens_per_s": tokens_per_s,
            "peak_bytes": trace.peak_bytes,
            "kv_bytes": trace.points[-1].kv_bytes,
            "paper_tokens_per_s": paper[0] if paper else None,
            "paper_peak_gib": paper[1] if paper else None,
        },
    )  # fmt: skip
    timing.record_samples(benchmark, trace.step_seconds, record)
    if trace.sampled:
        assert [point.generated for point in trace.points] == sorted(SETTING.checkpoints)
    assert trace.generated == SETTING.new_tokens and tokens_per_s > 0
