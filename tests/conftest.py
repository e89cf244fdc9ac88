"""Test set-up: run the Triton kernels in the CPU interpreter on machines without CUDA.

`TRITON_INTERPRET` is read when `@triton.jit` decorates a kernel, so it is set
here, before any test module imports `vase_triton.kernels`.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def one_thread():
    """The reference ops on these tiny tensors are dominated by thread wake-ups: run them on one thread."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def saved_model_dir(tmp_path):
    """A tiny Qwen3 and a character-level fast tokenizer saved as a local model directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from vase_triton.demo_model import tiny_qwen3

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab = {token: index for index, token in enumerate(specials + [chr(c) for c in range(32, 127)])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    ).save_pretrained(tmp_path)
    tiny_qwen3(seed=3).save_pretrained(tmp_path)
    return tmp_path
