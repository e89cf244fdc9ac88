"""Whether the testbed model reads its facts from the prompt or recovers them from its own trace.

For each held-out problem the facts its steps read are given new random values in the
prompt, and the model is fed the *original* trace (worked out from the old values). At
every count word where the old and the new values disagree (the old trace says the fact
was above the step's threshold and the new value is not, or the reverse), the model's
greedy prediction either follows the new prompt, follows the old trace, or neither:

    python benchmarks/testbed_counterfactual.py [--model-dir DIR] [--problems 256]

A model that reads every step's fact from the prompt follows the new values at every such
word; one that recovers them from the earlier trace follows the old trace. The same
problems with their own prompts give the teacher-forced accuracy as a control.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vase_triton.commands.common import positive_int  # noqa: E402
from vase_triton.testbed.task import (  # noqa: E402
    BOS, END_THINK, FACT_VALUES, THINK, USED_NAMES, fact_token, heldout_problems, parse_facts, threshold,
)

STEP_SPANS = ((0, 20), (20, 60), (60, 100))


def counterfactual_prompt(prompt: tuple[str, ...], rng: random.Random) -> tuple[tuple[str, ...], dict[str, int]]:
    """`prompt` with every used fact given a new value (a different one), and the new values."""
    old = parse_facts(prompt)
    new = {name: rng.choice([v for v in range(FACT_VALUES) if v != old[name]]) for name in USED_NAMES}
    words = tuple(
        fact_token(word.split("=")[0], new[word.split("=")[0]]) if word.split("=")[0] in new and "=" in word else word
        for word in prompt
    )
    return words, new


def count_targets(trace: tuple[str, ...], facts: dict[str, int]) -> list[tuple[int, int, int]]:
    """`(step, trace index of the count word, the count those facts give after the trace's previous count)`."""
    body = trace[: trace.index(END_THINK)]
    targets, previous = [], 0
    for index in range(0, len(body), 2):
        step, name = body[index].split(":")
        step = int(step)
        targets.append((step, index + 1, previous + (facts[name] > threshold(step))))
        previous = int(body[index + 1])
    return targets


def greedy_predictions(model, tokenizer, prompts: list[tuple[str, ...]], traces: list[tuple[str, ...]]) -> list[list[str]]:
    """The model's greedy next word at every trace position, fed `<bos> prompt <think> trace`."""
    rows = [tokenizer.convert_tokens_to_ids([BOS, *prompt, THINK, *trace]) for prompt, trace in zip(prompts, traces)]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(rows)).logits
    start = len(prompts[0]) + 2
    predicted = logits[:, start - 1 : -1].argmax(-1)  # [B, trace]
    return [tokenizer.convert_ids_to_tokens(row.tolist()) for row in predicted]


def measure(model, tokenizer, problems, *, seed: int = 0, batch_size: int = 64) -> tuple[dict, tuple[int, int]]:
    """Per span of `STEP_SPANS`, how many disputed count words follow the new prompt (`new`),
    the old trace (`old`) or neither (`other`); and `(right, total)` count words with the own prompt."""
    rng = random.Random(seed)
    tally = {span: {"new": 0, "old": 0, "other": 0} for span in STEP_SPANS}
    right = total = 0
    for start in range(0, len(problems), batch_size):
        batch = problems[start : start + batch_size]
        changed = [counterfactual_prompt(problem.prompt, rng) for problem in batch]
        traces = [problem.trace for problem in batch]
        predictions = greedy_predictions(model, tokenizer, [prompt for prompt, _ in changed], traces)
        own = greedy_predictions(model, tokenizer, [problem.prompt for problem in batch], traces)
        for problem, (_, new_facts), predicted, own_predicted in zip(batch, changed, predictions, own):
            for step, index, new_count in count_targets(problem.trace, new_facts):
                right += own_predicted[index] == problem.trace[index]
                total += 1
                old_count = int(problem.trace[index])
                if new_count == old_count:
                    continue
                span = next(span for span in STEP_SPANS if span[0] <= step < span[1])
                word = predicted[index]
                tally[span]["new" if word == str(new_count) else "old" if word == str(old_count) else "other"] += 1
    return tally, (right, total)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", help="a trained testbed model directory (default: the shipped weights)")
    parser.add_argument("--problems", type=positive_int, default=256, help="held-out problems")
    parser.add_argument("--seed", type=int, default=0, help="seed of the new fact values")
    parser.add_argument("--batch-size", type=positive_int, default=64)
    args = parser.parse_args()
    if args.model_dir is not None and not (Path(args.model_dir) / "config.json").is_file():
        parser.error(f"--model-dir: expected a trained testbed model directory (with config.json); got {args.model_dir}")
    from vase_triton.testbed.model import load_testbed
    from vase_triton.testbed.tokenizer import build_tokenizer

    if args.model_dir:
        from vase_triton.integrations.loading import load_causal_lm

        model = load_causal_lm(args.model_dir, dtype=torch.float32).eval()
        tokenizer = build_tokenizer()
    else:
        model, tokenizer = load_testbed()
    problems = heldout_problems(args.problems)
    tally, (right, total) = measure(model, tokenizer, problems, seed=args.seed, batch_size=args.batch_size)
    print(f"{len(problems)} held-out problems; teacher-forced count words right with the own prompt: "
          f"{100 * right / total:.2f}% of {total}\n")
    print("| steps | count words where new and old facts disagree | follows the new prompt | follows the old trace | neither |")
    print("|---|---:|---:|---:|---:|")
    rows = [*STEP_SPANS, (STEP_SPANS[0][0], STEP_SPANS[-1][1])]
    for span in rows:
        counts = {key: sum(tally[s][key] for s in STEP_SPANS if span[0] <= s[0] and s[1] <= span[1]) for key in tally[STEP_SPANS[0]]}
        disputed = sum(counts.values())
        cells = " | ".join(f"{100 * counts[key] / max(disputed, 1):.1f}%" for key in ("new", "old", "other"))
        print(f"| {span[0]}-{span[1] - 1} | {disputed} | {cells} |")


if __name__ == "__main__":
    main()
