"""vase_triton: value-aware stochastic KV-cache eviction (VaSE) as Triton kernels.

Public API:

- `VaSEConfig`: policy and sizes of the static cache.
- `Policy` / `register_policy`: eviction policies as specs (`vase_triton.policies`).
- `patch_qwen3(model, config=None, **overrides)` / `unpatch(model)` / `patched(model, ...)`:
  make `model.generate()` run with a static VaSE cache (`patch_qwen2`, `patch_llama` for the
  DeepSeek-R1 distills).
- `VaSECache`: the transformers cache (one `VaSECacheLayer` per decoder layer).
- `vase_triton.ops`: the kernels as PyTorch ops (`prefill_attention`, `decode_attention`, ...).

Importing this package has no side effects: nothing is registered with transformers and
no GPU is queried until a function is called.
"""

from vase_triton.config import POLICIES, VALUE_STATS, VaSEConfig

__version__ = "0.1.0"

_LAZY = {
    "VaSECache": ("vase_triton.integrations.hf_cache", "VaSECache"),
    "UnsupportedCacheOperation": ("vase_triton.integrations.hf_cache", "UnsupportedCacheOperation"),
    "VaSECacheLayer": ("vase_triton.cache", "VaSECacheLayer"),
    "patch_qwen3": ("vase_triton.integrations.models", "patch_qwen3"),
    "patch_qwen2": ("vase_triton.integrations.models", "patch_qwen2"),
    "patch_llama": ("vase_triton.integrations.models", "patch_llama"),
    "patched": ("vase_triton.integrations.models", "patched"),
    "unpatch": ("vase_triton.integrations.patching", "unpatch"),
    "is_patched": ("vase_triton.integrations.patching", "is_patched"),
    "Policy": ("vase_triton.policies", "Policy"),
    "register_policy": ("vase_triton.policies", "register_policy"),
    "CacheTensors": ("vase_triton.cache_tensors", "CacheTensors"),
}

__all__ = ["VaSEConfig", "POLICIES", "VALUE_STATS", "__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module_name, attribute = _LAZY[name]
        return getattr(importlib.import_module(module_name), attribute)
    raise AttributeError(f"module 'vase_triton' has no attribute {name!r}")
