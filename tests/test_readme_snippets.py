"""The README's "Using a patched model" snippets run as written on the tiny model, with
their generation lengths shortened: on its byte tokenizer, and the chat snippet on a
character tokenizer with a chat template (the README says which snippets need more).

Each snippet's result is checked against the unpatched model where the snippet's cache
never evicts (the same greedy tokens; the same sampled tokens from the same torch seed;
the same conversation generated from scratch at every turn), and against what the README
says of it where it does.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from model_dirs import save_model_dir
from transformers import AutoModelForCausalLM, AutoTokenizer

import vase_triton
from vase_triton.integrations.patching import patch_state

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Using a patched model"
# The snippet the README says the tiny model cannot run: several GPUs.
NEEDS_MORE_THAN_THE_TINY_MODEL = ("from_pretrained",)
CHAT_TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
NEW_TOKENS = 12


def section_snippets() -> list[str]:
    """The ```python blocks of the README's "Using a patched model" section, in order."""
    text = README.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start:end if end != -1 else None], flags=re.DOTALL)


def runnable_snippets() -> dict[str, str]:
    """The snippets the tiny model runs, by their first call, with `max_new_tokens` shortened."""
    snippets = [s for s in section_snippets() if not any(marker in s for marker in NEEDS_MORE_THAN_THE_TINY_MODEL)]
    shortened = [re.sub(r"max_new_tokens=\d+", f"max_new_tokens={NEW_TOKENS}", s) for s in snippets]
    return {re.search(r"\w+\(", s).group(0)[:-1] + f"#{i}": s for i, s in enumerate(shortened)}


SNIPPETS = runnable_snippets()


@pytest.fixture(autouse=True)
def _reference_backend(monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "torch")


def run_snippet(source: str, model, tokenizer, **names) -> dict:
    namespace = {"torch": torch, "vase_triton": vase_triton, "model": model, "tokenizer": tokenizer, **names}
    exec(compile(source, str(README), "exec"), namespace)
    return namespace


def test_the_section_has_the_snippets_this_file_runs_and_the_one_it_cannot():
    snippets = section_snippets()
    assert len(snippets) == len(SNIPPETS) + 1 == 5, "a snippet was added or removed: update this test"
    assert sum("from_pretrained" in s for s in snippets) == 1


def test_one_prompt_generates_what_the_unpatched_model_does(model, tokenizer):
    (source,) = [s for s in SNIPPETS.values() if "patch_qwen3(model, budget=2048)" in s]
    prompt = re.search(r'tokenizer\(\["(.*?)"\]', source).group(1)
    want = model.generate(**tokenizer([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)

    out = run_snippet(source, model, tokenizer)["out"]

    assert torch.equal(out, want)
    assert patch_state(model).last_cache.n_evictions == 0
    vase_triton.unpatch(model)


def test_batches_sample_what_the_unpatched_model_samples(model, tokenizer):
    (source,) = [s for s in SNIPPETS.values() if "num_return_sequences" in s]
    torch.manual_seed(7)
    unpatched = run_snippet(source, model, tokenizer)["out"]

    vase_triton.patch_qwen3(model, budget=2048)
    torch.manual_seed(7)
    patched = run_snippet(source, model, tokenizer)["out"]

    assert patched.shape[0] == 2 * 4
    assert torch.equal(patched, unpatched)
    vase_triton.unpatch(model)


def test_a_chat_keeps_its_cache_across_turns_and_says_what_a_fresh_start_at_each_turn_would(tmp_path):
    (source,) = [s for s in SNIPPETS.values() if "apply_chat_template" in s]
    directory = save_model_dir(tmp_path, chat_template=CHAT_TEMPLATE)
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory, padding_side="left")
    questions = ast.literal_eval(re.search(r"for question in (\[.*?\]):", source).group(1))

    def template(content: str) -> torch.Tensor:
        messages = [{"role": "user", "content": content}]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=False)

    want = template("Hi!")
    for question in questions:
        want = model.generate(input_ids=want, attention_mask=torch.ones_like(want), max_new_tokens=NEW_TOKENS,
                              do_sample=False)
        want = torch.cat([want, template(question)], dim=1)

    vase_triton.patch_qwen3(model, budget=2048)
    namespace = run_snippet(source, model, tokenizer)

    assert torch.equal(namespace["ids"], want)
    assert namespace["cache"].n_evictions == 0
    vase_triton.unpatch(model)


def test_a_long_prompt_is_read_in_chunks_and_compressed_to_the_budget(model, tokenizer):
    (source,) = [s for s in SNIPPETS.values() if "prefill_chunk_size=4096" in s]
    document = "The committee met on the third day and read the reports aloud. " * 80  # 5,040 bytes

    out = run_snippet(source, model, tokenizer, long_document=document)["out"]

    prompt = tokenizer([document])["input_ids"]
    assert prompt.shape[1] > 4096  # two chunks, the first of which alone overflows the budget
    assert torch.equal(out[:, : prompt.shape[1]], prompt)
    assert out.shape[1] == prompt.shape[1] + NEW_TOKENS
    cache = patch_state(model).last_cache
    assert cache.n_evictions >= 1
    assert cache.capacity == 2048 + 64
    assert all(int(store.tensors.lengths.max()) <= cache.capacity for store in cache.stores)
    vase_triton.unpatch(model)
