"""Saved local model directories for command tests: a tiny Qwen3 with a character-level tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def save_model_dir(path: Path, chat_template: Optional[str] = None, *, add_bos: bool = False) -> Path:
    """A tiny Qwen3 and a character-level fast tokenizer (ids 4.. are printable ASCII) saved in `path`.

    `add_bos`: the tokenizer puts `<bos>` (id 1) before every text it encodes, as Llama's do.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from vase_triton.demo_model import tiny_qwen3

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab = {token: index for index, token in enumerate(specials + [chr(c) for c in range(32, 127)])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    if add_bos:
        tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(path)
    tiny_qwen3(seed=3).save_pretrained(path)
    return path
