"""End-to-end: a patched tiny random Qwen3 (and Qwen2 / Llama) through `generate`.

Runs on CPU; the kernels run in the Triton interpreter (tests/conftest.py), except
for the long generations, which use the PyTorch reference backend for speed.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, StoppingCriteria

import vase_triton
from vase_triton import VaSECache, VaSEConfig
from vase_triton.demo_model import ByteTokenizer, tiny_qwen3

PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Hi!", "Count: 1, 2, 3,"]


def greedy(model, inputs, max_new_tokens, **kwargs):
    out = model.generate(
        **inputs,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        **kwargs,
    )
    return out.sequences, torch.stack(out.logits, dim=1)


def test_no_eviction_matches_unpatched_single_prompt(model, tokenizer):
    inputs = tokenizer(PROMPTS[0])
    ref_tokens, ref_logits = greedy(model, inputs, 24)
    vase_triton.patch_qwen3(model, budget=512, window=16)
    tokens, logits = greedy(model, inputs, 24)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)


def test_no_eviction_left_padded_batch_matches_each_row_alone(model, tokenizer):
    vase_triton.patch_qwen3(model, budget=512, window=16)
    batch_tokens, batch_logits = greedy(model, tokenizer(PROMPTS), 16)
    width = batch_tokens.shape[1] - 16
    for row, prompt in enumerate(PROMPTS):
        alone = tokenizer(prompt)
        tokens, logits = greedy(model, alone, 16)
        assert torch.equal(batch_tokens[row, width:], tokens[0, alone["input_ids"].shape[1]:])
        torch.testing.assert_close(batch_logits[row], logits[0], rtol=1e-4, atol=1e-4)
    vase_triton.unpatch(model)
    ref_tokens, ref_logits = greedy(model, tokenizer(PROMPTS), 16)
    assert torch.equal(batch_tokens, ref_tokens)
    torch.testing.assert_close(batch_logits, ref_logits, rtol=1e-4, atol=1e-4)


class CacheWatcher(StoppingCriteria):
    """Records the largest number of valid slots in any layer after every step."""

    def __init__(self, cache: VaSECache):
        self.cache = cache
        self.max_length = 0

    def __call__(self, input_ids, scores, **kwargs):
        lengths = torch.stack([store.lengths for store in self.cache.stores])
        self.max_length = max(self.max_length, int(lengths.max()))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def test_long_generation_with_eviction_stays_within_capacity_and_unpatch_restores(model, tokenizer, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    inputs = tokenizer(PROMPTS[:2])
    before = model.generate(**inputs, max_new_tokens=12, do_sample=False)

    config = VaSEConfig(budget=48, window=16)
    vase_triton.patch_qwen3(model, config)
    cache = VaSECache.for_model(model, config, batch_size=2)
    watcher = CacheWatcher(cache)
    pointers = [buffer.data_ptr() for store in cache.stores for buffer in store.buffers()]
    out = model.generate(
        **inputs, max_new_tokens=2000, min_new_tokens=2000, do_sample=False, cache=cache, stopping_criteria=[watcher]
    )
    assert out.shape[1] == inputs["input_ids"].shape[1] + 2000
    assert watcher.max_length <= config.capacity
    assert pointers == [buffer.data_ptr() for store in cache.stores for buffer in store.buffers()]
    assert cache.n_evictions >= (2000 - config.capacity) // config.window
    for store in cache.stores:
        assert torch.isfinite(store.keys[:, :, : config.budget]).all()

    vase_triton.unpatch(model)
    after = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert torch.equal(before, after)


def test_prompt_longer_than_capacity_is_compressed_at_prefill(model, tokenizer):
    config = VaSEConfig(budget=24, window=8)
    vase_triton.patch_qwen3(model, config)
    cache = VaSECache.for_model(model, config, batch_size=1)
    inputs = tokenizer("A long prompt that certainly exceeds the tiny capacity of this cache. " * 2)
    assert inputs["input_ids"].shape[1] > config.capacity
    out = model.generate(**inputs, max_new_tokens=10, do_sample=False, cache=cache)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 10
    assert all(int(store.lengths.max()) <= config.capacity for store in cache.stores)


def test_ragged_prompt_compression_is_one_eviction(model, tokenizer, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    config = VaSEConfig(budget=24, window=8)
    vase_triton.patch_qwen3(model, config)
    cache = VaSECache.for_model(model, config, batch_size=2)
    inputs = tokenizer(["A prompt longer than the capacity of this tiny cache, by a margin.", "Short."])
    assert inputs["input_ids"].shape[1] > config.capacity
    model.generate(**inputs, max_new_tokens=1, do_sample=False, cache=cache)
    assert cache.n_evictions == 1
    assert [int(store.lengths.max()) for store in cache.stores] == [config.budget] * len(cache.stores)


def test_same_seed_same_generation_other_seed_other_evictions(model, tokenizer, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    inputs = tokenizer(PROMPTS[:2])
    runs = []
    for seed in (5, 5, 6):
        config = VaSEConfig(budget=24, window=4, seed=seed)
        vase_triton.patch_qwen3(model, config)
        cache = VaSECache.for_model(model, config, batch_size=2)
        torch.manual_seed(0)
        out = model.generate(**inputs, max_new_tokens=40, do_sample=True, cache=cache)
        runs.append((out, [store.positions.clone() for store in cache.stores]))
    assert cache.n_evictions >= 5
    assert torch.equal(runs[0][0], runs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
    assert not all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[2][1]))


@pytest.mark.parametrize("mode, first_compiled_step", [("online", 1), ("cached", 0)])
def test_online_autotuning_runs_a_caches_first_decode_step_eagerly(model, tokenizer, monkeypatch, mode,
                                                                   first_compiled_step):  # fmt: skip
    """Online mode tunes a launch at its first use: a cache's first decode step runs eagerly, so
    that the decode launches are tuned outside compiled graphs; every later step is compiled."""
    from vase_triton.autotune import lookup
    from vase_triton.integrations.patching import patch_state

    monkeypatch.setenv("VASE_BACKEND", "torch")
    monkeypatch.setenv("VASE_AUTOTUNE", mode)
    monkeypatch.setattr(lookup, "_settings", None)  # the mode is read again (and restored after the test)
    vase_triton.patch_qwen3(model, VaSEConfig(budget=24, window=4))
    state = patch_state(model)
    compiled_at = []  # the cache's decode-step count at each compiled call

    def compiled(**kwargs):
        compiled_at.append(kwargs["vase_cache"].decode_steps)
        return state.previous_forward(**kwargs)

    state.compiled_forward = compiled
    inputs = tokenizer(PROMPTS[:2])
    for _ in range(2):  # the second call resets and reuses the cache: its first step is eager again
        model.generate(**inputs, min_new_tokens=6, max_new_tokens=6, do_sample=False)
    assert compiled_at == list(range(first_compiled_step, 5)) * 2


def test_generate_reuses_its_cache_when_the_size_fits(model, tokenizer, monkeypatch):
    """Calls of the same size share one cache (reset: the outputs are those of a fresh cache, evictions
    and their random draws included); another batch size, length or configuration gets its own."""
    from vase_triton.integrations.patching import patch_state

    monkeypatch.setenv("VASE_BACKEND", "torch")
    config = VaSEConfig(budget=24, window=4, seed=3)
    vase_triton.patch_qwen3(model, config)
    inputs = tokenizer(PROMPTS[:2])
    own = VaSECache.for_model(model, config, batch_size=2)
    fresh = model.generate(**inputs, max_new_tokens=40, do_sample=False, cache=own)
    first = model.generate(**inputs, max_new_tokens=40, do_sample=False)
    cache = patch_state(model).last_cache
    assert cache.n_evictions >= 5
    again = model.generate(**inputs, max_new_tokens=30, do_sample=False)
    assert patch_state(model).last_cache is cache
    assert torch.equal(first, fresh) and torch.equal(again, fresh[:, : again.shape[1]])

    model.generate(**tokenizer(PROMPTS[:1]), max_new_tokens=4, do_sample=False)
    assert patch_state(model).last_cache is not cache  # another batch size
    cache = patch_state(model).last_cache
    vase_triton.patch_qwen3(model, config.replace(seed=4))
    model.generate(**tokenizer(PROMPTS[:1]), max_new_tokens=4, do_sample=False)
    assert patch_state(model).last_cache is not cache  # another configuration
    vase_triton.patch_qwen3(model, VaSEConfig(policy="full", budget=24, window=4))
    model.generate(**tokenizer(PROMPTS[:1]), max_new_tokens=4, do_sample=False)
    cache = patch_state(model).last_cache
    model.generate(**tokenizer(PROMPTS[:1]), max_new_tokens=5, do_sample=False)
    assert patch_state(model).last_cache is not cache  # a full cache is sized by the length


def test_sampling_and_num_return_sequences(model, tokenizer, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    vase_triton.patch_qwen3(model, budget=20, window=4)
    torch.manual_seed(0)
    inputs = tokenizer(PROMPTS[:2])
    out = model.generate(**inputs, max_new_tokens=30, do_sample=True, temperature=1.0, num_return_sequences=2)
    assert out.shape == (4, inputs["input_ids"].shape[1] + 30)


def test_prompt_given_as_embeddings(model, tokenizer, monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    inputs = tokenizer(PROMPTS[0])
    embeds = model.get_input_embeddings()(inputs["input_ids"])
    kwargs = dict(inputs_embeds=embeds, attention_mask=inputs["attention_mask"], max_new_tokens=8, do_sample=False)
    reference = model.generate(**kwargs)
    vase_triton.patch_qwen3(model, budget=256, window=16)
    assert torch.equal(model.generate(**kwargs), reference)


def test_compiled_decode_step_has_no_graph_break_and_matches_eager(model, tokenizer):
    config = VaSEConfig(budget=20, window=4)
    vase_triton.patch_qwen3(model, config)
    inputs = tokenizer(PROMPTS[0])
    prompt_len = inputs["input_ids"].shape[1]
    cache = VaSECache.for_model(model, config, batch_size=1)
    with torch.no_grad():
        model(**inputs, cache=cache)
        cache.begin_step(1)
        step = {
            "input_ids": torch.tensor([[7]]),
            "position_ids": torch.tensor([[prompt_len]]),
            model._vase_patch_state.cache_kwarg: cache,
            "vase_cache": cache,
            "use_cache": True,
        }
        forward = type(model).forward.__get__(model)
        explanation = torch._dynamo.explain(forward)(**step)
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1

    torch._dynamo.reset()
    eager_model = tiny_qwen3(seed=1)
    vase_triton.patch_qwen3(eager_model, config)
    eager = eager_model.generate(**inputs, max_new_tokens=12, do_sample=False)
    vase_triton.patch_qwen3(model, config, compile_mode="default")
    with torch._dynamo.config.patch(error_on_recompile=True):  # one graph serves every decode step
        compiled = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert torch.equal(compiled, eager)


def test_cache_shapes_past_the_recompile_limit_decode_eagerly_with_one_warning(model, tokenizer, monkeypatch):
    """Each batch size compiles a graph; past dynamo's limit, a hard error under fullgraph, the steps
    of new shapes run eagerly (with the eager model's tokens) and those compiled before stay compiled."""
    monkeypatch.setenv("VASE_BACKEND", "torch")
    config = VaSEConfig(policy="snapkv", budget=20, window=4)
    eager_model = vase_triton.patch_qwen3(tiny_qwen3(seed=1), config)
    vase_triton.patch_qwen3(model, config, compile_mode="default")
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=1), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (1, 2, 3, 1):
            inputs = tokenizer(PROMPTS[:rows])
            want = eager_model.generate(**inputs, max_new_tokens=24, do_sample=False)
            assert torch.equal(model.generate(**inputs, max_new_tokens=24, do_sample=False), want), rows
    torch._dynamo.reset()
    limit_warnings = [str(warning.message) for warning in caught if "recompile limit" in str(warning.message)]
    assert len(limit_warnings) == 1 and "recompile_limit = 1" in limit_warnings[0]
    layouts = model._vase_patch_state.eager_layouts
    assert sorted(layout.batch_size for layout in layouts) == [2, 3]


@pytest.mark.parametrize("policy, score_mode", [("vase", "recompute"), ("vase", "emitted"), ("h2o", "recompute")])
def test_compiled_decode_step_mutates_only_static_inputs(model, tokenizer, policy, score_mode):
    """Under CUDA graphs inductor replays a compiled step only when every graph input it mutates is a
    static input, and otherwise runs the whole step without CUDA graphs (the decode workspace a
    `VaSECache` shares between layers once was such an input). Checked on the traced decode step's
    own metadata, which is what inductor reads."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    seen = {}

    def forward_compiler(graph, example_inputs):
        metadata = torch._guards.TracingContext.get().fw_metadata
        seen["mutated"] = set(metadata.mutated_inp_runtime_indices)
        seen["static"] = set(metadata.static_input_indices)
        return make_boxed_func(graph.forward)

    config = VaSEConfig(policy=policy, budget=20, window=4, score_mode=score_mode)
    vase_triton.patch_qwen3(model, config)
    inputs = tokenizer(PROMPTS[0])
    cache = VaSECache.for_model(model, config, batch_size=1)
    torch._dynamo.reset()
    with torch.no_grad():
        model(**inputs, cache=cache)
        cache.begin_step(1)
        step = {
            "input_ids": torch.tensor([[7]]), "position_ids": torch.tensor([[inputs["input_ids"].shape[1]]]),
            model._vase_patch_state.cache_kwarg: cache, "vase_cache": cache, "use_cache": True,
        }  # fmt: skip
        forward = type(model).forward.__get__(model)
        torch.compile(forward, backend=aot_autograd(fw_compiler=forward_compiler), fullgraph=True)(**step)
    torch._dynamo.reset()
    assert len(seen["mutated"]) >= 2 * 6  # keys, values, magnitudes, positions, lengths, next positions per layer
    assert seen["mutated"] <= seen["static"], f"mutated inputs not static: {sorted(seen['mutated'] - seen['static'])}"


def test_patch_is_idempotent_and_context_manager_restores(model, tokenizer):
    original_forward = model.forward
    vase_triton.patch_qwen3(model, budget=64, window=16)
    vase_triton.patch_qwen3(model, budget=32, window=16)
    assert vase_triton.is_patched(model)
    assert model._vase_patch_state.config.budget == 32
    assert model.config._attn_implementation == "vase"
    vase_triton.unpatch(model)
    assert not vase_triton.is_patched(model)
    assert model.forward == original_forward
    assert model.config._attn_implementation != "vase"
    with vase_triton.patched(model, budget=32, window=16):
        assert vase_triton.is_patched(model)
    assert not vase_triton.is_patched(model)


def test_refusals_are_clear(model, tokenizer):
    vase_triton.patch_qwen3(model, budget=32, window=8)
    inputs = tokenizer(PROMPTS[0])
    with pytest.raises(ValueError, match="num_beams.*beam search"):
        model.generate(**inputs, max_new_tokens=4, num_beams=2, do_sample=False)
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens.*prompt-lookup decoding"):
        model.generate(**inputs, max_new_tokens=4, prompt_lookup_num_tokens=3, do_sample=False)
    with pytest.raises(ValueError, match="assistant_model.*assisted decoding") as refusal:
        model.generate(**inputs, max_new_tokens=4, assistant_model=tiny_qwen3(seed=3), do_sample=False)
    assert "got assistant_model=a Qwen3ForCausalLM (" in str(refusal.value)  # its type, not its module tree
    assert "Qwen3Model(" not in str(refusal.value)
    cache = VaSECache.for_model(model, model._vase_patch_state.config, batch_size=1)
    with pytest.raises(ValueError, match="assistant_early_exit.*early-exit"):
        model.generate(**inputs, max_new_tokens=4, assistant_early_exit=1, do_sample=False, cache=cache)
    assert cache.seen_tokens == 0 and cache.stores[0].length_bound == 0
    model.generate(**inputs, max_new_tokens=4, do_sample=False, cache=cache)
    with pytest.raises(NotImplementedError, match="beam search"):
        cache.reorder_cache(torch.tensor([0]))
    with pytest.raises(NotImplementedError, match="cropped"):
        cache.crop(2)
    with pytest.raises(NotImplementedError, match="cannot repeat its rows"):
        cache.batch_repeat_interleave(2)
    with pytest.raises(NotImplementedError, match="cannot select rows"):
        cache.batch_select_indices(torch.tensor([0]))
    assert cache.stores[0].batch_size == 1 and cache.seen_tokens > 0  # left as it was
    with pytest.raises(TypeError, match="model_type"):
        vase_triton.patch_qwen3(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="budget"):
        vase_triton.patch_qwen3(model, budget=8, window=8)


def _tiny_config(config_class):
    return config_class(
        vocab_size=ByteTokenizer.vocab_size,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=0,
    )


@pytest.mark.parametrize(
    "model_class, config_class, patch",
    [
        (Qwen2ForCausalLM, Qwen2Config, "patch_qwen2"),
        (LlamaForCausalLM, LlamaConfig, "patch_llama"),
    ],
    ids=["qwen2", "llama"],
)
def test_distill_architectures(model_class, config_class, patch, tokenizer):
    torch.manual_seed(0)
    model = model_class(_tiny_config(config_class)).eval()
    inputs = tokenizer(PROMPTS[:2])
    ref_tokens, ref_logits = greedy(model, inputs, 10)
    getattr(vase_triton, patch)(model, budget=256, window=16)
    tokens, logits = greedy(model, inputs, 10)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    with pytest.raises(TypeError, match="qwen3"):
        vase_triton.patch_qwen3(model_class(_tiny_config(config_class)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host-device synchronisation is only observable on CUDA")
def test_decode_step_never_synchronises_with_the_host(tokenizer):
    model = tiny_qwen3(seed=1, device="cuda", dtype=torch.bfloat16)
    config = VaSEConfig(budget=20, window=4)
    vase_triton.patch_qwen3(model, config)
    inputs = {name: tensor.cuda() for name, tensor in tokenizer(PROMPTS[0]).items()}
    prompt_len = inputs["input_ids"].shape[1]
    cache = VaSECache.for_model(model, config, batch_size=1)
    token = torch.tensor([[7]], device="cuda")
    with torch.no_grad():
        model(**inputs, cache=cache)
        for step in range(3 * config.window):
            position = torch.tensor([[prompt_len + step]], device="cuda")
            torch.cuda.set_sync_debug_mode("error")  # evictions included: begin_step runs them
            try:
                cache.begin_step(1)
                forward = type(model).forward.__get__(model)
                forward(input_ids=token, position_ids=position, use_cache=True, vase_cache=cache,
                        **{model._vase_patch_state.cache_kwarg: cache})
                cache.end_step(1)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    assert cache.n_evictions > 0
