"""Grade an extracted answer against the gold one.

Multiple choice compares letters. Otherwise a normalised string match decides first
(cheap, and the fallback when `math-verify` cannot decide), then `math-verify`:
`verify(parse(gold), parse(answer))`, gold first (the relation is asymmetric).
`math-verify` times itself out with `signal.alarm`, which only works on the main
thread, so its own timeouts are switched off and each grading runs in a daemon
thread that is abandoned after `timeout_s` (the answer then counts as wrong).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from typing import Optional, Sequence

from vase_triton.eval.extraction import choice_letter

DEFAULT_TIMEOUT_S = 10.0

_UNIT_WORDS = (
    "cm", "m", "km", "mm", "kg", "g", "s", "sec", "seconds", "minutes", "hours", "days", "degrees",
    "dollars", "cents", "inches", "feet", "meters", "units", "square", "sq",
)


@dataclasses.dataclass(frozen=True)
class Grade:
    """`correct`, and what decided it: `letter`, `string`, `math-verify`, `timeout` or `no-answer`."""

    correct: bool
    method: str


def normalise(answer: str) -> str:
    """A canonical string form: no spacing, `$`, `\\left`/`\\right`, text wrappers, degree signs or
    the unit words after a quantity (`10 cm`, not the `m` of `x + m`);
    thousands separators dropped from one number written `2,100`; `\\dfrac`/`\\tfrac` as
    `\\frac`; a trailing `.0` dropped."""
    text = answer.strip().strip("$").strip()
    text = re.sub(r"\\(?:left|right|displaystyle|!|,|;|:)", "", text)
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    text = re.sub(r"\^\{?\\circ\}?", "", text).replace("°", "")
    text = re.sub(r"\\(?:text|mathrm|textbf|mbox)\{([^{}]*)\}", r"\1", text)
    text = text.replace("\\%", "").replace("%", "")
    words = text.split()
    first_unit = len(words)
    while first_unit > 1 and words[first_unit - 1].lower().strip(".") in _UNIT_WORDS:
        first_unit -= 1
    if first_unit < len(words) and words[first_unit - 1][-1] in "0123456789})":  # a quantity's unit, not `x + m`
        words = words[:first_unit]
    text = " ".join(words).rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):  # one token: `2, 100` is a pair, not 2100
        text = text.replace(",", "")
    text = text.replace(" ", "")
    if re.fullmatch(r"-?\d+\.0+", text):
        text = text.split(".")[0]
    return text


def _math_verify(gold: str, answer: str) -> bool:
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=None)
    answer_parsed = parse("\\boxed{" + answer + "}", parsing_timeout=None)
    if not gold_parsed or not answer_parsed:
        return False
    return bool(verify(gold_parsed, answer_parsed, timeout_seconds=None))


def verify_within(gold: str, answer: str, timeout_s: float) -> Optional[bool]:
    """`math-verify`'s verdict, computed off the calling thread; None after `timeout_s` seconds."""
    verdict: list[bool] = []

    def work() -> None:
        try:
            verdict.append(_math_verify(gold, answer))
        except Exception:  # a parse or sympy failure is a wrong answer, not a crash
            verdict.append(False)

    worker = threading.Thread(target=work, daemon=True, name="vase-grading")
    worker.start()
    worker.join(timeout_s)
    return verdict[0] if verdict else None


def grade(
    answer: Optional[str], gold: str, *, choices: Optional[Sequence[str]] = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Grade:
    """Whether `answer` (as extracted, or None) matches `gold` (a letter for multiple choice)."""
    if answer is None:
        return Grade(False, "no-answer")
    if choices:
        return Grade(choice_letter(answer, len(choices)) == gold.strip().upper(), "letter")
    if normalise(answer) == normalise(gold):
        return Grade(True, "string")
    verdict = verify_within(gold, answer, timeout_s)
    if verdict is None:
        return Grade(False, "timeout")
    return Grade(verdict, "math-verify")
