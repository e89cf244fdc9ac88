"""The testbed task, its tokenizer, and the shipped model's full-cache accuracy on held-out problems."""

from __future__ import annotations

import random

import pytest
import torch

from vase_triton.testbed.task import (
    DEFAULT_STEPS, END_THINK, FACT_NAMES, FACT_VALUES, HELDOUT_STREAM_SEED, PROMPT_TOKENS, USED_NAMES, heldout_problems,
    make_problem, parse_facts, threshold,
)


def _steps(problem):
    """`(step, name, count)` of every step, read back from the trace words."""
    words = problem.trace
    body = words[: words.index(END_THINK)]
    return [(int(head.split(":")[0]), head.split(":")[1], int(count)) for head, count in zip(body[0::2], body[1::2])]


@pytest.mark.parametrize("seed", range(5))
def test_trace_counts_the_steps_whose_fact_is_above_the_threshold(seed):
    problem = make_problem(random.Random(seed))
    assert len(problem.prompt) == PROMPT_TOKENS
    facts = parse_facts(problem.prompt)
    assert sorted(facts) == sorted(FACT_NAMES)
    assert sum("=" in word for word in problem.prompt) == len(FACT_NAMES)
    steps = _steps(problem)
    assert [step for step, _, _ in steps] == list(range(DEFAULT_STEPS))
    # Only words the task writes state a fact: ASCII digits, values below FACT_VALUES.
    assert parse_facts(["a=²", "a=٣", f"a={FACT_VALUES}", "a=-1", "a="]) == {}
    previous = 0
    for step, name, count in steps:
        assert name in USED_NAMES
        assert count == previous + (facts[name] > threshold(step))
        previous = count
    assert problem.answer == previous
    assert problem.trace[-1] == "\\boxed{" + str(previous) + "}"
    assert not any("=" in word for word in problem.trace)


def test_thresholds_take_every_value_once():
    assert sorted(threshold(step) for step in range(DEFAULT_STEPS)) == list(range(FACT_VALUES))


def test_each_block_of_four_steps_reads_every_used_fact_once_in_an_order_set_by_the_count():
    for problem in heldout_problems(50):
        steps = _steps(problem)
        counts = [0] + [count for _, _, count in steps]
        for start in range(0, DEFAULT_STEPS, len(USED_NAMES)):
            names = [name for _, name, _ in steps[start : start + len(USED_NAMES)]]
            first = USED_NAMES.index(names[0])
            assert first == counts[start] % len(USED_NAMES)
            assert names == [USED_NAMES[(first + k) % len(USED_NAMES)] for k in range(len(USED_NAMES))]
        last_seen = {}
        for step, name, _ in steps:
            assert step - last_seen.get(name, step - 1) <= 2 * len(USED_NAMES) - 1
            last_seen[name] = step


def test_heldout_stream_is_fixed_and_apart_from_training_streams():
    first, again = heldout_problems(8), heldout_problems(8)
    assert first == again and heldout_problems(3) == first[:3] and heldout_problems(0) == []
    training = {make_problem(random.Random(seed)).prompt for seed in range(50)}
    assert not training & {problem.prompt for problem in first}
    # The one data seed that draws the held-out stream, which training refuses.
    assert make_problem(random.Random(HELDOUT_STREAM_SEED)).prompt == first[0].prompt
    with pytest.raises(ValueError, match="count: expected an int >= 0; got -3"):
        heldout_problems(-3)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--seed", str(HELDOUT_STREAM_SEED)], "--seed: 2025 draws the held-out evaluation problems"),
        (["--seed", "-1"], "--seed: expected an integer >= 0; got -1"),
        (["--log-every", "0"], "--log-every: expected a positive integer; got 0"),
        (["--batch-size", "0"], "--batch-size: expected a positive integer; got 0"),
        (["--steps", "101"], "--steps: expected at most 100; got 101"),
        (["--plain-steps", "-3"], "--plain-steps: expected an integer >= 0; got -3"),
        (["--plain-steps", "0", "--noise-steps", "0"], "expected at least one optimiser step in all"),
        (["--threads", "0"], "--threads: expected a positive integer; got 0"),
        (["--heads", "3"], "--hidden-size: expected a multiple of --heads = 3; got 128"),
        (["--kv-heads", "3"], "--kv-heads: expected a divisor of --heads = 4; got 3"),
        (["--lr", "nan"], "--lr: expected a finite number"),
        (["--hidden-size", "12", "--heads", "4"], "--hidden-size: expected an even head dim"),
    ],
)
def test_training_arguments_are_refused_in_one_line_before_training(argv, fragment, tmp_path, capsys, monkeypatch):
    from vase_triton.testbed import train

    monkeypatch.setattr(train, "train", lambda args: pytest.fail("training started"))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--out", str(tmp_path / "model"), *argv])
    assert exit_info.value.code == 2
    assert fragment in capsys.readouterr().err.splitlines()[-1]


def test_output_directories_are_checked_before_training(tmp_path, capsys, monkeypatch):
    from vase_triton.testbed import train

    monkeypatch.setattr(train, "train", lambda args: pytest.fail("training started"))
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for argv, fragment in [
        (["--out", str(a_file)], f"--out: expected a directory; {a_file} is a file"),
        (["--out", str(tmp_path / "m"), "--plain-out", str(a_file)], f"--plain-out: expected a directory; {a_file}"),
        (["--out", str(tmp_path / "m"), "--plain-out", str(tmp_path / "m") + "/."],
         "--plain-out: expected a directory other than --out"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            train.main(argv)
        assert exit_info.value.code == 2 and fragment in capsys.readouterr().err.splitlines()[-1]


def test_a_run_without_noise_steps_saves_its_plain_model_too(tmp_path):
    from safetensors.torch import load_file

    from vase_triton.testbed import train

    out, plain = tmp_path / "model", tmp_path / "plain"
    train.main(["--out", str(out), "--plain-out", str(plain), "--plain-steps", "2", "--noise-steps", "0",
                "--steps", "1", "--batch-size", "1", "--hidden-size", "16", "--layers", "1", "--heads", "2",
                "--kv-heads", "1", "--warmup", "1"])  # fmt: skip
    final, at_plain_end = load_file(out / "model.safetensors"), load_file(plain / "model.safetensors")
    assert final.keys() == at_plain_end.keys()
    assert all(torch.equal(final[name], at_plain_end[name]) for name in final)


def test_the_demo_names_the_first_wrong_step_or_the_ending():
    from vase_triton.testbed.demo import trace_verdict

    reference = heldout_problems(1)[0].trace
    words = list(reference)
    joined = " ".join(words)
    assert trace_verdict(joined, joined) == "exact"
    at_step_5 = words.index(next(word for word in words if word.startswith("5:"))) + 1  # step 5's count
    changed = words[:at_step_5] + ["999"] + words[at_step_5 + 1 :]
    assert trace_verdict(" ".join(changed), joined) == "wrong from step 5"
    assert trace_verdict(" ".join(words[:-1] + ["\\boxed{999}"]), joined) == "steps right, the ending differs"
    assert trace_verdict(" ".join(words + ["more"]), joined) == "steps right, the ending differs"
    assert trace_verdict(" ".join(words[:10]), joined) == f"10 words, {len(words)} expected"


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


def test_noise_hides_only_the_counts_whose_fact_the_query_can_no_longer_see():
    import torch

    from vase_triton.testbed.tokenizer import build_tokenizer
    from vase_triton.testbed.train import encode_batch, eviction_noise_mask, mask_unseeable_labels

    tokenizer = build_tokenizer()
    problems = heldout_problems(4)
    input_ids, labels, fact_positions = encode_batch(tokenizer, problems)
    for row, problem in enumerate(problems):
        facts = {word.split("=")[0]: word for word in problem.prompt if "=" in word}
        for position in (fact_positions[row] >= 0).nonzero().flatten().tolist():
            step_word, fact_word = tokenizer.convert_ids_to_tokens(
                [input_ids[row, position - 1].item(), input_ids[row, fact_positions[row, position].item()].item()]
            )
            assert fact_word == facts[step_word.split(":")[1]]
    mask = eviction_noise_mask(4, input_ids.shape[1], 1.0, torch.Generator().manual_seed(1))
    masked = mask_unseeable_labels(labels, fact_positions, mask)
    hidden = 0
    for row in range(4):
        for position in range(input_ids.shape[1]):
            fact = fact_positions[row, position].item()
            seen = fact < 0 or bool(mask[row, 0, position - 1, fact])
            assert (masked[row, position] == labels[row, position]).item() == seen
            if not seen:
                assert masked[row, position].item() == -100
                hidden += 1
    assert 0 < hidden < (fact_positions >= 0).sum().item()


def test_shipped_model_reads_each_step_fact_from_the_prompt_not_from_its_trace():
    """With the used facts changed in the prompt and the old trace fed back, the counts follow the new facts."""
    from benchmarks.testbed_counterfactual import STEP_SPANS, measure
    from vase_triton.testbed.model import load_testbed

    model, tokenizer = load_testbed()
    tally, (right, total) = measure(model, tokenizer, heldout_problems(16), seed=1)
    assert right == total
    follows_new = sum(tally[span]["new"] for span in STEP_SPANS)
    disputed = sum(sum(tally[span].values()) for span in STEP_SPANS)
    assert disputed > 300
    assert follows_new >= 0.9 * disputed, f"{follows_new}/{disputed} counts follow the new prompt"
