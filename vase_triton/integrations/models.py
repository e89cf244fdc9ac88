"""Per-architecture entry points: `patch_qwen3`, `patch_qwen2`, `patch_llama`, and `patched`.

Qwen3 covers the dense models and Qwen3-MoE (e.g. Qwen3-30B-A3B: same attention);
Qwen2 and Llama cover the DeepSeek-R1-Distill-Qwen and -Llama reasoning models. All
apply RoPE before the cache update and call the registered attention function, so the
same patch serves them. Models whose layers do not all use global attention (sliding
windows) are refused: a VaSE cache would treat them as global.
"""

from __future__ import annotations

import contextlib
from typing import Optional

from vase_triton.config import VaSEConfig
from vase_triton.integrations.patching import patch_model, patch_state, unpatch
from vase_triton.validation import FLOAT_DTYPES, SUPPORTED_HEAD_DIMS

ARCHITECTURES = {
    "patch_qwen3": ("qwen3", "qwen3_moe"),
    "patch_qwen2": ("qwen2",),
    "patch_llama": ("llama",),
}
SUPPORTED_MODEL_TYPES = tuple(model_type for types in ARCHITECTURES.values() for model_type in types)


def _non_global_layers(config) -> list[str]:
    """`"layer i: <kind>"` for every decoder layer that does not attend over the whole sequence."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return [f"layer {i}: {kind}" for i, kind in enumerate(layer_types) if kind != "full_attention"]
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        first = getattr(config, "max_window_layers", 0) or 0
        return [f"layer {i}: sliding_attention" for i in range(first, config.num_hidden_layers)]
    return []


def check_attention_config(config) -> None:
    """Raise a `ValueError` unless every decoder layer of the model `config` describes attends
    over the whole sequence with a supported head dim (the config alone: no weights needed)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    sliding = _non_global_layers(text)
    if sliding:
        shown = ", ".join(sliding[:4]) + (f", ... ({len(sliding)} layers)" if len(sliding) > 4 else "")
        raise ValueError(
            f"model: every layer must use global attention for a VaSE cache; got non-global layers ({shown}) "
            "(load the model with use_sliding_window=False if it supports that)"
        )
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"model: expected an attention head dim in {SUPPORTED_HEAD_DIMS}; got {head_dim}")


def _checker(model_types: tuple[str, ...]):
    def check(model) -> None:
        if hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule forwards attributes to the model
            raise TypeError(
                f"model: expected the transformers model itself; got the torch.compile wrapper {type(model).__name__} "
                "(patch the model before compiling it, e.g. patch_qwen3(compiled._orig_mod); the patch's "
                "compile_mode compiles its decode steps)"
            )
        config = getattr(model, "config", None)
        model_type = getattr(config, "model_type", None)
        if model_type not in model_types or not hasattr(model, "generate"):
            raise TypeError(
                f"model: expected a transformers causal LM of type {', '.join(model_types)}; "
                f"got {type(model).__name__} with model_type={model_type!r}"
            )
        check_attention_config(config)
        if model.dtype not in FLOAT_DTYPES:
            raise ValueError(
                f"model: expected float16, bfloat16 or float32 weights (the VaSE cache's dtypes); got {model.dtype} "
                "(convert it first, e.g. model.to(torch.float32))"
            )

    return check


def patch_qwen3(model, config: Optional[VaSEConfig] = None, *, compile_mode: Optional[str] = None, **overrides):
    """Patch a transformers Qwen3 or Qwen3-MoE causal LM (any size) in place; returns it.

    Afterwards `model.generate(...)` runs with the VaSE kernels and a static `VaSECache`
    sized for each call. `overrides` are `VaSEConfig` fields (e.g. `budget=1024`).
    `compile_mode` (`"default"`, `"reduce-overhead"`, ...) runs decode steps through
    `torch.compile(fullgraph=True)`; `"reduce-overhead"` adds CUDA graphs on GPU, and then
    the evictions of all layers are replayed from one CUDA graph too.
    """
    return patch_model(model, _checker(ARCHITECTURES["patch_qwen3"]), config, compile_mode=compile_mode, **overrides)


def patch_qwen2(model, config: Optional[VaSEConfig] = None, *, compile_mode: Optional[str] = None, **overrides):
    """`patch_qwen3` for Qwen2 models (e.g. DeepSeek-R1-Distill-Qwen)."""
    return patch_model(model, _checker(ARCHITECTURES["patch_qwen2"]), config, compile_mode=compile_mode, **overrides)


def patch_llama(model, config: Optional[VaSEConfig] = None, *, compile_mode: Optional[str] = None, **overrides):
    """`patch_qwen3` for Llama models (e.g. DeepSeek-R1-Distill-Llama)."""
    return patch_model(model, _checker(ARCHITECTURES["patch_llama"]), config, compile_mode=compile_mode, **overrides)


def patch_any(model, config: Optional[VaSEConfig] = None, *, compile_mode: Optional[str] = None, **overrides):
    """Patch any supported architecture (`SUPPORTED_MODEL_TYPES`)."""
    return patch_model(model, _checker(SUPPORTED_MODEL_TYPES), config, compile_mode=compile_mode, **overrides)


@contextlib.contextmanager
def patched(model, config: Optional[VaSEConfig] = None, *, compile_mode: Optional[str] = None, **overrides):
    """`with patched(model, budget=1024): model.generate(...)` — patched inside, the previous state restored on exit.

    Nests: on an already patched model the block runs with the new configuration and the
    previous configuration and compile mode come back afterwards, also when the block raises.
    """
    previous = patch_state(model)
    restore = None if previous is None else (previous.config, previous.compile_mode)
    patch_any(model, config, compile_mode=compile_mode, **overrides)
    try:
        yield model
    finally:
        if restore is None:
            unpatch(model)
        else:
            patch_any(model, restore[0], compile_mode=restore[1])
