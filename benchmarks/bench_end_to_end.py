"""End-to-end greedy decoding against generated length: full caches and VaSE, side by side in one session.

Each method (`benchmarks.decoding`) generates for a batch of random prompts; the row's
timing samples are its decode steps, and its curve gives, at each checkpoint length, the
median step latency, tokens/s over those steps (evicting steps included) and memory: the
KV cache held (every profile) and the device's peak allocated memory (CUDA). VaSE's rows
are compared with each full cache the profile runs (`FULL_CACHES`) at every length in the
report, which also plots the curves.

The `gpu` profile samples its lengths (1k to 16k tokens): each is measured on its own, 128
timed steps, after one untimed, from a prompt that ends just before it
(`DecodeSetting.sample_steps`), longest first, so that gpu_check reaches the 16k-token
target in its time; a method stops after 45 s, or `VASE_BENCH_DECODE_SECONDS`, and its
curve then holds the lengths it measured. `deep` samples only the 16k-token length at
Qwen3-8B's full depth (36 layers): at 4 layers the output projection's 1.2 GB is over a
third of a VaSE step's bytes, which caps the speed-up a smaller cache can bring. `full`
decodes 32k tokens in one run without a limit; `cpu` is the CPU measurement quoted in the
README, also in one run. With `VASE_BENCH_DECODE_DEADLINE` (a Unix time) the methods share
the time up to it instead: each gets an equal share of what is left when it starts, once
the set-up time (`SETUP_S`: compilation and warm-up) of it and the methods after it is set
aside, so the time a fast method does not need goes to the later ones.
"""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
from torch._dynamo.utils import counters

from benchmarks import profiles, timing
from benchmarks.decoding import FULL_CACHE_PROMPT_CHUNK, HF_DYNAMIC, HF_DYNAMIC_NO_CUDNN, HF_STATIC, DecodeSetting
from benchmarks.decoding import build_model, generate_timed, model_dtype, vase_method
from benchmarks.records import Record
from benchmarks.shapes import BUDGETS, GENERATED_LENGTHS, QWEN3, SMALL, TINY

pytestmark = timing.REPLAYED

SUITE = "end-to-end"
TIME_LIMIT_VARIABLE = "VASE_BENCH_DECODE_SECONDS"
DEADLINE_VARIABLE = "VASE_BENCH_DECODE_DEADLINE"
# Compilation and warm-up of one method, by its cache, kept out of the decoding shares: VaSE
# and the StaticCache compile on CUDA, the DynamicCache runs eagerly.
SETUP_S = {"vase": 30.0, "static": 30.0, "dynamic": 5.0}
MIN_DECODE_S = 10.0
KERNEL = "greedy decode vs generated length"

SETTING, METHODS = profiles.pick({
    "smoke": (
        DecodeSetting(TINY, 2, batch=2, prompt_tokens=16, new_tokens=160, checkpoints=(32, 64, 128, 160),
                      sample_steps=16, prompt_chunk=64),
        [HF_DYNAMIC, HF_DYNAMIC_NO_CUDNN, HF_STATIC, vase_method(32)],
    ),
    "gpu": (
        DecodeSetting(QWEN3["Qwen3-8B"], 4, batch=16, prompt_tokens=256, new_tokens=16384,
                      checkpoints=GENERATED_LENGTHS[:5], time_limit_s=45.0, sample_steps=128,
                      prompt_chunk=FULL_CACHE_PROMPT_CHUNK),
        # VaSE first: a run cut at gpu_check's deadline keeps it; the slowest full cache last.
        [vase_method(2048), HF_STATIC, HF_DYNAMIC_NO_CUDNN, HF_DYNAMIC],
    ),
    "deep": (
        DecodeSetting(QWEN3["Qwen3-8B"], QWEN3["Qwen3-8B"].num_layers, batch=16, prompt_tokens=256,
                      new_tokens=16384, checkpoints=(16384,), time_limit_s=60.0, sample_steps=128,
                      prompt_chunk=FULL_CACHE_PROMPT_CHUNK),
        [vase_method(2048), HF_STATIC, HF_DYNAMIC_NO_CUDNN],
    ),
    "full": (
        DecodeSetting(QWEN3["Qwen3-8B"], 8, batch=16, prompt_tokens=256, new_tokens=32768,
                      checkpoints=GENERATED_LENGTHS),
        [HF_DYNAMIC, HF_DYNAMIC_NO_CUDNN, HF_STATIC, *(vase_method(budget) for budget in BUDGETS),
         vase_method(2048, "vase-dkv")],
    ),
    "cpu": (
        DecodeSetting(SMALL, SMALL.num_layers, batch=4, prompt_tokens=64, new_tokens=4096,
                      checkpoints=(256, 512, 1024, 2048, 3072, 4096)),
        [HF_DYNAMIC, vase_method(256), vase_method(1024)],
    ),
})  # fmt: skip
# What VaSE's rows are compared with: the profile's full caches.
FULL_CACHES = tuple(method.name for method in METHODS if method.cache != "vase")


def _seconds(variable: str, what: str) -> float | None:
    """The number in environment variable `variable` (None when unset); ValueError naming it otherwise."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        raise ValueError(f"{variable}: expected {what}; got {text!r}")
    return value


_TIME_LIMIT_S = _seconds(TIME_LIMIT_VARIABLE, "a positive number of seconds")
if _TIME_LIMIT_S is not None:
    SETTING = dataclasses.replace(SETTING, time_limit_s=_TIME_LIMIT_S)


def decode_seconds(method) -> float | None:
    """The decoding time `method` may take: its share of the time left before the deadline, or the setting's limit."""
    deadline = _seconds(DEADLINE_VARIABLE, "a Unix time (seconds)")
    if deadline is None:
        return SETTING.time_limit_s
    remaining = METHODS[METHODS.index(method) :]
    set_up = sum(SETUP_S[other.cache] for other in remaining)
    return max(MIN_DECODE_S, (deadline - time.time() - set_up) / len(remaining))


@pytest.fixture(scope="module")
def model(device):
    return build_model(SETTING.layout, SETTING.num_layers, device, model_dtype(device))


# The run measures the copy bandwidth, which the report sets each step's bytes against.
@pytest.mark.usefixtures("roofline")
@pytest.mark.parametrize("method", METHODS, ids=[m.name for m in METHODS])
def test_decode_vs_length(benchmark, device, monkeypatch, model, method):
    if device.type == "cpu":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    skips_before = counters["inductor"]["cudagraph_skips"]
    trace = generate_timed(model, method, dataclasses.replace(SETTING, time_limit_s=decode_seconds(method)), device)
    cudagraph_skips = counters["inductor"]["cudagraph_skips"] - skips_before
    record = Record(
        SUITE, KERNEL, method.name, SETTING.name,
        compare_to=FULL_CACHES if method.cache == "vase" else (),
        curve=tuple(trace.points),
        details={
            **trace.details,
            "dtype": str(model.dtype).replace("torch.", ""),
            "layers": model.config.num_hidden_layers,
            "prompt_tokens": SETTING.prompt_tokens,
            "new_tokens_requested": SETTING.new_tokens,
            "generated": trace.generated,
            "time_limited": trace.time_limited,
            "sampled": trace.sampled,
            "curve_measure": SETTING.describe_curve(),
            "decode_seconds": trace.decode_seconds,
            "tokens_per_s": trace.tokens_per_s,
            "peak_bytes": trace.peak_bytes,
            # Compiled graphs inductor ran without CUDA graphs (the reason is in its warning log).
            "cudagraph_skips": cudagraph_skips if device.type == "cuda" else None,
        },
    )  # fmt: skip
    timing.record_samples(benchmark, trace.step_seconds, record)
    assert trace.time_limited or trace.generated == SETTING.new_tokens
    kv_bytes = [point.kv_bytes for point in trace.points]
    assert kv_bytes, "the run ended before its first checkpoint"
    if method.cache == "dynamic":
        assert all(a < b for a, b in zip(kv_bytes, kv_bytes[1:])), f"a dynamic cache grows; got {kv_bytes}"
    else:
        assert len(set(kv_bytes)) == 1, f"{method.name}: a static cache does not grow; got {kv_bytes}"
