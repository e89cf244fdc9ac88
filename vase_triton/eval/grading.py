"""Grade an extracted answer against the gold one.

Multiple choice compares letters. Otherwise a canonical string match decides first
(cheap, and the fallback when `math-verify` cannot decide), then `math-verify`, run in a
child process (`verifier.Verifier`) that is killed after `timeout_s` seconds and whose
memory is capped (an answer that overruns either counts as wrong).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional, Sequence

from vase_triton.eval.extraction import choice_letter
from vase_triton.eval.verifier import Overrun, Verifier

DEFAULT_TIMEOUT_S = 10.0

_UNIT_WORDS = (
    "cm", "m", "km", "mm", "kg", "g", "s", "sec", "seconds", "minutes", "hours", "days", "degrees",
    "dollars", "cents", "inches", "feet", "meters", "units", "square", "sq",
)


@dataclasses.dataclass(frozen=True)
class Grade:
    """`correct`, and what decided it: `letter`, `string`, `math-verify`, `no-answer`, or the
    verifier's overrun, `timeout` or `memory-limit` (counted wrong)."""

    correct: bool
    method: str


def canonical(answer: str) -> tuple[str, str]:
    """`(quantity, unit)` in canonical string forms: no spacing (a spacing command separates words),
    `$`, `\\left`/`\\right`, text wrappers, degree signs or percent signs; thousands separators
    dropped from one number written `2,100` or `2 100`, other spaces between digits kept (`1 2`
    is not `12`); `\\dfrac`/`\\tfrac` as `\\frac`; a trailing `.0` dropped. `unit` holds the
    unit words after a quantity, lower case (`10 cm`, `10cm` and `10\\,\\text{cm}` give `cm`; the
    `m` of `x + m` is no unit)."""
    text = answer.strip().strip("$").strip()
    text = re.sub(r"\\(?:left|right|displaystyle|!)", "", text)
    text = re.sub(r"\\(?:,|;|:|quad|qquad|\s)|~", " ", text)  # spacing: `10\,\text{cm}` is `10 cm`
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    text = re.sub(r"\^\{?\\circ\}?", "", text).replace("°", "")
    # A wrapped word is a word of its own: `5\text{cm}` is `5 cm`.
    text = re.sub(r"\\(?:text|mathrm|textbf|mbox)\{([^{}]*)\}", lambda m: (" " if m[1][:1].isalpha() else "") + m[1], text)
    text = text.replace("\\%", "").replace("%", "")
    words = text.split()
    # `10cm`; not `2m`, `3s` or `5g`, whose letter may be a variable of the answer.
    glued = re.fullmatch(r"(.*\d)([a-zA-Z]{2,})\.?", words[-1]) if words else None
    if glued and glued[2].lower() in _UNIT_WORDS:
        words[-1:] = [glued[1], glued[2]]
    first_unit = len(words)
    while first_unit > 1 and words[first_unit - 1].lower().strip(".") in _UNIT_WORDS:
        first_unit -= 1
    unit = ""
    if first_unit < len(words) and words[first_unit - 1][-1] in "0123456789})":  # a quantity's unit, not `x + m`
        unit = " ".join(word.lower().strip(".") for word in words[first_unit:])
        words = words[:first_unit]
    text = " ".join(words).rstrip(".")
    if re.fullmatch(r"-?\d{1,3}([, ]\d{3})+(\.\d+)?", text) and len(set(re.findall(r"[, ]", text))) == 1:
        text = re.sub(r"[, ]", "", text)  # one token `2,100` or `2 100`; `2, 100` is a pair
    text = " ".join(re.sub(r"\s+", "", piece) for piece in re.split(r"(?<=\d)\s+(?=\d)", text))
    if re.fullmatch(r"-?\d+\.0+", text):
        text = text.split(".")[0]
    return text, unit


def string_verdict(answer: str, gold: str) -> Optional[bool]:
    """What the canonical forms decide: False when both have a unit and the units differ (`10 m`
    is not `10 cm`), True when the quantities are equal (`10 cm` matches `10`), else None."""
    (answer_quantity, answer_unit), (gold_quantity, gold_unit) = canonical(answer), canonical(gold)
    if answer_unit and gold_unit and answer_unit != gold_unit:
        return False
    return True if answer_quantity == gold_quantity else None


def grade(
    answer: Optional[str], gold: str, *, verifier: Verifier, choices: Optional[Sequence[str]] = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Grade:
    """Whether `answer` (as extracted, or None) matches `gold` (a letter for multiple choice);
    `verifier` runs `math-verify` when the string forms differ."""
    if answer is None:
        return Grade(False, "no-answer")
    if choices:
        return Grade(choice_letter(answer, len(choices)) == gold.strip().upper(), "letter")
    decided = string_verdict(answer, gold)
    if decided is not None:  # a unit clash is decided here: math-verify ignores units
        return Grade(decided, "string")
    verdict = verifier.verdict(gold, answer, timeout_s)
    if isinstance(verdict, Overrun):
        return Grade(False, verdict.value)
    return Grade(verdict, "math-verify")
