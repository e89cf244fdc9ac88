"""The testbed's word-level tokenizer: one id per word of `task.vocabulary()`, split on spaces."""

from __future__ import annotations

from vase_triton.testbed.task import BOS, EOS, PAD, THINK, UNK, vocabulary

# Renders a user message as `<bos> question <think>`: the testbed's thinking-mode prompt.
CHAT_TEMPLATE = (
    "{{ '" + BOS + " ' + messages[-1]['content'] }}"
    "{% if add_generation_prompt %}{{ ' " + THINK + "' }}{% endif %}"
)


def build_tokenizer():
    """A `transformers.PreTrainedTokenizerFast` over the task vocabulary, left-padding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: index for index, word in enumerate(vocabulary())}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK,
        padding_side="left", chat_template=CHAT_TEMPLATE,
    )
    return tokenizer
