"""The testbed task: a count of threshold tests over a few facts hidden among many distractors.

A problem is a prompt of `PROMPT_TOKENS` words holding sixteen facts (`a=57`, `k=3`, ...,
values 0-99) scattered at random among filler words, then a worked trace of `steps` steps.
Step `t` names one of the four facts `a`, `b`, `c`, `d` (word `t:name`) and writes the
count, so far, of steps whose fact was above that step's threshold `threshold(t)` (a
fixed permutation of 0-99 over the steps, never written). The steps come in blocks of
four that read each of `a b c d` once, in the order `a b c d a ...` starting at the fact
numbered `count % 4`, so the order depends on the facts and never repeats itself:

    <bos> so e=38 a=71 then ... k=5 <think> 0:a 1 1:b 1 2:c 2 3:d 2 4:c 3 ... </think> \\boxed{51} <eos>

A step needs its fact's value, and nothing in the trace holds it: a step shows only
whether one fact was above one threshold, and no (fact, threshold) pair comes twice.
Each needed fact is read once per block, one to seven steps (two to fourteen words)
apart, from the first step to the last, while the other 60 prompt words and every trace
word older than a step are never needed again. One wrong test makes one count wrong and,
through the count, the final answer.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Sequence

FACT_NAMES = tuple("abcdefghijklmnop")
USED_NAMES = FACT_NAMES[:4]
FACT_VALUES = 100
FILLER_WORDS = (
    "so", "then", "note", "thus", "also", "here", "now", "well", "next", "hence", "since", "given",
    "where", "while", "after", "before", "first", "again", "still", "yet", "once", "both", "each", "other",
    "more", "less", "same", "such", "only", "very", "just", "even",
)
PROMPT_TOKENS = 64
DEFAULT_STEPS = 100
# `random.Random` seed of the evaluation stream of the README's testbed tables (training refuses it).
HELDOUT_STREAM_SEED = 2025
MAX_STEPS = 100
# Step t tests against (THRESHOLD_STRIDE * t + THRESHOLD_OFFSET) % FACT_VALUES: each value once in 100 steps.
THRESHOLD_STRIDE = 37
THRESHOLD_OFFSET = 11

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
THINK, END_THINK = "<think>", "</think>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, THINK, END_THINK)


def fact_token(name: str, value: int) -> str:
    return f"{name}={value}"


def step_token(step: int, name: str) -> str:
    return f"{step}:{name}"


def answer_token(value: int) -> str:
    return "\\boxed{" + str(value) + "}"


def threshold(step: int) -> int:
    """The value step `step` compares its fact with (a permutation of 0-99 over steps 0-99)."""
    return (THRESHOLD_STRIDE * step + THRESHOLD_OFFSET) % FACT_VALUES


def trace_length(steps: int) -> int:
    """Words of a trace of `steps` steps: two a step, then `</think>` and the answer."""
    return 2 * steps + 2


def vocabulary() -> list[str]:
    """Every word of the task, in id order (specials first, `<pad>` = 0)."""
    steps = [step_token(step, name) for step in range(MAX_STEPS) for name in USED_NAMES]
    facts = [fact_token(name, value) for name in FACT_NAMES for value in range(FACT_VALUES)]
    counts = [str(value) for value in range(MAX_STEPS + 1)]
    answers = [answer_token(value) for value in range(MAX_STEPS + 1)]
    return [*SPECIAL_TOKENS, *steps, *facts, *FILLER_WORDS, *counts, *answers]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One testbed problem: `prompt` (the question's words), `trace` (the worked answer), `answer`."""

    prompt: tuple[str, ...]
    trace: tuple[str, ...]
    answer: int

    @property
    def question(self) -> str:
        return " ".join(self.prompt)


def read_order(step: int, previous_index: int, count: int) -> int:
    """The index in `USED_NAMES` of the fact step `step` reads."""
    if step % len(USED_NAMES) == 0:
        return count % len(USED_NAMES)
    return (previous_index + 1) % len(USED_NAMES)


def solve(facts: dict[str, int], steps: int) -> tuple[tuple[str, ...], int]:
    """The trace words of `steps` steps over `facts` (without the closing words) and the final count."""
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps: expected 1 <= steps <= {MAX_STEPS}; got {steps}")
    count, trace, index = 0, [], 0
    for step in range(steps):
        index = read_order(step, index, count)
        name = USED_NAMES[index]
        count += facts[name] > threshold(step)
        trace += [step_token(step, name), str(count)]
    return tuple(trace), count


def make_problem(rng: random.Random, steps: int = DEFAULT_STEPS) -> Problem:
    """A random problem with `steps` steps, drawn from `rng`."""
    facts = {name: rng.randrange(FACT_VALUES) for name in FACT_NAMES}
    fillers = [rng.choice(FILLER_WORDS) for _ in range(PROMPT_TOKENS - len(FACT_NAMES))]
    order = list(FACT_NAMES)
    rng.shuffle(order)
    slots = set(rng.sample(range(PROMPT_TOKENS), len(FACT_NAMES)))
    fact_words = iter(fact_token(name, facts[name]) for name in order)
    filler_words = iter(fillers)
    prompt = [next(fact_words) if position in slots else next(filler_words) for position in range(PROMPT_TOKENS)]
    trace, answer = solve(facts, steps)
    return Problem(tuple(prompt), (*trace, END_THINK, answer_token(answer)), answer)


def parse_facts(prompt: Sequence[str]) -> dict[str, int]:
    """The fact values stated in a prompt's words."""
    facts = {}
    for word in prompt:
        name, sep, value = word.partition("=")
        if sep and name in FACT_NAMES and value.isascii() and value.isdecimal() and int(value) < FACT_VALUES:
            facts[name] = int(value)
    return facts


def heldout_problems(count: int, *, steps: int = DEFAULT_STEPS) -> list[Problem]:
    """The first `count` problems of the one evaluation stream, drawn from `HELDOUT_STREAM_SEED`,
    the data seed training refuses. One stream only: any other seed is a training stream."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"count: expected an int >= 0; got {count!r}")
    rng = random.Random(HELDOUT_STREAM_SEED)
    return [make_problem(rng, steps) for _ in range(count)]
