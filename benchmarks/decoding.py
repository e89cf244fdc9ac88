"""End-to-end decoding against generated length: one `generate()` per method, every step timed.

The methods are what a user runs: Hugging Face's `DynamicCache` (eager), Hugging Face's
`StaticCache` (on CUDA, `generate` compiles the forward with `torch.compile`, mode
`reduce-overhead`, by itself), and VaSE through `vase_triton.patch_qwen3(model, budget=...,
compile_mode=...)` (`reduce-overhead` on CUDA; on CPU eager, through the PyTorch
reference). The model is a stack of Qwen3 layers of a registry layout with random
weights (greedy decoding; throughput does not depend on the weights), or a local
checkpoint of that layout and depth (`VASE_BENCH_CHECKPOINT`).

A `StepClock` stopping criterion stamps every step (CUDA events on GPU, `perf_counter` on
CPU), notes memory at the checkpoint lengths and can end a run at a wall-clock limit (the
run's curve then ends with a point at the length it stopped at).
Each phase of a method (its warm-up, with any compilation; its timed run; each sampled
length) prints how long it took on stderr, so a run cut by a deadline shows where its time went.
Before the timed run each method generates once with the same cache object (reset in
between, nothing reallocated; a `DynamicCache`, which holds no buffers ahead, is replaced
by a new one) so that compilation, CUDA-graph capture and the eviction kernels' first
launch stay out of the timing.

A setting with `sample_steps` measures each checkpoint length on its own instead of
decoding all the way to it (`generate_sampled`): a prompt that ends `sample_steps + 2`
tokens before the length, the token of its prefill, one untimed decode step, then
`sample_steps` timed steps. What a step costs depends on what the cache holds, and that is
the same as after generating the length: a `DynamicCache` holds as many tokens, a
`StaticCache` keeps its size, and a VaSE cache past its budget is full and evicts every
`window` steps (its prompt is compressed to the budget at prefill, as the decoded tokens
would have been). Its first eviction comes at the `window + 1`-th decode step, so the timed
steps, from the second on, span whole eviction periods when `sample_steps` is a multiple of
`window`. So a GPU session reaches the 16k-token point in seconds where decoding to it
takes minutes per method. A full cache stores a prompt longer than the setting's
`prompt_chunk` in forward passes of that many tokens before `generate`
(`Prepared.fill_prompt`): a whole prefill of a batch of 16 at 16k tokens needs, by our
count, about 104 GiB with its cache and weights at Qwen3-14B and 78 GiB at Qwen3-8B's full
depth, more than or all of an H100's memory. No timed step changes.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy
import torch
from transformers import StoppingCriteria

from benchmarks.records import CurvePoint
from benchmarks.shapes import WINDOW, ModelLayout

CHECKPOINT_VARIABLE = "VASE_BENCH_CHECKPOINT"
# A curve point at length L describes the steps that produced tokens (L - CURVE_SPAN, L].
CURVE_SPAN = 256
# Tokens the untimed run of a full-cache method generates (a VaSE one generates enough for two evictions).
WARMUP_STEPS = 8
# Tokens of a sampled length's run before its timed steps: the prefill's and one decode step's.
UNTIMED_SAMPLED_TOKENS = 2
# Tokens per row of a forward pass that stores a full cache's long sampled prompt (`Prepared.fill_prompt`).
FULL_CACHE_PROMPT_CHUNK = 2048


@dataclass(frozen=True)
class Method:
    """One way to hold the KV cache: `dynamic`, `static` (Hugging Face) or `vase` (policy at budget)."""

    name: str
    cache: str
    policy: str = "vase"
    budget: int = 0
    # SDPA backends the method's attention may use (`torch.nn.attention.SDPBackend` names); None: PyTorch's choice.
    sdpa_backends: Optional[tuple[str, ...]] = None

    def vase_config(self):
        """The `VaSEConfig` of a `vase` method (window 64, or half the budget for tiny smoke budgets)."""
        from vase_triton import VaSEConfig

        return VaSEConfig(policy=self.policy, budget=self.budget, window=min(WINDOW, self.budget // 2))

    def describe(self, device: torch.device) -> str:
        if self.cache == "dynamic":
            limited = "" if self.sdpa_backends is None else f", SDPA limited to {' / '.join(self.sdpa_backends)}"
            return f"transformers DynamicCache, eager{limited}"
        if self.cache == "static":
            compiled = "torch.compile reduce-overhead (generate's own)" if device.type == "cuda" else "eager"
            return f"transformers StaticCache, {compiled}"
        compiled = "compile_mode=reduce-overhead" if device.type == "cuda" else "eager, PyTorch reference ops"
        return f"vase_triton.patch_qwen3(policy={self.policy}, budget={self.budget}), {compiled}"


HF_DYNAMIC = Method("hf-dynamic", "dynamic")
# On sm90/sm100, recent PyTorch puts cuDNN attention first among SDPA's backends once its
# cuDNN is newer than 9.15 (torch 2.11's bundled 9.19 is), and cuDNN builds an execution
# plan per new problem shape: a DynamicCache's key length changes at every step. This
# baseline keeps SDPA off cuDNN.
HF_DYNAMIC_NO_CUDNN = Method(
    "hf-dynamic-no-cudnn", "dynamic", sdpa_backends=("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
)
HF_STATIC = Method("hf-static", "static")


def vase_method(budget: int, policy: str = "vase") -> Method:
    return Method(f"{policy}-{budget}", "vase", policy, budget)


@dataclass(frozen=True)
class DecodeSetting:
    """A decoding workload: `batch` random prompts of `prompt_tokens`, `new_tokens` greedy tokens each."""

    layout: ModelLayout
    num_layers: int
    batch: int
    prompt_tokens: int
    new_tokens: int
    checkpoints: tuple[int, ...]
    time_limit_s: Optional[float] = None
    sample_steps: Optional[int] = None  # measure each checkpoint on its own with this many timed steps
    # A full cache (transformers') takes a longer prompt in eager forward passes of this many tokens
    # before `generate` (`Prepared.generate`); None: `generate` prefills it whole.
    prompt_chunk: Optional[int] = None

    def __post_init__(self) -> None:
        if self.prompt_chunk is not None and not (type(self.prompt_chunk) is int and self.prompt_chunk > 0):
            raise ValueError(f"prompt_chunk: expected a positive number of tokens or None; got {self.prompt_chunk!r}")
        if self.sample_steps is None:
            return
        shortest = min(self.checkpoints)
        # The shortest length's sampled prompt, `prompt_tokens + shortest - sampled_run_tokens`, needs a token.
        most = min(shortest, self.prompt_tokens + shortest - UNTIMED_SAMPLED_TOKENS - 1)
        if not WARMUP_STEPS <= self.sample_steps <= most:
            raise ValueError(
                f"sample_steps: expected {WARMUP_STEPS} (the untimed run's steps) to {most} (the shortest checkpoint, "
                f"{shortest}, with a sampled prompt of at least one token) or None; got {self.sample_steps!r}"
            )

    @property
    def name(self) -> str:
        depth = "" if self.num_layers == self.layout.num_layers else f" ({self.num_layers} layers)"
        return f"{self.layout.name}{depth} B{self.batch} P{self.prompt_tokens}"

    @property
    def sampled_run_tokens(self) -> int:
        """Tokens one sampled length generates: its prefill's, an untimed decode step, `sample_steps` timed."""
        return self.sample_steps + UNTIMED_SAMPLED_TOKENS

    @property
    def warmup_prompt_tokens(self) -> int:
        """The untimed run's prompt: just shorter than the longest sampled one (long, so that the
        long-prompt prefill is compiled before timing and a VaSE cache starts full; shorter by
        `WARMUP_STEPS + 1`, so that a full cache's untimed steps attend over key lengths below
        that run's, whose per-length plans, cuDNN's, they would otherwise build before timing),
        else `prompt_tokens`."""
        if self.sample_steps is None:
            return self.prompt_tokens
        longest = self.prompt_tokens + max(self.checkpoints) - self.sampled_run_tokens
        return max(1, longest - WARMUP_STEPS - 1)

    def describe_curve(self) -> str:
        """What a curve point at length L summarises, for the report."""
        if self.sample_steps is None:
            return f"the steps that produced the {CURVE_SPAN} tokens up to L, in one run from the start"
        return (
            f"{self.sample_steps} steps ending at L, from a prompt of {self.prompt_tokens:,} + L - "
            f"{self.sampled_run_tokens} tokens and one untimed step (sampled: the cache holds what it would after "
            f"generating L tokens)"
        )


@dataclass
class Trace:
    """What one timed `generate()` measured."""

    generated: int
    step_seconds: list[float]
    decode_seconds: float
    points: list[CurvePoint]
    peak_bytes: Optional[int]
    time_limited: bool
    details: dict = field(default_factory=dict)
    sampled: bool = False  # its points were measured each on its own (`generate_sampled`)

    @property
    def tokens_per_s(self) -> Optional[float]:
        """Decode throughput over the whole run: new tokens after the first, per second, all sequences
        (None for a sampled run, whose steps come from several lengths)."""
        if self.sampled:
            return None
        return len(self.step_seconds) * self.details["batch"] / self.decode_seconds


# The configuration fields a checkpoint must share with the layout whose name its rows carry.
LAYOUT_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
                 "intermediate_size", "vocab_size", "tie_word_embeddings")  # fmt: skip


def model_dtype(device: torch.device) -> torch.dtype:
    """The dtype the model-level suites run in: bf16 on CUDA, fp32 on CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def build_model(layout: ModelLayout, num_layers: int, device: torch.device, dtype: torch.dtype):
    """`VASE_BENCH_CHECKPOINT` loaded whole when set, else a random-weight Qwen3 of `layout` with `num_layers`.

    The rows are named after `layout` at `num_layers` (`DecodeSetting.name`), so a checkpoint
    whose configuration differs from it in any of `LAYOUT_FIELDS` is refused before its weights load.
    """
    from transformers import AutoConfig, Qwen3ForCausalLM

    from vase_triton.integrations.loading import load_causal_lm

    checkpoint = os.path.expanduser(os.environ.get(CHECKPOINT_VARIABLE, "").strip())
    if checkpoint:
        if not os.path.isfile(os.path.join(checkpoint, "config.json")):
            raise ValueError(f"{CHECKPOINT_VARIABLE}: expected a local model directory holding config.json; "
                             f"got {checkpoint!r}")  # fmt: skip
        _check_checkpoint_layout(checkpoint, AutoConfig.from_pretrained(checkpoint), layout, num_layers)
        model = load_causal_lm(checkpoint, dtype=dtype).to(device)
    else:
        previous = torch.get_default_dtype()
        torch.manual_seed(0)
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model = Qwen3ForCausalLM(layout.qwen3_config(num_layers))
        finally:
            torch.set_default_dtype(previous)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def _check_checkpoint_layout(checkpoint: str, config, layout: ModelLayout, num_layers: int) -> None:
    expected = layout.qwen3_config(num_layers)
    differing = [
        f"{name} {getattr(config, name, None)} ({layout.name} at {num_layers} layers: {getattr(expected, name)})"
        for name in LAYOUT_FIELDS
        if getattr(config, name, None) != getattr(expected, name)
    ]
    if differing:
        raise ValueError(
            f"{CHECKPOINT_VARIABLE}={checkpoint}: its configuration differs from the layout the rows are named "
            f"after: {'; '.join(differing)}"
        )


def weights_description() -> str:
    checkpoint = os.environ.get(CHECKPOINT_VARIABLE, "").strip()
    return f"checkpoint {checkpoint}" if checkpoint else "random (throughput does not depend on the weights)"


def weight_bytes_per_step(model) -> int:
    """Bytes of the parameters one decode step reads: each weight once, except the input
    embedding table, of which a step reads only its batch's rows (a table the output
    projection shares is read whole there, so it counts). For a mixture of experts this
    counts every expert: an upper bound, since a step reads only the routed ones."""
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    shared = output is not None and output.weight is embedding
    return sum(
        parameter.numel() * parameter.element_size()
        for parameter in model.parameters()  # a shared parameter comes once
        if shared or parameter is not embedding
    )


def kv_cache_bytes(cache) -> int:
    """Bytes the cache holds now: a `VaSECache`'s static buffers, or a transformers cache's layer tensors."""
    if hasattr(cache, "memory_bytes"):
        return int(cache.memory_bytes)
    total = 0
    for layer in cache.layers:
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


class StepClock(StoppingCriteria):
    """Stamps each generation step; notes memory at `checkpoints` and at a stop past `time_limit_s`."""

    def __init__(
        self, prompt_tokens: int, checkpoints, cache, device: torch.device, time_limit_s=None, *, peak_of_decode=False
    ):
        self.prompt_tokens = prompt_tokens
        # The peak noted leaves out the prefill and the first decode step, which frees what the
        # prefill held (VaSE's prefill scratch): the peak of the steady decode steps.
        self.peak_of_decode = peak_of_decode
        self.checkpoints = set(checkpoints)
        self.cache = cache
        self.device = device
        self.time_limit_s = time_limit_s
        self.stamps: list = []
        self.memory: dict[int, tuple[int, Optional[int]]] = {}
        self.started = time.perf_counter()
        self.time_limited = False
        self._stop: Optional[torch.Tensor] = None

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        if self.device.type == "cuda":
            if self.peak_of_decode and len(self.stamps) == 1:  # the first decode step has run
                torch.cuda.reset_peak_memory_stats(self.device)
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.stamps.append(event)
        else:
            self.stamps.append(time.perf_counter())
        generated = input_ids.shape[1] - self.prompt_tokens
        if generated in self.checkpoints:
            self._note_memory(generated)
        if self._stop is None:
            self._stop = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        if self.time_limit_s is not None and time.perf_counter() - self.started > self.time_limit_s:
            self.time_limited = True
            if generated not in self.memory:  # the curve ends where the run got to
                self._note_memory(generated)
            return torch.ones_like(self._stop)
        return self._stop

    def _note_memory(self, generated: int) -> None:
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        self.memory[generated] = (kv_cache_bytes(self.cache), peak)

    def seconds_between_stamps(self) -> list[float]:
        """Durations of the steps after the first (the prefill step), in order."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.stamps, self.stamps[1:])]
        return [b - a for a, b in zip(self.stamps, self.stamps[1:])]


def curve_point(generated: int, span: list[float], memory: tuple[int, Optional[int]], batch: int) -> CurvePoint:
    """Decoding at `generated` tokens from the durations of the steps up to it: their median, and
    tokens/s over their total time (so the steps that evicted count in it)."""
    kv_bytes, peak = memory
    return CurvePoint(generated, statistics.median(span), batch * len(span) / sum(span), kv_bytes, peak, len(span))


def estimated_decode_seconds(points: list[CurvePoint], new_tokens: int, batch: int) -> float:
    """Decode time of one run of `new_tokens` tokens (the steps that produce tokens 2 to
    `new_tokens`) from a sampled curve: each step takes the mean step time (batch / tokens/s)
    interpolated linearly between the points' centres (the mean length of the steps each point
    measured), held at the first and last point beyond them."""
    lengths = [point.generated for point in points]
    if not lengths or lengths != sorted(lengths):
        raise ValueError(f"points: expected a curve sorted by length; got lengths {lengths}")
    means = [batch / point.tokens_per_s for point in points]
    centres = [point.centre for point in points]
    return float(numpy.interp(numpy.arange(2, new_tokens + 1), centres, means).sum())


def curve(step_seconds: list[float], memory: dict, batch: int) -> list[CurvePoint]:
    """A point from the `CURVE_SPAN` steps up to each checkpoint reached, with its memory.

    `step_seconds[i]` is the step that produced token `i + 2` (the first token comes from prefill).
    """
    points = []
    for generated in sorted(memory):
        span = step_seconds[max(0, generated - 1 - CURVE_SPAN) : generated - 1]
        if span:
            points.append(curve_point(generated, span, memory[generated], batch))
    return points


def _make_cache(model, method: Method, setting: DecodeSetting):
    from transformers import DynamicCache, StaticCache

    if method.cache == "dynamic":
        return DynamicCache(config=model.config)
    if method.cache == "static":
        return StaticCache(config=model.config, max_cache_len=setting.prompt_tokens + setting.new_tokens)
    from vase_triton import VaSECache

    return VaSECache.for_model(model, method.vase_config(), batch_size=setting.batch)


def random_prompts(model, batch: int, length: int, device: torch.device) -> dict:
    """`generate`'s inputs for `batch` prompts of `length` random tokens (seeded; no padding)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    input_ids = torch.randint(1, model.config.vocab_size, (batch, length), generator=gen).to(device)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def _report_phase(method: Method, phase: str, began: float) -> None:
    """Print on stderr that `method` finished `phase`, begun at `perf_counter()` time `began`, and its seconds."""
    print(f"[{method.name}] {phase}: {time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)


def _warmup_tokens(method: Method, setting: DecodeSetting) -> int:
    """Tokens the untimed run generates: enough for two evictions with VaSE (its cache holds at
    least min(prompt, budget) slots after the prompt, and evicts every `window` steps once it
    holds budget + window), a few steps otherwise."""
    if method.cache != "vase":
        return WARMUP_STEPS
    held = min(setting.warmup_prompt_tokens, method.budget)
    return max(WARMUP_STEPS, method.budget + 2 * method.vase_config().window - held + 2)


def _sdpa_backends(names: Optional[tuple[str, ...]]):
    """A context that limits SDPA to the named backends, or changes nothing for None."""
    if names is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, name) for name in names])


def _full_cache_prompt_chunk(method: Method, setting: DecodeSetting) -> Optional[int]:
    """Tokens per forward pass in which `Prepared.fill_prompt` stores a long prompt; None where `generate`
    prefills it whole: a VaSE cache (it chunks its prompt itself) or a setting without `prompt_chunk`."""
    return None if method.cache == "vase" else setting.prompt_chunk


@dataclass
class Prepared:
    """A method ready to decode: the prompts, its warmed-up (then emptied) cache and the cache keyword."""

    inputs: dict
    cache: object
    argument: str
    warmup: int
    method: Method
    setting: DecodeSetting

    def generate(self, model, max_new_tokens: int, **kwargs):
        """Greedy `generate` from the prompts into the (empty) cache; a full cache takes a prompt longer
        than `setting.prompt_chunk` in chunks first (`fill_prompt`)."""
        with _sdpa_backends(self.method.sdpa_backends):
            self.fill_prompt(model)
            return model.generate(
                **self.inputs, max_new_tokens=max_new_tokens, do_sample=False, **{self.argument: self.cache}, **kwargs
            )

    def fill_prompt(self, model) -> None:
        """Store all of a prompt longer than `setting.prompt_chunk` but its last token in a full cache, by
        eager forward passes of `prompt_chunk` tokens; `generate` then prefills the last token alone.

        A whole prefill's activations grow with batch x prompt: at batch 16 a 16k-token prompt
        needs about 36 GiB of them at Qwen3-14B (counted: the MLP's three intermediate tensors
        and four query-sized ones), next to 28 GiB of weights and 41 GiB of cache; in passes of
        2,048 tokens, 4.4 GiB. The cache ends up holding the same tokens, and no timed step
        changes. A VaSE cache takes its prompt in chunks itself (`prefill_chunk_size`).
        """
        chunk, input_ids = _full_cache_prompt_chunk(self.method, self.setting), self.inputs.get("input_ids")
        if chunk is None or input_ids.shape[1] <= chunk:
            return
        stored = input_ids.shape[1] - 1
        with torch.no_grad():  # as `generate` runs
            for start in range(0, stored, chunk):
                end = min(start + chunk, stored)
                model(input_ids=input_ids[:, start:end], attention_mask=self.inputs["attention_mask"][:, :end],
                      use_cache=True, logits_to_keep=1, **{self.argument: self.cache})  # fmt: skip

    def empty_cache(self, model) -> None:
        """Start the next `generate` from an empty cache: a new `DynamicCache`, else the same buffers reset."""
        if self.method.cache == "dynamic":
            self.cache = _make_cache(model, self.method, self.setting)
        else:
            self.cache.reset()


@contextlib.contextmanager
def prepared(model, method: Method, setting: DecodeSetting, device: torch.device, warmup: Optional[int] = None):
    """Patch `model` for `method` (VaSE), warm it up with `warmup` tokens (default: enough for two
    evictions with VaSE) and empty its cache; unpatch on exit."""
    import vase_triton
    from vase_triton.integrations.patching import cache_keyword

    if device.type == "cuda":
        # Each method starts as in a fresh process: no compiled code, graphs or cached blocks of the last.
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    began = time.perf_counter()
    inputs = random_prompts(model, setting.batch, setting.warmup_prompt_tokens, device)
    if method.cache == "vase":
        compile_mode = "reduce-overhead" if device.type == "cuda" else None
        vase_triton.patch_qwen3(model, method.vase_config(), compile_mode=compile_mode)
    try:
        warmup = min(_warmup_tokens(method, setting) if warmup is None else warmup, setting.new_tokens)
        ready = Prepared(inputs, _make_cache(model, method, setting), cache_keyword(model), warmup, method, setting)
        ready.generate(model, warmup)
        ready.empty_cache(model)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        _report_phase(method, f"warm-up, {warmup} tokens from a {setting.warmup_prompt_tokens:,}-token prompt", began)
        yield ready
    finally:
        if method.cache == "vase":
            vase_triton.unpatch(model)


def generate_timed(model, method: Method, setting: DecodeSetting, device: torch.device) -> Trace:
    """Warm up, then run one timed greedy `generate()` of `setting` with `method`'s cache
    (`generate_sampled` when the setting samples its checkpoints)."""
    if setting.sample_steps is not None:
        return generate_sampled(model, method, setting, device)
    with prepared(model, method, setting, device) as ready:
        began = time.perf_counter()
        clock = StepClock(setting.prompt_tokens, setting.checkpoints, ready.cache, device, setting.time_limit_s)
        ready.generate(model, setting.new_tokens, stopping_criteria=[clock])
        step_seconds = clock.seconds_between_stamps()
        _report_phase(method, f"timed run, {len(clock.stamps):,} tokens", began)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return Trace(
        generated=len(clock.stamps),
        step_seconds=step_seconds,
        decode_seconds=sum(step_seconds),
        points=curve(step_seconds, clock.memory, setting.batch),
        peak_bytes=peak,
        time_limited=clock.time_limited,
        details=_trace_details(model, method, setting, device, ready),
    )


def generate_sampled(model, method: Method, setting: DecodeSetting, device: torch.device) -> Trace:
    """Warm up, then generate `sampled_run_tokens` greedy tokens from a prompt ending that many
    tokens before each checkpoint, longest first (a run cut by the time limit keeps the longest lengths).

    The point at length L gets the `sample_steps` steps that produced tokens L - sample_steps + 1
    to L (not the first decode step, after which a VaSE cache takes `window` steps to its first
    eviction), and their peak memory (see `StepClock`). The trace's steps are those of every
    length; it has no whole-run throughput.
    """
    points, step_seconds = [], []
    time_limited = False
    with prepared(model, method, setting, device) as ready:
        started = time.perf_counter()
        for length in sorted(setting.checkpoints, reverse=True):
            left = None if setting.time_limit_s is None else setting.time_limit_s - (time.perf_counter() - started)
            if left is not None and left <= 0:
                time_limited = True
                break
            began = time.perf_counter()
            run_tokens = setting.sampled_run_tokens
            prompt_tokens = setting.prompt_tokens + length - run_tokens
            ready.empty_cache(model)
            ready.inputs = random_prompts(model, setting.batch, prompt_tokens, device)
            clock = StepClock(prompt_tokens, (run_tokens,), ready.cache, device, left, peak_of_decode=True)
            ready.generate(model, run_tokens, stopping_criteria=[clock])
            steps = clock.seconds_between_stamps()[1:]  # the first decode step is not timed
            time_limited = time_limited or clock.time_limited
            if steps:
                reached = max(clock.memory)  # run_tokens, or where the time limit stopped the run
                points.append(curve_point(length - run_tokens + reached, steps, clock.memory[reached],
                                          setting.batch))  # fmt: skip
                step_seconds += steps
            _report_phase(method, f"length {length:,}, {len(steps)} timed steps from a {prompt_tokens:,}-token prompt",
                          began)  # fmt: skip
    points.sort(key=lambda point: point.generated)
    return Trace(
        generated=points[-1].generated if points else 0,
        step_seconds=step_seconds,
        decode_seconds=sum(step_seconds),
        points=points,
        peak_bytes=max((point.peak_bytes for point in points if point.peak_bytes is not None), default=None),
        time_limited=time_limited,
        details=_trace_details(model, method, setting, device, ready),
        sampled=True,
    )


def _trace_details(model, method: Method, setting: DecodeSetting, device: torch.device, ready: Prepared) -> dict:
    """What a trace states beside its timings (the report reads `batch` and `weight_bytes`)."""
    details = {
        "batch": setting.batch,
        "method": method.describe(device),
        "weights": weights_description(),
        "weight_bytes": weight_bytes_per_step(model),
        "warmup_tokens": ready.warmup,
    }
    chunk = _full_cache_prompt_chunk(method, setting)
    if chunk is not None:
        details["prompt_fill"] = (f"a prompt over {chunk:,} tokens: eager forward passes of "
                                  f"{chunk:,} tokens, then generate from its last token (untimed)")  # fmt: skip
    return details
