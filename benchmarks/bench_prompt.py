"""A prompt end to end: a whole model's `generate(max_new_tokens=1)` from one prompt, full cache against VaSE.

`bench_prefill.py` times the attention kernels alone; this suite times what a user waits for
before the first token: every layer's projections, attention and cache writes, and with VaSE
the eviction of a prompt longer than its budget. One prompt of random tokens (batch 1); each
row runs one untimed call, then `ROUNDS` timed ones, each from an emptied cache
(`time.perf_counter` around the call). Profiles: `cpu`, the model of the CPU end-to-end record
(`SMALL`, fp32, the PyTorch reference ops) at prompts of 1,024, 4,096 and 16,384 tokens
(VaSE takes the last in chunks of `prefill_chunk_size`, the cache compressed between them,
where the full cache attends over the whole prompt); `gpu`,
Qwen3-8B's layout at 4 layers (bf16, the Triton kernels) at 8,192 and 32,768 tokens, the
`prompt` step of `gpu_check.sh`; `full`, the same layout at its 36 layers over every prompt
length of the registry; `smoke`, a tiny model (CI; not a measurement).
"""

from __future__ import annotations

import time

import pytest
import torch

from benchmarks import profiles, timing
from benchmarks.decoding import HF_DYNAMIC, DecodeSetting, build_model, model_dtype, prepared, vase_method
from benchmarks.records import Record
from benchmarks.shapes import PROMPT_LENGTHS, QWEN3, SMALL, TINY

pytestmark = timing.REPLAYED

SUITE = "prompt"
KERNEL = "prompt to first token (generate, 1 new token)"

LAYOUT, NUM_LAYERS, PROMPTS, METHODS, ROUNDS = profiles.pick({
    "smoke": (TINY, 2, (64,), [HF_DYNAMIC, vase_method(32)], 1),
    "cpu": (SMALL, SMALL.num_layers, (1024, 4096, 16384), [HF_DYNAMIC, vase_method(256)], 3),
    "gpu": (QWEN3["Qwen3-8B"], 4, (8192, 32768), [HF_DYNAMIC, vase_method(2048)], 5),
    "full": (QWEN3["Qwen3-8B"], QWEN3["Qwen3-8B"].num_layers, PROMPT_LENGTHS, [HF_DYNAMIC, vase_method(2048)], 5),
})  # fmt: skip
FULL_CACHES = tuple(method.name for method in METHODS if method.cache != "vase")


@pytest.fixture(scope="module")
def model(device):
    return build_model(LAYOUT, NUM_LAYERS, device, model_dtype(device))


@pytest.mark.parametrize("prompt_tokens", PROMPTS, ids=[f"P{tokens}" for tokens in PROMPTS])
@pytest.mark.parametrize("method", METHODS, ids=[m.name for m in METHODS])
def test_prompt_to_first_token(benchmark, device, monkeypatch, model, method, prompt_tokens):
    if device.type == "cpu":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    setting = DecodeSetting(LAYOUT, NUM_LAYERS, batch=1, prompt_tokens=prompt_tokens, new_tokens=1, checkpoints=(1,))
    samples = []
    with torch.inference_mode(), prepared(model, method, setting, device, warmup=1) as ready:
        for _ in range(ROUNDS):
            ready.empty_cache(model)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            output = ready.generate(model, 1)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            samples.append(time.perf_counter() - start)
            # The prompt went through whole: one new token after it, and every VaSE layer holds
            # the prompt, or `budget` of its tokens after an eviction.
            assert output.shape == (1, prompt_tokens + 1)
            if method.cache == "vase":
                held = [int(store.tensors.lengths[0]) for store in ready.cache.stores]
                assert held == [min(prompt_tokens, method.budget)] * NUM_LAYERS, held
    record = Record(
        SUITE, KERNEL, method.name, setting.name,
        compare_to=FULL_CACHES if method.cache == "vase" else (),
        details={
            "method": method.describe(device),
            "dtype": str(model.dtype).replace("torch.", ""),
            "layers": NUM_LAYERS,
            "prompt_tokens": prompt_tokens,
            "batch": 1,
            "timing": timing.HOST_TIMING + (" (CUDA synchronized)" if device.type == "cuda" else ""),
        },
    )  # fmt: skip
    timing.record_samples(benchmark, samples, record)
