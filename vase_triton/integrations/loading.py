"""`load_causal_lm`: a checkpoint loaded with transformers' own modules.

From transformers 5.25, `from_pretrained` replaces some layers (RMSNorm, RoPE) with
kernels fetched from the Hugging Face Hub unless told not to. Every load this library
makes keeps the stock modules: they are what the patch and the benchmarks' full-cache
baselines are tested with, and they load on a machine without network.
"""

from __future__ import annotations


def load_causal_lm(path, **kwargs):
    """`AutoModelForCausalLM.from_pretrained(path, **kwargs)` without Hub kernels."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, use_kernels=False, **kwargs)
