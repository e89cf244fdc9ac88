"""Every way users drive a patched model behaves as the unpatched model (policy `full`), or
refuses clearly: calls without a VaSE cache, hooks, devices, nesting, multi-turn chat,
chunked long prompts, Qwen3-MoE, and transformers' generate conventions."""

from __future__ import annotations

import copy
import types
import warnings

import pytest
import torch
from transformers import DynamicCache, GenerationConfig, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

import vase_triton
from vase_triton import VaSECache, VaSEConfig
from vase_triton.demo_model import ByteTokenizer, tiny_qwen3
from vase_triton.integrations.patching import cache_keyword

PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Hi!", "Count: 1, 2, 3,"]
TURNS = [" Tell me more.", " And then?"]


@pytest.fixture(autouse=True)
def _reference_backend(monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")


def greedy(model, max_new_tokens, **kwargs):
    out = model.generate(max_new_tokens=max_new_tokens, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, **kwargs)
    return out.sequences, torch.stack(out.logits, dim=1)


FULL = VaSEConfig(policy="full", budget=512, window=16)


# ---------------------------------------------------------------------------- without a VaSE cache


@pytest.mark.parametrize("cache_kind", ["none", "use_cache_false", "dynamic"])
def test_calls_without_a_vase_cache_are_the_original_attention(model, tokenizer, cache_kind):
    inputs = tokenizer(PROMPTS)  # left-padded
    kwargs = {"use_cache": False} if cache_kind == "use_cache_false" else {}

    def run():
        extra = {cache_keyword(model): DynamicCache()} if cache_kind == "dynamic" else {}
        with torch.no_grad():
            return model(**inputs, **kwargs, **extra).logits

    want = run()
    vase_triton.patch_qwen3(model, FULL)
    assert torch.equal(run(), want)
    with torch.no_grad():  # the inner model called directly, bypassing the patched forward
        inner = model.model(**inputs).last_hidden_state
    vase_triton.unpatch(model)
    with torch.no_grad():
        assert torch.equal(inner, model.model(**inputs).last_hidden_state)


def test_training_runs_the_original_attention_and_the_vase_path_refuses_gradients(model, tokenizer):
    inputs = tokenizer(PROMPTS[:2])
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    model.train()
    want = model(**inputs, labels=labels).loss
    vase_triton.patch_qwen3(model, FULL)
    loss = model(**inputs, labels=labels).loss
    loss.backward()
    torch.testing.assert_close(loss, want)
    assert model.lm_head.weight.grad is not None
    cache = VaSECache.for_model(model, FULL, batch_size=2, max_length=64)
    with pytest.raises(RuntimeError, match="inference.*no_grad"):
        model(**inputs, cache=cache)
    model.model.embed_tokens.weight.requires_grad_(False)  # frozen embeddings, the rest trained (as with adapters)
    with pytest.raises(RuntimeError, match="inference.*no_grad"):
        model(**inputs, cache=cache)
    assert cache.seen_tokens == 0


def test_a_vase_cache_given_to_an_unpatched_model_raises(model, tokenizer):
    cache = VaSECache.for_model(model, FULL, batch_size=1, max_length=64)
    with pytest.raises(RuntimeError, match="not patched.*patch_qwen3"):
        model.generate(**tokenizer(PROMPTS[0]), max_new_tokens=3, **{cache_keyword(model): cache})
    vase_triton.patch_qwen3(model, FULL)
    with pytest.raises(RuntimeError, match="not patched.*call it, not its inner model.model"), torch.no_grad():
        model.model(**tokenizer(PROMPTS[0]), **{cache_keyword(model): cache})
    assert cache.seen_tokens == 0


def test_a_passed_cache_too_small_for_the_return_sequences_is_refused_by_name(model, tokenizer):
    vase_triton.patch_qwen3(model, FULL)
    cache = VaSECache.for_model(model, FULL, batch_size=1, max_length=64)
    with pytest.raises(ValueError, match="num_return_sequences: .* 2 rows, and the cache was made for 1; make it with "
                                         "batch_size=2"):  # fmt: skip
        model.generate(**tokenizer(PROMPTS[0]), max_new_tokens=3, do_sample=True, num_return_sequences=2,
                       **{cache_keyword(model): cache})  # fmt: skip
    assert cache.seen_tokens == 0


def test_unpatching_a_deep_copy_of_a_patched_model_restores_the_copy(model, tokenizer):
    inputs = tokenizer(PROMPTS[0])
    want = greedy(model, 4, **inputs)[0]
    vase_triton.patch_qwen3(model, FULL)
    copied = vase_triton.unpatch(copy.deepcopy(model))
    assert not vase_triton.is_patched(copied) and "forward" not in vars(copied) and "generate" not in vars(copied)
    assert torch.equal(greedy(copied, 4, **inputs)[0], want)
    assert vase_triton.is_patched(model)


# ---------------------------------------------------------------------------- generate conventions


def test_generate_without_input_ids_starts_from_bos(model):
    want, want_logits = greedy(model, 6)
    vase_triton.patch_qwen3(model, FULL)
    got, got_logits = greedy(model, 6)
    assert torch.equal(got, want)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_a_passed_generation_config_is_completed_from_the_models_as_transformers_does(model, tokenizer):
    """Fields a passed GenerationConfig leaves unset come from `model.generation_config`, then from
    transformers' defaults: the cache is sized and shaped for what generate runs."""
    inputs = tokenizer(PROMPTS[1:2])
    unset_length = GenerationConfig(do_sample=False, pad_token_id=0)
    want_default = model.generate(**inputs, generation_config=unset_length)
    model.generation_config.num_return_sequences, model.generation_config.do_sample = 2, True
    more_rows = GenerationConfig(max_new_tokens=5, pad_token_id=0)
    torch.manual_seed(0)
    want_rows = model.generate(**inputs, generation_config=more_rows)
    prompt_len = inputs["input_ids"].shape[1]
    assert want_default.shape[1] > prompt_len + 1 and want_rows.shape == (2, prompt_len + 5)
    model.generation_config.num_return_sequences, model.generation_config.do_sample = 1, False
    vase_triton.patch_qwen3(model, policy="full")
    assert torch.equal(model.generate(**inputs, generation_config=unset_length), want_default)
    model.generation_config.num_return_sequences, model.generation_config.do_sample = 2, True
    vase_triton.patch_qwen3(model, policy="vase", budget=64, window=16)
    torch.manual_seed(0)
    assert torch.equal(model.generate(**inputs, generation_config=more_rows), want_rows)


def test_a_generation_config_passed_by_position_is_read_as_by_keyword(model, tokenizer):
    """`generate(ids, generation_config)`: the settings it holds size the cache and are refused alike."""
    inputs = tokenizer(PROMPTS[:2])
    rows = GenerationConfig(max_new_tokens=6, do_sample=True, num_return_sequences=2, pad_token_id=0)
    torch.manual_seed(0)
    want = model.generate(inputs["input_ids"], rows, attention_mask=inputs["attention_mask"])
    vase_triton.patch_qwen3(model, policy="vase", budget=64, window=16)
    torch.manual_seed(0)
    got = model.generate(inputs["input_ids"], rows, attention_mask=inputs["attention_mask"])
    assert got.shape == want.shape == (4, inputs["input_ids"].shape[1] + 6) and torch.equal(got, want)
    with pytest.raises(ValueError, match="num_beams: .* beam search is not supported"):
        model.generate(inputs["input_ids"], GenerationConfig(num_beams=2), attention_mask=inputs["attention_mask"])
    with pytest.raises(TypeError, match="multiple values for argument 'generation_config'"):
        model.generate(inputs["input_ids"], rows, generation_config=rows)
    too_many = [None] * 20  # more than generate takes: Python's own refusal, nothing dropped
    with pytest.raises(TypeError, match="positional argument"):
        model.generate(inputs["input_ids"], rows, *too_many)


def test_a_generate_wrapped_before_patching_gets_the_positional_settings_by_name(model, tokenizer):
    """A `(*args, **kwargs)` wrapper set on the instance (as instrumentation does) still receives
    `generation_config` under its own name."""
    inputs = tokenizer(PROMPTS[:1])
    config = GenerationConfig(max_new_tokens=4, do_sample=False, pad_token_id=0)
    want = model.generate(inputs["input_ids"], config, attention_mask=inputs["attention_mask"])
    original = model.generate
    model.generate = lambda *args, **kwargs: original(*args, **kwargs)
    vase_triton.patch_qwen3(model, budget=64, window=16)
    got = model.generate(inputs["input_ids"], config, attention_mask=inputs["attention_mask"])
    assert torch.equal(got, want)


@pytest.mark.parametrize("where", ["argument", "generation_config"])
def test_cache_implementation_is_overridden_with_a_warning(model, tokenizer, where):
    inputs = tokenizer(PROMPTS[:2])
    want, _ = greedy(model, 6, **inputs)
    vase_triton.patch_qwen3(model, FULL)
    kwargs = {}
    if where == "argument":
        kwargs["cache_implementation"] = "static"
    else:
        model.generation_config.cache_implementation = "static"
    with pytest.warns(UserWarning, match="cache_implementation='static' is ignored"):
        got, _ = greedy(model, 6, **inputs, **kwargs)
    assert torch.equal(got, want)


def test_past_key_values_keyword_still_reaches_the_cache(model, tokenizer):
    inputs = tokenizer(PROMPTS[0])
    want, _ = greedy(model, 5, **inputs)
    vase_triton.patch_qwen3(model, FULL)
    cache = VaSECache.for_model(model, FULL, batch_size=1, max_length=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' own deprecation notice, if it has one
        got, _ = greedy(model, 5, **inputs, past_key_values=cache)
    assert torch.equal(got, want) and cache.seen_tokens > 0


def test_output_attentions_warns_and_returns_no_weights(model, tokenizer, caplog):
    vase_triton.patch_qwen3(model, FULL)
    cache = VaSECache.for_model(model, FULL, batch_size=1, max_length=64)
    with torch.no_grad(), caplog.at_level("WARNING"):
        out = model(**tokenizer(PROMPTS[0]), cache=cache, output_attentions=True)
    assert out.attentions in (None, ())
    assert "does not return attention weights" in caplog.text


def test_refused_configurations_are_named_at_patch_time():
    wide = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=96, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=48))
    with pytest.raises(ValueError, match=r"head dim in \(32, 64, 128, 256\); got 48"):
        vase_triton.patch_qwen3(wide)
    sliding = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
                                           num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                           use_sliding_window=True, sliding_window=16, max_window_layers=1))
    with pytest.raises(ValueError, match="non-global layers.*layer 1: sliding_attention"):
        vase_triton.patch_qwen3(sliding)
    assert not vase_triton.is_patched(wide) and not vase_triton.is_patched(sliding)


def test_a_compiled_wrapper_and_float64_weights_are_refused_at_patch_time(model):
    compiled = torch.compile(model)
    with pytest.raises(TypeError, match=r"model: expected the transformers model itself; got the torch.compile "
                                        r"wrapper OptimizedModule \(patch the model before compiling it"):
        vase_triton.patch_qwen3(compiled)
    assert not vase_triton.is_patched(model) and model.config._attn_implementation != "vase"
    with pytest.raises(ValueError, match=r"model: expected float16, bfloat16 or float32 weights .*; got torch.float64"):
        vase_triton.patch_qwen3(model.double())
    assert not vase_triton.is_patched(model)


def _cache_state(cache: VaSECache) -> tuple:
    layers = [(store.length_bound, store.lengths.tolist(), store.n_evictions) for store in cache.stores]
    return cache.seen_tokens, layers


@torch.no_grad()
def test_inputs_that_do_not_fit_the_cache_are_refused_before_it_changes(model, tokenizer):
    """Wrong rows on a decode step, a cache made for another layer count, 1-D ids: refused with the
    argument named, and the cache, untouched, then decodes as if the mistake had not happened."""
    config = VaSEConfig(policy="vase", budget=16, window=4, n_sink=1, seed=3)
    vase_triton.patch_qwen3(model, config)
    inputs = tokenizer(PROMPTS[:2])

    def decode(cache, mistakes):
        logits = model(**inputs, cache=cache).logits
        for step in range(12):
            token = logits[:, -1:].argmax(-1)
            if step == 5:
                for call, error, match in mistakes:
                    before = _cache_state(cache)
                    with pytest.raises(error, match=match):
                        call(token)
                    assert _cache_state(cache) == before and not cache.in_step
            logits = model(input_ids=token, cache=cache).logits
        return logits, _cache_state(cache)

    deeper = vase_triton.patch_qwen3(tiny_qwen3(seed=1, num_layers=3), config)
    mistakes = [
        (lambda token: model(input_ids=token[:1], cache=cache),
         ValueError, r"input_ids: expected 2 rows, the batch size the cache was made for; got 1"),
        (lambda token: model(input_ids=token[:, 0], cache=cache), ValueError, r"input_ids: expected a \[B, T\] tensor"),
        (lambda token: deeper(input_ids=torch.cat([token, token], dim=1), cache=cache),
         ValueError, r"cache: made for num_layers=2, the model has num_layers=3"),
    ]
    cache = VaSECache.for_model(model, config, batch_size=2)
    want = decode(cache, [])
    cache = VaSECache.for_model(model, config, batch_size=2)
    got = decode(cache, mistakes)
    assert got[1] == want[1] and got[1][1][0][2] >= 2  # evictions before and after the mistakes
    assert torch.equal(got[0], want[0])


@torch.no_grad()
def test_a_decode_step_of_a_model_the_cache_was_not_made_for_is_refused_before_it_changes(model, tokenizer):
    """One-token calls (decode steps) of models with other layers, heads or dtype, tried before
    every step: each is refused naming what differs, the cache keeps its state (but for an
    eviction that fell due, which the next step would run anyway), and the decoding that
    follows is the one without the mistakes."""
    config = VaSEConfig(policy="vase", budget=16, window=4, n_sink=1, seed=3)
    vase_triton.patch_qwen3(model, config)
    inputs = tokenizer(PROMPTS[:2])

    def variant(**overrides):
        torch.manual_seed(0)
        settings = {key: value for key, value in model.config.to_dict().items() if key != "layer_types"}
        other = Qwen3ForCausalLM(Qwen3Config(**{**settings, **overrides}))
        return vase_triton.patch_qwen3(other, config)

    mistakes = [
        (variant(num_hidden_layers=1), ValueError, r"cache: made for num_layers=2, the model has num_layers=1"),
        (variant(num_hidden_layers=3), ValueError, r"cache: made for num_layers=2, the model has num_layers=3"),
        (variant(num_key_value_heads=4), ValueError, r"cache: made for num_kv_heads=2, the model has num_kv_heads=4"),
        (variant(num_attention_heads=8), ValueError,
         r"cache: made for num_query_heads=4, the model has num_query_heads=8"),
        (variant(head_dim=32), ValueError, r"cache: made for head_dim=64, the model has head_dim=32"),
        (vase_triton.patch_qwen3(tiny_qwen3(seed=1, dtype=torch.bfloat16), config), TypeError,
         r"query: expected dtype torch.float32 like the cache; got torch.bfloat16"),
    ]

    def decode(cache, mistakes):
        logits = model(**inputs, cache=cache).logits
        for _ in range(12):
            token = logits[:, -1:].argmax(-1)
            for other, error, match in mistakes:
                due = cache.stores[0].length_bound >= cache.capacity
                before = _cache_state(cache)
                with pytest.raises(error, match=match):
                    other(input_ids=token, cache=cache)
                assert not cache.in_step
                if not due:
                    assert _cache_state(cache) == before
            logits = model(input_ids=token, cache=cache).logits
        return logits, _cache_state(cache)

    want = decode(VaSECache.for_model(model, config, batch_size=2), [])
    got = decode(VaSECache.for_model(model, config, batch_size=2), mistakes)
    assert got[1] == want[1] and got[1][1][0][2] >= 2  # evictions during the mistakes
    assert torch.equal(got[0], want[0])


@torch.no_grad()
def test_an_attention_implementation_set_after_patching_is_refused_until_patched_again(model, tokenizer):
    inputs = tokenizer(PROMPTS[0])
    want = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    vase_triton.patch_qwen3(model, FULL)
    model.set_attn_implementation("eager")
    cache = VaSECache.for_model(model, FULL, batch_size=1, max_length=64)
    with pytest.raises(RuntimeError, match=r"model: its attention implementation is 'eager', set after patching"):
        model.generate(**inputs, max_new_tokens=8, do_sample=False, cache=cache)
    vase_triton.patch_qwen3(model, FULL)
    assert torch.equal(model.generate(**inputs, max_new_tokens=8, do_sample=False), want)
    vase_triton.unpatch(model)
    assert model.config._attn_implementation == "eager"


def test_a_chat_turn_without_the_conversation_names_what_input_ids_must_hold(model, tokenizer):
    vase_triton.patch_qwen3(model, FULL)
    cache = VaSECache.for_model(model, FULL, batch_size=1, max_length=128)
    first = tokenizer(PROMPTS[0])
    model.generate(**first, max_new_tokens=4, do_sample=False, cache=cache)
    turn = torch.tensor([tokenizer.encode(TURNS[0])[1:6]])
    with pytest.raises(ValueError, match=r"got 0 \(the cache holds a conversation of \d+ tokens: given to generate, "
                                         r"input_ids holds the whole conversation"):
        model.generate(input_ids=turn, attention_mask=torch.ones_like(turn), max_new_tokens=4, cache=cache)


@pytest.mark.parametrize("input_ids", [torch.zeros(0, 4, dtype=torch.long), torch.tensor([1, 5, 6]), [[1, 5, 6]]],
                         ids=["no-rows", "1-d", "a-list"])
def test_generate_names_input_ids_that_are_not_a_batch(model, input_ids):
    vase_triton.patch_qwen3(model, FULL)
    with pytest.raises(ValueError, match=r"input_ids: expected a \[B, T\] tensor of at least one row; got"):
        model.generate(input_ids=input_ids, max_new_tokens=2)


def test_use_cache_false_with_a_vase_cache_is_refused(model, tokenizer):
    vase_triton.patch_qwen3(model, FULL)
    cache = VaSECache.for_model(model, FULL, batch_size=1, max_length=64)
    with pytest.raises(ValueError, match=r"use_cache: False with a VaSECache .*; got use_cache=False"):
        model.generate(**tokenizer(PROMPTS[0]), max_new_tokens=4, use_cache=False, cache=cache)
    assert cache.seen_tokens == 0


@pytest.mark.parametrize("where", ["argument", "generation_config", "model_generation_config"])
def test_generate_with_use_cache_false_in_any_config_runs_the_original_attention(model, tokenizer, where):
    """No VaSE cache is made when the generation config says `use_cache=False`, wherever it says it."""
    inputs = tokenizer(PROMPTS[:2])
    want = greedy(model, 6, use_cache=False, **inputs)
    settings = {"generation_config": GenerationConfig(use_cache=False, pad_token_id=model.config.pad_token_id)}
    kwargs = {"argument": {"use_cache": False}, "generation_config": settings}.get(where, {})
    if where == "model_generation_config":
        model.generation_config.use_cache = False
    vase_triton.patch_qwen3(model, VaSEConfig(policy="vase", budget=8, window=4))  # would evict if it ran
    got = greedy(model, 6, **inputs, **kwargs)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert model._vase_patch_state.last_cache is None


def test_a_cache_for_something_that_is_not_a_model_is_refused():
    with pytest.raises(TypeError, match=r"model: expected a causal LM with decoder layers at model.model.layers; "
                                        r"got str"):
        VaSECache.for_model("Qwen/Qwen3-8B", FULL, batch_size=1, max_length=64)


@pytest.mark.parametrize("max_length", [0, -1, 2.5, True, "20"])
def test_a_full_cache_refuses_a_max_length_that_is_not_a_positive_int(model, max_length):
    with pytest.raises(ValueError, match=r"max_length: expected a positive int \(prompt \+ new tokens\); got"):
        VaSECache.for_model(model, FULL, batch_size=1, max_length=max_length)


# ---------------------------------------------------------------------------- hooks, devices, nesting


def test_instance_hooks_are_called_and_restored(model, tokenizer):
    from accelerate.hooks import ModelHook, add_hook_to_module

    class CountingHook(ModelHook):
        calls = 0

        def pre_forward(self, module, *args, **kwargs):
            CountingHook.calls += 1
            return args, kwargs

    add_hook_to_module(model, CountingHook())
    hooked_forward = model.forward
    inputs = tokenizer(PROMPTS[0])
    want, _ = greedy(model, 5, **inputs)
    calls = CountingHook.calls
    vase_triton.patch_qwen3(model, FULL)
    got, _ = greedy(model, 5, **inputs)
    assert torch.equal(got, want)
    assert CountingHook.calls - calls == 5  # prefill + 4 decode steps all went through the hook
    vase_triton.unpatch(model)
    assert model.forward is hooked_forward
    assert "generate" not in model.__dict__


def test_each_layer_cache_lives_where_its_layer_runs(model):
    model.model.layers[1]._hf_hook = types.SimpleNamespace(execution_device=torch.device("meta"))
    cache = VaSECache.for_model(model, VaSEConfig(budget=32, window=8), batch_size=2)
    assert [store.device.type for store in cache.stores] == ["cpu", "meta"]
    assert all(buffer.device.type == "meta" for buffer in cache.stores[1].buffers())
    assert cache.stores[0].buffers()[-1].device.type == "cpu"  # one decode workspace per device


def test_tensor_parallel_shards_size_the_cache_by_their_local_heads(model):
    """With heads sharded over ranks, each rank's projections hold a slice: the cache follows it."""

    def shard_of(rows: int) -> type:
        class Shard(torch.Tensor):
            def to_local(self):  # what a DTensor shard of `rows` output rows answers
                return torch.empty(rows, self.shape[1])

        return Shard

    for layer in model.model.layers:
        for name, rows in (("q_proj", 2 * 64), ("k_proj", 1 * 64)):
            projection = getattr(layer.self_attn, name)
            shard = projection.weight.detach().as_subclass(shard_of(rows))
            projection.weight = torch.nn.Parameter(shard, requires_grad=False)
    cache = VaSECache.for_model(model, VaSEConfig(budget=32, window=8), batch_size=1)
    assert cache.stores[0].num_kv_heads == 1 and cache.stores[0].num_query_heads == 2


def test_patched_nests_and_restores_on_error(model):
    vase_triton.patch_qwen3(model, budget=128, window=16)
    with vase_triton.patched(model, policy="rkv", budget=64, window=16):
        assert model._vase_patch_state.config.policy == "rkv"
    assert (model._vase_patch_state.config.policy, model._vase_patch_state.config.budget) == ("vase", 128)
    with pytest.raises(KeyError):
        with vase_triton.patched(model, policy="snapkv", budget=64, window=16):
            raise KeyError("inside the block")
    assert model._vase_patch_state.config.policy == "vase"
    vase_triton.unpatch(model)
    with pytest.raises(KeyError):
        with vase_triton.patched(model, budget=64, window=16):
            raise KeyError("inside the block")
    assert not vase_triton.is_patched(model)


# ---------------------------------------------------------------------------- multi-turn and chunked prefill


def test_three_turn_chat_equals_the_unpatched_model_with_a_dynamic_cache(model, tokenizer):
    def converse(patched: bool):
        cache = VaSECache.for_model(model, FULL, batch_size=1, max_length=200) if patched else DynamicCache()
        ids = tokenizer(PROMPTS[0])["input_ids"]
        for turn in [None, *TURNS]:
            if turn is not None:
                ids = torch.cat([ids, torch.tensor([tokenizer.encode(turn)[1:]])], dim=1)
            ids = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                 do_sample=False, **{cache_keyword(model): cache})
        return ids, cache

    want, _ = converse(False)
    vase_triton.patch_qwen3(model, FULL)
    got, cache = converse(True)
    assert torch.equal(got, want)
    assert cache.seen_tokens == want.shape[1] - 1


@torch.no_grad()
def test_a_returned_cache_passed_back_survives_calls_that_pass_none(model, tokenizer):
    """transformers' chat pattern: keep `out.past_key_values` and pass it back. A `generate` without a
    cache in between (same batch size) must make its own, not reset the conversation's."""
    def converse(side_call: bool):
        out = model.generate(**tokenizer(PROMPTS[:1]), max_new_tokens=6, do_sample=False,
                             return_dict_in_generate=True)
        cache, ids = out.past_key_values, out.sequences
        for turn in TURNS:
            if side_call:
                model.generate(**tokenizer(PROMPTS[1:2]), max_new_tokens=3, do_sample=False)
            ids = torch.cat([ids, torch.tensor([tokenizer.encode(turn)[1:]])], dim=1)
            ids = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                                 do_sample=False, **{cache_keyword(model): cache})
        return ids

    want = converse(side_call=False)
    vase_triton.patch_qwen3(model, budget=512, window=16)  # nothing evicted: the unpatched tokens
    assert torch.equal(converse(side_call=False), want)
    assert torch.equal(converse(side_call=True), want)


@torch.no_grad()
def test_a_deep_copy_of_a_prefilled_cache_serves_each_generation_from_the_same_prompt(model, tokenizer):
    """transformers' prompt-reuse pattern: prefill once, `copy.deepcopy` the cache for each question."""
    system = tokenizer(PROMPTS[:1])["input_ids"]
    questions = [torch.cat([system, torch.tensor([tokenizer.encode(turn)[1:]])], dim=1) for turn in TURNS]

    def answers(cache):
        model(input_ids=system, **{cache_keyword(model): cache})
        return [model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                               do_sample=False, **{cache_keyword(model): copy.deepcopy(cache)}) for ids in questions]

    want = answers(DynamicCache())
    config = VaSEConfig(budget=512, window=16)
    vase_triton.patch_qwen3(model, config)
    prompt_cache = VaSECache.for_model(model, config, batch_size=1)
    got = answers(prompt_cache)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert prompt_cache.seen_tokens == system.shape[1]  # the copies generated; the original holds the prompt


def test_a_deep_copy_records_its_own_eviction_graph(model):
    """A recorded graph replays over the original's buffers: the copy must not carry it."""
    config = VaSEConfig(budget=64, window=16)
    vase_triton.patch_qwen3(model, config)
    cache = VaSECache.for_model(model, config, batch_size=1)
    recorded = object()
    cache.eviction_graph = recorded
    copied = copy.deepcopy(cache)
    assert copied.eviction_graph is None and cache.eviction_graph is recorded
    assert all(c.keys.data_ptr() != o.keys.data_ptr() for c, o in zip(copied.stores, cache.stores))


def test_a_cache_made_under_inference_mode_serves_later_calls_or_is_refused_by_name(model, tokenizer):
    inputs = tokenizer(PROMPTS[:2])
    with torch.no_grad():
        want = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    vase_triton.patch_qwen3(model, budget=512, window=16)
    with torch.inference_mode():
        assert torch.equal(model.generate(**inputs, max_new_tokens=5, do_sample=False), want)
    with torch.no_grad():  # the cache generate made under inference mode is replaced, not reused
        assert torch.equal(model.generate(**inputs, max_new_tokens=5, do_sample=False), want)
    with torch.inference_mode():
        cache = VaSECache.for_model(model, VaSEConfig(budget=512, window=16), batch_size=2)
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"cache: used under torch.inference_mode\(\)"):
        model.generate(**inputs, max_new_tokens=5, do_sample=False, cache=cache)
    with torch.inference_mode():
        assert torch.equal(model.generate(**inputs, max_new_tokens=5, do_sample=False, cache=cache), want)


def test_buffers_a_cache_makes_later_under_inference_mode_are_checked_too(model, tokenizer):
    """A prompt longer than the cache stages its chunks in a scratch buffer made at that call: made under
    inference mode, it must not leave the next call outside it failing in PyTorch."""
    long_prompt = tokenizer(["x" * 140])
    config = VaSEConfig(budget=40, window=8)
    vase_triton.patch_qwen3(model, config)
    with torch.no_grad():
        model.generate(**long_prompt, max_new_tokens=1)
    with torch.inference_mode():
        model.generate(**long_prompt, max_new_tokens=1)
    with torch.no_grad():
        want = model.generate(**long_prompt, max_new_tokens=4, do_sample=False)
        cache = VaSECache.for_model(model, config, batch_size=1)
    with torch.inference_mode():
        model(**long_prompt, cache=cache)  # a user's cache, prefilled under inference mode
    turn = torch.tensor([tokenizer.encode(TURNS[0])[1:]])
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"cache: used under torch.inference_mode\(\)"):
        model(input_ids=turn, cache=cache)
    vase_triton.patch_qwen3(model, config)
    with torch.no_grad():
        fresh = model.generate(**long_prompt, max_new_tokens=4, do_sample=False)
    assert torch.equal(fresh, want)


@torch.no_grad()
def test_autocast_is_named_when_it_gives_the_cache_keys_of_another_dtype(model, tokenizer):
    vase_triton.patch_qwen3(model, budget=512, window=16)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TypeError, match="autocast is on"):
        model.generate(**tokenizer(PROMPTS[:1]), max_new_tokens=2)


@torch.no_grad()
def test_a_passed_cache_is_chunked_by_its_own_prefill_chunk_size(model, tokenizer):
    """The patch chunks at 16, the cache at 4096: one piece, so a loss over the labels is computed."""
    inputs = tokenizer(PROMPTS[:1])
    assert inputs["input_ids"].shape[1] > 16
    want = model(**inputs, labels=inputs["input_ids"]).loss
    vase_triton.patch_qwen3(model, FULL.replace(prefill_chunk_size=16))
    cache = VaSECache.for_model(model, FULL.replace(prefill_chunk_size=4096), batch_size=1, max_length=64)
    torch.testing.assert_close(model(**inputs, labels=inputs["input_ids"], cache=cache).loss, want)


def test_chunked_prefill_of_a_long_prompt_equals_one_piece(model, tokenizer):
    prompt = tokenizer(" ".join(["a long prompt"] * 30))  # ~400 tokens
    new = 6
    length = prompt["input_ids"].shape[1] + new
    outputs = []
    for chunk in (1024, 32, 5):  # 5: below the window, which `full` (it never compresses) does not need
        config = VaSEConfig(policy="full", budget=512, window=16, prefill_chunk_size=chunk)
        vase_triton.patch_qwen3(model, config)
        cache = VaSECache.for_model(model, config, batch_size=1, max_length=length)
        outputs.append(greedy(model, new, **prompt, cache=cache))
    for chunked in outputs[1:]:
        assert torch.equal(outputs[0][0], chunked[0])
        torch.testing.assert_close(outputs[0][1], chunked[1], rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_a_long_new_turn_reads_either_mask_form(model, tokenizer):
    """A turn of several chunks on a filled cache, masked `[B, T]` or `[B, seen + T]`: the unpatched logits."""
    config = VaSEConfig(policy="full", budget=512, window=16, prefill_chunk_size=16)
    first = tokenizer(PROMPTS[0])["input_ids"]
    turn = torch.tensor([tokenizer.encode(" " + " ".join(["and then what happened"] * 3))[1:]])
    assert turn.shape[1] > 2 * config.prefill_chunk_size
    both = torch.cat([first, turn], dim=1)
    want = model(input_ids=both, attention_mask=torch.ones_like(both)).logits[:, first.shape[1] :]
    vase_triton.patch_qwen3(model, config)
    for mask in (torch.ones_like(turn), torch.ones_like(both)):
        cache = VaSECache.for_model(model, config, batch_size=1, max_length=both.shape[1])
        model(input_ids=first, attention_mask=torch.ones_like(first), cache=cache)
        got = model(input_ids=turn, attention_mask=mask, cache=cache).logits
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert cache.seen_tokens == both.shape[1]


@torch.no_grad()
@pytest.mark.parametrize("keep", [1, 3, 6, 17, 40])
def test_a_chunked_input_keeps_the_logits_logits_to_keep_asks_for(model, keep):
    """Chunks of 8, the last of 2 tokens: the last `keep` positions' logits, the unpatched model's."""
    ids = torch.arange(3, 37).view(1, 34)
    want = model(input_ids=ids, logits_to_keep=keep).logits
    config = VaSEConfig(policy="full", budget=64, window=8, prefill_chunk_size=8)
    vase_triton.patch_qwen3(model, config)
    cache = VaSECache.for_model(model, config, batch_size=1, max_length=ids.shape[1])
    got = model(input_ids=ids, logits_to_keep=keep, cache=cache).logits
    assert got.shape == want.shape == (1, min(keep, ids.shape[1]), want.shape[2])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_an_input_too_long_for_a_full_cache_is_refused_before_any_chunk_is_stored(model):
    config = VaSEConfig(policy="full", budget=64, window=8, prefill_chunk_size=16)
    vase_triton.patch_qwen3(model, config)
    cache = VaSECache.for_model(model, config, batch_size=1, max_length=40)
    ids = torch.arange(3, 53).view(1, 50)
    with pytest.raises(ValueError, match="input_ids: .* never evicts; 50 more do not fit .* larger max_length"):
        model(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache)
    assert cache.seen_tokens == 0 and not cache.in_step
    assert all(int(store.lengths.max()) == 0 for store in cache.stores)


@torch.no_grad()
def test_a_chunked_input_returns_a_tuple_when_asked_and_refuses_labels_before_storing(model):
    ids = torch.arange(3, 37).view(1, 34)
    want = model(input_ids=ids).logits
    config = VaSEConfig(policy="full", budget=64, window=8, prefill_chunk_size=8)
    vase_triton.patch_qwen3(model, config)
    cache = VaSECache.for_model(model, config, batch_size=1, max_length=ids.shape[1])
    with pytest.raises(ValueError, match="labels: a forward pass of 34 tokens .* chunks of prefill_chunk_size = 8"):
        model(input_ids=ids, labels=ids, cache=cache)
    assert _cache_state(cache) == (0, [(0, [0], 0)] * len(cache.stores))
    got = model(input_ids=ids, cache=cache, return_dict=False)
    assert isinstance(got, tuple)
    torch.testing.assert_close(got[0], want, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_masks_the_cache_cannot_read_are_refused_before_it_changes(model, tokenizer):
    """A 4D mask (the cache builds its own causal mask) or a decode-step mask of the wrong shape."""
    inputs = tokenizer(PROMPTS[:2])
    vase_triton.patch_qwen3(model, FULL)
    cache = VaSECache.for_model(model, FULL, batch_size=2, max_length=64)
    square = inputs["attention_mask"][:, None, None, :].expand(-1, 1, inputs["input_ids"].shape[1], -1)
    for config in (FULL, FULL.replace(prefill_chunk_size=16)):  # one piece, or chunks
        vase_triton.patch_qwen3(model, config)
        with pytest.raises(ValueError, match=r"attention_mask: expected a 2D padding mask .*; got \[2, 1, "):
            model(input_ids=inputs["input_ids"], attention_mask=square, cache=cache)
        assert _cache_state(cache) == (0, [(0, [0, 0], 0)] * len(cache.stores))
    model(**inputs, cache=cache)
    state = _cache_state(cache)
    with pytest.raises(ValueError, match=r"attention_mask: expected shape \[B, T\] = \[2, 1\] .*; got \[7, 3\]"):
        model(input_ids=inputs["input_ids"][:, -1:], attention_mask=torch.ones(7, 3, dtype=torch.long), cache=cache)
    assert _cache_state(cache) == state


@torch.no_grad()
def test_a_step_that_fails_after_layers_stored_is_refused_until_reset(model, tokenizer):
    """A forward pass that raises after every layer stored (here in the LM head) leaves the layers
    ahead of the token count: the next use is refused, and after reset() the cache runs as new."""
    inputs = tokenizer(PROMPTS[:1])
    want = model(**inputs).logits
    vase_triton.patch_qwen3(model, FULL)
    cache = VaSECache.for_model(model, FULL, batch_size=1, max_length=64)

    def fail(*_):
        raise KeyboardInterrupt

    hook = model.lm_head.register_forward_hook(fail)
    with pytest.raises(KeyboardInterrupt):
        model(**inputs, cache=cache)
    hook.remove()
    with pytest.raises(RuntimeError, match="failed after 2 of 2 layers began to store its tokens.*call cache.reset"):
        model(**inputs, cache=cache)
    cache.reset()
    torch.testing.assert_close(model(**inputs, cache=cache).logits, want, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_a_turn_that_fails_inside_the_first_layer_after_it_stored_is_refused_until_reset(model, tokenizer, monkeypatch):
    """Out of memory in the first layer's attention, after that layer appended the turn's tokens:
    the other layers hold none of them, so the next use is refused, not run on disagreeing layers."""
    config = VaSEConfig(policy="snapkv", budget=64, window=8)  # 45 + 15 tokens fit: the turn is appended in place
    vase_triton.patch_qwen3(model, config)
    prompt, turn = tokenizer(PROMPTS[:1])["input_ids"], tokenizer(TURNS[:1])["input_ids"]
    cache = VaSECache.for_model(model, config, batch_size=1)
    model(input_ids=prompt, cache=cache)
    before = _cache_state(cache)
    attention = vase_triton.cache.prefill_attention

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("out of memory")

    monkeypatch.setattr(vase_triton.cache, "prefill_attention", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        model(input_ids=turn, cache=cache)
    monkeypatch.setattr(vase_triton.cache, "prefill_attention", attention)
    assert [store.lengths.tolist() for store in cache.stores] == [[60], [45]]  # the first layer stored, then failed
    with pytest.raises(RuntimeError, match="failed after 1 of 2 layers began to store its tokens"):
        model(input_ids=turn, cache=cache)
    cache.reset()
    model(input_ids=prompt, cache=cache)
    assert _cache_state(cache) == before


@torch.no_grad()
def test_an_eviction_that_fails_before_a_decode_step_is_refused_until_reset(model, tokenizer, monkeypatch):
    """The layers evict one after another before a decode step: one failing after the first evicted
    leaves them out of step, so the next use is refused."""
    config = VaSEConfig(policy="snapkv", budget=24, window=8)
    vase_triton.patch_qwen3(model, config)
    inputs = tokenizer(PROMPTS[:1])  # 45 tokens, compressed at prefill to the budget
    cache = VaSECache.for_model(model, config, batch_size=1)
    token = model(**inputs, cache=cache).logits[:, -1:].argmax(-1)
    for _ in range(config.window):  # fill the layers to budget + window, so the next step evicts
        token = model(input_ids=token, cache=cache).logits[:, -1:].argmax(-1)
    evictions = cache.n_evictions

    def out_of_memory():
        raise torch.OutOfMemoryError("out of memory")

    monkeypatch.setattr(cache.stores[1], "evict", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        model(input_ids=token, cache=cache)
    assert cache.stores[0].n_evictions == evictions + 1 and cache.stores[1].n_evictions == evictions
    with pytest.raises(RuntimeError, match="an eviction before a decode step failed partway.*call cache.reset"):
        model(input_ids=token, cache=cache)


@torch.no_grad()
def test_an_input_in_chunks_that_fails_after_its_first_chunk_is_refused_until_reset(model, tokenizer):
    """A 45-token prompt stored in chunks of 8 whose third chunk fails before any layer stores it:
    the cache holds the first two chunks of a prompt the call did not take, so the next use is
    refused (a retry would store them twice)."""
    ids = tokenizer(PROMPTS[:1])["input_ids"]
    want = model(input_ids=ids).logits
    config = FULL.replace(prefill_chunk_size=8)
    vase_triton.patch_qwen3(model, config)
    cache = VaSECache.for_model(model, config, batch_size=1, max_length=64)
    calls = []

    def third_call_interrupted(*_):
        calls.append(None)
        if len(calls) == 3:
            raise KeyboardInterrupt

    hook = model.model.embed_tokens.register_forward_pre_hook(third_call_interrupted)
    with pytest.raises(KeyboardInterrupt):
        model(input_ids=ids, cache=cache)
    hook.remove()
    assert cache.seen_tokens == 16
    with pytest.raises(RuntimeError, match="a forward pass of 45 tokens failed after 2 of its 6 chunks were stored"):
        model(input_ids=ids, cache=cache)
    cache.reset()
    torch.testing.assert_close(model(input_ids=ids, cache=cache).logits, want, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_a_compiled_step_that_fails_is_refused_until_reset(model, tokenizer):
    """A compiled decode step's progress is not visible from the host: one that raises (here after
    every layer stored its token) leaves the cache refused until reset()."""
    inputs = tokenizer(PROMPTS[:1])
    vase_triton.patch_qwen3(model, FULL)
    state = model._vase_patch_state
    cache = VaSECache.for_model(model, FULL, batch_size=1, max_length=64)
    first = model(**inputs, cache=cache).logits[:, -1:].argmax(-1)
    before = _cache_state(cache)

    def interrupted_after_the_layers(**kwargs):
        state.previous_forward(**kwargs)
        raise KeyboardInterrupt

    state.compiled_forward = interrupted_after_the_layers
    with pytest.raises(KeyboardInterrupt):
        model(input_ids=first, cache=cache)
    state.compiled_forward = None
    with pytest.raises(RuntimeError, match="a compiled decode step failed.*call cache.reset"):
        model(input_ids=first, cache=cache)
    cache.reset()
    model(**inputs, cache=cache)
    assert _cache_state(cache) == before


@torch.no_grad()
def test_padding_inside_a_new_turn_is_refused_in_either_mask_form(model, tokenizer):
    config = VaSEConfig(budget=64, window=8)
    vase_triton.patch_qwen3(model, config)
    cache = VaSECache.for_model(model, config, batch_size=2)
    inputs = tokenizer(PROMPTS[:2])
    model(**inputs, cache=cache)
    lengths = [store.lengths.clone() for store in cache.stores]
    turn = torch.tensor([tokenizer.encode(TURNS[0])[1:]] * 2)
    padded = torch.ones_like(turn)
    padded[1, :3] = 0
    for mask in (padded, torch.cat([inputs["attention_mask"], padded], dim=1)):
        with pytest.raises(ValueError, match="attention_mask"):
            model(input_ids=turn, attention_mask=mask, cache=cache)
        assert cache.seen_tokens == inputs["input_ids"].shape[1] and not cache.in_step
        assert all(torch.equal(store.lengths, before) for store, before in zip(cache.stores, lengths))


@pytest.mark.parametrize("budget, chunk", [(40, 4096), (24, 16)], ids=["one-piece", "compressed-in-chunks"])
def test_a_prompt_padded_wider_than_itself_generates_as_the_unpadded_one(model, tokenizer, budget, chunk):
    """Padding a prompt wider (as `pad_to_multiple_of` does) past C = budget + window neither
    compresses it at prefill (C = 48 holds its 45 tokens) nor moves the evictions of its decode
    steps; prefilled in chunks (C = 32), its real tokens are cut and compressed as without it."""
    config = VaSEConfig(policy="vase", budget=budget, window=8, seed=2, prefill_chunk_size=chunk)
    vase_triton.patch_qwen3(model, config)
    inputs = tokenizer(PROMPTS[:1])
    width = 56
    padded = {
        "input_ids": torch.cat([torch.full((1, width - 45), tokenizer.pad_token_id), inputs["input_ids"]], dim=1),
        "attention_mask": torch.cat([torch.zeros(1, width - 45, dtype=torch.long), inputs["attention_mask"]], dim=1),
    }
    runs = []
    for given in (inputs, padded):
        cache = VaSECache.for_model(model, config, batch_size=1, max_length=width + 24)
        runs.append((*greedy(model, 24, **given, cache=cache), cache.n_evictions))
    (want, want_logits, want_evictions), (got, got_logits, got_evictions) = runs
    assert want_evictions == got_evictions > 0
    assert torch.equal(got[:, width:], want[:, 45:])
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)


def test_a_left_padded_batch_prefilled_one_token_at_a_time_stores_no_padding(model, tokenizer):
    """One-token chunks over padding are not decode steps: each row holds its real tokens only,
    and `full` generates what the unpatched model does, through the cache's chunks or transformers'."""
    inputs = tokenizer(PROMPTS)
    want = greedy(model, 6, **inputs)[0]
    want_chunked = greedy(model, 6, **inputs, prefill_chunk_size=1)[0]
    config = FULL.replace(prefill_chunk_size=1)
    vase_triton.patch_qwen3(model, config)
    assert torch.equal(greedy(model, 6, **inputs)[0], want)
    vase_triton.patch_qwen3(model, FULL)
    assert torch.equal(greedy(model, 6, **inputs, prefill_chunk_size=1)[0], want_chunked)
    cache = VaSECache.for_model(model, config, batch_size=len(PROMPTS), max_length=64)
    with torch.no_grad():
        model(**inputs, **{cache_keyword(model): cache})
    real = inputs["attention_mask"].sum(dim=1).to(torch.int32)
    assert all(torch.equal(store.lengths, real) for store in cache.stores)


@torch.no_grad()
def test_a_prompt_stored_in_chunks_is_refused_before_its_first_chunk_when_a_later_one_is_padded_wrongly(
    model, tokenizer
):
    config = VaSEConfig(budget=512, window=8, prefill_chunk_size=16)
    vase_triton.patch_qwen3(model, config)
    cache = VaSECache.for_model(model, config, batch_size=2)
    bad = tokenizer(["a" * 40, "b" * 40])
    bad["attention_mask"][1, -1] = 0  # right padding, in the last chunk only
    with pytest.raises(ValueError, match="attention_mask: expected left padding"):
        model(**bad, cache=cache)
    assert _cache_state(cache) == (0, [(0, [0, 0], 0)] * len(cache.stores))


@pytest.mark.parametrize("policy", ["vase", "snapkv", "h2o", "tova", "vase-dkv", "streaming", "random", "rkv"])
def test_long_prompts_and_turns_stay_within_static_memory(model, tokenizer, policy):
    """A prompt 10x the capacity and two more turns: buffers never grow or move, prefill stages C + chunk."""
    config = VaSEConfig(policy=policy, budget=40, window=8, prefill_chunk_size=64)
    vase_triton.patch_qwen3(model, config)
    cache = VaSECache.for_model(model, config, batch_size=2)
    pointers = [buffer.data_ptr() for store in cache.stores for buffer in store.own_buffers()]
    resident = cache.memory_bytes
    staged = []
    original_get = cache._scratch.get

    def watched_get(*args, **kwargs):
        buffers = original_get(*args, **kwargs)
        staged.append(buffers.num_slots)
        return buffers

    cache._scratch.get = watched_get
    ids = tokenizer(["x" * 10 * config.capacity, "short"])
    ids, mask = ids["input_ids"], ids["attention_mask"]
    for turn in (None, *TURNS):
        if turn is not None:
            extra = torch.tensor([tokenizer.encode(turn)[1:]] * 2)
            ids, mask = torch.cat([ids, extra], dim=1), torch.cat([mask, torch.ones_like(extra)], dim=1)
        ids = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, cache=cache)
        mask = torch.cat([mask, torch.ones(2, ids.shape[1] - mask.shape[1], dtype=mask.dtype)], dim=1)
        assert all(int(store.lengths.max()) <= config.capacity for store in cache.stores)
        assert cache.memory_bytes == resident  # the prefill scratch is gone once decoding starts
    assert staged and max(staged) <= config.capacity + config.prefill_chunk_size
    assert pointers == [buffer.data_ptr() for store in cache.stores for buffer in store.own_buffers()]
    assert cache.n_evictions > 10


# ---------------------------------------------------------------------------- Qwen3-MoE


def tiny_qwen3_moe() -> Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=ByteTokenizer.vocab_size, hidden_size=128, intermediate_size=128, moe_intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=4,
        num_experts_per_tok=2, pad_token_id=0, max_position_embeddings=4096,
    )
    model = Qwen3MoeForCausalLM(config).eval()
    model.generation_config.pad_token_id = 0
    return model


def test_qwen3_moe_matches_unpatched_and_evicts(tokenizer):
    model = tiny_qwen3_moe()
    inputs = tokenizer(PROMPTS[:2])
    want, want_logits = greedy(model, 8, **inputs)
    vase_triton.patch_qwen3(model, FULL)
    got, got_logits = greedy(model, 8, **inputs)
    assert torch.equal(got, want)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)
    config = VaSEConfig(budget=24, window=4)
    vase_triton.patch_qwen3(model, config)
    cache = VaSECache.for_model(model, config, batch_size=2)
    model.generate(**inputs, max_new_tokens=40, do_sample=False, cache=cache)
    assert cache.n_evictions >= 5
