"""The end-to-end benchmark's step clock: stamps, memory at checkpoints, and a run stopped by
its time limit, whose curve must still end where it got to (an H200 run once stopped a slow
method before its first checkpoint and lost the whole curve)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from benchmarks import decoding
from benchmarks.decoding import StepClock, curve

REPO = Path(__file__).resolve().parents[1]

PROMPT = 5
BATCH = 2


class FakeTime:
    """A `time` module whose `perf_counter` returns what the test sets."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def drive(clock: StepClock, fake: FakeTime, durations: list[float]) -> int:
    """Call `clock` as generate would, once per new token, step `i` lasting `durations[i]`;
    return the number of calls made before it asked to stop (all of them if it never did)."""
    for step, duration in enumerate(durations, start=1):
        stop = clock(torch.zeros(BATCH, PROMPT + step, dtype=torch.long), None)
        if bool(stop.all()):
            return step
        fake.now += duration
    return len(durations)


@pytest.fixture
def fake_time(monkeypatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(decoding, "time", fake)
    return fake


def test_time_limited_run_ends_its_curve_where_it_stopped(fake_time):
    durations = [0.001 * (1 + step % 7) for step in range(200)]
    cache = types.SimpleNamespace(memory_bytes=4096)
    limit = sum(durations[:40]) - 1e-9
    clock = StepClock(PROMPT, (8, 16, 32, 64), cache, torch.device("cpu"), time_limit_s=limit)

    stopped_at = drive(clock, fake_time, durations)

    assert clock.time_limited and stopped_at == 41
    assert sorted(clock.memory) == [8, 16, 32, 41]
    step_seconds = clock.seconds_between_stamps()
    assert step_seconds == pytest.approx(durations[:40])
    points = curve(step_seconds, clock.memory, BATCH)
    assert [point.generated for point in points] == [8, 16, 32, 41]
    for point in points:
        span = durations[: point.generated - 1]
        assert point.step_s == pytest.approx(statistics.median(span))
        assert point.tokens_per_s == pytest.approx(BATCH * len(span) / sum(span))
        assert point.kv_bytes == 4096


def test_run_within_its_limit_notes_only_the_checkpoints(fake_time):
    durations = [0.002] * 50
    clock = StepClock(PROMPT, (8, 16, 32, 64), types.SimpleNamespace(memory_bytes=1), torch.device("cpu"), 10.0)

    assert drive(clock, fake_time, durations) == 50
    assert not clock.time_limited
    assert sorted(clock.memory) == [8, 16, 32]


def test_decode_profile_counts_each_steps_operations(tmp_path):
    """On the smoke setting every decode step runs each linear layer once (7 per layer and the
    LM head: one matrix product each), and nothing of the prefill is counted."""
    from benchmarks import profile_decode
    from benchmarks.bench_end_to_end import SETTING as setting
    from benchmarks.decoding import HF_DYNAMIC, build_model

    model = build_model(setting.layout, setting.num_layers, torch.device("cpu"), torch.float32)
    result = profile_decode.profile_method(model, HF_DYNAMIC, setting, torch.device("cpu"), steps=4, warmup=2)

    calls = {name: per_step for name, _, per_step in result.operations}
    assert calls["aten::mm"] == 7 * setting.num_layers + 1
    assert result.device_s is None and result.step_s > 0 and result.cudagraph_skips is None
    text = profile_decode.render([result], setting, torch.device("cpu"), 4)
    assert "| hf-dynamic |" in text and "not a measurement" in text
    row = next(line for line in text.splitlines() if line.startswith("| hf-dynamic |"))
    assert row.rstrip().endswith("| — | — |")  # no device time and no CUDA graphs on CPU


def test_decode_profile_passes_decode_key_lengths_no_earlier_pass_reached(monkeypatch):
    """The warm-up, the timed and the profiled pass decode disjoint key lengths (a full cache's cuDNN
    plans are built per length on first sight), and as many steps as fit end exactly at the
    setting's length (a StaticCache holds no more)."""
    from benchmarks import profile_decode
    from benchmarks.bench_end_to_end import SETTING as setting
    from benchmarks.decoding import HF_DYNAMIC, Prepared, build_model

    runs = []  # (prompt tokens, generated tokens) of each generate, in order
    generate = Prepared.generate

    def recorded(self, model, max_new_tokens, **kwargs):
        runs.append((self.inputs["input_ids"].shape[1], max_new_tokens))
        return generate(self, model, max_new_tokens, **kwargs)

    monkeypatch.setattr(Prepared, "generate", recorded)
    warmup = 2
    steps = profile_decode.fitting_steps(setting, 10_000, warmup)
    model = build_model(setting.layout, setting.num_layers, torch.device("cpu"), torch.float32)
    profile_decode.profile_method(model, HF_DYNAMIC, setting, torch.device("cpu"), steps=steps, warmup=warmup)

    assert runs[0] == (setting.warmup_prompt_tokens, warmup) and [tokens for _, tokens in runs[1:]] == [steps + 2] * 2
    # A run's decode steps attend over its prompt plus 1 to (its tokens - 1) keys.
    decoded = [set(range(prompt + 1, prompt + tokens)) for prompt, tokens in runs]
    assert all(not a & b for i, a in enumerate(decoded) for b in decoded[i + 1:])
    assert max(decoded[-1]) == setting.prompt_tokens + setting.new_tokens
    assert profile_decode.fitting_steps(setting, steps - 1, warmup) == steps - 1
    most = profile_decode.most_warmup(setting)
    assert [profile_decode.fitting_steps(setting, 1, warmup) for warmup in (most, most + 1)] == [1, 0]


def test_decode_profile_takes_vase_then_the_default_full_cache_first():
    """A profile cut by its time limit (gpu_check.sh's 90 s) keeps VaSE's step and the default
    DynamicCache's, whose per-length cuDNN plans it is to show; the compiled StaticCache comes last."""
    from benchmarks import profile_decode
    from benchmarks.decoding import HF_DYNAMIC, HF_DYNAMIC_NO_CUDNN, HF_STATIC, vase_method

    methods = [vase_method(2048), HF_STATIC, HF_DYNAMIC_NO_CUDNN, HF_DYNAMIC]  # the gpu profile's, in its order
    ordered = [method.name for method in profile_decode.default_order(methods)]
    assert ordered == ["vase-2048", "hf-dynamic", "hf-dynamic-no-cudnn", "hf-static"]


@pytest.mark.parametrize(
    "environment, argv, message",
    [({"VASE_BENCH_PROFILE": "bogus"}, [], "VASE_BENCH_PROFILE: expected one of"),
     ({"VASE_BENCH_DECODE_SECONDS": "abc"}, ["--help"], "VASE_BENCH_DECODE_SECONDS: expected"),
     ({"VASE_BENCH_CHECKPOINT": "/nonexistent"}, [], "VASE_BENCH_CHECKPOINT: expected a local model directory"),
     ({}, ["--out", "{file}"], "--out: expected a directory; {file} is a file"),
     ({}, ["--warmup", "23"], "--warmup: expected at most 22 tokens in this profile")],
    ids=["profile", "time-limit", "checkpoint", "out-a-file", "warmup"],
)  # fmt: skip
def test_decode_profile_refuses_its_settings_in_one_line(tmp_path, environment, argv, message):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.profile_decode", *(arg.format(file=a_file) for arg in argv)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **environment}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") <= 3 and message.format(file=a_file) in result.stderr.splitlines()[-1]


def test_decode_profile_counts_each_kernel_once_on_cuda():
    """The profiler gives a kernel's time to the kernel, to the CPU operation that launched it and to
    the annotations around it (a compiled graph's call, the profiler step): busy time per step is
    the kernels' and copies' alone, and only they are listed."""
    from torch.autograd import DeviceType

    from benchmarks import profile_decode

    def average(key, device_type, device_us, count=2, annotation=False):
        return types.SimpleNamespace(key=key, device_type=device_type, self_device_time_total=device_us,
                                     count=count, is_user_annotation=annotation, self_cpu_time_total=5.0)  # fmt: skip

    averages = [
        average("aten::mm", DeviceType.CPU, 300.0),
        average("sm90_xmma_gemm_bf16", DeviceType.CUDA, 300.0),
        average("cudaLaunchKernel", DeviceType.CPU, 0.0),
        average("## Call CompiledFxGraph ##", DeviceType.CUDA, 450.0, annotation=True),
        average("ProfilerStep#2", DeviceType.CUDA, 500.0, count=1, annotation=True),
        average("Memcpy DtoD (Device -> Device)", DeviceType.CUDA, 100.0),
    ]
    device_s, operations = profile_decode.step_costs(averages, steps=2, on_device=True)

    assert device_s == pytest.approx((300.0 + 100.0) / 1e6 / 2)
    assert operations == [("sm90_xmma_gemm_bf16", pytest.approx(150e-6), 1.0),
                          ("Memcpy DtoD (Device -> Device)", pytest.approx(50e-6), 1.0)]  # fmt: skip


def test_methods_share_the_time_left_before_the_deadline(monkeypatch):
    """Each method gets an equal share of what is left when it starts, once the set-up of it and
    of the methods after it (30 s compiled, 5 s eager) is set aside."""
    from benchmarks import bench_end_to_end as suite

    methods = [decoding.vase_method(32), decoding.HF_STATIC, decoding.HF_DYNAMIC_NO_CUDNN, decoding.HF_DYNAMIC]
    monkeypatch.setattr(suite, "METHODS", methods)
    monkeypatch.setattr(suite.time, "time", lambda: 1000.0)
    monkeypatch.delenv(suite.DEADLINE_VARIABLE, raising=False)
    assert suite.decode_seconds(methods[0]) == suite.SETTING.time_limit_s
    monkeypatch.setenv(suite.DEADLINE_VARIABLE, str(1000.0 + 300.0))
    shares = [suite.decode_seconds(method) for method in methods]
    # 300 s less 30 + 30 + 5 + 5 over four, then less 30 + 5 + 5 over three, ...
    assert shares == [pytest.approx(230.0 / 4), pytest.approx(260.0 / 3), pytest.approx(290.0 / 2), 295.0]
    monkeypatch.setenv(suite.DEADLINE_VARIABLE, str(1000.0 - 5.0))  # past: the floor
    assert suite.decode_seconds(methods[-1]) == suite.MIN_DECODE_S


@pytest.fixture(scope="module")
def tiny_model():
    from benchmarks.decoding import build_model
    from benchmarks.shapes import TINY

    return build_model(TINY, 2, torch.device("cpu"), torch.float32)


def tiny_setting(**overrides):
    from benchmarks.shapes import TINY

    fields = dict(batch=2, prompt_tokens=16, new_tokens=96, checkpoints=(32, 64, 96))
    return decoding.DecodeSetting(TINY, 2, **{**fields, **overrides})


@pytest.mark.parametrize("tied", [False, True], ids=["own-output-projection", "tied-embeddings"])
def test_a_step_reads_every_weight_but_the_embedding_table(tied):
    """Counted from the Qwen3 architecture: per layer the q/k/v/o projections, the q/k norms,
    two layer norms and the gated MLP; then the final norm and the vocab x hidden output
    projection, read whole whether or not it shares the (otherwise unread) embedding table."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, tie_word_embeddings=tied,
    )  # fmt: skip
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    hidden, heads, kv_heads, head_dim = 64, 4, 2, 32
    per_layer = (
        2 * hidden * heads * head_dim  # q and o
        + 2 * hidden * kv_heads * head_dim  # k and v
        + 2 * head_dim  # q and k norms
        + 2 * hidden  # input and post-attention norms
        + 3 * hidden * 96  # gate, up and down
    )
    expected = 2 * (3 * per_layer + hidden + 1000 * hidden)  # bf16
    assert decoding.weight_bytes_per_step(model) == expected


@pytest.mark.parametrize("method", [decoding.HF_DYNAMIC, decoding.HF_STATIC, decoding.vase_method(32)], ids=lambda method: method.name)
def test_sampled_lengths_hold_what_one_run_from_the_start_holds(tiny_model, method, monkeypatch):
    """Each sampled point's cache holds as many bytes as the one-run curve's at that length (a
    DynamicCache grows by a token per step; VaSE, its prompt compressed at prefill, holds its
    static buffers with no prefill scratch left), from `sample_steps` steps ending there."""
    monkeypatch.setenv("VASE_BACKEND", "torch")
    device = torch.device("cpu")
    whole = decoding.generate_timed(tiny_model, method, tiny_setting(), device)
    sampled = decoding.generate_timed(tiny_model, method, tiny_setting(sample_steps=16), device)

    assert [p.generated for p in sampled.points] == [p.generated for p in whole.points] == [32, 64, 96]
    assert [p.kv_bytes for p in sampled.points] == [p.kv_bytes for p in whole.points]
    if method.cache == "dynamic":
        per_token = whole.points[0].kv_bytes // (16 + 32 - 1)
        assert [p.kv_bytes for p in sampled.points] == [per_token * (16 + n - 1) for n in (32, 64, 96)]
    assert len(sampled.step_seconds) == 3 * 16 and not sampled.time_limited
    assert sampled.tokens_per_s is None and whole.tokens_per_s > 0
    assert sampled.generated == whole.generated == 96


def test_sampled_run_cut_by_its_time_limit_keeps_the_longest_lengths(tiny_model, monkeypatch):
    """Lengths run longest first; the one the limit cuts ends its point where it stopped, and
    the shorter ones are not started."""

    class TickingTime:
        """A `time` module whose clock advances 1 ms at every reading."""

        now = 0.0

        def perf_counter(self) -> float:
            self.now += 0.001
            return self.now

    monkeypatch.setattr(decoding, "time", TickingTime())
    setting = tiny_setting(sample_steps=16, time_limit_s=0.050)
    trace = decoding.generate_timed(tiny_model, decoding.HF_DYNAMIC, setting, torch.device("cpu"))

    assert trace.time_limited
    longest, cut = trace.points[1], trace.points[0]
    assert longest.generated == 96 and 64 - 18 < cut.generated < 64
    # Each length's prompt ends 16 + 2 tokens before it; its first decode step is not timed.
    assert len(trace.step_seconds) == 16 + (cut.generated - (64 - 18) - 2)


def test_each_phase_of_a_method_reports_its_seconds(tiny_model, capsys):
    """A run cut by a GPU session's deadline shows where its time went: the warm-up (from just
    below the longest sampled prompt, 16 + 96 - 18 - 9 tokens), then each sampled length, longest first, with
    its prompt (16 + L - 18 tokens) and its 16 timed steps, each with the seconds it took."""
    decoding.generate_timed(tiny_model, decoding.HF_DYNAMIC, tiny_setting(sample_steps=16), torch.device("cpu"))
    lines = capsys.readouterr().err.splitlines()
    phases = [line.rsplit(": ", 1)[0] for line in lines]
    assert phases == [
        f"[hf-dynamic] warm-up, {decoding.WARMUP_STEPS} tokens from a 85-token prompt",
        "[hf-dynamic] length 96, 16 timed steps from a 94-token prompt",
        "[hf-dynamic] length 64, 16 timed steps from a 62-token prompt",
        "[hf-dynamic] length 32, 16 timed steps from a 30-token prompt",
    ]
    seconds = [float(line.rsplit(": ", 1)[1].removesuffix(" s")) for line in lines]
    assert all(second >= 0 for second in seconds)


def test_sampled_vase_steps_evict_once_every_window(tiny_model, monkeypatch):
    """A VaSE cache compressed at prefill first evicts at its `window + 1`-th decode step, then every
    `window` steps: the timed steps of a sampled length whose cache is full hold one eviction per
    `window` steps, as decoding to that length does (`window` 16 here); at 32 tokens the cache
    (16 + 32 tokens, 48 slots) has not evicted yet."""
    evictions_at_stamps = []

    class EvictionCountingClock(decoding.StepClock):
        def __call__(self, input_ids, scores, **kwargs):
            if not self.stamps:
                evictions_at_stamps.append([])
            evictions_at_stamps[-1].append(self.cache.n_evictions)
            return super().__call__(input_ids, scores, **kwargs)

    monkeypatch.setenv("VASE_BACKEND", "torch")
    monkeypatch.setattr(decoding, "StepClock", EvictionCountingClock)
    method = decoding.vase_method(32)
    trace = decoding.generate_timed(tiny_model, method, tiny_setting(sample_steps=16), torch.device("cpu"))

    timed = [counts[-1] - counts[1] for counts in evictions_at_stamps]  # evictions after the first decode step
    assert [p.generated for p in trace.points] == [32, 64, 96]
    assert timed == [1, 1, 0]  # lengths 96, 64, 32 (longest first)
    assert method.vase_config().window == 16


@pytest.mark.parametrize("sample_steps", [7, 33])
def test_sample_steps_must_fit_before_the_shortest_checkpoint(sample_steps):
    expected = r"sample_steps: expected 8 \(the untimed run's steps\) to 32 \(the shortest checkpoint, 32,"
    with pytest.raises(ValueError, match=expected):
        tiny_setting(sample_steps=sample_steps)


@pytest.mark.parametrize("checkpoints", [(32, 64, 96), (1024, 2048, 4096, 8192, 16384)])
def test_the_warmup_primes_no_key_length_of_a_timed_step(checkpoints):
    """A full cache's untimed run (its prompt's last token, then `WARMUP_STEPS` decode steps)
    attends over key lengths that no timed step of any sampled length does (cuDNN builds and
    keeps a plan per key length): below the longest run's, above the others' when lengths are
    further apart than a run."""
    setting = tiny_setting(prompt_tokens=40, new_tokens=max(checkpoints), checkpoints=checkpoints, sample_steps=16)
    assert decoding._warmup_tokens(decoding.HF_DYNAMIC, setting) == decoding.WARMUP_STEPS
    warmup = set(range(setting.warmup_prompt_tokens, setting.warmup_prompt_tokens + decoding.WARMUP_STEPS + 1))
    for length in checkpoints:
        prompt = setting.prompt_tokens + length - setting.sampled_run_tokens
        timed = set(range(prompt + decoding.UNTIMED_SAMPLED_TOKENS, prompt + setting.sampled_run_tokens + 1))
        assert not warmup & timed
    assert max(warmup) < setting.prompt_tokens + max(checkpoints) - setting.sampled_run_tokens  # a long prompt


def test_the_shortest_sampled_prompt_keeps_a_token():
    """With a 2-token prompt, 32 steps at length 32 would start from an empty prompt (2 + 32 - 34)."""
    assert tiny_setting(prompt_tokens=2, sample_steps=31).sampled_run_tokens == 33  # prompt 2 + 32 - 33 = 1
    with pytest.raises(ValueError, match=r"to 31 \(the shortest checkpoint, 32, with a sampled prompt of at least"):
        tiny_setting(prompt_tokens=2, sample_steps=32)


@pytest.mark.parametrize("method", [decoding.HF_DYNAMIC, decoding.HF_STATIC, decoding.vase_method(32)], ids=lambda method: method.name)
def test_a_full_cache_takes_a_long_prompt_in_chunks_and_generates_what_one_prefill_gives(tiny_model, method, monkeypatch):
    """With `prompt_chunk` 8, a full cache stores a 30-token prompt but its last token in forward passes
    of 8, 8, 8 and 5 tokens; `generate` then prefills the last token, and the greedy tokens and their
    logits are those of one whole prefill. A VaSE cache takes the prompt whole (it chunks it itself)."""
    monkeypatch.setenv("VASE_BACKEND", "torch")
    lengths = []
    hook = tiny_model.model.embed_tokens.register_forward_hook(
        lambda module, args, embedded: lengths.append(embedded.shape[1])  # tokens of each forward pass
    )
    outputs = {}
    try:
        for chunk in (None, 8):
            setting = tiny_setting(prompt_tokens=30, new_tokens=5, checkpoints=(5,), prompt_chunk=chunk)
            with decoding.prepared(tiny_model, method, setting, torch.device("cpu"), warmup=1) as ready:
                lengths.clear()
                outputs[chunk] = ready.generate(tiny_model, 5, return_dict_in_generate=True, output_logits=True)
                outputs[chunk].lengths = list(lengths)
    finally:
        hook.remove()

    whole, chunked = outputs[None], outputs[8]
    assert whole.lengths == [30, 1, 1, 1, 1]
    assert chunked.lengths == (whole.lengths if method.cache == "vase" else [8, 8, 8, 5, 1, 1, 1, 1, 1])
    assert torch.equal(chunked.sequences, whole.sequences)
    torch.testing.assert_close(torch.stack(chunked.logits), torch.stack(whole.logits), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [0, -4, True, 2.0])
def test_a_prompt_chunk_must_be_a_positive_number_of_tokens(chunk):
    with pytest.raises(ValueError, match=rf"prompt_chunk: expected a positive number of tokens or None; got {chunk!r}"):
        tiny_setting(prompt_chunk=chunk)


def sampled_points(step_at, lengths, batch=BATCH):
    """Curve points whose mean step time at each length is `step_at(length)`."""
    return [decoding.CurvePoint(n, step_at(n), batch / step_at(n), 1) for n in lengths]


def test_estimated_decode_time_sums_the_interpolated_steps():
    """A step cost linear in length, and one that grows to a budget and stays flat there (VaSE),
    sampled at their corners, are summed exactly over the steps that produce tokens 2 to N;
    below the first sampled length a step costs what it costs there."""

    def linear(n):
        return 1e-3 + 2e-6 * n

    def flat_past_budget(n):
        return 1e-3 + 1e-6 * min(n, 512)

    for step_at, lengths in ((linear, (64, 300, 1000)), (flat_past_budget, (64, 512, 1000))):
        expected = sum(step_at(max(n, 64)) for n in range(2, 1001))
        estimate = decoding.estimated_decode_seconds(sampled_points(step_at, lengths), 1000, BATCH)
        assert estimate == pytest.approx(expected, rel=1e-12)
    # Past the last sampled length the last step cost holds.
    estimate = decoding.estimated_decode_seconds(sampled_points(linear, (64, 1000)), 1200, BATCH)
    assert estimate == pytest.approx(sum(linear(min(max(n, 64), 1000)) for n in range(2, 1201)), rel=1e-12)
    with pytest.raises(ValueError, match="points: expected a curve sorted by length"):
        decoding.estimated_decode_seconds(sampled_points(linear, (1000, 64)), 1000, BATCH)


def test_a_point_of_many_steps_stands_at_their_mean_length():
    """A point's mean step time is that of its span's middle length: for a cost linear in
    length, 64 steps ending at L average the cost at L - 31.5, and the estimate that places
    points there sums the run exactly; placed at L it would overstate each step by 31.5 lengths."""

    def linear(n):
        return 1e-3 + 2e-6 * n

    steps, lengths = 64, (64, 2048, 16384)
    spans = {length: [linear(n) for n in range(length - steps + 1, length + 1)] for length in lengths}
    points = [decoding.curve_point(length, spans[length], (1, None), BATCH) for length in lengths]
    assert [point.centre for point in points] == [length - 31.5 for length in lengths]
    expected = sum(linear(max(n, 32.5)) for n in range(2, 16385 - 32)) + 32 * linear(16384 - 31.5)
    assert decoding.estimated_decode_seconds(points, 16384, BATCH) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("method, cudnn", [(decoding.HF_DYNAMIC, True), (decoding.HF_DYNAMIC_NO_CUDNN, False)],
                         ids=["hf-dynamic", "hf-dynamic-no-cudnn"])  # fmt: skip
def test_a_method_limits_sdpa_backends_while_it_generates(method, cudnn):
    """The no-cuDNN full cache generates with cuDNN attention disabled (and the others left on);
    the plain one leaves PyTorch's choice alone; both restore the flags after."""
    seen = {}

    class Model:
        def generate(self, **kwargs):
            seen.update(cudnn=torch.backends.cuda.cudnn_sdp_enabled(), flash=torch.backends.cuda.flash_sdp_enabled())

    before = torch.backends.cuda.cudnn_sdp_enabled()
    ready = decoding.Prepared({}, None, "past_key_values", 0, method, tiny_setting())
    ready.generate(Model(), 4)
    assert seen == {"cudnn": cudnn and before, "flash": True}
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_a_checkpoint_must_have_the_layout_its_rows_are_named_after(tmp_path, monkeypatch):
    """The rows carry the setting's name (`tiny-qwen3 B2 P16`: the layout at its depth), so a
    checkpoint of another depth or head layout is refused, naming what differs, before its weights load."""
    from benchmarks.shapes import TINY

    three_layers = tmp_path / "three-layers"
    decoding.build_model(TINY, 3, torch.device("cpu"), torch.float32).save_pretrained(three_layers)
    monkeypatch.setenv(decoding.CHECKPOINT_VARIABLE, str(three_layers))

    with pytest.raises(ValueError, match=r"num_hidden_layers 3 \(tiny-qwen3 at 2 layers: 2\)"):
        decoding.build_model(TINY, 2, torch.device("cpu"), torch.float32)
    assert decoding.build_model(TINY, 3, torch.device("cpu"), torch.float32).config.num_hidden_layers == 3


@pytest.mark.parametrize("where", ["missing", "no-config"])
def test_a_checkpoint_that_is_not_a_local_model_directory_is_named(tmp_path, monkeypatch, where):
    """Not a hub lookup's traceback: the variable, what it must be, and what it was."""
    from benchmarks.shapes import TINY

    path = tmp_path / ("absent" if where == "missing" else "")
    monkeypatch.setenv(decoding.CHECKPOINT_VARIABLE, str(path))
    with pytest.raises(ValueError, match=r"VASE_BENCH_CHECKPOINT: expected a local model directory holding "
                                         r"config.json; got '.*'"):  # fmt: skip
        decoding.build_model(TINY, 2, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("variable, text", [("VASE_BENCH_DECODE_SECONDS", "-3"), ("VASE_BENCH_DECODE_SECONDS", "abc"),
                                            ("VASE_BENCH_DECODE_DEADLINE", "xyz"),
                                            ("VASE_BENCH_DECODE_DEADLINE", "inf")])  # fmt: skip
def test_decoding_time_variables_that_are_not_seconds_are_named(monkeypatch, variable, text):
    from benchmarks import bench_end_to_end

    monkeypatch.setenv(variable, text)
    with pytest.raises(ValueError, match=rf"{variable}: expected .*; got '{text}'"):
        bench_end_to_end._seconds(variable, "seconds")
    monkeypatch.setenv(variable, "12.5")
    assert bench_end_to_end._seconds(variable, "seconds") == 12.5
