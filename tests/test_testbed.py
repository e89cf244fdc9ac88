"""The testbed task, its tokenizer, and the shipped model's full-cache accuracy on held-out problems."""

from __future__ import annotations

import random

import pytest

from vase_triton.testbed.task import (
    DEFAULT_STEPS, END_THINK, FACT_NAMES, MODULUS, PROMPT_TOKENS, USED_NAMES, heldout_problems, make_problem, parse_facts,
)


def _steps(problem):
    """`(step, name, running sum)` of every step, read back from the trace words."""
    words = problem.trace
    body = words[: words.index(END_THINK)]
    return [(int(head.split(":")[0]), head.split(":")[1], int(total)) for head, total in zip(body[0::2], body[1::2])]


@pytest.mark.parametrize("seed", range(5))
def test_trace_is_the_running_sum_of_the_prompt_facts(seed):
    problem = make_problem(random.Random(seed))
    assert len(problem.prompt) == PROMPT_TOKENS
    facts = parse_facts(problem.prompt)
    assert sorted(facts) == sorted(FACT_NAMES)
    assert sum("=" in word for word in problem.prompt) == len(FACT_NAMES)
    steps = _steps(problem)
    assert [step for step, _, _ in steps] == list(range(DEFAULT_STEPS))
    previous = 0
    for step, name, total in steps:
        assert name in USED_NAMES
        assert total == (previous + facts[name]) % MODULUS
        previous = total
    assert problem.answer == previous
    assert problem.trace[-1] == "\\boxed{" + str(previous) + "}"
    assert not any("=" in word for word in problem.trace)


def test_reads_move_one_or_two_places_and_every_read_fact_recurs_within_six_steps():
    for problem in heldout_problems(50):
        steps = _steps(problem)
        positions = [USED_NAMES.index(name) for _, name, _ in steps]
        assert positions[0] == 0
        for (step, _, _), (_, _, previous_total), before, after in zip(steps[1:], steps, positions, positions[1:]):
            assert (after - before) % len(USED_NAMES) == 1 + (previous_total + step) % 2
        last_seen = {}
        for step, name, _ in steps:
            if name in last_seen:
                assert step - last_seen[name] <= 6
            last_seen[name] = step
        assert len(last_seen) >= 3


def test_heldout_stream_is_fixed_and_apart_from_training_streams():
    first, again = heldout_problems(8), heldout_problems(8)
    assert first == again
    training = {make_problem(random.Random(seed)).prompt for seed in range(50)}
    assert not training & {problem.prompt for problem in first}


def test_tokenizer_round_trip_without_unknown_words():
    from vase_triton.testbed.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    problem = heldout_problems(1)[0]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": problem.question}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(prompt + " " + " ".join(problem.trace), add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids[PROMPT_TOKENS + 2 :], skip_special_tokens=True) == " ".join(problem.trace)


def test_shipped_model_solves_heldout_problems_with_a_full_cache(monkeypatch):
    """Full-cache accuracy of the shipped weights on 32 fixed held-out problems is at least 90%."""
    monkeypatch.setenv("VASE_BACKEND", "torch")
    from vase_triton.config import VaSEConfig
    from vase_triton.eval.extraction import extract_answer
    from vase_triton.eval.prompting import render_prompt
    from vase_triton.eval.runner import EvalSettings, generate_batch
    from vase_triton.testbed.harness import MAX_NEW_TOKENS, TESTBED_WINDOW, testbed_problems
    from vase_triton.testbed.model import load_testbed

    model, tokenizer = load_testbed()
    problems = testbed_problems(32)
    settings = EvalSettings(
        model="testbed", max_new_tokens=MAX_NEW_TOKENS, batch_size=32, window=TESTBED_WINDOW, seed=0,
        sampling={"do_sample": False},
    )
    config = VaSEConfig(policy="full", budget=64, window=TESTBED_WINDOW)
    new_ids, *_ = generate_batch(model, tokenizer, [render_prompt(tokenizer, p) for p in problems], config, settings, 0)
    answers = [extract_answer(tokenizer.decode(ids, skip_special_tokens=True)) for ids in new_ids]
    correct = sum(answer == problem.answer for answer, problem in zip(answers, problems))
    assert correct >= 0.9 * len(problems), f"{correct}/{len(problems)} right"
