"""The testbed task: a long running sum over a few facts hidden among many distractors.

A problem is a prompt of `PROMPT_TOKENS` words holding eight facts, each a span of five
digits written as self-describing words (`a0=4 a1=7 a2=1 a3=9 a4=5`: fact `a`, slots 0-4),
at random places among filler words, then a worked trace of `steps` steps. Step `t`
names one of the four facts `a`, `b`, `c`, `d` (word `t:name`), reads that fact's digit in
slot `t % 5`, and writes the running sum, mod 100, after adding it. Step 0 names `a`;
step `t` moves `1 + (sum + t) % 2` places on along `a b c d a ...` from the previous name,
so the order of the reads depends on the sums and never repeats with a fixed period:

    <bos> so e0=3 ... a0=4 a1=7 a2=1 a3=9 a4=5 then ... <think> 0:a 4 1:c 13 2:d 15 ... </think> \\boxed{63} <eos>

The trace never writes a digit of a fact, and a fact is read again every few steps but
mostly in another slot than before, so an earlier step rarely tells what the next one
needs: the prompt must be read again. The needed spans (20 words) are re-read all along
the sequence, the other 44 prompt words and every trace word older than a step are never
needed again. A cache that keeps the needed spans (and the last few words) solves the
problem at any size; one that loses a digit gets the step that reads it wrong, and with
it the final sum.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Sequence

FACT_NAMES = tuple("abcdefgh")
USED_NAMES = FACT_NAMES[:4]
SLOTS = 5
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


def fact_token(name: str, slot: int, digit: int) -> str:
    return f"{name}{slot}={digit}"


def step_token(step: int, name: str) -> str:
    return f"{step}:{name}"


def answer_token(value: int) -> str:
    return "\\boxed{" + str(value) + "}"


def vocabulary() -> list[str]:
    """Every word of the task, in id order (specials first, `<pad>` = 0)."""
    steps = [step_token(step, name) for step in range(MAX_STEPS) for name in USED_NAMES]
    facts = [fact_token(name, slot, digit) for name in FACT_NAMES for slot in range(SLOTS) for digit in range(10)]
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


def solve(facts: dict[tuple[str, int], int], steps: int) -> tuple[tuple[str, ...], int]:
    """The trace words of `steps` steps over `facts[(name, slot)]` (without the closing words) and the final sum."""
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps: expected 1 <= steps <= {MAX_STEPS}; got {steps}")
    total, trace, index = 0, [], 0
    for step in range(steps):
        if step > 0:
            index = (index + 1 + (total + step) % 2) % len(USED_NAMES)
        name = USED_NAMES[index]
        total = (total + facts[(name, step % SLOTS)]) % MODULUS
        trace += [step_token(step, name), str(total)]
    return tuple(trace), total


def make_problem(rng: random.Random, steps: int = DEFAULT_STEPS) -> Problem:
    """A random problem with `steps` steps, drawn from `rng`."""
    facts = {(name, slot): rng.randrange(10) for name in FACT_NAMES for slot in range(SLOTS)}
    spans = [[fact_token(name, slot, facts[(name, slot)]) for slot in range(SLOTS)] for name in FACT_NAMES]
    rng.shuffle(spans)
    n_fillers = PROMPT_TOKENS - SLOTS * len(FACT_NAMES)
    fillers = [rng.choice(FILLER_WORDS) for _ in range(n_fillers)]
    # Span k goes after the filler at a sorted random cut, so spans never overlap.
    cuts = sorted(rng.randrange(n_fillers + 1) for _ in spans)
    prompt, previous = [], 0
    for cut, span in zip(cuts, spans):
        prompt += fillers[previous:cut] + span
        previous = cut
    prompt += fillers[previous:]
    trace, answer = solve(facts, steps)
    return Problem(tuple(prompt), (*trace, END_THINK, answer_token(answer)), answer)


def parse_facts(prompt: Sequence[str]) -> dict[tuple[str, int], int]:
    """The digits stated in a prompt's words, by `(name, slot)`."""
    facts = {}
    for word in prompt:
        head, sep, digit = word.partition("=")
        if sep and len(head) == 2 and head[0] in FACT_NAMES and head[1].isdigit() and digit.isdigit():
            facts[(head[0], int(head[1]))] = int(digit)
    return facts


def heldout_problems(count: int, *, seed: int = 2024, steps: int = DEFAULT_STEPS) -> list[Problem]:
    """`count` problems of a fixed evaluation stream (never used in training: its seeds are negative)."""
    rng = random.Random(-1 - seed)
    return [make_problem(rng, steps) for _ in range(count)]
