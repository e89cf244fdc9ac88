"""Per-architecture entry points: `patch_qwen3`, `patch_qwen2`, `patch_llama`, and `patched`.

Qwen2 and Llama cover the DeepSeek-R1-Distill-Qwen and -Llama reasoning models. All
three architectures apply RoPE before the cache update and call the registered
attention function, so the same patch serves them.
"""

from __future__ import annotations

import contextlib
from typing import Optional

from vase_triton.config import VaSEConfig
from vase_triton.integrations.patching import is_patched, patch_model, unpatch

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama")


def patch_qwen3(model, config: Optional[VaSEConfig] = None, *, compile_mode: Optional[str] = None, **overrides):
    """Patch a transformers Qwen3 causal LM (any size) in place; returns it.

    Afterwards `model.generate(...)` runs with the VaSE kernels and a static `VaSECache`
    sized for each call. `overrides` are `VaSEConfig` fields (e.g. `budget=1024`).
    `compile_mode` (`"default"`, `"reduce-overhead"`, ...) runs decode steps through
    `torch.compile(fullgraph=True)`; `"reduce-overhead"` adds CUDA graphs on GPU.
    """
    return patch_model(model, ("qwen3",), config, compile_mode=compile_mode, **overrides)


def patch_qwen2(model, config: Optional[VaSEConfig] = None, *, compile_mode: Optional[str] = None, **overrides):
    """`patch_qwen3` for Qwen2 models (e.g. DeepSeek-R1-Distill-Qwen)."""
    return patch_model(model, ("qwen2",), config, compile_mode=compile_mode, **overrides)


def patch_llama(model, config: Optional[VaSEConfig] = None, *, compile_mode: Optional[str] = None, **overrides):
    """`patch_qwen3` for Llama models (e.g. DeepSeek-R1-Distill-Llama)."""
    return patch_model(model, ("llama",), config, compile_mode=compile_mode, **overrides)


def patch_any(model, config: Optional[VaSEConfig] = None, *, compile_mode: Optional[str] = None, **overrides):
    """Patch any supported architecture (`SUPPORTED_MODEL_TYPES`)."""
    return patch_model(model, SUPPORTED_MODEL_TYPES, config, compile_mode=compile_mode, **overrides)


@contextlib.contextmanager
def patched(model, config: Optional[VaSEConfig] = None, *, compile_mode: Optional[str] = None, **overrides):
    """`with patched(model, budget=1024): model.generate(...)` — patched inside, restored on exit."""
    was_patched = is_patched(model)
    patch_any(model, config, compile_mode=compile_mode, **overrides)
    try:
        yield model
    finally:
        if not was_patched:
            unpatch(model)
