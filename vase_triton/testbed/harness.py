"""The testbed as an evaluation task: held-out problems and budgets at fixed compression ratios."""

from __future__ import annotations

import math

from vase_triton.testbed.task import DEFAULT_STEPS, PROMPT_TOKENS, heldout_problems, trace_length

TESTBED_WINDOW = 16
COMPRESSIONS = (2, 4, 8)
# <bos>, the prompt, <think>, the trace, <eos>.
SEQUENCE_TOKENS = 1 + PROMPT_TOKENS + 1 + trace_length(DEFAULT_STEPS) + 1
MAX_NEW_TOKENS = trace_length(DEFAULT_STEPS) + 1 + 16
# The demo (`vase-triton generate` without `--model`) shows one of the first `DEMO_PROBLEMS`
# held-out problems: the stream is one random sequence, so drawing problem i draws the i
# before it, and a bounded index keeps a pick cheap.
DEMO_PROBLEMS = 1024


def compression_budget(ratio: float) -> int:
    """The cache budget that holds `1 / ratio` of a whole testbed sequence."""
    return math.ceil(SEQUENCE_TOKENS / ratio)


def testbed_problems(count: int):
    """The first `count` problems of the fixed held-out stream, as evaluation `Problem`s."""
    from vase_triton.eval.tasks import Problem

    return [
        Problem(
            task="testbed", id=f"testbed-{index:04d}", question=problem.question, answer=str(problem.answer),
            reference=" ".join(problem.trace), instruct=False,
        )
        for index, problem in enumerate(heldout_problems(count))
    ]
