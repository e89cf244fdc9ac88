"""Explicit, reversible patching of a transformers causal LM with the VaSE cache and kernels.

`patch_model` changes three things on one model instance, and `unpatch` undoes
exactly those: the attention implementation (set to the registered `vase`
function), and instance-level `forward` and `generate` wrappers. The forward
wrapper does the cache's host-side bookkeeping eagerly and hands the cache to
the attention function; the generate wrapper creates a `VaSECache` sized for the
call when the caller passes none. Nothing happens at import time.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from types import MethodType
from typing import Callable, Optional

import torch

from vase_triton.config import VaSEConfig
from vase_triton.integrations.attention import ATTENTION_NAME, register_attention
from vase_triton.integrations.hf_cache import VaSECache

_STATE_ATTR = "_vase_patch_state"
COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclasses.dataclass
class _PatchState:
    config: VaSEConfig
    original_attn_implementation: Optional[str]
    cache_kwarg: str
    compile_mode: Optional[str]
    compiled_forward: Optional[Callable]


def _cache_kwarg(model) -> str:
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


def patch_model(
    model,
    supported_model_types: tuple[str, ...],
    config: Optional[VaSEConfig] = None,
    *,
    compile_mode: Optional[str] = None,
    **overrides,
):
    """Patch a causal LM whose `config.model_type` is one of `supported_model_types`.

    Patching an already patched model only replaces its configuration (idempotent).
    Returns the same model object.
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in supported_model_types or not hasattr(model, "generate"):
        raise TypeError(
            f"model: expected a transformers causal LM of type {', '.join(supported_model_types)}; "
            f"got {type(model).__name__} with model_type={model_type!r}"
        )
    if compile_mode not in COMPILE_MODES:
        raise ValueError(f"compile_mode: expected one of {COMPILE_MODES}; got {compile_mode!r}")
    vase_config = _resolve_config(config, overrides)
    register_attention()

    if is_patched(model):
        state = getattr(model, _STATE_ATTR)
        state.config = vase_config
        if compile_mode != state.compile_mode:
            state.compile_mode = compile_mode
            state.compiled_forward = _compile_forward(model, compile_mode)
        return model

    state = _PatchState(
        config=vase_config,
        original_attn_implementation=model.config._attn_implementation,
        cache_kwarg=_cache_kwarg(model),
        compile_mode=compile_mode,
        compiled_forward=None,
    )
    model.set_attn_implementation(ATTENTION_NAME)
    state.compiled_forward = _compile_forward(model, compile_mode)
    model.forward = MethodType(_with_signature_of(type(model).forward, _patched_forward), model)
    model.generate = MethodType(_with_signature_of(type(model).generate, _patched_generate), model)
    setattr(model, _STATE_ATTR, state)
    return model


def unpatch(model):
    """Undo `patch_*`: the model's attention implementation, `forward` and `generate` are restored."""
    if not is_patched(model):
        return model
    state = getattr(model, _STATE_ATTR)
    del model.forward
    del model.generate
    delattr(model, _STATE_ATTR)
    model.set_attn_implementation(state.original_attn_implementation)
    return model


def _with_signature_of(original: Callable, wrapper: Callable) -> Callable:
    """A copy of `wrapper` that reports `original`'s signature (generate inspects `forward`'s)."""

    @functools.wraps(original)
    def wrapped(self, *args, **kwargs):
        return wrapper(self, *args, **kwargs)

    return wrapped


def _compile_forward(model, compile_mode: Optional[str]) -> Optional[Callable]:
    if compile_mode is None:
        return None
    original = type(model).forward.__get__(model)
    return torch.compile(original, fullgraph=True, dynamic=False, mode=None if compile_mode == "default" else compile_mode)


def _num_new_tokens(args: tuple, kwargs: dict) -> int:
    input_ids = kwargs.get("input_ids", args[0] if args else None)
    if input_ids is not None:
        return input_ids.shape[1]
    inputs_embeds = kwargs.get("inputs_embeds")
    if inputs_embeds is None:
        raise ValueError("input_ids: expected input_ids or inputs_embeds; got neither")
    return inputs_embeds.shape[1]


def _normalise_cache_kwarg(state: _PatchState, kwargs: dict) -> None:
    """Accept both `cache=` and `past_key_values=` whatever the installed transformers calls it."""
    for name in ("cache", "past_key_values"):
        if name != state.cache_kwarg and kwargs.get(name) is not None:
            kwargs[state.cache_kwarg] = kwargs.pop(name)


def _patched_forward(self, *args, **kwargs):
    """Model forward with the VaSE cache's eager bookkeeping; decode steps may run compiled."""
    state: _PatchState = getattr(self, _STATE_ATTR)
    original = type(self).forward.__get__(self)
    _normalise_cache_kwarg(state, kwargs)
    cache = kwargs.get(state.cache_kwarg)
    if not isinstance(cache, VaSECache):
        return original(*args, **kwargs)
    num_new_tokens = _num_new_tokens(args, kwargs)
    cache.begin_step(num_new_tokens, kwargs.get("attention_mask"))
    kwargs["vase_cache"] = cache
    if not cache.in_prefill:
        # The cache tracks padding itself; the growing 2D mask would only change input shapes.
        kwargs.pop("attention_mask", None)
    run = state.compiled_forward if state.compiled_forward is not None and not cache.in_prefill else original
    output = run(*args, **kwargs)
    cache.end_step(num_new_tokens)
    return output


def _generation_setting(self, kwargs: dict, name: str):
    generation_config = kwargs.get("generation_config") or self.generation_config
    return kwargs.get(name, getattr(generation_config, name, None))


def _patched_generate(self, *args, **kwargs):
    """`generate` that creates a `VaSECache` for this call when none is given."""
    state: _PatchState = getattr(self, _STATE_ATTR)
    num_beams = _generation_setting(self, kwargs, "num_beams") or 1
    if num_beams > 1:
        raise ValueError(
            f"num_beams: VaSE caches evict different tokens per row and do not support beam search; "
            f"expected 1, got {num_beams}"
        )
    _normalise_cache_kwarg(state, kwargs)
    cache = kwargs.get(state.cache_kwarg)
    if isinstance(cache, VaSECache):
        if cache.seen_tokens > 0:
            raise ValueError(
                f"{state.cache_kwarg}: this VaSECache already holds a generation "
                f"({cache.seen_tokens} tokens); pass a new cache or call cache.reset() first"
            )
    elif cache is None and kwargs.get("use_cache", True):
        inputs = kwargs.get("input_ids", kwargs.get("inputs", args[0] if args else None))
        if inputs is None:
            inputs = kwargs.get("inputs_embeds")
        if inputs is None:
            raise ValueError("input_ids: a patched generate needs input_ids or inputs_embeds to size its VaSECache")
        num_return_sequences = _generation_setting(self, kwargs, "num_return_sequences") or 1
        max_new_tokens = _generation_setting(self, kwargs, "max_new_tokens")
        if max_new_tokens is None:
            max_new_tokens = max(1, (_generation_setting(self, kwargs, "max_length") or 0) - inputs.shape[1])
        kwargs[state.cache_kwarg] = VaSECache.for_model(
            self,
            state.config,
            batch_size=inputs.shape[0] * num_return_sequences,
            max_length=inputs.shape[1] + max_new_tokens,
        )
    return type(self).generate(self, *args, **kwargs)
