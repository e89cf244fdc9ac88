"""The built-in testbed: a small Qwen3 trained here on a task where eviction must choose.

`task` generates problems, `tokenizer` builds the word-level tokenizer, `model` holds the
architecture and loads the shipped weights (`weights/`), `train` reproduces them from a
seed, `harness` turns the held-out problems into an evaluation task, and `demo` is the
side-by-side run of `vase-triton generate`.
"""
