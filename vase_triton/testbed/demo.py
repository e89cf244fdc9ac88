"""`vase-triton generate` without `--model`: one testbed problem, full cache and an evicting cache side by side."""

from __future__ import annotations

import torch

from vase_triton.commands.common import format_bytes
from vase_triton.config import VaSEConfig
from vase_triton.eval.extraction import extract_answer, opens_reasoning
from vase_triton.eval.prompting import render_prompt
from vase_triton.eval.runner import EvalSettings, generate_batch
from vase_triton.testbed.harness import DEMO_PROBLEMS, SEQUENCE_TOKENS, testbed_problems
from vase_triton.testbed.model import load_testbed
from vase_triton.testbed.task import END_THINK, MAX_STEPS, USED_NAMES, step_token

STEP_WORDS = frozenset(step_token(step, name) for step in range(MAX_STEPS) for name in USED_NAMES)


def trace_verdict(output: str, reference: str) -> str:
    """`exact`; the step of the first word that differs from the reference trace; or, when every
    step is right, that the closing words (`</think>`, the answer) differ."""
    produced, expected = output.split(), reference.split()
    if produced == expected:
        return "exact"
    shorter = min(len(produced), len(expected))
    first_difference = next((i for i in range(shorter) if produced[i] != expected[i]), shorter)
    if first_difference >= (expected.index(END_THINK) if END_THINK in expected else len(expected)):
        return "steps right, the ending differs"
    if first_difference == shorter:  # one is the other cut short within the steps
        return f"{len(produced)} words, {len(expected)} expected"
    return f"wrong from step {sum(word in STEP_WORDS for word in expected[: first_difference + 1]) - 1}"


def _cache_label(config: VaSEConfig) -> str:
    """`all tokens`, or the budget, window and compression of a problem's sequence."""
    if config.policy == "full":
        return "all tokens"
    if config.budget >= SEQUENCE_TOKENS:
        return f"budget {config.budget} + window {config.window} (holds all {SEQUENCE_TOKENS})"
    return f"budget {config.budget} + window {config.window} ({SEQUENCE_TOKENS / config.budget:.1f}x)"


def side_by_side(config: VaSEConfig, *, problem_index: int, max_new_tokens: int, device, dtype: torch.dtype) -> None:
    """Solve held-out problem `problem_index < DEMO_PROBLEMS` with the full cache and with `config`; print both."""
    if not 0 <= problem_index < DEMO_PROBLEMS:
        raise ValueError(f"problem_index: expected 0 <= problem_index < {DEMO_PROBLEMS}; got {problem_index}")
    model, tokenizer = load_testbed(device=device, dtype=dtype)
    problem = testbed_problems(problem_index + 1)[problem_index]
    prompt = render_prompt(tokenizer, problem)
    settings = EvalSettings(
        model="testbed", max_new_tokens=max_new_tokens, batch_size=1, window=config.window, seed=config.seed,
        sampling={"do_sample": False},
    )
    full = config.replace(policy="full", n_protect=None, protect_values=None)  # eviction options do not apply
    runs = [("full cache", full), (config.policy, config)]
    results = []
    for label, run_config in runs:
        new_ids, _, evictions, kv_bytes, _ = generate_batch(model, tokenizer, [prompt], run_config, settings, config.seed)
        text = tokenizer.decode(new_ids[0], skip_special_tokens=True)
        answer = extract_answer(text, reasoning_open=opens_reasoning(prompt))
        results.append((label, run_config, text, answer, evictions, kv_bytes))

    words = problem.question.split()
    reads = [word for word in problem.reference.split() if word in STEP_WORDS]
    read_names = {word.split(":")[1] for word in reads}
    needed = " ".join(word for word in words if word.split("=")[0] in read_names)
    print(f"testbed problem {problem_index} (held-out), {len(words)} prompt words; the facts its steps read: {needed}")
    print(f"question: {' '.join(words[:12])} ... {' '.join(words[-6:])}")
    print(f"expected answer: {problem.answer} after {len(reads)} steps")
    print("")
    rows = {
        "": [label for label, *_ in results],
        "cache": [_cache_label(c) for _, c, *_ in results],
        "answer": [
            "none" if answer is None else f"{answer} ({'right' if answer == problem.answer else 'wrong'})"
            for _, _, _, answer, *_ in results
        ],
        "trace": [trace_verdict(text, problem.reference) for _, _, text, *_ in results],
        "KV memory": [format_bytes(kv) for *_, kv in results],
        "evictions": [f"{ev} per layer" for *_, ev, _ in results],
    }
    width = max(32, *(len(value) + 2 for values in rows.values() for value in values))
    for name, values in rows.items():
        print(f"{name:18}" + "".join(f"{value:>{width}}" for value in values))
    print("")
    for label, _, text, *_ in results:
        words = text.split()
        shown = " ".join(words) if len(words) <= 14 else f"{' '.join(words[:8])} ... {' '.join(words[-6:])}"
        print(f"{label}: {shown}")
