"""Explicit, reversible patching of a transformers causal LM with the VaSE cache and kernels.

`patch_model` changes three things on one model instance, and `unpatch` undoes exactly
those: the attention implementation (set to the registered VaSE function over the
model's own implementation), and the instance's `forward` and `generate`, wrapped.
Whatever the instance had — the class methods, or instance attributes such as
accelerate's dispatch hooks — is what the wrappers call and what `unpatch` puts back.

The forward wrapper does the cache's host-side bookkeeping eagerly, hands the cache to
the attention function and splits long inputs into chunks; without a `VaSECache` it is
a plain call of the previous forward, and attention is the model's original one. The
generate wrapper creates a `VaSECache` sized for the call when the caller passes none, or
resets and reuses the one it made for the previous call when that has the same size.
Nothing happens at import time.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from types import MethodType
from typing import Any, Callable, Optional

import torch
from transformers import GenerationConfig

from vase_triton.autotune import lookup
from vase_triton.config import VaSEConfig
from vase_triton.integrations.attention import register_attention
from vase_triton.integrations.hf_cache import VaSECache

_STATE_ATTR = "_vase_patch_state"
COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Modes whose compiled decode steps run under CUDA graphs: evictions are replayed from one too.
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
_CACHE_KWARGS = ("cache", "past_key_values")
_PATCHED_ATTRIBUTES = ("forward", "generate")  # instance attributes a patch sets and `unpatch` restores


@dataclasses.dataclass
class _PatchState:
    config: VaSEConfig
    original_attn_implementation: Optional[str]
    attn_implementation: str  # the registered VaSE attention the patch set
    cache_kwarg: str
    compile_mode: Optional[str]
    compiled_forward: Optional[Callable]
    previous_forward: Callable  # what the instance's `forward` was (class method or instance attribute)
    previous_generate: Callable
    saved_attributes: dict  # the instance attributes (of `_PATCHED_ATTRIBUTES`) the patch replaced
    last_cache: Optional[VaSECache] = None  # the cache `generate` made last, reused when it fits
    eager_layouts: set = dataclasses.field(default_factory=set)  # cache layouts past the recompile limit


def cache_keyword(model) -> str:
    """Name of the cache argument of `model.forward`: `cache` (transformers >= 5.24) or `past_key_values`."""
    parameters = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _resolve_config(config: Optional[VaSEConfig], overrides: dict) -> VaSEConfig:
    if config is not None and not isinstance(config, VaSEConfig):
        raise TypeError(f"config: expected a VaSEConfig or None; got {type(config).__name__}")
    config = config or VaSEConfig()
    return config.replace(**overrides) if overrides else config


def is_patched(model) -> bool:
    """Whether `model` is currently patched by vase_triton."""
    return _STATE_ATTR in getattr(model, "__dict__", {})


def patch_state(model) -> Optional[_PatchState]:
    """The patch of `model` (configuration, compile mode), or None."""
    return getattr(model, "__dict__", {}).get(_STATE_ATTR)


def patch_model(
    model,
    check_model: Callable[[Any], None],
    config: Optional[VaSEConfig] = None,
    *,
    compile_mode: Optional[str] = None,
    **overrides,
):
    """Patch a causal LM that `check_model` accepts (it raises a clear error otherwise).

    Patching an already patched model only replaces its configuration and compile mode.
    Returns the same model object.
    """
    check_model(model)
    if compile_mode not in COMPILE_MODES:
        raise ValueError(f"compile_mode: expected one of {COMPILE_MODES}; got {compile_mode!r}")
    vase_config = _resolve_config(config, overrides)

    state = patch_state(model)
    if state is not None:
        state.config = vase_config
        current = model.config._attn_implementation
        if current != state.attn_implementation:  # replaced since (set_attn_implementation): patch over it
            state.original_attn_implementation = current
            state.attn_implementation = register_attention(current)
            model.set_attn_implementation(state.attn_implementation)
        if compile_mode != state.compile_mode:
            state.compile_mode = compile_mode
            state.compiled_forward = _compile(state.previous_forward, compile_mode)
        return model

    original = model.config._attn_implementation
    name = register_attention(original)
    previous_forward, previous_generate = model.forward, model.generate
    state = _PatchState(
        config=vase_config,
        original_attn_implementation=original,
        attn_implementation=name,
        cache_kwarg=cache_keyword(model),
        compile_mode=compile_mode,
        compiled_forward=_compile(previous_forward, compile_mode),
        previous_forward=previous_forward,
        previous_generate=previous_generate,
        saved_attributes={name: model.__dict__[name] for name in _PATCHED_ATTRIBUTES if name in model.__dict__},
    )
    model.set_attn_implementation(name)
    model.forward = MethodType(_with_signature_of(type(model).forward, _patched_forward), model)
    model.generate = MethodType(_with_signature_of(type(model).generate, _patched_generate), model)
    setattr(model, _STATE_ATTR, state)
    return model


def unpatch(model):
    """Undo `patch_*`: the attention implementation and exactly the `forward` and `generate` the instance had."""
    state = patch_state(model)
    if state is None:
        return model
    for attribute in _PATCHED_ATTRIBUTES:
        if attribute in state.saved_attributes:
            setattr(model, attribute, state.saved_attributes[attribute])
        else:
            delattr(model, attribute)
    delattr(model, _STATE_ATTR)
    model.set_attn_implementation(state.original_attn_implementation)
    return model


def _with_signature_of(original: Callable, wrapper: Callable) -> Callable:
    """A copy of `wrapper` that reports `original`'s signature (generate inspects `forward`'s)."""

    @functools.wraps(original)
    def wrapped(self, *args, **kwargs):
        return wrapper(self, *args, **kwargs)

    return wrapped


def _compile(forward: Callable, compile_mode: Optional[str]) -> Optional[Callable]:
    if compile_mode is None:
        return None
    return torch.compile(forward, fullgraph=True, dynamic=False, mode=None if compile_mode == "default" else compile_mode)


def _find_cache(kwargs: dict):
    """The cache the caller passed, under either name transformers has used."""
    for name in _CACHE_KWARGS:
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


def _accept_newer_cache_keyword(state: _PatchState, kwargs: dict) -> None:
    """`cache=` on a transformers that only knows `past_key_values` (< 5.24) is renamed; the reverse is
    left to transformers, which accepts the old name with its own deprecation warning."""
    if state.cache_kwarg == "past_key_values" and kwargs.get("cache") is not None:
        kwargs["past_key_values"] = kwargs.pop("cache")


def _described(inputs) -> str:
    """`shape [...]` of a tensor, else the type's name, for an error's "got ..."."""
    return f"shape {list(inputs.shape)}" if isinstance(inputs, torch.Tensor) else type(inputs).__name__


def _input_rows_and_tokens(kwargs: dict) -> tuple[int, int]:
    """`(B, T)` of the forward's `input_ids` `[B, T]` (or `inputs_embeds` `[B, T, hidden]`)."""
    for name, rank, layout in (("input_ids", 2, "[B, T]"), ("inputs_embeds", 3, "[B, T, hidden]")):
        inputs = kwargs.get(name)
        if inputs is None:
            continue
        if not isinstance(inputs, torch.Tensor) or inputs.dim() != rank:
            raise ValueError(f"{name}: expected a {layout} tensor; got {_described(inputs)}")
        return inputs.shape[0], inputs.shape[1]
    raise ValueError("input_ids: expected input_ids or inputs_embeds; got neither")


def _refuse_gradients(model) -> None:
    if torch.is_grad_enabled() and any(parameter.requires_grad for parameter in model.parameters()):
        raise RuntimeError(
            "cache: the VaSE cache path is for inference and has no gradients; run it under torch.no_grad() or "
            "torch.inference_mode(), or train without a VaSECache (the original attention then runs)"
        )


def _patched_forward(self, *args, **kwargs):
    """Model forward: with a `VaSECache`, its eager bookkeeping and chunked prefill; otherwise unchanged."""
    state: _PatchState = patch_state(self)
    _accept_newer_cache_keyword(state, kwargs)
    cache = _find_cache(kwargs)
    if not isinstance(cache, VaSECache):
        return state.previous_forward(*args, **kwargs)
    cache.check_usable()
    _refuse_gradients(self)
    if self.config._attn_implementation != state.attn_implementation:
        raise RuntimeError(
            f"model: its attention implementation is {self.config._attn_implementation!r}, set after patching, so "
            "it would ignore the VaSE cache; patch it again (the same vase_triton.patch_* call) to run the VaSE "
            "attention over it, or unpatch it first"
        )
    if args:
        kwargs["input_ids"], args = args[0], args[1:]
    if args:
        raise TypeError("forward: with a VaSECache, pass every argument but input_ids by keyword")
    rows, new_tokens = _input_rows_and_tokens(kwargs)
    if rows != cache.stores[0].batch_size:
        raise ValueError(
            f"input_ids: expected {cache.stores[0].batch_size} rows, the batch size the cache was made for; got {rows}"
        )
    if new_tokens > 1 or cache.seen_tokens == 0:  # not a decode step (`begin_step` checks those)
        cache.check_writable()
        cache.check_model(self)
        cache.stores[0].check_room(new_tokens, "input_ids")  # refused whole, before any chunk stores
    elif not cache.checked_for(self):  # a decode step of another model than the last checked
        cache.check_model(self)
    chunk = cache.vase_config.prefill_chunk_size  # the cache's chunks (`chunk_bounds`), not the patch's
    if new_tokens <= chunk or isinstance(kwargs.get("logits_to_keep"), torch.Tensor):
        return _run_step(self, state, cache, kwargs, new_tokens)
    if kwargs.get("labels") is not None:
        raise ValueError(
            f"labels: a forward pass of {new_tokens} tokens on a VaSECache runs in chunks of prefill_chunk_size = "
            f"{chunk} tokens, and a loss over chunks is not computed; compute it from the returned logits, or "
            f"raise prefill_chunk_size to at least {new_tokens}"
        )
    return_dict = kwargs.get("return_dict")
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    outputs = []
    keep = kwargs.get("logits_to_keep", 0) or 0
    seen = cache.seen_tokens
    # Checked before the first chunk stores. Columns that pad every row (an input padded wider
    # than its longest row) are chunks of their own, which store nothing: the real tokens are cut
    # as they would be without them.
    padding = cache.check_prompt_mask(new_tokens, kwargs.get("attention_mask"))
    bounds = [(start, min(padding, start + chunk)) for start in range(0, padding, chunk)]
    bounds += [(padding + start, padding + stop) for start, stop in cache.stores[0].chunk_bounds(new_tokens - padding)]
    for start, stop in bounds:
        part = _chunk_kwargs(kwargs, new_tokens, seen, start, stop)
        part["return_dict"] = True
        needed = stop - start if keep == 0 else min(stop - start, max(0, keep - (new_tokens - stop)))
        if "logits_to_keep" in inspect.signature(type(self).forward).parameters:
            part["logits_to_keep"] = 0 if needed == stop - start else max(needed, 1)
        try:
            outputs.append((needed, _run_step(self, state, cache, part, stop - start)))
        except BaseException:
            if outputs:  # the cache holds the first chunks of an input the call did not take
                cache.refuse_until_reset(
                    f"a forward pass of {new_tokens} tokens failed after {len(outputs)} of its {len(bounds)} "
                    "chunks were stored"
                )
            raise
    joined = _join_chunk_outputs(outputs)
    return joined if return_dict else joined.to_tuple()


def _run_step(model, state: _PatchState, cache: VaSECache, kwargs: dict, new_tokens: int):
    cache.begin_step(
        new_tokens, kwargs.get("attention_mask"), graph_evictions=state.compile_mode in CUDA_GRAPH_MODES
    )
    kwargs["vase_cache"] = cache
    # The cache tracks padding itself. A 4D placeholder mask makes transformers skip mask
    # creation, which would otherwise read host-side lengths into compiled graphs.
    inputs = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs["inputs_embeds"]
    kwargs["attention_mask"] = cache.mask_placeholder(inputs.device)
    compiled = state.compiled_forward is not None and cache.is_decode_step and not _tunes_this_step(cache)
    try:
        output = _compiled_step(state, cache, kwargs) if compiled else state.previous_forward(**kwargs)
    except BaseException:
        cache.abort_step(ran_eagerly=not compiled)
        raise
    cache.end_step(new_tokens)
    return output


def _compiled_step(state: _PatchState, cache: VaSECache, kwargs: dict):
    """The decode step through the compiled forward; eagerly for a shape past torch.compile's recompile limit.

    Each cache shape (batch size; for `full`, capacity) compiles a graph of its own, and dynamo
    refuses a new one past `torch._dynamo.config.recompile_limit` (a hard error under
    `fullgraph=True`, raised before the step runs). The steps of such a cache run eagerly, as
    dynamo itself does without `fullgraph`; the shapes compiled before keep their graphs.
    """
    if state.eager_layouts and cache.layout in state.eager_layouts:  # hashes the layout only once one is there
        return state.previous_forward(**kwargs)
    try:
        return state.compiled_forward(**kwargs)
    except _recompile_limit_error():  # evaluated only when the step raised: no import per step
        if not state.eager_layouts:
            warnings.warn(
                f"compile_mode={state.compile_mode!r}: torch.compile's recompile limit "
                f"(torch._dynamo.config.recompile_limit = {torch._dynamo.config.recompile_limit}) is reached, one "
                "graph per cache shape (batch size; for policy 'full', prompt + new tokens); decode steps of new "
                "shapes run eagerly. Raise the limit, or keep to fewer shapes, to compile them",
                stacklevel=4,
            )
        state.eager_layouts.add(cache.layout)
        return state.previous_forward(**kwargs)


def _recompile_limit_error() -> type:
    from torch._dynamo.exc import FailOnRecompileLimitHit

    return FailOnRecompileLimitHit


def _tunes_this_step(cache: VaSECache) -> bool:
    """Whether a decode step runs eagerly for online autotuning: a cache's first, so that the
    decode launches are tuned outside compiled graphs (under CUDA graphs a compiled step's first
    run allocates into the graphs' private memory pool, tuning inputs included)."""
    return cache.decode_steps == 0 and lookup.mode() == "online"


def _chunk_kwargs(kwargs: dict, total: int, seen: int, start: int, stop: int) -> dict:
    """The forward arguments of tokens `[start, stop)` of a `total`-token input to a cache that has seen `seen`."""
    part = dict(kwargs)
    for name in ("input_ids", "inputs_embeds", "position_ids", "token_type_ids"):
        if isinstance(kwargs.get(name), torch.Tensor):
            part[name] = kwargs[name][:, start:stop]
    if isinstance(kwargs.get("cache_position"), torch.Tensor):
        part["cache_position"] = kwargs["cache_position"][start:stop]
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        if seen > 0 and mask.shape[1] == total:  # [B, T]: the chunk's own columns
            part["attention_mask"] = mask[:, start:stop]
        else:  # [B, seen + T]: every column up to the chunk's last
            part["attention_mask"] = mask[:, : mask.shape[1] - (total - stop)]
    return part


def _join_chunk_outputs(outputs: list):
    """One output for a chunked input: logits (and hidden states) of the kept positions, in order."""
    last = outputs[-1][1]
    logits = [output.logits[:, output.logits.shape[1] - needed :] for needed, output in outputs if needed > 0]
    last.logits = torch.cat(logits, dim=1)
    if getattr(last, "hidden_states", None) is not None:
        last.hidden_states = tuple(
            torch.cat(layer_states, dim=1) for layer_states in zip(*(output.hidden_states for _, output in outputs))
        )
    return last


def _generation_setting(self, kwargs: dict, name: str, *, default: bool = True):
    """The value `generate` uses for `name`, in transformers' order: the keyword, then the fields a passed
    `generation_config` sets (not None), then the model's `generation_config`, then (with `default`)
    transformers' defaults."""
    if name in kwargs:
        return kwargs[name]
    for generation_config in (kwargs.get("generation_config"), self.generation_config):
        value = getattr(generation_config, name, None)
        if value is not None:
            return value
    return getattr(GenerationConfig, "_get_default_generation_params", dict)().get(name) if default else None


_REFUSED_GENERATION = {
    "num_beams": ("beam search", lambda value: value is not None and value > 1),
    "assistant_model": ("assisted decoding", lambda value: value is not None),
    "prompt_lookup_num_tokens": ("prompt-lookup decoding", lambda value: value is not None),
    "assistant_early_exit": ("early-exit (self-speculative) decoding", lambda value: value is not None),
}


def _positional_as_keywords(model, args: tuple, kwargs: dict) -> tuple:
    """`args` past the first (the inputs) moved into `kwargs` under the names transformers' `generate`
    gives them (`generation_config`, `logits_processor`, ...), so that every setting is read where it
    is given. More positional arguments than it takes are left for it to refuse."""
    parameters = list(inspect.signature(type(model).generate).parameters.values())[1:]  # after `self`
    positional = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    if len(args) <= 1 or len(args) > len(positional):
        return args
    for name, value in zip(positional[1:], args[1:]):
        if name in kwargs:
            raise TypeError(f"generate: got multiple values for argument {name!r}")
        kwargs[name] = value
    return args[:1]


def _patched_generate(self, *args, **kwargs):
    """`generate` that creates a `VaSECache` for this call when none is given."""
    state: _PatchState = patch_state(self)
    args = _positional_as_keywords(self, args, kwargs)
    for name, (feature, refused) in _REFUSED_GENERATION.items():
        value = _generation_setting(self, kwargs, name)
        if refused(value):
            given = repr(value) if isinstance(value, (int, float, str)) else f"a {type(value).__name__}"
            raise ValueError(
                f"{name}: a VaSE cache evicts different tokens per row and cannot roll back, so {feature} is not "
                f"supported; got {name}={given} (unpatch the model, or use plain or sampled decoding)"
            )
    cache_implementation = _generation_setting(self, kwargs, "cache_implementation")
    if cache_implementation is not None:
        warnings.warn(
            f"cache_implementation={cache_implementation!r} is ignored: the patched model generates with a "
            "VaSECache (unpatch it to use another cache)",
            stacklevel=2,
        )
        kwargs["cache_implementation"] = None
    _accept_newer_cache_keyword(state, kwargs)
    cache = _find_cache(kwargs)
    if isinstance(cache, VaSECache) and _generation_setting(self, kwargs, "use_cache") is False:
        raise ValueError(
            "use_cache: False with a VaSECache would store the whole sequence again at every step; got "
            "use_cache=False (drop the cache argument to generate without one)"
        )
    if cache is None and _generation_setting(self, kwargs, "use_cache") is not False:
        kwargs[state.cache_kwarg] = _cache_for_call(self, state, args, kwargs)
    num_return_sequences = _generation_setting(self, kwargs, "num_return_sequences") or 1
    if isinstance(cache, VaSECache) and num_return_sequences > 1:
        rows = _prompt_rows_and_length(args, kwargs)[0] * num_return_sequences
        if cache.stores[0].batch_size != rows:
            raise ValueError(
                f"num_return_sequences: generate repeats each prompt row {num_return_sequences} times, {rows} rows, "
                f"and the cache was made for {cache.stores[0].batch_size}; make it with batch_size={rows}"
            )
    output = state.previous_generate(*args, **kwargs)
    returned = (getattr(output, name, None) for name in ("cache", "past_key_values"))
    if state.last_cache is not None and any(held is state.last_cache for held in returned):
        state.last_cache = None  # returned to the caller, who may pass it back: no later call resets it
    return output


def _prompt_rows_and_length(args: tuple, kwargs: dict) -> tuple[int, int]:
    """(rows, tokens) of the prompt a `generate` call was given (one BOS token when it has none)."""
    inputs = kwargs.get("input_ids", kwargs.get("inputs", args[0] if args else None))
    if inputs is None:
        inputs = kwargs.get("inputs_embeds")
    if inputs is not None:
        if not isinstance(inputs, torch.Tensor) or inputs.dim() < 2 or inputs.shape[0] == 0:
            raise ValueError(f"input_ids: expected a [B, T] tensor of at least one row; got {_described(inputs)}")
        return inputs.shape[0], inputs.shape[1]
    mask = kwargs.get("attention_mask")  # generation starts from the BOS token
    return (mask.shape[0], mask.shape[1] + 1) if mask is not None else (1, 1)


def _cache_for_call(model, state: _PatchState, args: tuple, kwargs: dict) -> VaSECache:
    """A `VaSECache` sized for one `generate` call: its batch (times return sequences) and length.

    The cache of the previous call, reset, when it has that size (as transformers does with its
    static caches) and that call did not return it (`return_dict_in_generate=True` hands it to
    the caller, who may pass it back): its buffers keep their addresses, so the CUDA graphs
    recorded over them under `compile_mode="reduce-overhead"` serve again instead of being
    recorded anew.
    """
    batch, prompt_len = _prompt_rows_and_length(args, kwargs)
    num_return_sequences = _generation_setting(model, kwargs, "num_return_sequences") or 1
    max_new_tokens = _generation_setting(model, kwargs, "max_new_tokens")
    max_length = _generation_setting(model, kwargs, "max_length", default=False)
    if max_new_tokens is None and max_length is None:  # transformers then adds its default length to the prompt
        max_new_tokens = _generation_setting(model, kwargs, "max_length") or 1
    elif max_new_tokens is None:
        max_new_tokens = max(1, max_length - prompt_len)
    batch_size, max_length = batch * num_return_sequences, prompt_len + int(max_new_tokens)
    state.last_cache = VaSECache.reuse_or_make(
        state.last_cache, model, state.config, batch_size=batch_size, max_length=max_length
    )
    return state.last_cache
