"""A tiny, randomly initialised Qwen3 and a byte tokenizer, for the README's snippets and the tests.

It needs no download, so it runs on a fresh CPU-only machine. Its weights are random,
so its text is noise: it exercises the whole VaSE path (prefill compression, decode
attention, evictions), not language quality; the trained model the `vase-triton`
command runs by default is the testbed's (`vase_triton.testbed`).
"""

from __future__ import annotations

from typing import Sequence

import torch

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
_BYTE_OFFSET = 3


class ByteTokenizer:
    """UTF-8 byte tokenizer (259 ids: pad, bos, eos, 256 bytes), left-padding batches."""

    vocab_size = 256 + _BYTE_OFFSET
    pad_token_id, bos_token_id, eos_token_id = PAD_ID, BOS_ID, EOS_ID
    padding_side = "left"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`text`'s UTF-8 bytes as ids, after a BOS unless `add_special_tokens` is False."""
        return [BOS_ID] * add_special_tokens + [byte + _BYTE_OFFSET for byte in text.encode("utf-8")]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        data = bytes(int(i) - _BYTE_OFFSET for i in ids if int(i) >= _BYTE_OFFSET)
        return data.decode("utf-8", errors="replace")

    def __call__(self, texts, return_tensors: str = "pt", padding: bool = True, add_special_tokens: bool = True) -> dict:
        """`{"input_ids": [B, T], "attention_mask": [B, T]}`, left-padded."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        encoded = [self.encode(text, add_special_tokens) for text in texts]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.full((len(encoded), width), PAD_ID, dtype=torch.long)
        attention_mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, ids in enumerate(encoded):
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            attention_mask[row, width - len(ids):] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask}


def tiny_qwen3(*, seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu", num_layers: int = 2):
    """A randomly initialised Qwen3 causal LM (2 layers, 4 query / 2 KV heads, head dim 64)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=ByteTokenizer.vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=65536,
        tie_word_embeddings=True,
        initializer_range=0.15,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen3ForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.eos_token_id = None
    return model.to(device=device, dtype=dtype).eval()
