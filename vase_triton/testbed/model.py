"""The testbed model: a small Qwen3 trained on `vase_triton.testbed.task`, shipped with the package.

`WEIGHTS_DIR` is a transformers model directory (config, safetensors weights, tokenizer,
generation config) written by `python -m vase_triton.testbed.train`, so it loads like any
model: `AutoModelForCausalLM.from_pretrained(WEIGHTS_DIR)`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vase_triton.testbed.task import BOS, EOS, PAD, vocabulary
from vase_triton.testbed.tokenizer import build_tokenizer

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
# Room for the longest problem (under 400 words) and whatever a caller asks beyond it.
MAX_POSITIONS = 1024


def testbed_config(*, hidden_size: int = 128, num_layers: int = 4, num_heads: int = 4, num_kv_heads: int = 2):
    """The `Qwen3Config` of the testbed model (head dim 32, GQA, tied embeddings)."""
    from transformers import Qwen3Config

    words = vocabulary()
    return Qwen3Config(
        vocab_size=len(words),
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=MAX_POSITIONS,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        pad_token_id=words.index(PAD),
        bos_token_id=words.index(BOS),
        eos_token_id=words.index(EOS),
    )


def load_testbed(*, device="cpu", dtype: torch.dtype = torch.float32):
    """The shipped testbed `(model, tokenizer)`; the tokenizer pads on the left.

    The tokenizer is rebuilt from the task vocabulary (the same as the shipped tokenizer
    files), which keeps loading independent of how a transformers version names its classes.
    """
    from vase_triton.integrations.loading import load_causal_lm

    if not (WEIGHTS_DIR / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"testbed weights: expected {WEIGHTS_DIR / 'model.safetensors'} (run "
            "`python -m vase_triton.testbed.train --out vase_triton/testbed/weights`); it is missing"
        )
    tokenizer = build_tokenizer()
    model = load_causal_lm(WEIGHTS_DIR, dtype=dtype).to(device).eval()
    return model, tokenizer
