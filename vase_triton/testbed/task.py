"""The testbed task: a long running sum over a few facts hidden among many distractors.

A problem is a prompt of `PROMPT_TOKENS` words holding sixteen facts (`a=7`, `k=2`, ...)
scattered at random among filler words, then a worked trace of `steps` steps. Step `t`
names one of the four facts `a`, `b`, `c`, `d` (word `t:name`) and writes the running sum,
mod 100, after adding that fact's digit. Step 0 names `a`; step `t` moves
`1 + (sum + t) % 2` places on along `a b c d a ...` from the previous name, so the order
of the reads depends on the sums and the step, and the trace never repeats itself:

    <bos> so e=3 a=7 then ... k=1 <think> 0:a 7 1:c 9 2:d 13 ... </think> \\boxed{63} <eos>

The trace never writes a fact's digit, and each needed fact (four, or three when the
moves keep skipping one) is read again every four steps on average and at most six steps
(12 words) apart, from near the start of the sequence to its end, while the other 60
prompt words and every trace word older than a step are never needed again. One wrong
digit makes one step wrong and, through the running sum, the final answer.

The digit of a fact also shows in the trace, as the difference of the two sums around an
earlier step that read the same fact; a model can learn to read it from there instead of
from the prompt.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Sequence

FACT_NAMES = tuple("abcdefghijklmnop")
USED_NAMES = FACT_NAMES[:4]
FILLER_WORDS = (
    "so", "then", "note", "thus", "also", "here", "now", "well", "next", "hence", "since", "given",
    "where", "while", "after", "before", "first", "again", "still", "yet", "once", "both", "each", "other",
    "more", "less", "same", "such", "only", "very", "just", "even",
)
PROMPT_TOKENS = 64
MODULUS = 100
DEFAULT_STEPS = 128
MAX_STEPS = 128

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
THINK, END_THINK = "<think>", "</think>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, THINK, END_THINK)


def fact_token(name: str, digit: int) -> str:
    return f"{name}={digit}"


def step_token(step: int, name: str) -> str:
    return f"{step}:{name}"


def answer_token(value: int) -> str:
    return "\\boxed{" + str(value) + "}"


def trace_length(steps: int) -> int:
    """Words of a trace of `steps` steps: two a step, then `</think>` and the answer."""
    return 2 * steps + 2


def vocabulary() -> list[str]:
    """Every word of the task, in id order (specials first, `<pad>` = 0)."""
    steps = [step_token(step, name) for step in range(MAX_STEPS) for name in USED_NAMES]
    facts = [fact_token(name, digit) for name in FACT_NAMES for digit in range(10)]
    numbers = [str(value) for value in range(MODULUS)]
    answers = [answer_token(value) for value in range(MODULUS)]
    return [*SPECIAL_TOKENS, *steps, *facts, *FILLER_WORDS, *numbers, *answers]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One testbed problem: `prompt` (the question's words), `trace` (the worked answer), `answer`."""

    prompt: tuple[str, ...]
    trace: tuple[str, ...]
    answer: int

    @property
    def question(self) -> str:
        return " ".join(self.prompt)


def solve(facts: dict[str, int], steps: int) -> tuple[tuple[str, ...], int]:
    """The trace words of `steps` steps over `facts` (without the closing words) and the final sum."""
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps: expected 1 <= steps <= {MAX_STEPS}; got {steps}")
    total, trace, index = 0, [], 0
    for step in range(steps):
        if step > 0:
            index = (index + 1 + (total + step) % 2) % len(USED_NAMES)
        name = USED_NAMES[index]
        total = (total + facts[name]) % MODULUS
        trace += [step_token(step, name), str(total)]
    return tuple(trace), total


def make_problem(rng: random.Random, steps: int = DEFAULT_STEPS) -> Problem:
    """A random problem with `steps` steps, drawn from `rng`."""
    facts = {name: rng.randrange(10) for name in FACT_NAMES}
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
    """The fact digits stated in a prompt's words."""
    facts = {}
    for word in prompt:
        name, sep, digit = word.partition("=")
        if sep and name in FACT_NAMES and digit.isdigit():
            facts[name] = int(digit)
    return facts


def heldout_problems(count: int, *, seed: int = 2024, steps: int = DEFAULT_STEPS) -> list[Problem]:
    """`count` problems of a fixed evaluation stream (never used in training: its seeds are negative)."""
    rng = random.Random(-1 - seed)
    return [make_problem(rng, steps) for _ in range(count)]
